//! The artifact cache in the cluster owner's object storage: a kernel is
//! compiled once per cluster, every other node downloads the result.
//!
//! Stores: `s3://bucket/prefix` (AWS and S3-compatible stores), `gs://`,
//! `az://container/prefix` and `file:///dir`, through the `object_store`
//! crate. Endpoint and credentials come from the providers' standard
//! environment variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, …), which
//! a mounted Secret can supply; nothing secret is ever logged.
//!
//! Layout under the URL's prefix (see `docs/cache.md`):
//!
//! ```text
//! artifacts/v<format>/<arch>/<kernel>/<driver>/<flavor>/cc-<hash>/
//!     manifest.json                  written last: the entry exists once it exists
//!     artifact-<sha256[..16]>.tar.zst  the build artifact, named by its content
//!     lease.json                     while one builder compiles the key
//! packages/<file>                    driver packages (private mirror)
//! ```
//!
//! The cache never fails a node: an unreachable store, a corrupt entry or a
//! failed upload become a [`CacheOutcome`] and warnings in the result, and
//! the build compiles as it would without a cache.
//!
//! `object_store` is async; this module owns a current-thread tokio runtime
//! and offers a blocking interface, so that the rest of the installer stays
//! synchronous.

mod entry;
mod mirror;
mod session;
mod store;
mod tee;

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use entry::CacheKey;

pub use entry::StoredEntry;
pub(crate) use mirror::fetch_with_mirror;
pub use session::Session;
pub use store::CacheConfig;
pub(crate) use store::{check_entry_flag, check_sha256_flag};

/// The layout and entry format of the cache. Bumped when either changes
/// (the build manifest's own version is part of the key as well), so that
/// old and new installers never read each other's entries.
const FORMAT_VERSION: u32 = 1;

/// Default of `--cache-wait`: how long a builder waits for another one that
/// holds the key's lease (a compile takes 2–5 minutes).
pub(crate) const DEFAULT_WAIT_SECS: u64 = 900;
/// Default of `--cache-lease-ttl`: a lease older than this is taken to be
/// left by a builder that crashed.
pub(crate) const DEFAULT_LEASE_TTL_SECS: u64 = 1800;
/// Default of `--cache-poll-ms`: how often a waiting builder looks again.
pub(crate) const DEFAULT_POLL_MS: u64 = 2000;
/// How long a builder that created the lease waits before checking that
/// the lease still names it (see [`Session::acquire_lease`]). Paid once per
/// compile, which takes minutes.
const LEASE_SETTLE: Duration = Duration::from_millis(1000);

// ------------------------------------------------------------ the document

/// What the cache did for a build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CacheOutcome {
    /// A verified artifact came from the store; nothing was compiled.
    Hit,
    /// The store had no entry for the key: compiled (and stored).
    Miss,
    /// The entry was unreadable, truncated or failed a sha256: compiled
    /// and replaced.
    Corrupt,
    /// The store could not be reached or refused: compiled without it.
    Unavailable,
    /// No `--cache-url`.
    Disabled,
}

/// `status.cache` of a build result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheStatus {
    pub outcome: CacheOutcome,
    /// The store (`--cache-url`, without any user info).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The entry's key: its path under the store's prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Bytes read from the store (manifest and artifact).
    pub bytes_downloaded: u64,
    /// Bytes written to the store (artifact and manifest).
    pub bytes_uploaded: u64,
    /// True when this build's artifact was stored under the key.
    #[serde(default)]
    pub stored: bool,
    /// What happened with the key's lease (held, waited for, taken over).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Why the cache could not help (unreachable, corrupt, not stored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl CacheStatus {
    pub(crate) fn disabled() -> Self {
        CacheStatus {
            outcome: CacheOutcome::Disabled,
            url: None,
            key: None,
            bytes_downloaded: 0,
            bytes_uploaded: 0,
            stored: false,
            lease: None,
            warnings: Vec::new(),
        }
    }

    fn warn(&mut self, w: String) {
        tracing::warn!("cache: {w}");
        self.warnings.push(w);
    }
}
