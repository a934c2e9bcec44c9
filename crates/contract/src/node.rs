//! What the wire documents say about a node: its OS, CPU architecture,
//! loaded modules and driver, lockdown and Secure Boot, and who signed a
//! build's modules.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The parsed os-release of the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OsInfo {
    /// `ID`, e.g. `gardenlinux`, `debian`, `ubuntu`.
    pub id: String,
    /// `ID_LIKE`, split on spaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub id_like: Vec<String>,
    /// The version the catalog is keyed by: `GARDENLINUX_VERSION` on Garden
    /// Linux (which has no `VERSION_ID`), else `VERSION_ID`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version_codename: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pretty_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant_id: Option<String>,
    /// Where it was read, relative to the host root.
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadedModule {
    pub name: String,
    pub refcount: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModuleFlavor {
    Open,
    Proprietary,
}

impl std::fmt::Display for ModuleFlavor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModuleFlavor::Open => "open",
            ModuleFlavor::Proprietary => "proprietary",
        })
    }
}

/// The driver the loaded `nvidia` module reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadedDriver {
    pub version: String,
    pub flavor: ModuleFlavor,
}

/// The node's CPU architecture, as the kernel reports it (`uname -m`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum CpuArch {
    #[serde(rename = "x86_64")]
    X86_64,
    Aarch64,
}

impl CpuArch {
    /// `uname -m` and NVIDIA's file names: `x86_64`, `aarch64`.
    pub fn nvidia_name(self) -> &'static str {
        match self {
            CpuArch::X86_64 => "x86_64",
            CpuArch::Aarch64 => "aarch64",
        }
    }

    /// Debian's, Kubernetes' and OCI's name: `amd64`, `arm64`.
    pub fn debian_name(self) -> &'static str {
        match self {
            CpuArch::X86_64 => "amd64",
            CpuArch::Aarch64 => "arm64",
        }
    }

    /// The kernel's `ARCH=` for kbuild.
    pub fn kernel_arch(self) -> &'static str {
        match self {
            CpuArch::X86_64 => "x86",
            CpuArch::Aarch64 => "arm64",
        }
    }

    /// Debian's multiarch triplet, also the GNU cross tools' prefix
    /// (`aarch64-linux-gnu-gcc-12`): `x86_64-linux-gnu`, `aarch64-linux-gnu`.
    pub fn gnu_triplet(self) -> &'static str {
        match self {
            CpuArch::X86_64 => "x86_64-linux-gnu",
            CpuArch::Aarch64 => "aarch64-linux-gnu",
        }
    }

    /// `e_machine` of this architecture's ELF files (`EM_X86_64`,
    /// `EM_AARCH64`).
    pub fn elf_machine(self) -> u16 {
        match self {
            CpuArch::X86_64 => 62,
            CpuArch::Aarch64 => 183,
        }
    }

    /// The architecture of an ELF `e_machine`, when it is one of ours.
    pub fn from_elf_machine(machine: u16) -> Option<CpuArch> {
        [CpuArch::X86_64, CpuArch::Aarch64]
            .into_iter()
            .find(|a| a.elf_machine() == machine)
    }

    /// Either naming (`x86_64`/`amd64`, `aarch64`/`arm64`).
    pub fn parse(s: &str) -> Option<CpuArch> {
        match s.trim() {
            "x86_64" | "amd64" => Some(CpuArch::X86_64),
            "aarch64" | "arm64" => Some(CpuArch::Aarch64),
            _ => None,
        }
    }
}

impl std::fmt::Display for CpuArch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.nvidia_name())
    }
}

/// The kernel's lockdown mode (`/sys/kernel/security/lockdown`, the one in
/// brackets). `integrity` and `confidentiality` make module signatures
/// mandatory, whatever `module.sig_enforce` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Lockdown {
    None,
    Integrity,
    Confidentiality,
}

/// Who signed a build's modules: the certificate's subject (RFC 4514-like,
/// `CN=…, O=…`) and the SHA-256 of its DER encoding, the fingerprint
/// `openssl x509 -fingerprint -sha256` and `mokutil --list-enrolled` print.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Signer {
    pub subject: String,
    /// 64 lowercase hex digits.
    pub sha256: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SecureBoot {
    Enabled,
    Disabled,
    /// EFI, but the SecureBoot variable is not visible (efivarfs not mounted).
    Unknown,
    /// Booted without EFI: Secure Boot does not apply.
    NotEfi,
}
