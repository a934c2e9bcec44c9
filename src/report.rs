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

pub use crate::error::{Phase, Reason, ReasonClass};

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
}

/// Pretty JSON with a trailing newline, as printed on stdout; credentials
/// in any URL masked ([`crate::redact`]).
pub fn to_json<T: Serialize>(doc: &T) -> Result<String> {
    let s = serde_json::to_string_pretty(doc)
        .map_err(|e| Error::new(crate::Reason::Internal, format!("serializing result: {e}")))?;
    let mut s = crate::redact::text(&s).into_owned();
    s.push('\n');
    Ok(s)
}

/// The compact copy for `/dev/termination-log`: the whole document if it fits
/// in Kubernetes' 4096 bytes, else only apiVersion, kind and the outcome, with
/// the message shortened until it fits.
pub fn termination_message<T: ResultDocument>(kind: Kind, doc: &T) -> Result<String> {
    let full = serde_json::to_string(doc)
        .map_err(|e| Error::new(crate::Reason::Internal, format!("serializing result: {e}")))?;
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
