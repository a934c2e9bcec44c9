//! `install` and `uninstall`: put a build artifact's modules into the running
//! kernel, safely.
//!
//! Order of events for `install` (one function each, in the order of
//! `steps::install`):
//!
//! 1. preflight: root (`NotRoot`); the host lock
//!    `<host-root>/run/gpu-driver/install.lock` (flock) so two installers
//!    never race;
//! 2. unpack: the artifact (a `.tar.zst`/`.tar*` or a directory holding
//!    `manifest.json`, `modules/*.ko`, optional `firmware/`) is unpacked into
//!    a staging directory beside the driver roots and every file's sha256 is
//!    checked against the manifest (`ArtifactInvalid`);
//! 3. check vermagic: every module's vermagic (read from its `.modinfo` in
//!    Rust) must name the running kernel release, else `VermagicMismatch` —
//!    before anything is loaded or placed;
//! 4. select: `--drm`, `--peermem`, and the load order;
//! 5. find conflicts in `/proc/modules`: the same version already loaded →
//!    left alone (`AlreadyInstalled` when all are); another version (or
//!    nouveau) loaded and unused → unloaded in reverse dependency order; in
//!    use → `DriverInUse` unless `--force`, naming the processes and pods
//!    that hold `/dev/nvidia*` open (from `<host-root>/proc/*/fd`);
//! 6. place root: the staging directory is renamed to the versioned driver
//!    root `<host-root>/var/lib/gpu-driver/drivers/<version>-<flavor>-<release>-<hash>`;
//! 7. firmware path, then load: `finit_module` in dependency order (nvidia,
//!    nvidia-uvm, nvidia-modeset, nvidia-drm, nvidia-peermem with
//!    `--peermem`), with parameters from `--module-params`. A refusal reads
//!    the kernel's log records written since the attempt from `/dev/kmsg`
//!    and quotes them; modules loaded earlier in the same run are unloaded
//!    again, so a failed install leaves the kernel as it found it;
//! 8. device nodes from `/proc/devices`, then the `current` symlink is
//!    switched by rename and the user space registered.
//!
//! Every write under the host root (lock, staging, renames, links, device
//! nodes, `ld.so.conf.d`, removals) goes through [`crate::confined_fs`], which
//! resolves paths inside the root: a link such as `var/lib -> /elsewhere`
//! in the host root never leads a write outside it.
//!
//! The parts: `steps` (the named steps and their order), `kmod`
//! (load, unload, their order, the kernel log of a refusal), `holders`
//! (which processes and pods hold the driver open, for `DriverInUse`), `roots`
//! (the versioned driver roots: staging, the `current` switch, garbage
//! collection), `devices` (device nodes from `/proc/devices`, sysfs
//! writes), `services` (the daemons' systemd units, systemctl and
//! journalctl in the host's namespace) and `documents` (the result
//! document).

mod devices;
mod documents;
mod holders;
mod kmod;
mod roots;
mod services;
mod steps;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Failure, Result};
use crate::host_root::HostRoot;
use crate::step::{self, StepStatus, Stopped};

pub use documents::{Action, InstallResult};

pub use documents::{InstallSpec, InstallStatus};

pub use documents::{FabricManagerState, ModuleState, ServiceState, UserSpace};

pub use documents::ModuleAction;
pub use gpu_driver_contract::layout::DRIVERS_DIR;
pub(crate) use services::{HostTool, exec_host_tool};

/// The host lock every installer takes before touching modules.
const LOCK_PATH: &str = "/run/gpu-driver/install.lock";

/// The reason of a failure on this machine's own files (not the host's).
const LOCAL_IO: Failure = Failure::Internal;

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

/// Installs the artifact `opts` names; the result says what happened,
/// failures included.
pub fn install(opts: &InstallOptions) -> InstallResult {
    step::document(
        documents::install_spec(opts),
        step::attempt(InstallStatus::unfinished(), |st| steps::install(opts, st)),
    )
}

/// An install refused before it began (e.g. an unreadable
/// `--fabric-manager` archive).
pub(crate) fn install_refused(opts: &InstallOptions, e: Error) -> InstallResult {
    step::document(documents::install_spec(opts), Err(Stopped::at_start(e)))
}

/// Unloads the driver's modules; the result says what happened.
pub fn uninstall(opts: &UninstallOptions) -> InstallResult {
    step::document(
        documents::uninstall_spec(opts),
        step::attempt(InstallStatus::unfinished(), |st| steps::uninstall(opts, st)),
    )
}

/// Loading and unloading modules needs root: refused up front, before
/// the lock or anything else is touched.
fn check_root() -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(Error::new(
            Failure::NotRoot,
            format!(
                "loading kernel modules needs root (effective uid is {})",
                nix::unistd::geteuid()
            ),
        )
        .with_hint("run as root: sudo, nsenter from a privileged pod, or a privileged container"))
    }
}
