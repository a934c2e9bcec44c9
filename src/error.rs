//! One error type for the whole installer. Its `reason` is the closed
//! [`Reason`] list, which decides the result phase and the exit code.

use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// "opening /host/etc/os-release: No such file or directory". A full
    /// disk or quota is `InsufficientDisk` whatever the caller's reason:
    /// the fix is the same (free space there), not a bug report.
    pub fn io(reason: Reason, action: &str, path: &Path, err: std::io::Error) -> Self {
        use std::io::ErrorKind;
        if matches!(
            err.kind(),
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded
        ) {
            return Error::new(
                Reason::InsufficientDisk,
                format!("{action} {}: {err}", path.display()),
            )
            .with_hint(format!(
                "free space on the filesystem of {} (or raise the quota), then retry",
                path.display()
            ));
        }
        Error::new(reason, format!("{action} {}: {err}", path.display()))
    }

    /// Adds a hint on what to do about it.
    pub fn with_hint(mut self, hint: impl AsRef<str>) -> Self {
        self.message.push_str("; ");
        self.message.push_str(hint.as_ref());
        self
    }
}

pub use gpu_driver_contract::reason::{Phase, Reason, ReasonClass};

/// A failed step's outcome: its reason and the whole message.
impl From<&Error> for gpu_driver_contract::report::Outcome {
    fn from(err: &Error) -> Self {
        gpu_driver_contract::report::Outcome::new(err.reason, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_insufficient_disk_whatever_the_caller_said() {
        let p = Path::new("/var/cache/gpu-driver/x.partial");
        for errno in [28 /* ENOSPC */, 122 /* EDQUOT */] {
            let e = Error::io(
                Reason::Internal,
                "writing",
                p,
                std::io::Error::from_raw_os_error(errno),
            );
            assert_eq!(e.reason, Reason::InsufficientDisk, "{e}");
            assert!(
                e.message
                    .starts_with("writing /var/cache/gpu-driver/x.partial: ")
            );
            assert!(e.message.contains("free space on the filesystem of"));
        }
        let e = Error::io(
            Reason::Internal,
            "opening",
            p,
            std::io::Error::from_raw_os_error(13 /* EACCES */),
        );
        assert_eq!(e.reason, Reason::Internal);
    }
}
