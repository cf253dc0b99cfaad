//! Accepting connections: HTTP/1.1 on a TCP listener, every connection served by the
//! same S3 service, until the shutdown future resolves; then open connections get a
//! little time to finish.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnectionBuilder;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;

use crate::gateway::Gateway;

pub struct ServerConfig {
    pub listener: std::net::TcpListener,
    /// The accepted keys; `None` serves anonymous requests (refused unless asked for).
    pub auth: Option<crate::keys::Keys>,
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
