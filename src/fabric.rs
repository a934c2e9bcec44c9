//! Fabric Manager and nvidia-persistenced: the host daemons some GPUs need
//! beyond the driver, supervised by the host's systemd.
//!
//! On NVSwitch systems (HGX A100/H100/H200) CUDA fails with error 802
//! (`cudaErrorSystemNotReady`) until `nv-fabricmanager` has set up the
//! fabric; nvidia-smi works regardless. Its version must equal the
//! driver's: NVIDIA publishes it as a redistributable archive next to the
//! driver's (`…/redist/fabricmanager/linux-<x86_64|sbsa>/fabricmanager-linux-<x86_64|sbsa>-<version>-archive.tar.xz`,
//! sha256 in `…/redist/redistrib_<version>.json`), holding `bin/`,
//! `etc/fabricmanager.cfg`, `share/nvidia/nvswitch/` (topologies),
//! `systemd/`, `lib/` and `include/` (docs/install.md cites the sources).
//!
//! Its files go into the driver root (`usr/bin/nv-fabricmanager`, …), so
//! the `current` link names the driver and its Fabric Manager at once; the
//! systemd units (written and started by the install module's services)
//! run them from `/var/lib/gpu-driver/drivers/current`.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Failure, Result};
use crate::node::CpuArch;

/// NVIDIA's redistributable driver components.
const REDIST_BASE: &str = "https://developer.download.nvidia.com/compute/nvidia-driver/redist";
/// The driver root the units run from, as the host sees it.
pub(crate) const CURRENT_ROOT: &str = "/var/lib/gpu-driver/drivers/current";
/// Inside the driver root.
pub(crate) const FM_BINARY: &str = "usr/bin/nv-fabricmanager";
pub(crate) const FM_CONFIG: &str = "etc/fabricmanager.cfg";
const TOPOLOGY_DIR: &str = "usr/share/nvidia/nvswitch";
pub(crate) const PERSISTENCED_BINARY: &str = "usr/bin/nvidia-persistenced";

/// NVIDIA's redist platform: the aarch64 server platform is `linux-sbsa`.
fn redist_platform(arch: CpuArch) -> &'static str {
    match arch {
        CpuArch::X86_64 => "linux-x86_64",
        CpuArch::Aarch64 => "linux-sbsa",
    }
}

/// The Fabric Manager archive of driver `version`.
pub(crate) fn archive_url(version: &str, arch: CpuArch) -> String {
    let p = redist_platform(arch);
    format!("{REDIST_BASE}/fabricmanager/{p}/fabricmanager-{p}-{version}-archive.tar.xz")
}

/// The driver version in an archive's file name
/// (`fabricmanager-linux-<platform>-<version>-archive.tar.xz`).
pub(crate) fn archive_version(file_name: &str) -> Option<String> {
    let rest = file_name
        .strip_prefix("fabricmanager-")?
        .strip_suffix("-archive.tar.xz")?;
    let version = rest.rsplit('-').next()?;
    crate::node::is_driver_version(version).then(|| version.to_string())
}

// ------------------------------------------------------------ placement

/// Unpacks the Fabric Manager archive (already sha256-verified by fetch)
/// into the staging driver root `staged` (a real path): `bin/*` →
/// `usr/bin`, `share/nvidia/nvswitch` → `usr/share/nvidia/nvswitch`,
/// `etc/fabricmanager.cfg` → `etc/fabricmanager.cfg` with its topology and
/// database paths moved into the driver root. NVIDIA's own unit, the SDK
/// library and headers are left out: the unit is ours (paths), the SDK
/// serves only virtualized (shared NVSwitch) modes. Returns the placed
/// paths, relative to the root.
pub(crate) fn place_archive(archive: &Path, staged: &Path) -> Result<Vec<String>> {
    let scratch = staged.join(".fabricmanager");
    let _ = fs::remove_dir_all(&scratch);
    let placed = place_from(archive, &scratch, staged);
    let _ = fs::remove_dir_all(&scratch);
    placed
}

fn place_from(archive: &Path, scratch: &Path, staged: &Path) -> Result<Vec<String>> {
    crate::extract::extract_package(archive, scratch).map_err(|e| {
        failed(format!(
            "unpacking the Fabric Manager archive {}: {}",
            archive.display(),
            e
        ))
    })?;
    let top = archive_top(scratch).ok_or_else(|| {
        failed(format!(
            "{} has no bin/nv-fabricmanager (NVIDIA's layout: fabricmanager-linux-<platform>-<version>-archive/bin/nv-fabricmanager)",
            archive.display()
        ))
    })?;
    let mut placed = Vec::new();
    let bin = staged.join("usr/bin");
    mkdir(&bin)?;
    for entry in read_dir(&top.join("bin"))? {
        let name = entry.file_name();
        move_into(&entry.path(), &bin.join(&name))?;
        placed.push(format!("usr/bin/{}", name.to_string_lossy()));
    }
    let topo = top.join("share/nvidia/nvswitch");
    if topo.is_dir() {
        let dest = staged.join(TOPOLOGY_DIR);
        mkdir(dest.parent().unwrap_or(staged))?;
        move_into(&topo, &dest)?;
        placed.push(TOPOLOGY_DIR.to_string());
    }
    let cfg = top.join("etc/fabricmanager.cfg");
    if let Ok(text) = fs::read_to_string(&cfg) {
        mkdir(&staged.join("etc"))?;
        let dest = staged.join(FM_CONFIG);
        fs::write(&dest, adjust_config(&text, CURRENT_ROOT))
            .map_err(|e| Error::io(Failure::FabricManagerFailed, "writing", &dest, e))?;
        placed.push(FM_CONFIG.to_string());
    }
    Ok(placed)
}

