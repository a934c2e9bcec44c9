//! Delivery of a command's output: stdout or `--output`, the termination
//! log, and the exit code of the document's reason.

use std::io::Write;
use std::path::Path;

use serde::Serialize;

use super::args::GlobalArgs;
use crate::error::{Error, Failure, Result};
use crate::report::{self, Kind, ResultDocument};

/// Prints (or writes) the document, copies it to the termination log, logs
/// the outcome on stderr and returns the exit code of its reason.
pub(super) fn deliver<T: ResultDocument + Serialize>(
    g: &GlobalArgs,
    kind: Kind,
    doc: &T,
) -> Result<u8> {
    let outcome = doc.outcome();
    match outcome.reason.phase() {
        report::Phase::Failed => tracing::error!("{}: {}", outcome.reason, outcome.message),
        _ => tracing::info!("{}: {}", outcome.reason, outcome.message),
    }
    emit_raw(g, &report::to_json(doc)?)?;
    let message = report::termination_message(kind, doc)?;
    if let Err(e) = report::write_termination_log(&g.termination_log, &message) {
        tracing::warn!("termination log not written: {e}");
    }
    Ok(outcome.reason.exit_code())
}

pub(super) fn emit_raw(g: &GlobalArgs, text: &str) -> Result<()> {
    match &g.output {
        Some(path) => {
            crate::publish::write_atomic(path, text.as_bytes(), 0o644, Failure::InvalidArgument)
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| Error::io(Failure::Internal, "writing", Path::new("<stdout>"), e))
        }
    }
}
