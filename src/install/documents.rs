//! The install result document (`InstallResult`): what was asked
//! (`InstallSpec`) and what happened (`InstallStatus`), and its building
//! blocks. Other processes read it; its JSON does not change.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::options::{InstallOptions, UninstallOptions};
use crate::node::ModuleFlavor;
use crate::report::{Document, Kind, Outcome, Reason, StatusOutcome};
use crate::step::StepStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    Install,
    Uninstall,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstallSpec {
    pub action: Action,
    pub host_root: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    /// `--kernel-release`, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_release_override: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module_params: Option<String>,
    /// `uninstall --module`: the modules asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<String>,
    pub drm: bool,
    pub peermem: bool,
    pub force: bool,
}

/// What happened to one module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ModuleAction {
    /// Loaded by this run.
    Loaded,
    /// The same version was already loaded; left alone.
    AlreadyLoaded,
    /// In the artifact but not selected (`--peermem` or `--drm` not given).
    Skipped,
    /// Not attempted: an earlier step failed.
    NotLoaded,
    /// The kernel refused it.
    Failed,
    /// Loaded by this run, then unloaded again after a later failure.
    RolledBack,
    /// Unloaded (`uninstall`, or an older version replaced).
    Unloaded,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleState {
    /// Kernel module name (`nvidia_uvm`).
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vermagic: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub action: ModuleAction,
    /// Parameters passed to the kernel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<String>,
    /// `ENODEV`, when the kernel refused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserSpace {
    pub present: bool,
    pub note: String,
    /// Files and links placed (`usr/bin/nvidia-smi`, …), in the driver root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// The `ld.so.conf.d` entry written, as the host sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ld_so_conf: Option<String>,
    /// The ldconfig command run for the host, or why it did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ldconfig: Option<String>,
    /// `/run/nvidia/driver`, when it was pointed at the driver root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_nvidia_driver: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstallStatus {
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flavor: Option<ModuleFlavor>,
    /// The versioned driver root, as the host sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_root: Option<String>,
    #[serde(default)]
    pub modules: Vec<ModuleState>,
    /// Modules of another version (or nouveau) unloaded first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<String>,
    /// Device nodes created or found correct, as the host sees them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<String>,
    /// What was written to `/sys/module/firmware_class/parameters/path`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_space: Option<UserSpace>,
    /// Kernel log records written during a failed load (`/dev/kmsg`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_log: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Fabric Manager, placed into the driver root (NVSwitch hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_manager: Option<FabricManagerState>,
    /// The host's systemd units written for the driver's daemons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceState>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FabricManagerState {
    pub version: String,
    /// The verified archive it came from.
    pub archive: String,
    /// Files placed, relative to the driver root.
    #[serde(default)]
    pub files: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceState {
    /// `nvidia-fabricmanager.service`
    pub unit: String,
    /// The unit file, as the host sees it.
    pub unit_file: String,
    /// Linked into `multi-user.target.wants`, so that it starts at boot
    /// once the driver is there.
    pub enabled: bool,
    /// The systemctl command that (re)started it in the host's namespace;
    /// absent when the host's systemd cannot be reached from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
}

impl StepStatus for InstallStatus {
    const KIND: Kind = Kind::InstallResult;
    fn unfinished() -> Self {
        InstallStatus {
            outcome: Outcome::new(Reason::Internal, "install did not finish"),
            kernel_release: None,
            driver_version: None,
            flavor: None,
            driver_root: None,
            modules: Vec::new(),
            replaced: Vec::new(),
            device_nodes: Vec::new(),
            firmware_path: None,
            user_space: None,
            kernel_log: Vec::new(),
            notes: Vec::new(),
            fabric_manager: None,
            services: Vec::new(),
        }
    }
    fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

pub type InstallResult = Document<InstallSpec, InstallStatus>;

impl StatusOutcome for InstallStatus {
    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

impl InstallStatus {
    /// Marks `name`'s action, where the result lists it.
    pub(super) fn set_action(&mut self, name: &str, action: ModuleAction) {
        if let Some(s) = self.modules.iter_mut().find(|s| s.name == name) {
            s.action = action;
        }
    }
}

impl ModuleState {
    /// A module this run unloaded (`uninstall`).
    pub(super) fn unloaded(name: &str) -> Self {
        ModuleState {
            name: name.to_string(),
            file: None,
            vermagic: None,
            version: None,
            action: ModuleAction::Unloaded,
            params: None,
            errno: None,
        }
    }
}

/// What `install` was asked to do.
pub(super) fn install_spec(opts: &InstallOptions) -> InstallSpec {
    InstallSpec {
        action: Action::Install,
        host_root: opts.root.path().display().to_string(),
        artifact: Some(opts.artifact.display().to_string()),
        kernel_release_override: opts.kernel_release.clone(),
        module_params: opts.module_params.as_ref().map(|p| p.display().to_string()),
        modules: Vec::new(),
        drm: opts.drm,
        peermem: opts.peermem,
        force: opts.force,
    }
}

/// What `uninstall` was asked to do.
pub(super) fn uninstall_spec(opts: &UninstallOptions) -> InstallSpec {
    InstallSpec {
        action: Action::Uninstall,
        host_root: opts.root.path().display().to_string(),
        artifact: None,
        kernel_release_override: None,
        module_params: None,
        modules: opts.modules.clone(),
        drm: true,
        peermem: true,
        force: opts.force,
    }
}

pub(super) fn user_space_status(present: bool, host_dir: &Path, files: Vec<String>) -> UserSpace {
    let note = if present {
        format!(
            "nvidia-smi and NVIDIA's libraries are in {}",
            host_dir.display()
        )
    } else {
        "the artifact has no user space (nvidia-smi, libcuda, libnvidia-ml): it was built from module sources without one (Debian's module-source packages never have it); install NVIDIA's user space separately (into usr/bin and usr/lib of the driver root) for verify".into()
    };
    UserSpace {
        present,
        note,
        files,
        ld_so_conf: None,
        ldconfig: None,
        run_nvidia_driver: None,
    }
}
