//! The kernel headers' own `scripts/sign-file`: the tool the kernel's
//! build signs its modules with, so the format (appended PKCS#7, the
//! hash the kernel expects) is the kernel's by construction.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Failure, Result};

/// sign-file and the hash algorithm to sign with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SignFile {
    pub path: PathBuf,
    /// `CONFIG_MODULE_SIG_HASH` (`sha256` on Debian's kernels).
    pub hash: String,
}

impl SignFile {
    /// `sign-file <hash> <key> <cert> <module>`: signs `module` in place.
    pub(crate) fn sign(&self, key: &Path, cert: &Path, module: &Path) -> Result<()> {
        let mut cmd = crate::process::command(&self.path);
        cmd.arg(&self.hash).arg(key).arg(cert).arg(module);
        let out = crate::process::output(&mut cmd, Failure::SigningFailed)?;
        if !out.status.success() {
            return Err(
                crate::process::exit_error(&cmd, &out, Failure::SigningFailed).with_hint(
                    "check that --signing-key is the private key of --signing-cert (PEM, not encrypted)",
                ),
            );
        }
        Ok(())
    }
}

/// The headers' sign-file (`scripts/sign-file` in the arch directory, else
/// in the common one) with the kernel's hash algorithm.
pub(crate) fn find_sign_file(arch_dir: &Path, common_dir: &Path) -> Result<SignFile> {
    let found = [arch_dir, common_dir]
        .iter()
        .map(|d| d.join("scripts/sign-file"))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        });
    let Some(path) = found else {
        return Err(Error::new(
            Failure::SigningFailed,
            format!(
                "the kernel headers at {} have no executable scripts/sign-file to sign modules with",
                arch_dir.display()
            ),
        )
        .with_hint("install the headers with their kbuild tools (Debian: linux-kbuild-<version>, which linux-headers-<release> depends on)"));
    };
    Ok(SignFile {
        path,
        hash: module_sig_hash(arch_dir)?,
    })
}

/// `CONFIG_MODULE_SIG_HASH` from the headers' configuration; `sha256`
/// (the kernel's default since 4.x) when it is not set.
pub(crate) fn module_sig_hash(arch_dir: &Path) -> Result<String> {
    let hash = crate::headers::read_config_value(arch_dir, parse_module_sig_hash)?;
    Ok(hash.unwrap_or_else(|| "sha256".to_string()))
}

/// The hash name, if it is one sign-file takes (a plain lowercase name).
pub(crate) fn parse_module_sig_hash(config: &str) -> Option<String> {
    crate::headers::parse_kconfig_string(config, "CONFIG_MODULE_SIG_HASH").filter(|h| {
        !h.is_empty()
            && h.len() <= 16
            && h.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_comes_from_the_kernel_config() {
        let debian =
            "CONFIG_MODULE_SIG=y\nCONFIG_MODULE_SIG_SHA256=y\nCONFIG_MODULE_SIG_HASH=\"sha256\"\n";
        assert_eq!(parse_module_sig_hash(debian).as_deref(), Some("sha256"));
        assert_eq!(
            parse_module_sig_hash("CONFIG_MODULE_SIG_HASH=\"sha512\"").as_deref(),
            Some("sha512")
        );
        assert_eq!(
            parse_module_sig_hash("CONFIG_MODULE_SIG_HASH=\"sh a;\""),
            None
        );
        assert_eq!(
            parse_module_sig_hash("# CONFIG_MODULE_SIG is not set"),
            None
        );
    }
}
