//! Where the installer leaves a driver on the host: what the exporter, NVIDIA's
//! container toolkit and the operator's Jobs rely on.

/// The versioned driver roots, relative to the host root; `current` links
/// to the one in use.
pub const DRIVERS_DIR: &str = "/var/lib/gpu-driver/drivers";

/// Libraries, inside the artifact and the driver root: Debian's multiarch
/// directory, which the container toolkit searches in a driver root.
pub fn lib_dir() -> String {
    format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH)
}
