//! One error type for the whole installer. Its `reason` is the closed
//! [`Reason`] list, which decides the result phase and the exit code.

use std::path::Path;

use crate::report::Reason;

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub reason: Reason,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Error {
            reason,
            message: message.into(),
        }
    }

    /// An I/O error with the action and the path it concerned, e.g.
    /// "opening /host/etc/os-release: No such file or directory".
    pub fn io(reason: Reason, action: &str, path: &Path, err: std::io::Error) -> Self {
        Error::new(reason, format!("{action} {}: {err}", path.display()))
    }

    /// Adds a hint on what to do about it.
    pub fn with_hint(mut self, hint: impl AsRef<str>) -> Self {
        self.message.push_str("; ");
        self.message.push_str(hint.as_ref());
        self
    }
}
