//! An entry of the cache: its key, its `manifest.json`, and reading and
//! verifying both with the artifact they name.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::status::CacheStatus;
use super::store::{Downloaded, Store, unavailable};
use crate::artifact::{MANIFEST_VERSION, Manifest};
use crate::error::{Error, Failure, Result};
use crate::node::{CpuArch, ModuleFlavor};

/// The layout and entry format of the cache. Bumped when either changes
/// (the build manifest's own version is part of the key as well), so that
/// old and new installers never read each other's entries.
const FORMAT_VERSION: u32 = 1;

/// Everything that makes two artifacts interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheKey {
    pub arch: String,
    pub kernel_release: String,
    pub driver_version: String,
    pub flavor: ModuleFlavor,
    /// The builder's identity: the first line of `<cc> --version`.
    pub compiler: String,
    /// `<cache format>.<manifest version>`.
    pub format: String,
    /// The SHA-256 of the certificate the modules are signed with (`build
    /// --signing-cert`); empty when unsigned, and then absent, so that
    /// unsigned entries keep the key (and the path) they always had.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signer: String,
}

impl CacheKey {
    /// `arch` is the modules' architecture (a cross build's target, not
    /// the builder's).
    pub fn new(
        arch: CpuArch,
        kernel_release: &str,
        driver_version: &str,
        flavor: ModuleFlavor,
        compiler: &str,
    ) -> Self {
        CacheKey {
            arch: arch.nvidia_name().to_string(),
            kernel_release: kernel_release.to_string(),
            driver_version: driver_version.to_string(),
            flavor,
            compiler: compiler.to_string(),
            format: format!("{FORMAT_VERSION}.{MANIFEST_VERSION}"),
            signer: String::new(),
        }
    }

    /// The key of the same build signed by `signer` (`None`: unsigned). A
    /// signed and an unsigned artifact never share an entry.
    pub fn signed_by(self, signer: Option<&crate::node::Signer>) -> Self {
        CacheKey {
            signer: signer.map(|s| s.sha256.clone()).unwrap_or_default(),
            ..self
        }
    }

    /// The same target: everything but the compiler and the signer. An
    /// entry a build Job named (`--cache-entry`) was built with that Job's
    /// image's compiler and signed with its Secret's key, neither of which
    /// an install Job has or needs (install checks the signature itself
    /// where the host requires one).
    pub(crate) fn same_target(&self, other: &CacheKey) -> bool {
        self.arch == other.arch
            && self.kernel_release == other.kernel_release
            && self.driver_version == other.driver_version
            && self.flavor == other.flavor
            && self.format == other.format
    }

    /// The entry's directory under the store's prefix. The compiler string
    /// (spaces, parentheses) is hashed; the entry's manifest holds it whole.
    /// A signed build's directory ends in its certificate's fingerprint
    /// (`cc-…-signer-<16 hex>`), an unsigned one's as it always has.
    pub fn path(&self) -> String {
        let cc = hex::encode(Sha256::digest(self.compiler.as_bytes()));
        let signer = match self.signer.get(..16) {
            Some(fp) => format!("-signer-{fp}"),
            None => String::new(),
        };
        format!(
            "artifacts/v{}/{}/{}/{}/{}/cc-{}{signer}",
            self.format,
            self.arch,
            self.kernel_release,
            self.driver_version,
            self.flavor,
            &cc[..16]
        )
    }
}

/// `manifest.json` of an entry: the key, the artifact object and its
/// sha256, and the build manifest with the sha256 of every file inside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredEntry {
    pub key: CacheKey,
    /// Object name of the artifact, relative to the entry's directory.
    pub artifact: String,
    pub artifact_sha256: String,
    pub artifact_size_bytes: u64,
    pub stored_at: String,
    pub stored_by: String,
    pub manifest: Manifest,
}

/// What reading an entry found.
pub(super) enum Found {
    Hit(Box<StoredEntry>),
    Miss,
    /// The entry is broken (`ArtifactInvalid`): compile and replace it.
    Corrupt(Error),
    /// A complete entry whose artifact sha256 is not `--artifact-sha256`:
    /// the sha256 it has.
    Unexpected(String),
    /// The store could not be read: compile without it.
    Unavailable(Error),
}

impl Found {
    fn corrupt(why: String) -> Found {
        Found::Corrupt(Error::new(Failure::ArtifactInvalid, why))
    }
}

