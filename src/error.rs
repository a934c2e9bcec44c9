//! One error type for the whole installer. Its `reason` is a [`Failure`]
//! (the closed list's failures and skips: a success cannot be an error),
//! which decides the result phase and the exit code; its `message` names
//! the path or URL, its `hint` says what to do, and its `source` keeps the
//! lower-level error it came from.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

pub use gpu_driver_contract::reason::{Failure, Reason, Success};

/// What to do about an error, shown after its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint(String);

impl Hint {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The lower-level error an [`Error`] wraps; shared, so that errors stay
/// `Clone` (a step's error is reported and also kept).
type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, Clone)]
pub struct Error {
    pub reason: Failure,
    /// What happened, naming the path or URL (and the source's text).
    pub message: String,
    pub hint: Option<Hint>,
    source: Option<Source>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(reason: Failure, message: impl Into<String>) -> Self {
        Error {
            reason,
            message: message.into(),
            hint: None,
            source: None,
        }
    }

    /// An I/O error with the action and the path it concerned, e.g.
    /// "opening /host/etc/os-release: No such file or directory". A full
    /// disk or quota is `InsufficientDisk` whatever the caller's reason:
    /// the fix is the same (free space there), not a bug report.
    pub fn io(reason: Failure, action: &str, path: &Path, err: std::io::Error) -> Self {
        use std::io::ErrorKind;
        let message = format!("{action} {}: {err}", path.display());
        if matches!(
            err.kind(),
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded
        ) {
            return Error::new(Failure::InsufficientDisk, message)
                .with_source(err)
                .with_hint(format!(
                    "free space on the filesystem of {} (or raise the quota), then retry",
                    path.display()
                ));
        }
        Error::new(reason, message).with_source(err)
    }

    /// Adds a hint on what to do about it (after any hint it has).
    /// [`Error::with_hint`], unless the hint is empty.
    pub(crate) fn with_hint_if(self, hint: &str) -> Self {
        if hint.is_empty() {
            self
        } else {
            self.with_hint(hint)
        }
    }

    pub(crate) fn with_hint(mut self, hint: impl AsRef<str>) -> Self {
        let hint = hint.as_ref();
        self.hint = Some(Hint(match self.hint.take() {
            Some(Hint(first)) => format!("{first}; {hint}"),
            None => hint.to_string(),
        }));
        self
    }

    /// Keeps the lower-level error this one comes from.
    pub(crate) fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Puts what the caller was doing (a URL, a command) before the message;
    /// reason, hint and source stay.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "; {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// Errors are equal when they say the same: the source's text is in the
/// message already.
impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        (self.reason, &self.message, &self.hint) == (other.reason, &other.message, &other.hint)
    }
}

impl Eq for Error {}

/// A failed step's outcome: its reason and the whole text, hint included.
impl From<&Error> for gpu_driver_contract::report::Outcome {
    fn from(err: &Error) -> Self {
        gpu_driver_contract::report::Outcome::new(err.reason, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_full_disk_is_insufficient_disk_whatever_the_caller_said() {
        let p = Path::new("/var/cache/gpu-driver/x.partial");
        for errno in [28 /* ENOSPC */, 122 /* EDQUOT */] {
            let e = Error::io(
                Failure::Internal,
                "writing",
                p,
                std::io::Error::from_raw_os_error(errno),
            );
            assert_eq!(e.reason, Failure::InsufficientDisk, "{e}");
            assert!(
                e.to_string()
                    .starts_with("writing /var/cache/gpu-driver/x.partial: ")
            );
            assert!(e.to_string().contains("free space on the filesystem of"));
        }
        let e = Error::io(
            Failure::Internal,
            "opening",
            p,
            std::io::Error::from_raw_os_error(13 /* EACCES */),
        );
        assert_eq!(e.reason, Failure::Internal);
    }

    #[test]
    fn the_hint_follows_the_message_and_the_source_is_kept() {
        let io = std::io::Error::from_raw_os_error(2 /* ENOENT */);
        let e = Error::io(Failure::HostReadFailed, "opening", Path::new("/x"), io)
            .with_hint("mount the host at /host")
            .with_hint("or pass --host-root")
            .context("reading os-release");
        assert_eq!(
            e.to_string(),
            "reading os-release: opening /x: No such file or directory (os error 2); \
             mount the host at /host; or pass --host-root"
        );
        assert_eq!(
            e.hint.as_ref().map(Hint::as_str),
            Some("mount the host at /host; or pass --host-root")
        );
        let source = e.source().expect("the I/O error is kept");
        assert_eq!(source.to_string(), "No such file or directory (os error 2)");
        assert_eq!(
            gpu_driver_contract::report::Outcome::from(&e).message,
            e.to_string()
        );
    }
}
