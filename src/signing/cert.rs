//! The signing certificate: read (bounded), PEM or DER, its subject and
//! SHA-256 fingerprint; and the DER form a user enrolls (`mokutil
//! --import` takes DER).

use std::path::Path;

use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::{Error, Failure, Result};
use crate::named_file::Named;
use crate::node::Signer;

/// A certificate is one or two KiB; a chain or a CA bundle would not be
/// what sign-file expects either.
const CERT_FILE: Named = Named {
    what: "signing certificate",
    max: 64 << 10,
    reason: Failure::SigningFailed,
    hint: "--signing-cert names one X.509 certificate, PEM or DER (a tls Secret's tls.crt)",
};

/// Reads and parses the certificate at `path`: its DER and its signer.
pub(crate) fn read_certificate(path: &Path) -> Result<(Vec<u8>, Signer)> {
    let bytes = CERT_FILE.read(path)?;
    parse_certificate(&bytes, &path.display().to_string())
}

/// One X.509 certificate, PEM (`-----BEGIN CERTIFICATE-----`) or DER;
/// `origin` names it in errors (its content is never quoted).
pub(crate) fn parse_certificate(bytes: &[u8], origin: &str) -> Result<(Vec<u8>, Signer)> {
    let bad = |why: String| {
        Error::new(
            Failure::SigningFailed,
            format!("{origin} is not a usable signing certificate: {why}"),
        )
        .with_hint(CERT_FILE.hint)
    };
    let der = if bytes.starts_with(b"-----BEGIN") || bytes.windows(10).any(|w| w == b"-----BEGIN") {
        let (_, pem) = x509_parser::pem::parse_x509_pem(bytes)
            .map_err(|e| bad(format!("unreadable PEM ({e})")))?;
        if pem.label != "CERTIFICATE" {
            return Err(bad(format!(
                "the PEM block is a {:?}, not a CERTIFICATE",
                pem.label
            )));
        }
        pem.contents
    } else {
        bytes.to_vec()
    };
    let (rest, cert) =
        X509Certificate::from_der(&der).map_err(|e| bad(format!("not X.509 DER ({e})")))?;
    if !rest.is_empty() {
        return Err(bad(format!("{} bytes after the certificate", rest.len())));
    }
    let signer = Signer {
        subject: cert.subject().to_string(),
        sha256: hex::encode(Sha256::digest(&der)),
    };
    Ok((der, signer))
}

/// Writes the certificate's DER to `out` (temporary file, then rename).
pub(crate) fn write_der(der: &[u8], out: &Path) -> Result<()> {
    crate::publish::write_atomic(out, der, 0o644, Failure::InvalidArgument)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_cert() -> rcgen::CertifiedKey<rcgen::KeyPair> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "gpu-driver module signing");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "example");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        rcgen::CertifiedKey {
            cert,
            signing_key: key,
        }
    }

    #[test]
    fn pem_and_der_give_one_signer_with_the_der_fingerprint() {
        let ck = test_cert();
        let der = ck.cert.der().to_vec();
        let (from_pem, signer) = parse_certificate(ck.cert.pem().as_bytes(), "tls.crt").unwrap();
        assert_eq!(from_pem, der);
        assert_eq!(signer.sha256, hex::encode(Sha256::digest(&der)));
        assert!(
            signer.subject.contains("CN=gpu-driver module signing"),
            "{signer:?}"
        );
        assert!(signer.subject.contains("O=example"), "{signer:?}");
        let (from_der, again) = parse_certificate(&der, "cert.der").unwrap();
        assert_eq!((from_der, again), (der, signer));
    }

    #[test]
    fn a_key_garbage_or_trailing_bytes_are_refused_without_quoting_them() {
        let ck = test_cert();
        let key = ck.signing_key.serialize_pem();
        let e = parse_certificate(key.as_bytes(), "tls.key").unwrap_err();
        assert_eq!(e.reason, Failure::SigningFailed);
        assert!(
            e.message.contains("PRIVATE KEY") && e.message.contains("tls.key"),
            "{e}"
        );
        // Never echo a file someone else named (it might be the key).
        assert!(!e.message.contains(&key[40..80]), "{e}");
        let e = parse_certificate(b"not a certificate", "x").unwrap_err();
        assert_eq!(e.reason, Failure::SigningFailed);
        let mut der = ck.cert.der().to_vec();
        der.extend(b"tail");
        let e = parse_certificate(&der, "x").unwrap_err();
        assert!(e.message.contains("4 bytes after"), "{e}");
    }

    #[test]
    fn the_der_is_written_for_mokutil() {
        let ck = test_cert();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("signing.der");
        write_der(ck.cert.der(), &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), ck.cert.der().to_vec());
    }
}
