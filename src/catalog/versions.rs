//! Driver and OS versions as the catalog compares them.

/// `"570.195.03"` → 570; `"580"` → 580.
pub(crate) fn branch_of(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// Compares driver versions numerically, part by part.
pub(crate) fn version_key(version: &str) -> Vec<u32> {
    version.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// An OS version matches a catalog version exactly, or as its leading
/// dot-separated parts ("1592" matches "1592.4", not "15920.1").
pub fn version_matches(host: &str, pattern: &str) -> bool {
    host == pattern
        || host
            .strip_prefix(pattern)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// Auto picks the open modules for Turing and newer from this branch on
/// (NVIDIA's default since 560).
pub(crate) const OPEN_BY_DEFAULT_FROM: u32 = 560;
