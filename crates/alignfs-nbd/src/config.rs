//! What a server serves and how (its exports and settings), the sockets it serves on,
//! and what it counts: shared by the listener, negotiation and transmission.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use alignfs::stats::{LatencyCounter, RequestLatency};

use crate::protocol::{CMD_DISC, CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES};
use crate::tls::TlsConfig;
use crate::Export;

/// One export a server offers.
pub struct ExportEntry {
    pub name: String,
    pub description: String,
    pub export: Arc<dyn Export>,
    pub read_only: bool,
}

/// Workers per connection unless told otherwise: one per CPU, 2 to 16. More than the CPUs
/// only add wake-ups: on two CPUs, eight workers served 4 KiB requests at queue depth 8
/// 15–21 % slower than two (fio's nbd engine over a Unix socket, 3 alternating rounds).
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(2, 16)
}

/// What a server serves and how.
pub struct ServerConfig {
    pub exports: Vec<ExportEntry>,
    /// Threads serving one connection's requests ([`default_workers`]).
    pub workers_per_connection: usize,
    /// Largest READ or WRITE accepted; larger ones get `NBD_EINVAL`.
    pub max_request_bytes: u32,
    /// A client has this long for each step of negotiation.
    pub handshake_timeout: Duration,
    /// TLS offered or required (`NBD_OPT_STARTTLS`); `None`: plaintext only.
    pub tls: Option<TlsConfig>,
}

impl ServerConfig {
    pub fn new(exports: Vec<ExportEntry>) -> ServerConfig {
        ServerConfig {
            exports,
            workers_per_connection: default_workers(),
            max_request_bytes: 32 << 20,
            handshake_timeout: Duration::from_secs(30),
            tls: None,
        }
    }
}

/// A connected socket of either family.
pub trait Stream: Read + Write + Send + Sync + 'static {
    fn try_clone_stream(&self) -> io::Result<Self>
    where
        Self: Sized;
    fn shutdown_both(&self);
    fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn peer(&self) -> String;
    /// The socket, duplicated, for a TLS session to take over; `None` where there is no
    /// socket (TLS is then refused).
    fn duplicate_socket(&self) -> Option<io::Result<OwnedFd>> {
        None
    }
}

impl Stream for TcpStream {
    fn try_clone_stream(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_both(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(timeout)
    }
    fn peer(&self) -> String {
        self.peer_addr().map_or_else(|_| "tcp peer".into(), |a| a.to_string())
    }
    fn duplicate_socket(&self) -> Option<io::Result<OwnedFd>> {
        Some(self.as_fd().try_clone_to_owned())
    }
}

impl Stream for UnixStream {
    fn try_clone_stream(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_both(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(timeout)
    }
    fn peer(&self) -> String {
        "unix socket peer".into()
    }
    fn duplicate_socket(&self) -> Option<io::Result<OwnedFd>> {
        Some(self.as_fd().try_clone_to_owned())
    }
}

/// What the server did, for logs and tests.
#[derive(Default)]
pub struct ServerStats {
    pub connections: AtomicU64,
    pub refused_handshakes: AtomicU64,
    /// Connections that completed a TLS handshake.
    pub tls_sessions: AtomicU64,
    pub requests: AtomicU64,
    /// Requests the connection's reading thread served itself, without a worker.
    pub served_by_reader: AtomicU64,
    pub errors_returned: AtomicU64,
    /// Service times by command number (`NBD_CMD_*`), from a request's arrival to its reply.
    latency: [LatencyCounter; 8],
}

impl ServerStats {
    pub(crate) fn record(&self, command: u16, took: std::time::Duration) {
        if let Some(counter) = self.latency.get(usize::from(command)) {
            counter.record(took);
        }
    }

    /// Each command's service times so far ("READ", "WRITE", ...); commands never seen are
    /// left out.
    pub fn latency_by_command(&self) -> Vec<RequestLatency> {
        self.latency.iter().enumerate().filter_map(|(command, counter)| counter.snapshot(command_name(command as u16))).collect()
    }
}

fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        _ => "other",
    }
}
