//! The one versioned result schema: every command prints exactly one of these
//! documents on stdout (or to `--output`), and the same reasons and exit codes
//! are used everywhere.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// API group and version of every result document.
pub const API_VERSION: &str = "gpu-driver.gardenlinux.io/v1alpha1";

/// Kubernetes truncates a container's termination message at 4096 bytes.
pub const TERMINATION_LOG_LIMIT: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    Succeeded,
    Failed,
    Skipped,
}

/// The closed list of reasons. Each reason belongs to exactly one phase and
/// one exit code; `docs/results.md` documents them and a test keeps the two
/// in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Reason {
    /// `detect` found a supported OS and at least one NVIDIA GPU.
    Detected,
    /// `resolve` produced an install plan.
    Resolved,
    /// The node has no NVIDIA GPU: nothing to do.
    NoGpu,
    /// The OS (or OS version) is detectable but not installable.
    UnsupportedOs,
    /// A host file could not be read or parsed.
    HostReadFailed,
    /// A command-line value is malformed or contradictory.
    InvalidArgument,
    /// The catalog file could not be read or is invalid.
    CatalogInvalid,
    /// The requested module flavor cannot drive the node's GPUs.
    FlavorNotSupported,
    /// The chosen driver branch does not support a GPU on the node.
    GpuNotSupported,
    /// The catalog lists this driver/kernel pair as known not to work.
    IncompatibleKernel,
    /// `fetch`: the package is on disk with a verified checksum.
    Fetched,
    /// The package could not be downloaded from any URL or mirror.
    DownloadFailed,
    /// The downloaded bytes do not have the expected sha256; they were deleted.
    ChecksumMismatch,
    /// No trusted checksum is known for the package.
    ChecksumMissing,
    /// `--offline` and the package is not in the cache.
    NotCached,
    /// A plain `http://` URL without `--allow-http`.
    InsecureUrl,
    /// A package or archive is malformed, truncated, or fails its own checksums.
    ArchiveInvalid,
    /// An archive entry would escape the target directory (absolute path,
    /// `..`, or a link pointing outside).
    UnsafeArchive,
    /// `build`: modules compiled, stripped and packaged for the kernel.
    Built,
    /// No kernel headers for the release: not installed, not given, and no
    /// `linux-headers-<release>` package in the OS's repository.
    KernelHeadersNotFound,
    /// Headers present but for another release, or incomplete.
    KernelHeadersMismatch,
    /// No C compiler (or make) in the build environment.
    CompilerMissing,
    /// The compiler differs from the one the kernel was built with
    /// (`CONFIG_CC_VERSION_TEXT`).
    CompilerMismatch,
    /// Not enough free disk space for the build, or a write that found the
    /// disk or quota full.
    InsufficientDisk,
    /// `/proc` is not mounted in the build environment (NVIDIA's conftest
    /// silently misbehaves without it).
    ProcNotMounted,
    /// The compile failed with errors typical of a kernel API change
    /// (too few arguments, implicit declaration, missing member, …).
    KernelApiMismatch,
    /// The compile failed for another reason; the log excerpt says why.
    BuildFailed,
    /// `install`: the artifact's modules are loaded and the driver root is
    /// in place.
    Installed,
    /// `install`: the same driver version is already loaded; nothing was
    /// reloaded.
    AlreadyInstalled,
    /// `uninstall`: the modules are unloaded (or were not loaded).
    Uninstalled,
    /// `install`/`uninstall` needs root (CAP_SYS_MODULE).
    NotRoot,
    /// The artifact is malformed: no manifest, a file missing, a sha256
    /// that differs from the manifest's, a module without `.modinfo`.
    ArtifactInvalid,
    /// A module's vermagic names another kernel release than the running
    /// one; refused before anything is loaded.
    VermagicMismatch,
    /// The kernel refused a module; the message quotes the errno and the
    /// kernel's own log lines.
    ModuleLoadFailed,
    /// The kernel refused to unload a module.
    ModuleUnloadFailed,
    /// Another driver version (or nouveau) is loaded and in use.
    DriverInUse,
    /// `verify`: nvidia-smi sees every GPU with the expected driver version.
    Verified,
    /// `verify`: nvidia-smi is missing, failed, or disagrees with detect.
    VerifyFailed,
    /// A bug: something that should not happen did.
    Internal,
}

