//! The network front ends' rule for listening beyond loopback: only with the protection
//! a stranger on the network would meet (TLS, and for S3 keys), unless the operator says
//! otherwise with `--insecure-listen`.

use std::net::ToSocketAddrs;

use anyhow::{bail, Context, Result};

/// Whether `addr` (as `--listen` takes it) reaches beyond this machine: any address it
/// resolves to that is not loopback, such as `0.0.0.0` or a LAN address.
pub fn reaches_network(addr: &str) -> Result<bool> {
    let resolved: Vec<_> = addr.to_socket_addrs().with_context(|| format!("--listen {addr}"))?.collect();
    Ok(resolved.iter().any(|a| !a.ip().is_loopback()))
}

/// Refuse to serve `addr` beyond loopback while `missing` names what is unprotected
/// (`None`: nothing is); `how` says what to add.
pub fn check(addr: &str, missing: Option<&str>, how: &str, insecure_listen: bool) -> Result<()> {
    let Some(missing) = missing else { return Ok(()) };
    if insecure_listen || !reaches_network(addr)? {
        return Ok(());
    }
    bail!(
        "--listen {addr} reaches beyond this machine, and {missing}: anyone who can reach the port could read and change the volume. \
         {how}, or pass --insecure-listen to serve it anyway"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_served_and_the_network_needs_protection_or_the_override() {
        for local in ["127.0.0.1:10809", "[::1]:10809", "localhost:10809"] {
            assert!(!reaches_network(local).unwrap(), "{local}");
            check(local, Some("TLS is off"), "add TLS", false).unwrap();
        }
        for open in ["0.0.0.0:10809", "[::]:10809", "192.0.2.7:10809"] {
            assert!(reaches_network(open).unwrap(), "{open}");
            let error = check(open, Some("TLS is off"), "Add --tls require", false).unwrap_err().to_string();
            assert!(error.contains("TLS is off") && error.contains("Add --tls require") && error.contains("--insecure-listen"), "{error}");
            check(open, Some("TLS is off"), "", true).unwrap();
            check(open, None, "", false).unwrap();
        }
        assert!(reaches_network("no-such-host.invalid:1").is_err());
    }
}
