//! The one versioned result schema: every command prints exactly one of these
//! documents on stdout (or to `--output`), and the same reasons and exit codes
//! are used everywhere.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group and version of every result document.
pub const API_VERSION: &str = "gpu-driver.gardenlinux.io/v1alpha1";

/// Kubernetes truncates a container's termination message at 4096 bytes.
pub const TERMINATION_LOG_LIMIT: usize = 4096;

pub use crate::reason::{Failure, Phase, Reason, ReasonClass, Success};

/// `phase`, `reason` and `message`: flattened into every `status`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub phase: Phase,
    pub reason: Reason,
    pub message: String,
}

impl Outcome {
    pub fn new(reason: impl Into<Reason>, message: impl Into<String>) -> Self {
        let reason = reason.into();
        Outcome {
            phase: reason.phase(),
            reason,
            message: message.into(),
        }
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
    CatalogCheck,
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
    /// Bytes this step received over the network (0 for steps that
    /// download nothing).
    fn bytes_downloaded(&self) -> u64 {
        0
    }
}

/// A document's `status`, which carries its outcome: every
/// `Document<Spec, Status>` of such a status is a [`ResultDocument`].
pub trait StatusOutcome {
    fn outcome(&self) -> &Outcome;
    /// See [`ResultDocument::bytes_downloaded`].
    fn bytes_downloaded(&self) -> u64 {
        0
    }
}

impl<Spec: Serialize, Status: StatusOutcome + Serialize> ResultDocument for Document<Spec, Status> {
    fn outcome(&self) -> &Outcome {
        self.status.outcome()
    }
    fn bytes_downloaded(&self) -> u64 {
        self.status.bytes_downloaded()
    }
}

/// The compact copy for `/dev/termination-log`: the whole document if it fits
/// in Kubernetes' 4096 bytes, else only apiVersion, kind and the outcome, with
/// the message shortened until it fits.
pub fn termination_message<T: ResultDocument>(kind: Kind, doc: &T) -> serde_json::Result<String> {
    let full = serde_json::to_string(doc)?;
    let full = crate::redact::text(&full).into_owned();
    if full.len() <= TERMINATION_LOG_LIMIT {
        return Ok(full);
    }
    let outcome = doc.outcome();
    // What the operator acts on besides the outcome survives the cut: the
    // installed driver (`run`) and the stored artifact's digest (`prebuild`).
    let value: serde_json::Value = serde_json::from_str(&full).unwrap_or_default();
    let kept: Vec<(&str, serde_json::Value)> = ["installed", "built"]
        .into_iter()
        .filter_map(|k| Some((k, value.pointer(&format!("/status/{k}"))?.clone())))
        .collect();
    let compact = |message: &str| {
        let mut c = serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": kind,
            "truncated": true,
            "status": { "phase": outcome.phase, "reason": outcome.reason, "message": message },
        });
        for (k, v) in &kept {
            c["status"][*k] = v.clone();
        }
        c.to_string()
    };
    // Escaping makes the JSON longer than the text by a varying amount, so
    // binary-search the longest prefix (cut on a char boundary) that fits.
    let redacted = crate::redact::text(&outcome.message);
    let text = redacted.as_ref();
    let prefix = |n: usize| crate::text::prefix(text, n);
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
}
