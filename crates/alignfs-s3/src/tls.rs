//! HTTPS for the gateway: a certificate chain and its private key in PEM files, served
//! with rustls (TLS 1.2 and 1.3, HTTP/1.1 by ALPN).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server's TLS settings from `cert` (the chain, leaf first) and `key`; every error
/// names the file it is about.
pub fn load(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no PEM certificate in it", cert.display()));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: no PEM private key in it ({e})", key.display()))?;
    // ring rather than rustls's default, aws-lc-rs: it builds without cmake and in a
    // fraction of the time. rustls marks it deprecated for its lack of post-quantum key
    // exchange; X25519 and the NIST curves are what S3 clients offer today.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
