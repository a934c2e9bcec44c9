//! How to download ([`FetchPolicy`]: retries and backoff, time and size
//! bounds, plain HTTP or not) and what ([`FetchRequest`]: the URLs and the
//! sha256 the bytes must have).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Failure, Result};

/// When and how long to wait between attempts at one URL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt, per URL.
    pub retries: u32,
    /// Wait before the first retry; doubles each time.
    pub initial_backoff: Duration,
    /// Upper bound of any single wait, also of a server's Retry-After.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 4,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Wait before retry number `retry` (1-based): initial × 2^(retry-1),
    /// capped; a server's Retry-After replaces it, within the same cap.
    pub fn backoff(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << retry.saturating_sub(1).min(16));
        retry_after.unwrap_or(exp).min(self.max_backoff)
    }
}

/// The bounds of one download: time per request and per read, time for
/// the whole fetch, and its size.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    /// Longest wait for the response head or for any single read of the body.
    pub read: Duration,
    /// The whole fetch, every source, retry and backoff included: a server
    /// that sends one byte just inside each read timeout still ends.
    pub total: Duration,
    /// The most bytes a download may have; a larger `Content-Length` is
    /// refused before anything is written.
    pub max_bytes: u64,
}

/// 30 minutes: NVIDIA's largest `.run` (about 400 MB) at 250 kB/s.
pub(crate) const DEFAULT_DOWNLOAD_TIMEOUT_SECS: u64 = 1800;

/// 2 GiB: five times NVIDIA's largest `.run`.
pub(crate) const DEFAULT_MAX_DOWNLOAD_MIB: u64 = 2048;

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(30),
            read: Duration::from_secs(60),
            total: Duration::from_secs(DEFAULT_DOWNLOAD_TIMEOUT_SECS),
            max_bytes: DEFAULT_MAX_DOWNLOAD_MIB << 20,
        }
    }
}

/// How to download: the same for every download of a command (retries and
/// backoff, time and size bounds, plain HTTP or not, extra CA certificates,
/// offline, where the verified files are kept). The proxy comes from the
/// environment ([`agent`]); mirrors are a package's ([`PackageRequest`]).
#[derive(Debug, Clone)]
pub struct FetchPolicy {
    /// The package cache: verified files named by their sha256.
    pub cache_dir: PathBuf,
    /// Only the cache: no network at all.
    pub offline: bool,
    pub allow_http: bool,
    pub retry: RetryPolicy,
    pub timeouts: Timeouts,
    /// Extra PEM CA certificates (private mirrors); the bundled web roots
    /// are used otherwise.
    pub ca_bundle: Option<PathBuf>,
    /// Show a progress bar (on a TTY).
    pub progress_bar: bool,
}

/// What to download: where from, in order, and the sha256 the bytes must
/// have (which also names the file in the cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequest {
    /// The package URL first, then mirrors, in order.
    pub urls: Vec<String>,
    /// Lower-case hex sha256.
    pub sha256: String,
}

impl FetchRequest {
    /// One URL, no mirror.
    pub fn new(url: &str, sha256: &str) -> Self {
        FetchRequest {
            urls: vec![url.to_string()],
            sha256: sha256.to_string(),
        }
    }
}

pub(crate) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Refuses plain HTTP unless allowed, and anything that is not HTTP(S).
pub(crate) fn check_url(url: &str, allow_http: bool) -> Result<()> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        Ok(())
    } else if lower.starts_with("http://") {
        if allow_http {
            Ok(())
        } else {
            Err(Error::new(
                Failure::InsecureUrl,
                format!("refusing plain HTTP URL {url}"),
            )
            .with_hint("use an https:// URL or mirror, or pass --allow-http for a trusted network"))
        }
    } else {
        Err(Error::new(
            Failure::InvalidArgument,
            format!("{url} is not an http(s) URL"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = RetryPolicy {
            retries: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(700),
        };
        assert_eq!(p.backoff(1, None), Duration::from_millis(100));
        assert_eq!(p.backoff(2, None), Duration::from_millis(200));
        assert_eq!(p.backoff(3, None), Duration::from_millis(400));
        assert_eq!(p.backoff(4, None), Duration::from_millis(700));
        assert_eq!(p.backoff(40, None), Duration::from_millis(700));
        assert_eq!(
            p.backoff(1, Some(Duration::from_secs(60))),
            Duration::from_millis(700)
        );
        assert_eq!(
            p.backoff(1, Some(Duration::from_millis(5))),
            Duration::from_millis(5)
        );
    }

    #[test]
    fn urls_must_be_https_unless_allowed() {
        assert!(check_url("https://x/y", false).is_ok());
        assert_eq!(
            check_url("http://x/y", false).unwrap_err().reason,
            Reason::InsecureUrl
        );
        assert!(check_url("http://x/y", true).is_ok());
        assert_eq!(
            check_url("ftp://x/y", true).unwrap_err().reason,
            Reason::InvalidArgument
        );
    }
}
