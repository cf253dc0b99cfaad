//! Connections: negotiation, then requests served by a few worker threads per
//! connection, overlapping requests in the order they arrived.

use std::collections::HashMap;
use std::io::{self, BufReader};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

pub use crate::config::{default_workers, ExportEntry, ServerConfig, ServerStats, Stream};
use crate::negotiate::{greet, negotiate, Negotiated};
use crate::protocol::Hangup;
use crate::tls::TlsStream;
use crate::transmit::transmit;

/// Hangs up one connection.
type HangUp = Box<dyn Fn() + Send>;

/// A running server: listeners and connections, until [`Server::shutdown`].
pub struct Server {
    config: Arc<ServerConfig>,
    stop: Arc<AtomicBool>,
    /// Each open connection's way to hang it up, by connection number.
    live: Arc<Mutex<HashMap<u64, HangUp>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pub stats: Arc<ServerStats>,
}

impl Server {
    pub fn new(config: ServerConfig) -> Server {
        Server {
            config: Arc::new(config),
            stop: Arc::new(AtomicBool::new(false)),
            live: Arc::default(),
            threads: Mutex::default(),
            stats: Arc::default(),
        }
    }

    /// Accept TCP connections on `listener` in a background thread.
    pub fn listen_tcp(&self, listener: TcpListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        // Replies are written whole; Nagle would only hold one back behind an earlier one.
        self.accept_loop(move || listener.accept().and_then(|(s, _)| s.set_nodelay(true).map(|()| s)))
    }

    /// Accept Unix-socket connections on `listener` in a background thread.
    pub fn listen_unix(&self, listener: UnixListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        self.accept_loop(move || listener.accept().map(|(s, _)| s))
    }

    fn accept_loop<S: Stream>(&self, mut accept: impl FnMut() -> io::Result<S> + Send + 'static) -> io::Result<()> {
        let (config, stop, live, stats) =
            (Arc::clone(&self.config), Arc::clone(&self.stop), Arc::clone(&self.live), Arc::clone(&self.stats));
        let handle = std::thread::Builder::new().name("nbd-accept".into()).spawn(move || {
            let mut connections: Vec<JoinHandle<()>> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match accept() {
                    Ok(stream) => {
                        connections.retain(|c| !c.is_finished());
                        let Ok(closer) = stream.try_clone_stream() else { continue };
                        let id = stats.connections.fetch_add(1, Ordering::Relaxed);
                        live.lock().insert(id, Box::new(move || closer.shutdown_both()));
                        let (config, stats, live) = (Arc::clone(&config), Arc::clone(&stats), Arc::clone(&live));
                        let serve = move || {
                            serve_connection(stream, &config, &stats);
                            // Hang up: the closer's descriptor would keep the socket open.
                            if let Some(close) = live.lock().remove(&id) {
                                close();
                            }
                        };
                        match std::thread::Builder::new().name("nbd-conn".into()).spawn(serve) {
                            Ok(c) => connections.push(c),
                            Err(e) => tracing::error!("start a connection thread: {e}"),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
            for c in connections {
                let _ = c.join();
            }
        })?;
        self.threads.lock().push(handle);
        Ok(())
    }

    /// Stop accepting, disconnect every client (requests in progress finish first), and
    /// wait for every thread.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for (_, close) in self.live.lock().drain() {
            close();
        }
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

/// Serve one connection to its end; every way it can end is logged, none panics.
pub fn serve_connection<S: Stream>(stream: S, config: &ServerConfig, stats: &ServerStats) {
    let peer = stream.peer();
    // One buffered reader from the first byte to the last: a client may send its first
    // requests right behind its last option.
    let mut reader = match stream.try_clone_stream() {
        Ok(clone) => BufReader::with_capacity(256 << 10, clone),
        Err(e) => return tracing::warn!("{peer}: {e}"),
    };
    let no_zeroes = match greet(&stream, &mut reader, config) {
        Ok(no_zeroes) => no_zeroes,
        Err(e) => return refused(stats, &peer, &e),
    };
    let Some((stream, reader)) = serve_negotiated(stream, reader, config, stats, no_zeroes, false) else { return };
    // STARTTLS was acknowledged. A client starts its handshake only after reading that,
    // so nothing may be buffered yet.
    if !reader.buffer().is_empty() {
        return refused(stats, &peer, &Hangup::Protocol("bytes sent before STARTTLS's reply".into()));
    }
    drop(reader);
    let Some(tls) = &config.tls else { unreachable!("STARTTLS is acknowledged only with TLS configured") };
    let session = match stream.duplicate_socket() {
        Some(Ok(socket)) => TlsStream::accept(socket, tls, format!("{peer} (TLS)"), config.handshake_timeout),
        Some(Err(e)) => Err(e),
        None => Err(io::Error::other("this connection has no socket to run TLS on")),
    };
    // The session owns its own copy of the socket; this one would keep it open.
    drop(stream);
    match session {
        Ok(session) => {
            stats.tls_sessions.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("{peer}: TLS ({}) established", tls.kind);
            let reader = BufReader::with_capacity(256 << 10, session.clone());
            serve_negotiated(session, reader, config, stats, no_zeroes, true);
        }
        Err(e) => refused(stats, &peer, &Hangup::Io(io::Error::new(e.kind(), format!("TLS handshake failed: {e}")))),
    }
}

/// Negotiate on `stream`, then serve the chosen export to the connection's end. Returns
/// the stream and its reader when the client asked for TLS and this is not TLS yet.
fn serve_negotiated<S: Stream>(
    stream: S,
    mut reader: BufReader<S>,
    config: &ServerConfig,
    stats: &ServerStats,
    no_zeroes: bool,
    tls_on: bool,
) -> Option<(S, BufReader<S>)> {
    let peer = stream.peer();
    match negotiate(&stream, &mut reader, config, no_zeroes, tls_on) {
        Ok(Negotiated::Export(entry)) => {
            tracing::info!("{peer}: serving export {:?}{}", entry.name, if no_zeroes { "" } else { " (old-style zero padding)" });
            match transmit(stream, reader, entry, config, stats) {
                Ok(()) => tracing::info!("{peer}: disconnected"),
                Err(e) => tracing::warn!("{peer}: {e}"),
            }
        }
        Ok(Negotiated::Ended) => tracing::info!("{peer}: ended negotiation"),
        Ok(Negotiated::StartTls) if !tls_on => return Some((stream, reader)),
        Ok(Negotiated::StartTls) => unreachable!("STARTTLS is refused over TLS"),
        Err(e) => refused(stats, &peer, &e),
    }
    None
}

fn refused(stats: &ServerStats, peer: &str, e: &Hangup) {
    stats.refused_handshakes.fetch_add(1, Ordering::Relaxed);
    tracing::warn!("{peer}: closed during negotiation: {e}");
}
