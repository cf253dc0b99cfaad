//! Accepting connections: HTTP/1.1 on a TCP listener, every connection served by the
//! same S3 service, until the shutdown future resolves; then open connections get a
//! little time to finish.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::header::{HeaderValue, CONNECTION, EXPECT};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnectionBuilder;
use s3s::service::{S3Service, S3ServiceBuilder};
use tokio::net::TcpListener;

use crate::gateway::Gateway;

pub struct ServerConfig {
    pub listener: std::net::TcpListener,
    /// The accepted keys; `None` serves anonymous requests (refused unless asked for).
    pub auth: Option<crate::keys::Keys>,
}

/// Serve one request; a request that asked `Expect: 100-continue` and was refused is
/// answered with `Connection: close`. The client then never sent its body, but hyper,
/// reading on in case a small body came anyway, would take the first bytes of the
/// client's next request on that connection as the body (its method loses letters and
/// its signature no longer matches). Closing is what RFC 9110 §10.1.1 allows a server
/// that answers before reading the body.
fn close_after_refused_continue(
    service: &S3Service,
    request: hyper::Request<hyper::body::Incoming>,
) -> impl Future<Output = Result<s3s::HttpResponse, s3s::HttpError>> + use<> {
    let expects_continue = request.headers().get(EXPECT).is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let response = Service::call(service, request);
    async move {
        let mut response = response.await?;
        if expects_continue && !response.status().is_success() {
            response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        }
        Ok(response)
    }
}

/// Serve until `shutdown` resolves; returns once connections have finished (or after
/// ten seconds).
pub async fn serve(gateway: Gateway, config: ServerConfig, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    config.listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(config.listener)?;
    let service = {
        let mut builder = S3ServiceBuilder::new(gateway);
        if let Some(auth) = config.auth {
            builder.set_auth(auth);
        }
        builder.build()
    };
    let service = hyper::service::service_fn(move |request| close_after_refused_continue(&service, request));
    let http = ConnectionBuilder::new(TokioExecutor::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
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
        let connection = http.serve_connection(TokioIo::new(socket), service.clone());
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => tracing::warn!("connections still open after 10 s; closing anyway"),
    }
    Ok(())
}