/// What an entry's key must be.
#[derive(Clone, Copy)]
pub(super) enum Wanted<'a> {
    /// Exactly this key: a lookup by the key computed here.
    Key(&'a CacheKey),
    /// This target, whatever compiler built it: an entry a build Job named.
    Target(&'a CacheKey),
}

impl Wanted<'_> {
    fn accepts(&self, key: &CacheKey) -> bool {
        match self {
            Wanted::Key(k) => *k == key,
            Wanted::Target(k) => k.same_target(key),
        }
    }
}

/// Reads and verifies the entry; on success the artifact is at `artifact`.
pub(super) fn read_entry(
    store: &Store,
    key: Wanted<'_>,
    dir: &str,
    artifact: &Path,
    expected_sha256: Option<&str>,
    status: &mut CacheStatus,
) -> Found {
    let manifest = match store.get(
        &format!("{dir}/manifest.json"),
        crate::artifact::MANIFEST.max,
    ) {
        Ok(Some((bytes, _))) => bytes,
        Ok(None) => return Found::Miss,
        Err(e) => return Found::Unavailable(unavailable(&e)),
    };
    status.bytes_downloaded += manifest.len() as u64;
    let entry: StoredEntry = match serde_json::from_slice(&manifest) {
        Ok(e) => e,
        Err(e) => {
            return Found::corrupt(format!(
                "manifest.json ({} bytes) is not a valid entry: {e}",
                manifest.len()
            ));
        }
    };
    if !key.accepts(&entry.key) {
        return Found::corrupt(format!(
            "manifest.json is for another key ({:?})",
            entry.key
        ));
    }
    if entry.artifact.contains('/') || !entry.artifact.ends_with(".tar.zst") {
        return Found::corrupt(format!("manifest.json names artifact {:?}", entry.artifact));
    }
    // Refused before the download: the artifact is checked against the
    // manifest's sha256 below, so the manifest's must be the expected one.
    if let Some(expected) = expected_sha256 {
        if !entry.artifact_sha256.eq_ignore_ascii_case(expected) {
            return Found::Unexpected(entry.artifact_sha256);
        }
    }
    if entry.artifact_size_bytes > MAX_ARTIFACT_BYTES {
        return Found::corrupt(format!(
            "{} claims {} bytes, more than an artifact may have",
            entry.artifact, entry.artifact_size_bytes
        ));
    }
    let parent = match artifact.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Err(e) = check_entry_modules(&entry) {
        return Found::Corrupt(e);
    }
    let rel = format!("{dir}/{}", entry.artifact);
    // Checked as it streams in (every file inside against the build
    // manifest, on a thread of its own): the file is read once.
    let inner = entry.manifest.clone();
    let check: super::tee::StreamCheck =
        Box::new(move |r| crate::artifact::check_reader(r, &inner));
    let got = match store.get_to_file(&rel, parent, entry.artifact_size_bytes, Some(check)) {
        Ok(Some(d)) => d,
        Ok(None) => return Found::corrupt(format!("{} is missing", entry.artifact)),
        Err(e) if e.reason == Failure::ArtifactInvalid => return Found::Corrupt(e),
        Err(e) => return Found::Unavailable(e),
    };
    status.bytes_downloaded += got.size;
    let file = match verify_artifact(got, &entry) {
        Ok(f) => f,
        Err(e) => return Found::Corrupt(e),
    };
    match place(file, artifact) {
        Ok(()) => Found::Hit(Box::new(entry)),
        Err(e) => Found::Unavailable(e),
    }
}

/// The verified download, readable by all, renamed to `artifact`.
fn place(file: tempfile::NamedTempFile, artifact: &Path) -> Result<()> {
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    std::fs::set_permissions(file.path(), mode).map_err(|e| {
        Error::io(
            Failure::DownloadFailed,
            "setting permissions of",
            file.path(),
            e,
        )
    })?;
    file.persist(artifact)
        .map_err(|e| Error::io(Failure::DownloadFailed, "renaming into", artifact, e.error))?;
    Ok(())
}

/// The largest artifact a cache entry may name (modules and user space of
/// one driver are a few hundred MiB).
const MAX_ARTIFACT_BYTES: u64 = 4 << 30;

