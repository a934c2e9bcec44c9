//! One attempt's vocabulary, shared by the download loop and the body
//! streamer: the fetch's deadline and the failure of an attempt, retryable
//! or not.

use std::time::{Duration, Instant};

use crate::error::{Error, Failure};

/// When a fetch must have ended.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    at: Instant,
    total: Duration,
}

impl Deadline {
    pub(super) fn new(total: Duration) -> Self {
        Deadline {
            at: Instant::now() + total,
            total,
        }
    }

    pub(super) fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    pub(super) fn left(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    pub(super) fn error(&self, url: &str, got: u64) -> Error {
        Error::new(
            Failure::DownloadFailed,
            format!(
                "{url}: the download deadline of {} s passed after {got} bytes",
                self.total.as_secs()
            ),
        )
        .with_hint("raise --download-timeout for a slow network, or add a closer --mirror")
    }
}

/// An attempt's failure, and whether another attempt at the URL may help.
pub(super) struct Transient {
    pub(super) error: Error,
    pub(super) retryable: bool,
    pub(super) retry_after: Option<Duration>,
}

pub(super) fn transient(msg: String, retryable: bool) -> Transient {
    Transient {
        error: Error::new(Failure::DownloadFailed, msg),
        retryable,
        retry_after: None,
    }
}

/// A local failure: retrying the URL would not help.
pub(super) fn fatal(error: Error) -> Transient {
    Transient {
        error,
        retryable: false,
        retry_after: None,
    }
}

/// A download over `--max-download-size`.
pub(super) fn too_large(url: &str, what: &str, max: u64) -> Error {
    Error::new(
        Failure::UnsafeArchive,
        format!(
            "{url} {what}, more than the {} MiB a download may have; nothing of it was kept",
            max >> 20
        ),
    )
    .with_hint("a real driver package is under 1 GiB; check the URL, or raise --max-download-size")
}