/// The directory holding `bin/nv-fabricmanager`: the archive's one top
/// directory, or the extraction directory itself.
fn archive_top(scratch: &Path) -> Option<PathBuf> {
    let has = |d: &Path| d.join("bin/nv-fabricmanager").is_file();
    if has(scratch) {
        return Some(scratch.to_path_buf());
    }
    fs::read_dir(scratch)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.is_dir() && has(p))
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    let mut v: Vec<fs::DirEntry> = fs::read_dir(dir)
        .map_err(|e| Error::io(Failure::FabricManagerFailed, "reading", dir, e))?
        .filter_map(std::result::Result::ok)
        .collect();
    v.sort_by_key(fs::DirEntry::file_name);
    Ok(v)
}

fn mkdir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| Error::io(Failure::FabricManagerFailed, "creating", dir, e))
}

fn move_into(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).map_err(|e| {
        Error::io(
            Failure::FabricManagerFailed,
            &format!("moving {} to", from.display()),
            to,
            e,
        )
    })
}

fn failed(message: String) -> Error {
    Error::new(Failure::FabricManagerFailed, message)
}

/// `fabricmanager.cfg` with the keys that name the topology files
/// (`TOPOLOGY_FILE_PATH`, and `DATABASE_PATH` where the release has it)
/// pointed into `root` when they name NVIDIA's default
/// `/usr/share/nvidia/nvswitch`; every other line is kept as shipped
/// (`KEY=VALUE`, `#` comments), so NVIDIA's defaults (log file, daemon
/// mode, fabric mode) stay.
fn adjust_config(text: &str, root: &str) -> String {
    let mut out = String::with_capacity(text.len() + 128);
    for line in text.lines() {
        match line.split_once('=') {
            Some((key, value))
                if matches!(key.trim(), "TOPOLOGY_FILE_PATH" | "DATABASE_PATH")
                    && value.trim().starts_with("/usr/share/nvidia/nvswitch") =>
            {
                out.push_str(&format!("{}={root}{}", key.trim(), value.trim()));
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// A `KEY=VALUE` of `fabricmanager.cfg` (the last one wins, as in FM's own
/// reading); `None` when absent or empty.
pub(crate) fn config_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
        .next_back()
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_urls_follow_nvidias_redist_layout() {
        assert_eq!(
            archive_url("580.95.05", CpuArch::X86_64),
            "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-580.95.05-archive.tar.xz"
        );
        assert_eq!(
            archive_url("580.95.05", CpuArch::Aarch64),
            "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-sbsa/fabricmanager-linux-sbsa-580.95.05-archive.tar.xz"
        );
        assert_eq!(
            archive_version("fabricmanager-linux-sbsa-580.95.05-archive.tar.xz").as_deref(),
            Some("580.95.05")
        );
        assert_eq!(
            archive_version("fabricmanager-linux-x86_64-x-archive.tar.xz"),
            None
        );
        assert_eq!(archive_version("NVIDIA-Linux-x86_64-580.95.05.run"), None);
    }

    #[test]
    fn the_config_keeps_nvidias_defaults_and_finds_topologies_in_the_root() {
        let shipped = "# comment\nLOG_LEVEL=4\nLOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=1\nTOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch\nDATABASE_PATH=/usr/share/nvidia/nvswitch\nSTATE_FILE_NAME=/tmp/fabricmanager.state\n";
        let got = adjust_config(shipped, CURRENT_ROOT);
        assert_eq!(
            got,
            "# comment\nLOG_LEVEL=4\nLOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=1\nTOPOLOGY_FILE_PATH=/var/lib/gpu-driver/drivers/current/usr/share/nvidia/nvswitch\nDATABASE_PATH=/var/lib/gpu-driver/drivers/current/usr/share/nvidia/nvswitch\nSTATE_FILE_NAME=/tmp/fabricmanager.state\n"
        );
        // A path an administrator chose elsewhere is theirs.
        assert_eq!(
            adjust_config("TOPOLOGY_FILE_PATH=/opt/topo\n", CURRENT_ROOT),
            "TOPOLOGY_FILE_PATH=/opt/topo\n"
        );
        assert_eq!(
            config_value(shipped, "LOG_FILE_NAME").as_deref(),
            Some("/var/log/fabricmanager.log")
        );
        assert_eq!(config_value("LOG_FILE_NAME=\n", "LOG_FILE_NAME"), None);
        assert_eq!(config_value("#LOG_FILE_NAME=/x\n", "LOG_FILE_NAME"), None);
    }
}
