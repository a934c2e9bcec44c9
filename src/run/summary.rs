//! The run's result document: each step's outcome collected as the
//! pipeline goes, what was installed and built, and the run's outcome.

use crate::error::Error;
use crate::report::{Document, Kind, Outcome, Phase, Reason, ResultDocument};
use crate::step::Done;

pub use gpu_driver_contract::run::{
    BuiltArtifact, Installed, PrebuildTarget, RunResult, RunSpec, RunStatus, Step,
};

/// Collects steps; `push` says whether to go on.
pub struct Steps {
    steps: Vec<Step>,
    installed: Option<Installed>,
    built: Option<BuiltArtifact>,
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
            built: None,
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
            bytes_downloaded: doc.bytes_downloaded(),
        });
        o.phase == Phase::Succeeded
    }

    /// Records what the install step loaded.
    pub fn set_installed(&mut self, installed: Installed) {
        self.installed = Some(installed);
    }

    /// Records what a prebuild left in the cache.
    pub fn set_built(&mut self, built: BuiltArtifact) {
        self.built = Some(built);
    }

    /// Ends the run with the last step's outcome.
    pub fn finish(self, spec: RunSpec) -> RunResult {
        let outcome = self.steps.last().map_or_else(
            || Outcome::new(Reason::Internal, "run had no steps"),
            |s| Outcome::new(s.reason, s.message.clone()),
        );
        self.end(spec, outcome)
    }

    /// Ends the run with the error that stopped it outside any step.
    pub fn stop(self, spec: RunSpec, error: &Error) -> RunResult {
        self.end(spec, Outcome::from(error))
    }

    /// Ends the run with a success of its own (`prebuild`'s `Built`).
    pub fn succeed(self, spec: RunSpec, done: Done) -> RunResult {
        self.end(spec, done.into())
    }

    fn end(self, spec: RunSpec, outcome: Outcome) -> RunResult {
        Document::new(
            Kind::RunResult,
            spec,
            RunStatus {
                outcome,
                installed: self.installed,
                built: self.built,
                bytes_downloaded: self.steps.iter().map(|s| s.bytes_downloaded).sum(),
                steps: self.steps,
            },
        )
    }
}
