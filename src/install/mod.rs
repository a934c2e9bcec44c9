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
mod options;
mod roots;
mod services;
mod steps;

use crate::error::Error;
use crate::step::{self, StepStatus, Stopped};

pub use documents::{
    Action, FabricManagerState, InstallResult, InstallSpec, InstallStatus, ModuleAction,
    ModuleState, ServiceState, UserSpace,
};
pub use gpu_driver_contract::layout::DRIVERS_DIR;
pub use options::{FabricManagerArchive, InstallOptions, UninstallOptions};
pub(crate) use services::{HostTool, exec_host_tool};

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
