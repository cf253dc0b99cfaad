//! What the gateway served, by S3 operation: counts and service times (from a request's
//! arrival to its response's head; a GET's body streams after that), and answers by
//! class. For the `--metrics` endpoint.

use std::sync::atomic::{AtomicU64, Ordering};

use alignfs::stats::{LatencyCounter, RequestLatency};
use hyper::Method;

/// The operations told apart, in the order of [`RequestStats`]'s counters.
const OPERATIONS: [&str; 18] = [
    "ListBuckets",
    "CreateBucket",
    "HeadBucket",
    "DeleteBucket",
    "ListObjects",
    "ListMultipartUploads",
    "DeleteObjects",
    "GetObject",
    "HeadObject",
    "PutObject",
    "DeleteObject",
    "CreateMultipartUpload",
    "UploadPart",
    "CompleteMultipartUpload",
    "AbortMultipartUpload",
    "ListParts",
    "CopyObject",
    "other",
];

/// Counters a server shares with whoever reports on it.
#[derive(Debug, Default)]
pub struct RequestStats {
    latency: [LatencyCounter; OPERATIONS.len()],
    client_errors: AtomicU64,
    server_errors: AtomicU64,
    tls_handshake_failures: AtomicU64,
}

impl RequestStats {
    pub(crate) fn record(&self, operation: usize, status: hyper::StatusCode, took: std::time::Duration) {
        self.latency[operation].record(took);
        if status.is_client_error() {
            self.client_errors.fetch_add(1, Ordering::Relaxed);
        } else if status.is_server_error() {
            self.server_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Each operation's service times so far; operations never seen are left out.
    pub fn latency_by_operation(&self) -> Vec<RequestLatency> {
        OPERATIONS.iter().zip(&self.latency).filter_map(|(name, counter)| counter.snapshot(name)).collect()
    }

    pub(crate) fn tls_handshake_failed(&self) {
        self.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections whose TLS handshake failed or did not finish in time.
    pub fn tls_handshake_failures(&self) -> u64 {
        self.tls_handshake_failures.load(Ordering::Relaxed)
    }

    /// Requests answered 4xx (the client's mistake) and 5xx (the gateway's failure).
    pub fn errors(&self) -> (u64, u64) {
        (self.client_errors.load(Ordering::Relaxed), self.server_errors.load(Ordering::Relaxed))
    }
}

/// Which S3 operation a path-style request is, from its method, path, query and whether
/// it names a copy source; an index into [`OPERATIONS`].
pub(crate) fn operation(method: &Method, path: &str, query: Option<&str>, copies: bool) -> usize {
    let has = |key: &str| query.is_some_and(|q| q.split('&').any(|pair| pair.split('=').next() == Some(key)));
    let segments: Vec<&str> = path.trim_matches('/').splitn(2, '/').filter(|s| !s.is_empty()).collect();
    let name = match (segments.len(), method) {
        (0, &Method::GET) => "ListBuckets",
        (1, &Method::PUT) => "CreateBucket",
        (1, &Method::HEAD) => "HeadBucket",
        (1, &Method::DELETE) => "DeleteBucket",
        (1, &Method::GET) if has("uploads") => "ListMultipartUploads",
        (1, &Method::GET) => "ListObjects",
        (1, &Method::POST) if has("delete") => "DeleteObjects",
        (2, &Method::GET) if has("uploadId") => "ListParts",
        (2, &Method::GET) => "GetObject",
        (2, &Method::HEAD) => "HeadObject",
        (2, &Method::PUT) if has("partNumber") && has("uploadId") => "UploadPart",
        (2, &Method::PUT) if copies => "CopyObject",
        (2, &Method::PUT) => "PutObject",
        (2, &Method::DELETE) if has("uploadId") => "AbortMultipartUpload",
        (2, &Method::DELETE) => "DeleteObject",
        (2, &Method::POST) if has("uploads") => "CreateMultipartUpload",
        (2, &Method::POST) if has("uploadId") => "CompleteMultipartUpload",
        _ => "other",
    };
    OPERATIONS.iter().position(|o| *o == name).expect("every name is listed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(method: Method, path: &str, query: Option<&str>) -> &'static str {
        OPERATIONS[operation(&method, path, query, false)]
    }

    #[test]
    fn requests_are_told_apart_by_operation() {
        assert_eq!(named(Method::GET, "/", None), "ListBuckets");
        assert_eq!(named(Method::GET, "/b", Some("list-type=2&prefix=a")), "ListObjects");
        assert_eq!(named(Method::GET, "/b/", Some("uploads")), "ListMultipartUploads");
        assert_eq!(named(Method::PUT, "/b/k/with/slashes", None), "PutObject");
        assert_eq!(named(Method::PUT, "/b/k", Some("partNumber=2&uploadId=x")), "UploadPart");
        assert_eq!(named(Method::POST, "/b/k", Some("uploads=")), "CreateMultipartUpload");
        assert_eq!(named(Method::POST, "/b/k", Some("uploadId=x")), "CompleteMultipartUpload");
        assert_eq!(named(Method::DELETE, "/b/k", Some("uploadId=x")), "AbortMultipartUpload");
        assert_eq!(named(Method::POST, "/b", Some("delete")), "DeleteObjects");
        assert_eq!(named(Method::PATCH, "/b/k", None), "other");
        assert_eq!(OPERATIONS[operation(&Method::PUT, "/b/k", None, true)], "CopyObject");
    }

    #[test]
    fn answers_are_counted_by_class() {
        let stats = RequestStats::default();
        let put = operation(&Method::PUT, "/b/k", None, false);
        stats.record(put, hyper::StatusCode::OK, std::time::Duration::from_micros(30));
        stats.record(put, hyper::StatusCode::FORBIDDEN, std::time::Duration::from_micros(30));
        stats.record(put, hyper::StatusCode::INTERNAL_SERVER_ERROR, std::time::Duration::from_micros(30));
        assert_eq!(stats.errors(), (1, 1));
        let latency = stats.latency_by_operation();
        assert_eq!(latency.len(), 1);
        assert_eq!((latency[0].kind.as_str(), latency[0].counts.iter().sum::<u64>()), ("PutObject", 3));
    }
}
