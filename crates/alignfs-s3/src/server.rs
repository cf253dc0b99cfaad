//! Accepting connections: HTTP/1.1 on a TCP listener, every connection served by the
//! same S3 service, until the shutdown future resolves; then open connections get a
//! little time to finish. As production HTTP servers do, a client gets a bounded time to
//! send its request head and between the pieces of its body, and the connections served
//! at once are bounded (past that, new ones wait in the listen queue).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderValue, CONNECTION, EXPECT};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnectionBuilder;
use s3s::service::{S3Service, S3ServiceBuilder};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::gateway::Gateway;
use crate::request_stats::RequestStats;
use crate::timeouts::{IdleBody, InRequest, TimedIo};

pub struct ServerConfig {
    pub listener: std::net::TcpListener,
    /// HTTPS with this certificate and key ([`crate::tls::load`]); `None`: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The accepted keys; `None` serves anonymous requests (refused unless asked for).
    pub auth: Option<crate::keys::Keys>,
    pub connections: ConnectionLimits,
    /// Where the served requests are counted.
    pub stats: Arc<RequestStats>,
}

/// How long a client may take, and how many may be served at once.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// From the start of a request's head (or of waiting for the next one on a kept-alive
    /// connection) to its end; past it the connection is closed.
    pub header_timeout: Duration,
    /// Longest wait for the next piece of a request body; past it the request fails
    /// (`RequestTimeout`) and the connection is closed.
    pub body_idle_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    /// nginx's and MinIO's order of magnitude: 30 s for a head, 60 s between body pieces.
    fn default() -> ConnectionLimits {
        ConnectionLimits { header_timeout: Duration::from_secs(30), body_idle_timeout: Duration::from_secs(60), max_connections: 1024 }
    }
}

/// Serve one request; a request that asked `Expect: 100-continue` and was refused is
/// answered with `Connection: close`. The client then never sent its body, but hyper,
/// reading on in case a small body came anyway, would take the first bytes of the
/// client's next request on that connection as the body (its method loses letters and
/// its signature no longer matches). Closing is what RFC 9110 §10.1.1 allows a server
/// that answers before reading the body.
///
/// The body is read with [`IdleBody`]'s bound. A client's mistake (4xx) is logged at
/// debug level, the gateway's own failure (5xx) at error.
fn serve_request(
    service: &S3Service,
    request: hyper::Request<hyper::body::Incoming>,
    in_request: &Arc<InRequest>,
    body_idle: Duration,
    stats: &Arc<RequestStats>,
) -> impl Future<Output = Result<s3s::HttpResponse, s3s::HttpError>> + use<> {
    let inside = in_request.enter();
    let arrived = std::time::Instant::now();
    let copies = request.headers().contains_key("x-amz-copy-source");
    let operation = crate::request_stats::operation(request.method(), request.uri().path(), request.uri().query(), copies);
    let stats = Arc::clone(stats);
    let expects_continue = request.headers().get(EXPECT).is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let request = request.map(|body| s3s::Body::http_body(IdleBody::new(body, body_idle)));
    let service = service.clone();
    async move {
        let _inside = inside;
        let mut response = service.call(request).await?;
        let status = response.status();
        stats.record(operation, status, arrived.elapsed());
        // 501 is a method or feature this gateway does not offer: the client's choice.
        if status.is_server_error() && status != hyper::StatusCode::NOT_IMPLEMENTED {
            tracing::error!(%method, path, %status, "S3 request failed");
        } else if status.is_client_error() {
            tracing::debug!(%method, path, %status, "S3 request refused");
        }
        if expects_continue && !status.is_success() {
            response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        }
        Ok(response)
    }
}

/// One accepted connection and what serving it needs.
struct Connection {
    service: S3Service,
    limits: ConnectionLimits,
    stats: Arc<RequestStats>,
    http: ConnectionBuilder<TokioExecutor>,
    /// The server's shutdown, which the connection follows; `None` outside a server.
    graceful: Option<hyper_util::server::graceful::Watcher>,
    peer: String,
}

