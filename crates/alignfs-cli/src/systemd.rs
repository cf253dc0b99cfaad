//! The two things a daemon tells systemd (sd_notify(3)): that it is ready (`Type=notify`
//! units start the next unit only then), and, under `WatchdogSec=`, that it is still
//! alive. Without `NOTIFY_SOCKET` in the environment (not started by systemd) both do
//! nothing. The protocol is one datagram per message to that socket; no library needed.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

/// Sends `state` (e.g. `READY=1`) to systemd if it started this process with a notify
/// socket. Errors are logged, never fatal: a daemon must not stop because its supervisor
/// went away.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(e) = send(Path::new(&path), state) {
        tracing::warn!("tell systemd {state:?}: {e}");
    }
}

fn send(path: &Path, state: &str) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_os_str().as_encoded_bytes();
    // `@name` is a socket in the abstract namespace.
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        socket.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}

/// How often to tell the watchdog that all is well: half the interval systemd gives
/// (`WATCHDOG_USEC`), if it gives one to this process.
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var("WATCHDOG_PID").ok().and_then(|p| p.parse::<u32>().ok()) {
        if pid != std::process::id() {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// Pings the watchdog every `watchdog_interval()` for as long as `healthy()` says so,
/// from a thread of its own; does nothing when no watchdog is asked for. A check that
/// fails or hangs sends nothing, so systemd restarts the service when the interval ends.
pub fn keep_watchdog(healthy: impl Fn() -> bool + Send + 'static) {
    let Some(interval) = watchdog_interval() else { return };
    let spawned = std::thread::Builder::new().name("alignfs-watchdog".into()).spawn(move || loop {
        if healthy() {
            notify("WATCHDOG=1");
        } else {
            tracing::warn!("health check failed: not telling the systemd watchdog all is well");
        }
        std::thread::sleep(interval);
    });
    if let Err(e) = spawned {
        tracing::error!("cannot start the watchdog thread, systemd will restart the service: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_a_named_and_an_abstract_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        send(&path, "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("alignfs-notify-test-{}", std::process::id());
        let abstract_listener =
            UnixDatagram::bind_addr(&std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        send(Path::new(&format!("@{name}")), "WATCHDOG=1").unwrap();
        let n = abstract_listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");
    }
}
