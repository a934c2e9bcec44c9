//! `run`: the Job's entrypoint. detect → resolve → fetch → build → install
//! → verify, stopping at the first step that does not succeed; its outcome
//! is the run's. A node without a GPU is Skipped (NoGpu) right after detect.
//!
//! The build step is not part of this branch's base yet: without
//! `--artifact` the run stops after fetch and says so (InvalidArgument);
//! with `--artifact` (a prebuilt artifact, e.g. from a cluster cache)
//! resolve, fetch and build are skipped.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::host::ModuleFlavor;
use crate::report::{Document, Kind, Outcome, Phase, Reason, ResultDocument};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    pub host_root: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
}

/// One step's result, summarized; the full documents are logged on stderr.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub kind: Kind,
    pub phase: Phase,
    pub reason: Reason,
    pub message: String,
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
    pub steps: Vec<Step>,
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

impl ResultDocument for RunResult {
    fn outcome(&self) -> &Outcome {
        &self.status.outcome
    }
}

/// Collects steps; `push` says whether to go on.
pub struct Steps {
    steps: Vec<Step>,
    installed: Option<Installed>,
}

impl Default for Steps {
    fn default() -> Self {
        Self::new()
    }
}

impl Steps {
    pub fn new() -> Self {
        Steps {
            steps: Vec::new(),
            installed: None,
        }
    }

    /// Records a step's document (also logged whole on stderr) and returns
    /// true when it succeeded.
    pub fn push<T: ResultDocument>(&mut self, kind: Kind, doc: &T) -> bool {
        if let Ok(json) = serde_json::to_string(doc) {
            tracing::info!("{kind:?}: {json}");
        }
        let o = doc.outcome();
        self.steps.push(Step {
            kind,
            phase: o.phase,
            reason: o.reason,
            message: o.message.clone(),
        });
        o.phase == Phase::Succeeded
    }

    /// Records what the install step loaded.
    pub fn set_installed(&mut self, installed: Installed) {
        self.installed = Some(installed);
    }

    /// Ends the run with the last step's outcome (or `outcome` when given).
    pub fn finish(self, spec: RunSpec, outcome: Option<Outcome>) -> RunResult {
        let outcome = outcome.unwrap_or_else(|| {
            self.steps.last().map_or_else(
                || Outcome::new(Reason::Internal, "run had no steps"),
                |s| Outcome::new(s.reason, s.message.clone()),
            )
        });
        Document::new(
            Kind::RunResult,
            spec,
            RunStatus {
                outcome,
                installed: self.installed,
                steps: self.steps,
            },
        )
    }
}
