//! The closed list of reasons every result document ends with, the phase
//! each implies and the exit code of its class.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// An apt repository's `InRelease` (or `Release` with `Release.gpg`)
    /// carries no OpenPGP signature that verifies with a trusted key.
    SignatureInvalid,
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
    /// `build --signing-key/--signing-cert`: the key or certificate cannot
    /// be read or parsed, the kernel headers have no `scripts/sign-file`,
    /// or signing a module failed (the message quotes sign-file's stderr).
    SigningFailed,
    /// `run --no-compile`: the artifact cache holds no usable artifact for
    /// the node's key (no entry, a corrupt one, or the store unreachable),
    /// and compiling on the node is not allowed.
    ArtifactNotCached,
    /// `prebuild`: the artifact was built but is not in the cache afterwards
    /// (the store refused or failed the upload, or could not be reached).
    CacheWriteFailed,
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
    /// The host loads only signed modules (Secure Boot, lockdown or
    /// `module.sig_enforce`) and the artifact's modules are not signed;
    /// refused before anything is placed or loaded.
    ModuleSignatureRequired,
    /// The kernel refused a signed module's key (`EKEYREJECTED`): the
    /// certificate is not enrolled (MOK) on the host; the message names its
    /// SHA-256 fingerprint and the enrollment command.
    ModuleKeyRejected,
    /// The kernel refused a module; the message quotes the errno and the
    /// kernel's own log lines.
    ModuleLoadFailed,
    /// The kernel refused to unload a module.
    ModuleUnloadFailed,
    /// Another driver version (or nouveau) is loaded and in use.
    DriverInUse,
    /// Where the driver root's `current` link belongs there is a directory
    /// with files in it, or `/run/nvidia/driver` holds another driver's
    /// files: this installer did not make them; not touched.
    DriverRootOccupied,
    /// `install`: Fabric Manager (NVSwitch systems) could not be placed,
    /// or its systemd service could not be started; the message quotes
    /// systemctl's stderr and the service's log tail.
    FabricManagerFailed,
    /// `verify`: nvidia-smi sees every GPU with the expected driver version.
    Verified,
    /// `catalog-check`: the catalog is consistent (every listed OS release
    /// resolves to a digest-pinned, not excluded default).
    CatalogChecked,
    /// `verify`: nvidia-smi is missing, failed, or disagrees with detect.
    VerifyFailed,
    /// `verify`: the driver root's libcuda could not be loaded, or a CUDA
    /// driver API call (cuInit, context, allocation, copy) failed on a device.
    CudaCheckFailed,
    /// A tool a step ran (make, nvidia-smi, the CUDA check, modprobe,
    /// systemctl, …) did not finish within its deadline, or left a process
    /// holding its output past it; its whole process group was killed.
    TimedOut,
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
    Timeout,
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
        Reason::SignatureInvalid,
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
        Reason::SigningFailed,
        Reason::ArtifactNotCached,
        Reason::CacheWriteFailed,
        Reason::Installed,
        Reason::AlreadyInstalled,
        Reason::Uninstalled,
        Reason::NotRoot,
        Reason::ArtifactInvalid,
        Reason::VermagicMismatch,
        Reason::ModuleSignatureRequired,
        Reason::ModuleKeyRejected,
        Reason::ModuleLoadFailed,
        Reason::ModuleUnloadFailed,
        Reason::DriverInUse,
        Reason::DriverRootOccupied,
        Reason::FabricManagerFailed,
        Reason::Verified,
        Reason::CatalogChecked,
        Reason::VerifyFailed,
        Reason::CudaCheckFailed,
        Reason::TimedOut,
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
            | Reason::Verified
            | Reason::CatalogChecked => ReasonClass::Success,
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
            | Reason::SignatureInvalid
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
            | Reason::BuildFailed
            | Reason::SigningFailed
            | Reason::ArtifactNotCached
            | Reason::CacheWriteFailed => ReasonClass::Build,
            Reason::NotRoot
            | Reason::ArtifactInvalid
            | Reason::VermagicMismatch
            | Reason::ModuleSignatureRequired
            | Reason::ModuleKeyRejected
            | Reason::ModuleLoadFailed
            | Reason::ModuleUnloadFailed
            | Reason::DriverInUse
            | Reason::DriverRootOccupied
            | Reason::FabricManagerFailed => ReasonClass::Install,
            Reason::VerifyFailed | Reason::CudaCheckFailed => ReasonClass::Verify,
            Reason::TimedOut => ReasonClass::Timeout,
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
            Reason::SignatureInvalid => "SignatureInvalid",
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
            Reason::SigningFailed => "SigningFailed",
            Reason::ArtifactNotCached => "ArtifactNotCached",
            Reason::CacheWriteFailed => "CacheWriteFailed",
            Reason::Installed => "Installed",
            Reason::AlreadyInstalled => "AlreadyInstalled",
            Reason::Uninstalled => "Uninstalled",
            Reason::NotRoot => "NotRoot",
            Reason::ArtifactInvalid => "ArtifactInvalid",
            Reason::VermagicMismatch => "VermagicMismatch",
            Reason::ModuleSignatureRequired => "ModuleSignatureRequired",
            Reason::ModuleKeyRejected => "ModuleKeyRejected",
            Reason::ModuleLoadFailed => "ModuleLoadFailed",
            Reason::ModuleUnloadFailed => "ModuleUnloadFailed",
            Reason::DriverInUse => "DriverInUse",
            Reason::DriverRootOccupied => "DriverRootOccupied",
            Reason::FabricManagerFailed => "FabricManagerFailed",
            Reason::Verified => "Verified",
            Reason::CatalogChecked => "CatalogChecked",
            Reason::VerifyFailed => "VerifyFailed",
            Reason::CudaCheckFailed => "CudaCheckFailed",
            Reason::TimedOut => "TimedOut",
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
            ReasonClass::Timeout => 16,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// [`Success`] and [`Failure`]: the two halves of [`Reason`], one variant
