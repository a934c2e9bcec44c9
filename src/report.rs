//! The installer's side of the result documents ([`gpu_driver_contract::report`]):
//! printing them and the termination log.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Failure, Result};

pub use gpu_driver_contract::report::{
    API_VERSION, Document, Kind, Metadata, Outcome, Phase, Reason, ReasonClass, ResultDocument,
    StatusOutcome, TERMINATION_LOG_LIMIT,
};

/// Pretty JSON with a trailing newline, as printed on stdout; credentials
/// in any URL masked ([`crate::redact`]).
pub(crate) fn to_json<T: Serialize>(doc: &T) -> Result<String> {
    let s = serde_json::to_string_pretty(doc)
        .map_err(|e| Error::new(Failure::Internal, format!("serializing result: {e}")))?;
    let mut s = crate::redact::text(&s).into_owned();
    s.push('\n');
    Ok(s)
}

/// [`gpu_driver_contract::report::termination_message`], its failure an `Internal` error.
pub fn termination_message<T: ResultDocument>(kind: Kind, doc: &T) -> Result<String> {
    gpu_driver_contract::report::termination_message(kind, doc)
        .map_err(|e| Error::new(Failure::Internal, format!("serializing result: {e}")))
}

/// Writes the termination message only when the file already exists and is
/// writable: Kubernetes creates it; anywhere else we must not create files.
pub(crate) fn write_termination_log(path: &Path, message: &str) -> Result<bool> {
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
        Err(e) => return Err(Error::io(Failure::Internal, "opening", path, e)),
    };
    file.write_all(message.as_bytes())
        .map_err(|e| Error::io(Failure::Internal, "writing", path, e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

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
