//! Bounds on what one extraction may write: the process's (`--max-unpacked-size`)
//! or explicit ones.

/// Bounds on what one extraction may write, so that a small hostile
/// archive (a sparse-file or compression bomb) cannot fill the disk or
/// exhaust the inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of file contents in the whole tree.
    pub max_bytes: u64,
    /// Files, directories and links in the whole tree.
    pub max_entries: u64,
}

/// NVIDIA's largest `.run` (x86_64, with its user space) unpacks to about
/// 1 GiB and 2,000 entries; kernel headers to about 100 MiB and 25,000
/// entries. The defaults leave room for several times that.
pub(crate) const DEFAULT_LIMITS: Limits = Limits {
    max_bytes: 8 << 30,
    max_entries: 500_000,
};

static LIMITS: std::sync::OnceLock<Limits> = std::sync::OnceLock::new();

/// Sets the limits for this process (`--max-unpacked-size`), once, before
/// any extraction; later calls are ignored.
pub(crate) fn set_limits(limits: Limits) {
    let _ = LIMITS.set(limits);
}

pub(super) fn limits() -> Limits {
    LIMITS.get().copied().unwrap_or(DEFAULT_LIMITS)
}
