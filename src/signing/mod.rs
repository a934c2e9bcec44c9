//! Module signing for hosts that load only signed modules (UEFI Secure
//! Boot, lockdown): a build signs every `.ko` with the owner's key, as the
//! kernel's own `scripts/sign-file` does (appended PKCS#7,
//! `~Module signature appended~`), and install checks for the signature
//! before anything is loaded. See `docs/secure-boot.md`.
//!
//! The private key is only ever a path handed to sign-file: never read,
//! copied, logged or packaged here.

mod cert;
mod modsig;
mod sign;

use std::path::{Path, PathBuf};

pub(crate) use cert::{read_certificate, write_der};
pub(crate) use modsig::is_signed_file;
pub(crate) use sign::{SignFile, find_sign_file};

use crate::error::{Error, Failure, Result};
use crate::node::Signer;

/// `--signing-key` and `--signing-cert`: files, as a Kubernetes Secret
/// mounts them (`tls.key`, `tls.crt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningFiles {
    pub key: PathBuf,
    pub cert: PathBuf,
}

/// Everything a build needs to sign, checked before the compile: the
/// certificate parsed, the key present, sign-file found, the hash known.
#[derive(Debug, Clone)]
pub(crate) struct Signing {
    pub files: SigningFiles,
    pub signer: Signer,
    pub sign_file: SignFile,
}

impl Signing {
    /// Checks the files and finds the headers' sign-file (`arch_dir`,
    /// then `common_dir`).
    pub(crate) fn prepare(
        files: &SigningFiles,
        arch_dir: &Path,
        common_dir: &Path,
    ) -> Result<Signing> {
        let (_, signer) = read_certificate(&files.cert)?;
        check_key_file(&files.key)?;
        let sign_file = find_sign_file(arch_dir, common_dir)?;
        Ok(Signing {
            files: files.clone(),
            signer,
            sign_file,
        })
    }

    /// Signs `module` in place and checks the signature is there.
    pub(crate) fn sign(&self, module: &Path) -> Result<()> {
        self.sign_file
            .sign(&self.files.key, &self.files.cert, module)?;
        if !is_signed_file(module, Failure::SigningFailed)? {
            return Err(Error::new(
                Failure::SigningFailed,
                format!(
                    "{} succeeded but {} carries no module signature",
                    self.sign_file.path.display(),
                    module.display()
                ),
            ));
        }
        Ok(())
    }
}

/// The key must be a readable regular file. Its content is sign-file's
/// business: this process never reads it.
fn check_key_file(key: &Path) -> Result<()> {
    let meta = std::fs::metadata(key).map_err(|e| {
        Error::io(Failure::SigningFailed, "inspecting the signing key", key, e)
            .with_hint("--signing-key names the PEM private key (a tls Secret's tls.key)")
    })?;
    if !meta.is_file() {
        return Err(Error::new(
            Failure::SigningFailed,
            format!("the signing key {} is not a regular file", key.display()),
        ));
    }
    std::fs::File::open(key)
        .map_err(|e| Error::io(Failure::SigningFailed, "opening the signing key", key, e))?;
    Ok(())
}
