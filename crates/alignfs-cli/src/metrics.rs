//! `--metrics ADDR`: a daemon's `/metrics` endpoint for Prometheus to scrape. It answers
//! `GET /metrics` with what `render` returns at that moment, 404 for other paths and 405
//! for other methods, on its own thread, so a slow scraper never holds up the volume.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};

/// The text format's content type (Prometheus exposition format 0.0.4).
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A client that takes longer than this to send its request head is disconnected.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Scrapes served at once; more connections wait to be accepted.
const MAX_CONNECTIONS: usize = 16;

/// Renders the metrics text on each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A running endpoint. Dropping it stops it and drops `render` (with whatever it holds).
pub struct MetricsServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Listens on `addr` and serves `/metrics` from a thread of its own until the returned
/// server is dropped.
pub fn serve(addr: &str, render: Render) -> Result<MetricsServer> {
    let listener = std::net::TcpListener::bind(addr).with_context(|| format!("--metrics: listen on {addr}"))?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("--metrics: start its runtime")?;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("alignfs-metrics".into())
        .spawn(move || {
            runtime.block_on(async {
                tokio::select! {
                    _ = accept_loop(listener, render) => {}
                    _ = stopped => {}
                }
            })
        })
        .context("--metrics: start its thread")?;
    Ok(MetricsServer { addr: bound, stop: Some(stop), thread: Some(thread) })
}

async fn accept_loop(listener: std::net::TcpListener, render: Render) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!("metrics endpoint: {e}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!("metrics endpoint: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let render = Arc::clone(&render);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| answer(request, Arc::clone(&render)));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                tracing::debug!("metrics endpoint: connection: {e}");
            }
            drop(slot);
        });
    }
}

async fn answer(request: Request<hyper::body::Incoming>, render: Render) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, text: String| {
        let mut response = Response::new(Full::new(Bytes::from(text)));
        *response.status_mut() = status;
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(CONTENT_TYPE));
        Ok(response)
    };
    if request.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "alignfs serves /metrics only\n".into());
    }
    match *request.method() {
        Method::GET | Method::HEAD => {
            // The report reads the volume's counters and usage under its locks: off the
            // runtime's thread.
            match tokio::task::spawn_blocking(move || render()).await {
                Ok(text) => reply(StatusCode::OK, text),
                Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, format!("the report failed: {e}\n")),
            }
        }
        _ => reply(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn an_address_that_cannot_be_listened_on_is_a_clear_error() {
        let render: Render = Arc::new(String::new);
        for bad in ["not an address", "127.0.0.1:99999", "256.0.0.1:9464"] {
            let error = serve(bad, Arc::clone(&render)).err().expect(bad).to_string();
            assert!(error.contains(&format!("--metrics: listen on {bad}")), "{bad}: {error}");
        }
    }

    #[test]
    fn metrics_are_served_at_their_path_only() {
        let scrapes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = Arc::clone(&scrapes);
        let render: Render = Arc::new(move || {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            format!("# TYPE scrapes_total counter\nscrapes_total {n}\n")
        });
        let server = serve("127.0.0.1:0", render).unwrap();
        let addr = server.addr;
        let close = "Connection: close\r\n\r\n";
        let ok = get(addr, &format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{close}"));
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("text/plain; version=0.0.4") && ok.ends_with("scrapes_total 1\n"), "{ok}");
        assert!(get(addr, &format!("GET / HTTP/1.1\r\nHost: x\r\n{close}")).starts_with("HTTP/1.1 404"));
        assert!(get(addr, &format!("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n{close}")).starts_with("HTTP/1.1 405"));
        assert_eq!(scrapes.load(std::sync::atomic::Ordering::Relaxed), 1, "only the GET rendered");
        drop(server);
        assert_eq!(Arc::strong_count(&scrapes), 1, "a stopped server holds nothing it was given");
        assert!(std::net::TcpStream::connect(addr).is_err(), "a stopped server no longer listens");
    }
}
