//! TLS on NBD connections, as the protocol defines it: the client asks with
//! `NBD_OPT_STARTTLS`, the server acknowledges in plaintext, and the handshake and the rest
//! of the connection run over TLS. Credentials come as qemu-nbd and nbdkit take them: a
//! directory of X.509 PEM files (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`), or a
//! TLS-PSK key file of `identity:hexkey` lines (GnuTLS's `psktool` format).
//!
//! OpenSSL, not rustls: rustls has no external pre-shared keys (rustls/rustls#174), and the
//! NBD clients people run (libnbd, qemu) authenticate with them.
//!
//! A connection's requests are read by one thread while its workers send replies, so a
//! [`TlsStream`] is shared by handles like a socket is. The session sits behind a mutex
//! over a non-blocking socket: a reader that finds no whole record releases the lock and
//! waits in `poll`, so replies go out while it waits.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions, SslStream, SslVerifyMode, SslVersion,
};
use parking_lot::Mutex;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::config::Stream;

/// Whether a client may stay in plaintext.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsPolicy {
    /// TLS is offered; plaintext clients are served too.
    On,
    /// Nothing but `NBD_OPT_STARTTLS` (or `NBD_OPT_ABORT`) is answered before TLS.
    Require,
}

/// How the server authenticates itself and its clients.
pub struct TlsConfig {
    pub policy: TlsPolicy,
    context: SslContext,
    /// What a log line says about the credentials ("X.509", "PSK").
    pub kind: &'static str,
}

impl TlsConfig {
    /// X.509 from a directory laid out as qemu-nbd and nbdkit expect: `server-cert.pem`
    /// (the chain), `server-key.pem`, and `ca-cert.pem`, the authority client certificates
    /// must be signed by when `verify_peer`.
    pub fn certificates(dir: &Path, verify_peer: bool, policy: TlsPolicy) -> Result<TlsConfig, String> {
        let file = |name: &str| {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!(
                    "{}: missing (a TLS certificate directory holds server-cert.pem, server-key.pem and ca-cert.pem)",
                    path.display()
                ))
            }
        };
        let mut builder = base_context(SslVersion::TLS1_2)?;
        let (cert, key) = (file("server-cert.pem")?, file("server-key.pem")?);
        builder.set_certificate_chain_file(&cert).map_err(|e| format!("{}: {e}", cert.display()))?;
        builder.set_private_key_file(&key, SslFiletype::PEM).map_err(|e| format!("{}: {e}", key.display()))?;
        builder.check_private_key().map_err(|e| format!("{} does not match {}: {e}", key.display(), cert.display()))?;
        if verify_peer {
            let ca = file("ca-cert.pem")?;
            builder.set_ca_file(&ca).map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
        Ok(TlsConfig { policy, context: builder.build(), kind: "X.509" })
    }

    /// TLS-PSK from a key file of `identity:hexkey` lines. TLS 1.3 only: its PSK modes
    /// with a Diffie-Hellman exchange are what GnuTLS clients offer.
    pub fn psk(file: &Path, policy: TlsPolicy) -> Result<TlsConfig, String> {
        let keys = Arc::new(read_psk_file(file)?);
        let mut builder = base_context(SslVersion::TLS1_3)?;
        builder.set_psk_server_callback(move |_ssl, identity, out| {
            let Some(key) = identity.and_then(|id| keys.iter().find(|(name, _)| name.as_bytes() == id)).map(|(_, key)| key) else {
                tracing::warn!("TLS-PSK: unknown identity {:?}", String::from_utf8_lossy(identity.unwrap_or_default()));
                // Zero bytes: no key, the handshake fails.
                return Ok(0);
            };
            if key.len() > out.len() {
                return Ok(0);
            }
            out[..key.len()].copy_from_slice(key);
            Ok(key.len())
        });
        Ok(TlsConfig { policy, context: builder.build(), kind: "PSK" })
    }
}

