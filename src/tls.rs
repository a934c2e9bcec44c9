//! The one TLS stack of both binaries: rustls with the ring crypto provider.
//!
//! Downloads ([`crate::fetch`]), the artifact cache ([`crate::cache`],
//! object_store over reqwest) and the operator's Kubernetes client (kube)
//! all speak rustls. None of them links aws-lc-rs: reqwest is built with
//! `rustls-no-provider` and object_store with its `ring` feature, so ring is
//! the only provider in the binary and rustls cannot pick one by itself.
//! [`init`] installs it as the process default (what object_store's and
//! kube's clients look up when they are built); `fetch` passes it
//! explicitly ([`client_config`]).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

/// The crypto provider: ring.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs ring as the process's default rustls provider, once. Call it
/// before building any HTTP client that looks the default up (object_store's
/// reqwest client, kube's); without it, such a build panics, as no provider
/// is compiled in as a fallback. Idempotent and cheap.
pub fn init() {
    if CryptoProvider::get_default().is_none() {
        // Err only means another thread installed one first: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Mozilla's roots, bundled in the binary: builder roots and scratch images
/// have no `/etc/ssl/certs`.
pub(crate) fn web_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned());
    roots
}

/// The certificates of a PEM bundle (other PEM items are skipped).
pub fn pem_certificates(
    pem: &[u8],
) -> std::result::Result<Vec<CertificateDer<'static>>, rustls::pki_types::pem::Error> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem).collect()
}

/// A client config with ring, the given roots, HTTP/1.1 only (one download
/// per connection: HTTP/2's multiplexing buys nothing and its flow control
/// costs throughput).
pub fn client_config(roots: RootCertStore) -> std::result::Result<ClientConfig, rustls::Error> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_roots_and_config() {
        let roots = web_roots();
        assert!(roots.len() > 100, "{} roots", roots.len());
        assert!(client_config(roots).is_ok());
        init();
        init();
        assert!(CryptoProvider::get_default().is_some());
    }

    #[test]
    fn pem_bundles() {
        assert_eq!(pem_certificates(b"").map(|c| c.len()).ok(), Some(0));
        assert_eq!(
            pem_certificates(b"no pem here\n").map(|c| c.len()).ok(),
            Some(0)
        );
    }
}