impl Connection {
    /// The TLS handshake, bounded as a request head is, then HTTP over it. A failed
    /// handshake is the client's affair: logged at debug level and counted.
    async fn serve_tls(self, socket: tokio::net::TcpStream, tls: tokio_rustls::TlsAcceptor) {
        match tokio::time::timeout(self.limits.header_timeout, tls.accept(socket)).await {
            Ok(Ok(stream)) => self.serve(stream).await,
            Ok(Err(e)) => {
                self.stats.tls_handshake_failed();
                tracing::debug!(peer = %self.peer, "TLS handshake failed: {e}");
            }
            Err(_) => {
                self.stats.tls_handshake_failed();
                tracing::debug!(peer = %self.peer, "no TLS handshake within {:?}", self.limits.header_timeout);
            }
        }
    }

    /// HTTP/1.1 on `io` until the client leaves or the server shuts down.
    async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static>(self, io: S) {
        let Connection { service, limits, stats, http, graceful, peer } = self;
        let in_request = Arc::new(InRequest::default());
        let io = TokioIo::new(TimedIo::new(io, Arc::clone(&in_request), limits.header_timeout));
        let body_idle = limits.body_idle_timeout;
        let serve = hyper::service::service_fn(move |request| serve_request(&service, request, &in_request, body_idle, &stats));
        let connection = http.serve_connection(io, serve).into_owned();
        let ended = match graceful {
            Some(graceful) => graceful.watch(connection).await,
            None => connection.await,
        };
        if let Err(e) = ended {
            tracing::debug!(%peer, "connection ended: {e}");
        }
    }
}

/// The S3 service over `gateway`, checking SigV4 with `auth` (`None`: anonymous).
fn s3_service(gateway: Gateway, auth: Option<crate::keys::Keys>) -> S3Service {
    let mut builder = S3ServiceBuilder::new(gateway);
    if let Some(auth) = auth {
        builder.set_auth(auth);
    }
    builder.build()
}

/// Serve HTTP/1.1 on one byte stream until it ends, as [`serve`] serves each accepted
/// connection (the same bounds, parsing, signature checks and S3 service), without a
/// listener: for fuzzing and tests.
pub async fn serve_stream<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static>(
    gateway: Gateway,
    auth: Option<crate::keys::Keys>,
    limits: ConnectionLimits,
    io: S,
) {
    let connection = Connection {
        service: s3_service(gateway, auth),
        limits,
        stats: Arc::default(),
        http: ConnectionBuilder::new(TokioExecutor::new()),
        graceful: None,
        peer: "stream".into(),
    };
    connection.serve(io).await;
}

/// Serve until `shutdown` resolves; returns once connections have finished (or after
/// ten seconds).
pub async fn serve(gateway: Gateway, config: ServerConfig, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    config.listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(config.listener)?;
    let service = s3_service(gateway, config.auth);
    let limits = config.connections;
    let tls = config.tls.map(tokio_rustls::TlsAcceptor::from);
    let http = ConnectionBuilder::new(TokioExecutor::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // At the limit, stop accepting: new connections wait in the listen queue.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
            () = shutdown.as_mut() => break,
        };
        let (socket, peer): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(connection) => connection,
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.as_mut() => break,
        };
        // A response's head and body go out as separate writes: with Nagle's algorithm
        // the body waits for the client's delayed ACK, 40 ms per request.
        if let Err(e) = socket.set_nodelay(true) {
            tracing::debug!(%peer, "TCP_NODELAY: {e}");
        }
        let connection = Connection {
            service: service.clone(),
            limits,
            stats: Arc::clone(&config.stats),
            http: http.clone(),
            graceful: Some(graceful.watcher()),
            peer: peer.to_string(),
        };
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                Some(tls) => connection.serve_tls(socket, tls).await,
                None => connection.serve(socket).await,
            }
            drop(slot);
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => tracing::warn!("connections still open after 10 s; closing anyway"),
    }
    Ok(())
}
