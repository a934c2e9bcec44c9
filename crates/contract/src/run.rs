//! The `RunResult`: what the Job's `run` (and `prebuild`) did, step by
//! step, and what it left installed or stored. The operator reads it from
//! the Job's termination message.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::node::{CpuArch, ModuleFlavor};
use crate::report::{Document, Kind, Outcome, Phase, Reason, StatusOutcome};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    pub host_root: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// `prebuild`'s target, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<PrebuildTarget>,
}

/// The node a `prebuild` builds for: what such a node's os-release says
/// (`gardenlinux` `1877.3`, `debian` `12`), its kernel and architecture.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrebuildTarget {
    pub os_id: String,
    pub os_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<CpuArch>,
}

/// One step's result, summarized; the full documents are logged on stderr.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub kind: Kind,
    pub phase: Phase,
    pub reason: Reason,
    pub message: String,
    /// Bytes the step received over the network (a fetch's package, a
    /// build's cache objects); absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_downloaded: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    #[serde(flatten)]
    pub outcome: Outcome,
    /// What the install step loaded, when it succeeded: the operator writes
    /// these onto the node without parsing step messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed: Option<Installed>,
    /// What `prebuild` left in the artifact cache, when it succeeded: the
    /// operator passes `artifactSha256` to the install Jobs
    /// (`--artifact-sha256`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub built: Option<BuiltArtifact>,
    pub steps: Vec<Step>,
    /// The steps' `bytesDownloaded` summed: on a node whose artifact is
    /// cached, the artifact's size and nothing else.
    #[serde(default)]
    pub bytes_downloaded: u64,
}

impl RunStatus {
    /// A status with this outcome and nothing else (no steps, nothing
    /// installed or built).
    pub fn new(outcome: Outcome) -> Self {
        RunStatus {
            outcome,
            installed: None,
            built: None,
            steps: Vec::new(),
            bytes_downloaded: 0,
        }
    }
}

/// An artifact in the cache, as `prebuild` stored (or found) it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuiltArtifact {
    pub driver_version: String,
    pub flavor: ModuleFlavor,
    pub kernel_release: String,
    /// The modules' architecture (`x86_64`, `aarch64`).
    pub arch: CpuArch,
    /// The entry's path in the store, under the cache URL's prefix.
    pub cache_key: String,
    /// The sha256 of the stored artifact, as the entry's manifest records
    /// it.
    pub artifact_sha256: String,
}

/// The driver now in the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Installed {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flavor: Option<ModuleFlavor>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
}

pub type RunResult = Document<RunSpec, RunStatus>;

impl StatusOutcome for RunStatus {
    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}