/// What a reason says about where things went wrong; each class has one exit
/// code so that scripts can branch without parsing JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonClass {
    Success,
    Skip,
    Internal,
    Usage,
    Host,
    Resolve,
    Fetch,
    Build,
    Install,
    Verify,
}

impl Reason {
    pub const ALL: &'static [Reason] = &[
        Reason::Detected,
        Reason::Resolved,
        Reason::NoGpu,
        Reason::UnsupportedOs,
        Reason::HostReadFailed,
        Reason::InvalidArgument,
        Reason::CatalogInvalid,
        Reason::FlavorNotSupported,
        Reason::GpuNotSupported,
        Reason::IncompatibleKernel,
        Reason::Fetched,
        Reason::DownloadFailed,
        Reason::ChecksumMismatch,
        Reason::ChecksumMissing,
        Reason::NotCached,
        Reason::InsecureUrl,
        Reason::ArchiveInvalid,
        Reason::UnsafeArchive,
        Reason::Built,
        Reason::KernelHeadersNotFound,
        Reason::KernelHeadersMismatch,
        Reason::CompilerMissing,
        Reason::CompilerMismatch,
        Reason::InsufficientDisk,
        Reason::ProcNotMounted,
        Reason::KernelApiMismatch,
        Reason::BuildFailed,
        Reason::Installed,
        Reason::AlreadyInstalled,
        Reason::Uninstalled,
        Reason::NotRoot,
        Reason::ArtifactInvalid,
        Reason::VermagicMismatch,
        Reason::ModuleLoadFailed,
        Reason::ModuleUnloadFailed,
        Reason::DriverInUse,
        Reason::Verified,
        Reason::VerifyFailed,
        Reason::Internal,
    ];

    pub fn class(self) -> ReasonClass {
        match self {
            Reason::Detected
            | Reason::Resolved
            | Reason::Fetched
            | Reason::Built
            | Reason::Installed
            | Reason::AlreadyInstalled
            | Reason::Uninstalled
            | Reason::Verified => ReasonClass::Success,
            Reason::NoGpu => ReasonClass::Skip,
            Reason::Internal => ReasonClass::Internal,
            Reason::InvalidArgument | Reason::CatalogInvalid => ReasonClass::Usage,
            Reason::UnsupportedOs | Reason::HostReadFailed => ReasonClass::Host,
            Reason::FlavorNotSupported | Reason::GpuNotSupported | Reason::IncompatibleKernel => {
                ReasonClass::Resolve
            }
            Reason::DownloadFailed
            | Reason::ChecksumMismatch
            | Reason::ChecksumMissing
            | Reason::NotCached
            | Reason::InsecureUrl
            | Reason::ArchiveInvalid
            | Reason::UnsafeArchive => ReasonClass::Fetch,
            Reason::KernelHeadersNotFound
            | Reason::KernelHeadersMismatch
            | Reason::CompilerMissing
            | Reason::CompilerMismatch
            | Reason::InsufficientDisk
            | Reason::ProcNotMounted
            | Reason::KernelApiMismatch
            | Reason::BuildFailed => ReasonClass::Build,
            Reason::NotRoot
            | Reason::ArtifactInvalid
            | Reason::VermagicMismatch
            | Reason::ModuleLoadFailed
            | Reason::ModuleUnloadFailed
            | Reason::DriverInUse => ReasonClass::Install,
            Reason::VerifyFailed => ReasonClass::Verify,
        }
    }

    pub fn phase(self) -> Phase {
        match self.class() {
            ReasonClass::Success => Phase::Succeeded,
            ReasonClass::Skip => Phase::Skipped,
            _ => Phase::Failed,
        }
    }

    pub fn exit_code(self) -> u8 {
        self.class().exit_code()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Detected => "Detected",
            Reason::Resolved => "Resolved",
            Reason::NoGpu => "NoGpu",
            Reason::UnsupportedOs => "UnsupportedOs",
            Reason::HostReadFailed => "HostReadFailed",
            Reason::InvalidArgument => "InvalidArgument",
            Reason::CatalogInvalid => "CatalogInvalid",
            Reason::FlavorNotSupported => "FlavorNotSupported",
            Reason::GpuNotSupported => "GpuNotSupported",
            Reason::IncompatibleKernel => "IncompatibleKernel",
            Reason::Fetched => "Fetched",
            Reason::DownloadFailed => "DownloadFailed",
            Reason::ChecksumMismatch => "ChecksumMismatch",
            Reason::ChecksumMissing => "ChecksumMissing",
            Reason::NotCached => "NotCached",
            Reason::InsecureUrl => "InsecureUrl",
            Reason::ArchiveInvalid => "ArchiveInvalid",
            Reason::UnsafeArchive => "UnsafeArchive",
            Reason::Built => "Built",
            Reason::KernelHeadersNotFound => "KernelHeadersNotFound",
            Reason::KernelHeadersMismatch => "KernelHeadersMismatch",
            Reason::CompilerMissing => "CompilerMissing",
            Reason::CompilerMismatch => "CompilerMismatch",
            Reason::InsufficientDisk => "InsufficientDisk",
            Reason::ProcNotMounted => "ProcNotMounted",
            Reason::KernelApiMismatch => "KernelApiMismatch",
            Reason::BuildFailed => "BuildFailed",
            Reason::Installed => "Installed",
            Reason::AlreadyInstalled => "AlreadyInstalled",
            Reason::Uninstalled => "Uninstalled",
            Reason::NotRoot => "NotRoot",
            Reason::ArtifactInvalid => "ArtifactInvalid",
            Reason::VermagicMismatch => "VermagicMismatch",
            Reason::ModuleLoadFailed => "ModuleLoadFailed",
            Reason::ModuleUnloadFailed => "ModuleUnloadFailed",
            Reason::DriverInUse => "DriverInUse",
            Reason::Verified => "Verified",
            Reason::VerifyFailed => "VerifyFailed",
            Reason::Internal => "Internal",
        }
    }
}