/// What every context shares: no renegotiation (a read may then never need to write
/// from another thread's write), no session tickets (no client resumes NBD sessions).
fn base_context(min_version: SslVersion) -> Result<SslContextBuilder, String> {
    let mut builder = SslContext::builder(SslMethod::tls_server()).map_err(|e| format!("TLS: {e}"))?;
    builder.set_min_proto_version(Some(min_version)).map_err(|e| format!("TLS: {e}"))?;
    builder.set_options(SslOptions::NO_RENEGOTIATION | SslOptions::NO_TICKET | SslOptions::CIPHER_SERVER_PREFERENCE);
    builder.set_num_tickets(0).map_err(|e| format!("TLS: {e}"))?;
    // AES-GCM before ChaCha20 (OpenSSL's default order puts ChaCha20 before AES-128, the
    // one PSK sessions can use): with AES instructions it moved 1 MiB writes 2.2× faster.
    builder
        .set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256")
        .map_err(|e| format!("TLS: {e}"))?;
    Ok(builder)
}

/// The `identity:hexkey` lines of a PSK file; blank lines and `#` comments are skipped.
/// Like the S3 gateway's key file, it must be private to its owner.
fn read_psk_file(path: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let shown = path.display();
    let text = alignfs::paths::read_private_file(path)?;
    let keys = parse_psk_keys(&text).map_err(|e| format!("{shown}: {e}"))?;
    if keys.is_empty() {
        return Err(format!("{shown}: no keys (expected identity:hexkey lines)"));
    }
    Ok(keys)
}

/// Longest key accepted: OpenSSL's limit for a pre-shared key.
const MAX_PSK_BYTES: usize = 256;

pub(crate) fn parse_psk_keys(text: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut keys = Vec::new();
    for (number, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((identity, hex)) = line.split_once(':') else {
            return Err(format!("line {number}: expected identity:hexkey"));
        };
        if identity.is_empty() || hex.is_empty() || hex.len() % 2 != 0 || hex.len() / 2 > MAX_PSK_BYTES {
            return Err(format!("line {number}: expected identity:hexkey with a key of 1 to {MAX_PSK_BYTES} hex bytes"));
        }
        let key = (0..hex.len())
            .step_by(2)
            .map(|i| hex.get(i..i + 2).and_then(|pair| u8::from_str_radix(pair, 16).ok()))
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| format!("line {number}: the key is not hexadecimal"))?;
        keys.push((identity.to_string(), key));
    }
    Ok(keys)
}

/// A connected socket as the TLS session reads and writes it: sends never raise SIGPIPE
/// (a client that hung up is an error to the caller, not the end of the process).
struct Socket(OwnedFd);

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(rustix::net::recv(&self.0, buf, rustix::net::RecvFlags::empty())?.0)
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(rustix::net::send(&self.0, buf, rustix::net::SendFlags::NOSIGNAL)?)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One side of a TLS session over a socket; clones share the session.
#[derive(Clone)]
pub(crate) struct TlsStream {
    shared: Arc<Shared>,
}

struct Shared {
    session: Mutex<SslStream<Socket>>,
    /// The socket again, for waiting and hanging up without the session's lock.
    socket: OwnedFd,
    read_timeout: Mutex<Option<Duration>>,
    peer: String,
}

/// Longest single wait in `poll` before the session is tried again: a safety net should
/// another handle's call have taken in the bytes a waiting reader wants.
const POLL_SLICE: Duration = Duration::from_millis(100);