/// per reason of that phase, so that a failure (the installer's `Error`)
/// cannot carry a success reason, nor a success outcome a failure's. The
/// match in [`Reason::split`] is exhaustive: a new reason must be put in
/// one half or this does not compile.
macro_rules! reason_halves {
    (success: $($s:ident,)* ; failure: $($f:ident,)*) => {
        /// The reasons a command succeeds with.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Success {
            $($s,)*
        }

        /// The reasons a command stops short of success with: failures and
        /// skips (`NoGpu`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Failure {
            $($f,)*
        }

        impl From<Success> for Reason {
            fn from(s: Success) -> Reason {
                match s {
                    $(Success::$s => Reason::$s,)*
                }
            }
        }

        impl From<Failure> for Reason {
            fn from(f: Failure) -> Reason {
                match f {
                    $(Failure::$f => Reason::$f,)*
                }
            }
        }

        impl Reason {
            /// Which half this reason is in.
            pub fn split(self) -> Result<Success, Failure> {
                match self {
                    $(Reason::$s => Ok(Success::$s),)*
                    $(Reason::$f => Err(Failure::$f),)*
                }
            }
        }
    };
}

reason_halves! {
    success:
        Detected, Resolved, Fetched, Built, Installed, AlreadyInstalled, Uninstalled, Verified,
        CatalogChecked,
    ;
    failure:
        NoGpu, UnsupportedOs, HostReadFailed, InvalidArgument, CatalogInvalid,
        FlavorNotSupported, GpuNotSupported, IncompatibleKernel, DownloadFailed,
        ChecksumMismatch, ChecksumMissing, SignatureInvalid, NotCached, InsecureUrl,
        ArchiveInvalid, UnsafeArchive, KernelHeadersNotFound, KernelHeadersMismatch,
        CompilerMissing, CompilerMismatch, InsufficientDisk, ProcNotMounted, KernelApiMismatch,
        BuildFailed, SigningFailed, ArtifactNotCached, CacheWriteFailed, NotRoot, ArtifactInvalid,
        VermagicMismatch, ModuleSignatureRequired, ModuleKeyRejected, ModuleLoadFailed, ModuleUnloadFailed, DriverInUse,
        DriverRootOccupied, FabricManagerFailed, VerifyFailed, CudaCheckFailed, TimedOut, Internal,
}

impl Failure {
    pub fn phase(self) -> Phase {
        Reason::from(self).phase()
    }

    pub fn exit_code(self) -> u8 {
        Reason::from(self).exit_code()
    }

    pub fn as_str(self) -> &'static str {
        Reason::from(self).as_str()
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<Failure> for Reason {
    fn eq(&self, other: &Failure) -> bool {
        *self == Reason::from(*other)
    }
}

impl PartialEq<Reason> for Failure {
    fn eq(&self, other: &Reason) -> bool {
        Reason::from(*self) == *other
    }
}

#[cfg(test)]
mod halves {
    use super::*;

    #[test]
    fn every_reason_is_in_exactly_the_half_its_phase_says() {
        for r in Reason::ALL {
            match r.split() {
                Ok(s) => {
                    assert_eq!(r.phase(), Phase::Succeeded, "{r}");
                    assert_eq!(Reason::from(s), *r);
                }
                Err(f) => {
                    assert_ne!(r.phase(), Phase::Succeeded, "{r}");
                    assert_eq!(Reason::from(f), *r);
                    assert_eq!(f.exit_code(), r.exit_code());
                }
            }
        }
    }
}
