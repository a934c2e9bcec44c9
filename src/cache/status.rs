//! What the cache did for a build: `status.cache` of its result.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

    pub(super) fn warn(&mut self, w: String) {
        tracing::warn!("cache: {w}");
        self.warnings.push(w);
    }
}