impl TlsStream {
    /// Run the server's side of the handshake on `socket` (the connection's socket,
    /// duplicated), within `timeout`.
    pub(crate) fn accept(socket: OwnedFd, config: &TlsConfig, peer: String, timeout: Duration) -> io::Result<TlsStream> {
        rustix::io::ioctl_fionbio(&socket, true)?;
        let waiter = socket.try_clone()?;
        let ssl = Ssl::new(&config.context).map_err(io::Error::other)?;
        let session = SslStream::new(ssl, Socket(socket)).map_err(io::Error::other)?;
        let stream = TlsStream {
            shared: Arc::new(Shared { session: Mutex::new(session), socket: waiter, read_timeout: Mutex::new(Some(timeout)), peer }),
        };
        // Success is 1: 0 is how `retry` says the peer went away.
        if stream.retry(|session| session.accept().map(|()| 1), true)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed during the TLS handshake"));
        }
        *stream.shared.read_timeout.lock() = None;
        Ok(stream)
    }

    /// Call `op` on the session until it completes, waiting for the socket whenever it
    /// needs to; `bounded`: a read's wait, which ends at the read timeout.
    fn retry(&self, mut op: impl FnMut(&mut SslStream<Socket>) -> Result<usize, openssl::ssl::Error>, bounded: bool) -> io::Result<usize> {
        let deadline = bounded.then(|| *self.shared.read_timeout.lock()).flatten().map(|t| Instant::now() + t);
        loop {
            let wanted = {
                let mut session = self.shared.session.lock();
                match op(&mut session) {
                    Ok(n) => return Ok(n),
                    Err(e) => match e.code() {
                        ErrorCode::WANT_READ => PollFlags::IN,
                        ErrorCode::WANT_WRITE => PollFlags::OUT,
                        // The peer closed (with close_notify, or by dropping the socket).
                        ErrorCode::ZERO_RETURN => return Ok(0),
                        ErrorCode::SYSCALL if e.io_error().is_none() => return Ok(0),
                        _ => return Err(e.into_io_error().unwrap_or_else(io::Error::other)),
                    },
                }
            };
            let mut slice = POLL_SLICE;
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "TLS peer sent nothing in time"));
                }
                slice = slice.min(left);
            }
            let timeout = Timespec { tv_sec: slice.as_secs() as i64, tv_nsec: i64::from(slice.subsec_nanos()) };
            let mut fds = [PollFd::new(&self.shared.socket, wanted)];
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.retry(|session| session.ssl_read(buf), true)
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.retry(|session| session.ssl_write(buf), false)? {
            0 => Err(io::Error::new(io::ErrorKind::WriteZero, "TLS peer closed the connection")),
            n => Ok(n),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stream for TlsStream {
    fn try_clone_stream(&self) -> io::Result<Self> {
        Ok(self.clone())
    }
    fn shutdown_both(&self) {
        let _ = rustix::net::shutdown(self.shared.socket.as_fd(), rustix::net::Shutdown::Both);
    }
    fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        *self.shared.read_timeout.lock() = timeout;
        Ok(())
    }
    fn peer(&self) -> String {
        self.shared.peer.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::{parse_psk_keys, read_psk_file};

    #[test]
    fn a_psk_file_others_can_read_is_refused_and_an_empty_one_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.psk");
        std::fs::write(&path, "alice:00ff\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_psk_file(&path).unwrap_err().contains("chmod 600"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_psk_file(&path).unwrap(), vec![("alice".to_string(), vec![0, 0xff])]);
        std::fs::write(&path, "# none\n").unwrap();
        assert!(read_psk_file(&path).unwrap_err().contains("no keys"));
    }

    #[test]
    fn psk_files_parse_as_psktool_writes_them_and_bad_lines_are_named() {
        let keys = parse_psk_keys("# keys\nalice:00ff10\n\n bob:ABCDEF \n").unwrap();
        assert_eq!(keys, vec![("alice".to_string(), vec![0, 0xff, 0x10]), ("bob".to_string(), vec![0xab, 0xcd, 0xef])]);
        for (text, says) in [
            ("alice", "line 1: expected identity:hexkey"),
            ("ok:00\n:00", "line 2"),
            ("alice:0", "hex bytes"),
            ("alice:zz", "not hexadecimal"),
            ("alice:é", "not hexadecimal"),
            (&format!("alice:{}", "00".repeat(257)), "1 to 256"),
        ] {
            let error = parse_psk_keys(text).unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }
}
