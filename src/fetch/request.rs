//! What the `fetch` step is asked for: a package URL, its mirrors, and
//! whatever checksum is known, with where it came from.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the expected checksum came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ChecksumSource {
    /// `--sha256`
    Flag,
    /// The catalog's driver entry.
    Catalog,
    /// `<url>.sha256sum` fetched over HTTPS.
    Companion,
    /// NVIDIA's `redistrib_<version>.json` manifest.
    RedistManifest,
}

/// What to fetch: a URL, its file name, and whatever checksum is known.
#[derive(Debug, Clone)]
pub(crate) struct PackageRequest {
    pub url: String,
    pub sha256: Option<(String, ChecksumSource)>,
    /// Mirror prefixes or templates (`{file}`, `{version}`).
    pub mirrors: Vec<String>,
    pub version: Option<String>,
    /// Explicit redistrib manifest URL.
    pub manifest: Option<String>,
}

/// The file name at the end of a URL.
pub(crate) fn file_name_of(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or(path).to_string()
}
