//! What an install or uninstall is asked to do, and the failure reason
//! every step gives its own (not the host's) files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Failure, Result};
use crate::host_root::HostRoot;

/// The reason of a failure on this machine's own files (not the host's).
pub(super) const LOCAL_IO: Failure = Failure::Internal;

pub struct InstallOptions<'a> {
    pub root: &'a HostRoot,
    pub artifact: PathBuf,
    pub kernel_release: Option<String>,
    pub module_params: Option<PathBuf>,
    /// Parameters the plan sets (catalog `moduleParams`), by module; the
    /// `--module-params` file's come after them.
    pub planned_params: BTreeMap<String, String>,
    /// Switch the GPUs' IOMMU groups to passthrough before loading (the
    /// plan's `iommuPassthrough`).
    pub iommu_passthrough: bool,
    pub drm: bool,
    pub peermem: bool,
    pub force: bool,
    /// Fabric Manager to place into the driver root and run as a service.
    pub fabric_manager: Option<FabricManagerArchive>,
    /// Run the driver root's nvidia-persistenced as a service.
    pub persistenced: bool,
}

pub struct UninstallOptions<'a> {
    pub root: &'a HostRoot,
    /// Module names; empty: NVIDIA's stack.
    pub modules: Vec<String>,
    pub force: bool,
}

/// Fabric Manager's archive, fetched and verified by `run`.
#[derive(Debug, Clone)]
pub struct FabricManagerArchive {
    pub path: PathBuf,
    pub sha256: String,
    pub version: String,
}

impl FabricManagerArchive {
    /// A local archive (`install --fabric-manager`): its version from
    /// NVIDIA's file name, its sha256 from its bytes (the caller vouches
    /// for the file, as for `--artifact`).
    pub fn local(path: &Path) -> Result<Self> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let version = crate::fabric::archive_version(&name).ok_or_else(|| {
            Error::new(
                Failure::FabricManagerFailed,
                format!(
                    "{}: not named like NVIDIA's archive fabricmanager-linux-<platform>-<version>-archive.tar.xz",
                    path.display()
                ),
            )
        })?;
        let (sha256, _) = crate::digest::sha256_file(path, Failure::FabricManagerFailed)?;
        Ok(FabricManagerArchive {
            path: path.to_path_buf(),
            sha256,
            version,
        })
    }
}
