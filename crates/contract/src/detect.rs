//! The `HostReport`: what `detect` found on a node. The operator reads it
//! from a detect Job's termination message.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::host_root::HostRootSource;
use crate::node::{CpuArch, LoadedDriver, LoadedModule, Lockdown, OsInfo, SecureBoot};
use crate::report::{Document, Outcome, Reason, StatusOutcome};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DetectSpec {
    pub host_root: String,
    pub host_root_source: HostRootSource,
    /// `--kernel-release`, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_release_override: Option<String>,
    /// `--arch`, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch_override: Option<CpuArch>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// `0000:3b:00.0`
    pub pci_address: String,
    /// `0x1eb8`
    pub device_id: String,
    /// `0x10de:0x12a2`, when sysfs shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subsystem_id: Option<String>,
    /// `0x030200`
    pub pci_class: String,
    /// GPU family from the catalog's device id ranges (`turing`, `hopper`, …);
    /// absent when the id is in no known range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Whether NVIDIA's open kernel modules can drive it (Turing and newer);
    /// absent when the architecture is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_modules_supported: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostStatus {
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub os: Option<OsInfo>,
    /// Whether the catalog lists this OS and version as installable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub os_supported: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    /// The CPU architecture (`x86_64`, `aarch64`): NVIDIA ships a package
    /// for each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<CpuArch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// PCI addresses of NVSwitch fabric bridges (they need Fabric Manager,
    /// not a driver of their own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvswitches: Vec<String>,
    /// NVIDIA modules (and nouveau) in `/proc/modules`.
    #[serde(default)]
    pub loaded_modules: Vec<LoadedModule>,
    /// What `/proc/driver/nvidia/version` reports, when the driver is loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded_driver: Option<LoadedDriver>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<SecureBoot>,
    /// The kernel's lockdown mode; absent where securityfs is not mounted
    /// or the kernel has no lockdown LSM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockdown: Option<Lockdown>,
    /// Whether the kernel loads only signed modules (Secure Boot on,
    /// lockdown `integrity`/`confidentiality`, or `module.sig_enforce=Y`);
    /// absent where none of them could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_signatures_required: Option<bool>,
}

impl HostStatus {
    /// A status whose outcome says detection did not finish.
    pub fn unfinished() -> Self {
        HostStatus {
            outcome: Outcome::new(Reason::Internal, "detection did not finish"),
            os: None,
            os_supported: None,
            kernel_release: None,
            arch: None,
            boot_id: None,
            gpus: Vec::new(),
            nvswitches: Vec::new(),
            loaded_modules: Vec::new(),
            loaded_driver: None,
            secure_boot: None,
            lockdown: None,
            module_signatures_required: None,
        }
    }
}

pub type HostReport = Document<DetectSpec, HostStatus>;

impl StatusOutcome for HostStatus {
    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}