impl ReasonClass {
    /// 2 is left to clap's own usage errors (unparseable command lines).
    pub fn exit_code(self) -> u8 {
        match self {
            ReasonClass::Success => 0,
            ReasonClass::Internal => 1,
            ReasonClass::Skip => 3,
            ReasonClass::Usage => 4,
            ReasonClass::Host => 10,
            ReasonClass::Resolve => 11,
            ReasonClass::Fetch => 12,
            ReasonClass::Build => 13,
            ReasonClass::Install => 14,
            ReasonClass::Verify => 15,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `phase`, `reason` and `message`: flattened into every `status`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub phase: Phase,
    pub reason: Reason,
    pub message: String,
}

impl Outcome {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Outcome {
            phase: reason.phase(),
            reason,
            message: message.into(),
        }
    }

    pub fn from_error(err: &Error) -> Self {
        Outcome::new(err.reason, err.to_string())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Kind {
    HostReport,
    InstallPlan,
    FetchResult,
    BuildResult,
    InstallResult,
    VerifyResult,
    RunResult,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// `gpu-driver-installer <version>` that wrote the document.
    pub generator: String,
}

impl Default for Metadata {
    fn default() -> Self {
        Metadata {
            generator: format!("gpu-driver-installer {}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// A Kubernetes-style result document.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "{Status}Document")]
pub struct Document<Spec, Status> {
    pub api_version: String,
    pub kind: Kind,
    pub metadata: Metadata,
    pub spec: Spec,
    pub status: Status,
}

impl<Spec, Status> Document<Spec, Status> {
    pub fn new(kind: Kind, spec: Spec, status: Status) -> Self {
        Document {
            api_version: API_VERSION.to_string(),
            kind,
            metadata: Metadata::default(),
            spec,
            status,
        }
    }
}

/// Anything that ends a command as a result document.
pub trait ResultDocument: Serialize {
    fn outcome(&self) -> &Outcome;
}

/// Pretty JSON with a trailing newline, as printed on stdout.
pub fn to_json<T: Serialize>(doc: &T) -> Result<String> {
    let mut s = serde_json::to_string_pretty(doc)
        .map_err(|e| Error::new(crate::Reason::Internal, format!("serializing result: {e}")))?;
    s.push('\n');
    Ok(s)
}

/// The compact copy for `/dev/termination-log`: the whole document if it fits
/// in Kubernetes' 4096 bytes, else only apiVersion, kind and the outcome, with
/// the message shortened until it fits.
pub fn termination_message<T: ResultDocument>(kind: Kind, doc: &T) -> Result<String> {
    let full = serde_json::to_string(doc)
        .map_err(|e| Error::new(crate::Reason::Internal, format!("serializing result: {e}")))?;
    if full.len() <= TERMINATION_LOG_LIMIT {
        return Ok(full);
    }
    let outcome = doc.outcome();
    let compact = |message: &str| {
        serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": kind,
            "truncated": true,
            "status": { "phase": outcome.phase, "reason": outcome.reason, "message": message },
        })
        .to_string()
    };
    // Escaping makes the JSON longer than the text by a varying amount, so
    // binary-search the longest prefix (cut on a char boundary) that fits.
    let text = outcome.message.as_str();
    let prefix = |mut n: usize| {
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        &text[..n]
    };
    let (mut lo, mut hi) = (0usize, text.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if compact(prefix(mid)).len() <= TERMINATION_LOG_LIMIT {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(compact(prefix(lo)))
}

/// Writes the termination message only when the file already exists and is
/// writable: Kubernetes creates it; anywhere else we must not create files.
pub fn write_termination_log(path: &Path, message: &str) -> Result<bool> {
    let mut file = match OpenOptions::new().write(true).truncate(true).open(path) {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
            ) || e.raw_os_error() == Some(nix::libc::EROFS) =>
        {
            return Ok(false);
        }
        Err(e) => return Err(Error::io(crate::Reason::Internal, "opening", path, e)),
    };
    file.write_all(message.as_bytes())
        .map_err(|e| Error::io(crate::Reason::Internal, "writing", path, e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Doc {
        status: Outcome,
        blob: String,
    }
    impl ResultDocument for Doc {
        fn outcome(&self) -> &Outcome {
            &self.status
        }
    }

    #[test]
    fn every_reason_has_one_phase_and_code() {
        for r in Reason::ALL {
            let code = r.exit_code();
            match r.phase() {
                Phase::Succeeded => assert_eq!(code, 0, "{r}"),
                Phase::Skipped => assert_eq!(code, 3, "{r}"),
                Phase::Failed => assert!(code == 1 || code >= 4, "{r}: {code}"),
            }
            // The serde name is the documented CamelCase word.
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }

    #[test]
    fn termination_message_fits_the_kubernetes_limit() {
        let doc = Doc {
            status: Outcome::new(Reason::HostReadFailed, "é\"".repeat(5000)),
            blob: "x".repeat(10_000),
        };
        let msg = termination_message(Kind::HostReport, &doc).unwrap();
        assert!(msg.len() <= TERMINATION_LOG_LIMIT, "{}", msg.len());
        let v: serde_json::Value = serde_json::from_str(&msg).unwrap();
        assert_eq!(v["status"]["reason"], "HostReadFailed");
        assert_eq!(v["truncated"], true);
        let m = v["status"]["message"].as_str().unwrap();
        assert!(m.starts_with("é\""), "{m:?}");
    }

    #[test]
    fn small_documents_are_copied_whole() {
        let doc = Doc {
            status: Outcome::new(Reason::NoGpu, "none"),
            blob: "small".into(),
        };
        let msg = termination_message(Kind::HostReport, &doc).unwrap();
        assert_eq!(msg, serde_json::to_string(&doc).unwrap());
    }

    #[test]
    fn termination_log_is_never_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("termination-log");
        assert!(!write_termination_log(&path, "x").unwrap());
        assert!(!path.exists());
        std::fs::write(&path, "old content that is longer").unwrap();
        assert!(write_termination_log(&path, "new").unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
    }
}
