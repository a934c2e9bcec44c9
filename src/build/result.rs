//! The `build` step's result document.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::node::{CpuArch, ModuleFlavor};
use crate::report::{Document, Kind, Outcome, Reason, StatusOutcome};
use crate::step::StepStatus;

/// Seconds rounded to a tenth, for [`Timings`].
pub(super) fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildSpec {
    /// The package: a `.run`, a module-source tarball or a directory.
    pub source: String,
    pub kernel_release: String,
    /// `--headers` as given; absent when they were looked up on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<String>,
    pub flavor: ModuleFlavor,
    pub out_dir: String,
    pub work_dir: String,
    pub jobs: usize,
    /// `--driver-version` as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// `--arch` as given: the architecture to build for. Absent: the
    /// headers' (their `.config`), else the builder's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<CpuArch>,
    pub host_root: String,
}

/// The kernel headers used: the release-specific (arch) directory and the
/// common tree it builds on (the same directory for a full tree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeadersUsed {
    /// Passed to make as `SYSOUT`.
    pub arch_dir: String,
    /// Passed to make as `SYSSRC`.
    pub common_dir: String,
    /// `UTS_RELEASE` (or `kernel.release`) of the headers.
    pub release: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompilerUsed {
    /// The command passed to make as `CC`.
    pub command: String,
    /// The first line of `<command> --version`.
    pub version: String,
    /// The kernel's `CONFIG_CC_VERSION_TEXT`, when the headers carry it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_version_text: Option<String>,
    /// A cross build's `CROSS_COMPILE` (`aarch64-linux-gnu-`): the prefix
    /// of the compiler, linker and strip used. Absent for a native build.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cross_compile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuiltModule {
    /// The module name as the kernel knows it (`nvidia_uvm`).
    pub name: String,
    /// The file in the artifact (`modules/nvidia-uvm.ko`).
    pub file: String,
    pub vermagic: String,
    /// Size after stripping debug info.
    pub size_bytes: u64,
    pub sha256: String,
}

/// Wall-clock seconds of each step that ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extract_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package_seconds: Option<f64>,
    /// Time spent with the artifact cache: lookup, waiting for another
    /// builder, download and verification, upload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatus {
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The CPU architecture the modules are built for (known once the
    /// headers were read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<CpuArch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<HeadersUsed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compiler: Option<CompilerUsed>,
    /// The packaged `.tar.zst` (modules, firmware, manifest.json).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<BuiltModule>,
    /// GSP firmware files packaged (`firmware/gsp_*.bin`); empty when the
    /// source has none (Debian's module-source tarballs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub firmware: Vec<String>,
    /// NVIDIA's user space packaged from the `.run`'s `.manifest`
    /// (`usr/bin/nvidia-smi`, `usr/lib/<triplet>/libcuda.so.*`, …); empty
    /// when the source has none (Debian's module-source tarballs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_space: Vec<String>,
    /// The full compile log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// On a failed compile: the log around the first errors (at most 40
    /// lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_excerpt: Option<String>,
    /// Who signed the modules (`--signing-key/--signing-cert`): the
    /// certificate's subject and SHA-256 fingerprint; absent when unsigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<crate::node::Signer>,
    pub timings: Timings,
    /// What the artifact cache did (`--cache-url`); `Disabled` without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::CacheStatus>,
}

pub type BuildResult = Document<BuildSpec, BuildStatus>;

impl StatusOutcome for BuildStatus {
    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
    fn bytes_downloaded(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.bytes_downloaded)
    }
}

impl StepStatus for BuildStatus {
    const KIND: Kind = Kind::BuildResult;
    fn unfinished() -> Self {
        BuildStatus {
            outcome: Outcome::new(Reason::Internal, "build did not finish"),
            driver_version: None,
            arch: None,
            headers: None,
            compiler: None,
            artifact: None,
            artifact_sha256: None,
            modules: Vec::new(),
            firmware: Vec::new(),
            user_space: Vec::new(),
            log: None,
            log_excerpt: None,
            signer: None,
            timings: Timings::default(),
            cache: None,
        }
    }
    fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}