/// The modules the entry lists, against its key: refused before the
/// download.
fn check_entry_modules(entry: &StoredEntry) -> Result<()> {
    let corrupt = |m: String| Error::new(Failure::ArtifactInvalid, m);
    if !entry
        .manifest
        .modules
        .iter()
        .any(|m| m.file == "modules/nvidia.ko")
    {
        return Err(corrupt("the manifest lists no modules/nvidia.ko".into()));
    }
    for m in &entry.manifest.modules {
        if m.vermagic.split_whitespace().next() != Some(entry.key.kernel_release.as_str()) {
            return Err(corrupt(format!(
                "{} has vermagic {:?}, not for kernel {}",
                m.file, m.vermagic, entry.key.kernel_release
            )));
        }
    }
    Ok(())
}

/// The artifact's size and sha256 against the entry, then the result of
/// the check that read it as it came (every file inside against the build
/// manifest): no second read of the file.
fn verify_artifact(got: Downloaded, entry: &StoredEntry) -> Result<tempfile::NamedTempFile> {
    let corrupt = |m: String| Error::new(Failure::ArtifactInvalid, m);
    if got.size != entry.artifact_size_bytes {
        return Err(corrupt(format!(
            "{} is truncated or padded: {} bytes, the manifest says {}",
            entry.artifact, got.size, entry.artifact_size_bytes
        )));
    }
    if got.sha256 != entry.artifact_sha256 {
        return Err(corrupt(format!(
            "{} has sha256 {}, the manifest says {}",
            entry.artifact, got.sha256, entry.artifact_sha256
        )));
    }
    match got.checked {
        Some(Ok(())) => Ok(got.file),
        Some(Err(e)) => Err(e),
        None => Err(Error::new(
            Failure::Internal,
            "the artifact was downloaded unchecked".to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_path_covers_every_part() {
        let k = CacheKey::new(
            CpuArch::X86_64,
            "6.1.0-50-cloud-amd64",
            "535.261.03",
            ModuleFlavor::Open,
            "gcc (Debian 12.2.0-14) 12.2.0",
        );
        let p = k.path();
        assert!(p.starts_with(&format!("artifacts/v{FORMAT_VERSION}.{MANIFEST_VERSION}/")));
        assert!(p.contains("/x86_64/"), "{p}");
        assert!(p.contains("/6.1.0-50-cloud-amd64/535.261.03/open/cc-"));
        let other_cc = CacheKey::new(
            CpuArch::X86_64,
            "6.1.0-50-cloud-amd64",
            "535.261.03",
            ModuleFlavor::Open,
            "gcc (Debian 12.2.0-14+deb12u1) 12.2.0",
        );
        assert_ne!(p, other_cc.path());
        let other_flavor = CacheKey::new(
            CpuArch::X86_64,
            "6.1.0-50-cloud-amd64",
            "535.261.03",
            ModuleFlavor::Proprietary,
            "gcc (Debian 12.2.0-14) 12.2.0",
        );
        assert_ne!(p, other_flavor.path());
        // A cross build's modules are keyed by their architecture.
        let arm = CacheKey::new(
            CpuArch::Aarch64,
            "6.1.0-50-cloud-amd64",
            "535.261.03",
            ModuleFlavor::Open,
            "gcc (Debian 12.2.0-14) 12.2.0",
        );
        assert!(arm.path().contains("/aarch64/"), "{}", arm.path());
    }

    #[test]
    fn a_signed_build_has_its_own_key_and_entry() {
        let unsigned = CacheKey::new(
            CpuArch::X86_64,
            "6.1.0-50-cloud-amd64",
            "535.261.03",
            ModuleFlavor::Open,
            "gcc (Debian 12.2.0-14) 12.2.0",
        );
        let signer = |fp: &str| crate::node::Signer {
            subject: "CN=owner".into(),
            sha256: fp.repeat(64),
        };
        let signed = unsigned.clone().signed_by(Some(&signer("a")));
        let other = unsigned.clone().signed_by(Some(&signer("b")));
        assert_ne!(unsigned, signed);
        assert_ne!(signed, other);
        assert!(
            signed.path().ends_with(&format!(
                "/cc-{}-signer-aaaaaaaaaaaaaaaa",
                &hex::encode(Sha256::digest(b"gcc (Debian 12.2.0-14) 12.2.0"))[..16]
            )),
            "{}",
            signed.path()
        );
        assert_ne!(signed.path(), other.path());
        // Unsigned keys and paths are what they were before signing existed:
        // the signer is not even serialized.
        assert_eq!(unsigned.clone().signed_by(None), unsigned);
        assert!(!serde_json::to_string(&unsigned).unwrap().contains("signer"));
        assert!(!unsigned.path().contains("signer"));
        // An install Job reads the entry its build Job named whoever signed it.
        assert!(unsigned.same_target(&signed));
    }
}
