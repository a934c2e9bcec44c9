//! The node's state, read through the host root ([`HostRoot`]):
//! os-release, kernel release, boot id, PCI devices, loaded modules and
//! driver, Secure Boot, lockdown and the module signature policy. The
//! types the documents carry are the contract's, re-exported here.

use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Failure, Result};

use crate::host_root::{HostRoot, OS_RELEASE_PATHS};

pub use gpu_driver_contract::node::{
    CpuArch, LoadedDriver, LoadedModule, Lockdown, ModuleFlavor, OsInfo, SecureBoot, Signer,
};

/// The most a host file the installer reads may hold: os-release and the
/// `/proc` and `/sys` files are a few KiB.
pub(crate) const MAX_HOST_FILE_BYTES: u64 = 1 << 20;

/// How host files are read: small, regular files only.
const HOST_FILE: crate::named_file::Named = crate::named_file::Named {
    what: "host file",
    max: MAX_HOST_FILE_BYTES,
    reason: Failure::HostReadFailed,
    hint: "the host root's os-release, /proc and /sys files must be the real ones; check --host-root",
};

/// Reads a small host file ([`crate::named_file::Named::read_optional`]): a
/// regular file only, at most [`MAX_HOST_FILE_BYTES`]; `Ok(None)` when it
/// does not exist.
pub(crate) fn read_host_file(path: &Path) -> Result<Option<Vec<u8>>> {
    HOST_FILE.read_optional(path)
}

/// Reads a small host text file that may be absent ([`read_host_file`]).
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>> {
    match read_host_file(path)? {
        None => Ok(None),
        Some(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| {
            Error::new(
                Failure::HostReadFailed,
                format!("{} is not UTF-8 text", path.display()),
            )
        }),
    }
}

// ---------------------------------------------------------------- os-release

/// Parses os-release(5): `KEY=value` lines, values optionally quoted with
/// shell quoting rules; comments and blank lines ignored.
pub(crate) fn parse_os_release(text: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, raw)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        map.insert(key.to_string(), unquote(raw.trim()));
    }
    map
}

fn unquote(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.peek() {
                            Some('"' | '\\' | '$' | '`') => out.extend(chars.next()),
                            _ => out.push('\\'),
                        },
                        c => out.push(c),
                    }
                }
            }
            '\'' => {
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    out.push(c);
                }
            }
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn os_info_from(map: &BTreeMap<String, String>, source: &str) -> Result<OsInfo> {
    let get = |k: &str| map.get(k).filter(|v| !v.is_empty()).cloned();
    let id = get("ID").ok_or_else(|| {
        Error::new(
            Failure::HostReadFailed,
            format!("{source} has no ID= line, so the OS cannot be identified"),
        )
    })?;
    let version = if id == "gardenlinux" {
        get("GARDENLINUX_VERSION").or_else(|| get("VERSION_ID"))
    } else {
        get("VERSION_ID")
    };
    Ok(OsInfo {
        id,
        id_like: get("ID_LIKE")
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
        version,
        version_codename: get("VERSION_CODENAME"),
        pretty_name: get("PRETTY_NAME"),
        variant_id: get("VARIANT_ID"),
        source: source.to_string(),
    })
}

/// os-release from `/etc/os-release`, else `/usr/lib/os-release`.
pub(crate) fn read_os(root: &HostRoot) -> Result<OsInfo> {
    for rel in OS_RELEASE_PATHS {
        // Distributions ship /etc/os-release as a link (relative or absolute)
        // to /usr/lib/os-release: follow it inside the host root.
        let Some(path) = root.resolve(rel) else {
            continue;
        };
        if let Some(text) = read_optional(&path)? {
            return os_info_from(&parse_os_release(&text), &format!("/{rel}"));
        }
    }
    Err(Error::new(
        Failure::HostReadFailed,
        format!(
            "no os-release under {} (looked for /etc/os-release and /usr/lib/os-release)",
            root.path().display()
        ),
    )
    .with_hint("pass --host-root pointing at the host's root filesystem"))
}

/// A Garden Linux version: `1592.4` (two parts) or `2150.0.0` (three parts).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct GardenLinuxVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: Option<u32>,
}

#[cfg(test)]
impl GardenLinuxVersion {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let parts: Vec<u32> = s
            .split('.')
            .map(|p| p.parse().ok())
            .collect::<Option<_>>()?;
        match parts[..] {
            [major, minor] => Some(Self {
                major,
                minor,
                patch: None,
            }),
            [major, minor, patch] => Some(Self {
                major,
                minor,
                patch: Some(patch),
            }),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------- kernel

/// The running kernel's release: `<root>/proc/sys/kernel/osrelease`, else
/// uname(2).
pub(crate) fn read_kernel_release(root: &HostRoot) -> Result<String> {
    let path = root.kernel_path("/proc/sys/kernel/osrelease");
    if let Some(s) = read_optional(&path)? {
        let s = s.trim();
        if !s.is_empty() {
            return Ok(s.to_string());
        }
    }
    let uts = nix::sys::utsname::uname().map_err(|e| {
        Error::new(
            Failure::HostReadFailed,
            format!("uname(2) failed and {} is absent: {e}", path.display()),
        )
    })?;
    Ok(uts.release().to_string_lossy().into_owned())
}

pub(crate) fn read_boot_id(root: &HostRoot) -> Result<Option<String>> {
    let path = root.kernel_path("/proc/sys/kernel/random/boot_id");
    Ok(read_optional(&path)?.map(|s| s.trim().to_string()))
}

/// The numeric part of a kernel release: `6.12.57+deb13-cloud-amd64` →
/// (6, 12, 57).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct KernelVersion(pub u32, pub u32, pub u32);

impl KernelVersion {
    pub(crate) fn parse(release: &str) -> Option<Self> {
        let end = release
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(release.len());
        let mut it = release[..end].split('.').filter(|s| !s.is_empty());
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        let patch = it.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        Some(KernelVersion(major, minor, patch))
    }

    /// `6.12`
    pub(crate) fn series(&self) -> String {
        format!("{}.{}", self.0, self.1)
    }
}

impl std::fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

// ---------------------------------------------------------------- PCI

/// One PCI function as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PciDevice {
    pub address: String,
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    pub subsystem_vendor: Option<u16>,
    pub subsystem_device: Option<u16>,
}

pub(crate) const NVIDIA_VENDOR: u16 = 0x10de;

/// What an NVIDIA PCI function is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PciRole {
    /// Display controller (class 0x03xxxx): VGA or 3D controller.
    Gpu,
    /// NVSwitch fabric bridge (class 0x0680xx).
    NvSwitch,
    /// Anything else of NVIDIA's (HDMI audio, USB-C controller, …).
    OtherNvidia,
    NotNvidia,
}

impl PciDevice {
    pub(crate) fn role(&self) -> PciRole {
        if self.vendor != NVIDIA_VENDOR {
            return PciRole::NotNvidia;
        }
        match self.class >> 16 {
            0x03 => PciRole::Gpu,
            0x06 if (self.class >> 8) & 0xff == 0x80 => PciRole::NvSwitch,
            _ => PciRole::OtherNvidia,
        }
    }
}

fn parse_hex<T: TryFrom<u64>>(s: &str) -> Option<T> {
    let s = s.trim();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(s, 16)
        .ok()
        .and_then(|v| T::try_from(v).ok())
}

/// The PCI device directory: `<root>/sys/bus/pci/devices` if the root has a
/// `/sys`, else our own `/sys/bus/pci/devices`.
pub(crate) fn pci_devices_dir(root: &HostRoot) -> PathBuf {
    root.kernel_path("/sys/bus/pci/devices")
}

/// Reads every function under a sysfs `devices` directory. Entries are
/// symlinks into `/sys/devices/...`; reading through them follows them.
pub(crate) fn read_pci_devices(dir: &Path) -> Result<Vec<PciDevice>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(Failure::HostReadFailed, "listing", dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(Failure::HostReadFailed, "listing", dir, e))?;
        let address = entry.file_name().to_string_lossy().into_owned();
        let dev = entry.path();
        let read = |name: &str| -> Result<Option<String>> { read_optional(&dev.join(name)) };
        let bad = |name: &str| {
            Error::new(
                Failure::HostReadFailed,
                format!(
                    "{} is missing or not a hex number",
                    dev.join(name).display()
                ),
            )
        };
        let vendor = read("vendor")?
            .and_then(|s| parse_hex(&s))
            .ok_or_else(|| bad("vendor"))?;
        let device = read("device")?
            .and_then(|s| parse_hex(&s))
            .ok_or_else(|| bad("device"))?;
        let class = read("class")?
            .and_then(|s| parse_hex(&s))
            .ok_or_else(|| bad("class"))?;
        out.push(PciDevice {
            address,
            vendor,
            device,
            class,
            subsystem_vendor: read("subsystem_vendor")?.and_then(|s| parse_hex(&s)),
            subsystem_device: read("subsystem_device")?.and_then(|s| parse_hex(&s)),
        });
    }
    out.sort_by(|a, b| a.address.cmp(&b.address));
    Ok(out)
}

// ---------------------------------------------------------------- modules

/// Modules that matter to us from `/proc/modules`: NVIDIA's and nouveau,
/// which must not be loaded alongside NVIDIA's driver.
pub(crate) fn parse_proc_modules(text: &str) -> Result<Vec<LoadedModule>> {
    use procfs::FromBufRead;
    let mods = procfs::KernelModules::from_buf_read(text.as_bytes()).map_err(|e| {
        Error::new(
            Failure::HostReadFailed,
            format!("parsing /proc/modules: {e}"),
        )
    })?;
    let mut out: Vec<LoadedModule> = mods
        .0
        .into_values()
        .filter(|m| m.name.starts_with("nvidia") || m.name == "nouveau")
        .map(|m| {
            let mut used_by = m.used_by;
            used_by.sort();
            LoadedModule {
                name: m.name,
                refcount: m.refcount,
                used_by,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Parses `/proc/driver/nvidia/version`:
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.195.03  Release Build …`
/// or `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul …`.
pub(crate) fn parse_nvidia_version(text: &str) -> Option<LoadedDriver> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let after = &line[line.find("Kernel Module")? + "Kernel Module".len()..];
    let version = after.split_whitespace().find(|w| is_driver_version(w))?;
    let flavor = if line.contains("Open Kernel Module") {
        ModuleFlavor::Open
    } else {
        ModuleFlavor::Proprietary
    };
    Some(LoadedDriver {
        version: version.to_string(),
        flavor,
    })
}

/// `535.261.03`, `580.95.05`, `550.54` — digits separated by dots, 2–3 parts.
pub(crate) fn is_driver_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
}

// ---------------------------------------------------------------- CPU architecture

/// The architecture this process runs on (a Job runs on its node).
pub fn running_arch() -> Result<CpuArch> {
    let uts = nix::sys::utsname::uname()
        .map_err(|e| Error::new(Failure::HostReadFailed, format!("uname(2) failed: {e}")))?;
    let machine = uts.machine().to_string_lossy().into_owned();
    CpuArch::parse(&machine).ok_or_else(|| {
        Error::new(
            Failure::UnsupportedOs,
            format!("CPU architecture {machine:?} is not supported (x86_64 and aarch64 are)"),
        )
    })
}

// ---------------------------------------------------------------- secure boot

/// `SecureBoot` under EFI's global variable GUID (`EFI_GLOBAL_VARIABLE`
/// in the UEFI specification), as efivarfs names it.
const SECURE_BOOT_VAR: &str = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// efivarfs files hold 4 bytes of attributes, then the value.
pub(crate) fn parse_secure_boot_var(bytes: &[u8]) -> SecureBoot {
    match bytes.get(4) {
        Some(1) => SecureBoot::Enabled,
        Some(0) => SecureBoot::Disabled,
        _ => SecureBoot::Unknown,
    }
}

pub(crate) fn read_secure_boot(root: &HostRoot) -> Result<SecureBoot> {
    let efi = root.kernel_path("/sys/firmware/efi");
    if !efi.is_dir() {
        return Ok(SecureBoot::NotEfi);
    }
    let var = efi.join("efivars").join(SECURE_BOOT_VAR);
    match read_host_file(&var) {
        Ok(Some(bytes)) => Ok(parse_secure_boot_var(&bytes)),
        Ok(None) => Ok(SecureBoot::Unknown),
        // efivarfs may be unreadable to us: not knowing is an answer.
        Err(_) if fs::File::open(&var).is_err_and(|e| e.kind() == ErrorKind::PermissionDenied) => {
            Ok(SecureBoot::Unknown)
        }
        Err(e) => Err(e),
    }
}

/// `/sys/kernel/security/lockdown`: `none [integrity] confidentiality`;
/// the bracketed one is in force.
pub(crate) fn parse_lockdown(text: &str) -> Option<Lockdown> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .and_then(|m| match m {
            "none" => Some(Lockdown::None),
            "integrity" => Some(Lockdown::Integrity),
            "confidentiality" => Some(Lockdown::Confidentiality),
            _ => None,
        })
}

/// The lockdown mode; `None` without securityfs or the lockdown LSM.
pub(crate) fn read_lockdown(root: &HostRoot) -> Result<Option<Lockdown>> {
    let path = root.kernel_path("/sys/kernel/security/lockdown");
    Ok(read_optional(&path)
        .ok()
        .flatten()
        .as_deref()
        .and_then(parse_lockdown))
}

/// Whether the kernel refuses unsigned modules, from what could be read:
/// Secure Boot on (Debian's and Garden Linux's kernels lock down then),
/// lockdown `integrity`/`confidentiality`, or `module.sig_enforce=Y`.
/// `None` when nothing could be read.
pub(crate) fn module_signatures_required(
    secure_boot: Option<SecureBoot>,
    lockdown: Option<Lockdown>,
    sig_enforce: Option<bool>,
) -> Option<bool> {
    let yes = secure_boot == Some(SecureBoot::Enabled)
        || matches!(
            lockdown,
            Some(Lockdown::Integrity | Lockdown::Confidentiality)
        )
        || sig_enforce == Some(true);
    let known = matches!(
        secure_boot,
        Some(SecureBoot::Enabled | SecureBoot::Disabled | SecureBoot::NotEfi)
    ) || lockdown.is_some()
        || sig_enforce.is_some();
    (yes || known).then_some(yes)
}

/// `/sys/module/module/parameters/sig_enforce` (`Y`/`N`); `None` when the
/// kernel has no module signing.
pub(crate) fn read_sig_enforce(root: &HostRoot) -> Option<bool> {
    let path = root.kernel_path("/sys/module/module/parameters/sig_enforce");
    match read_optional(&path).ok().flatten()?.trim() {
        "Y" => Some(true),
        "N" => Some(false),
        _ => None,
    }
}

/// What decides whether the host loads only signed modules, read once for
/// detect's report and install's check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SignaturePolicy {
    pub secure_boot: SecureBoot,
    pub lockdown: Option<Lockdown>,
    pub sig_enforce: Option<bool>,
}

impl SignaturePolicy {
    pub(crate) fn read(root: &HostRoot) -> Result<SignaturePolicy> {
        Ok(SignaturePolicy {
            secure_boot: read_secure_boot(root)?,
            lockdown: read_lockdown(root)?,
            sig_enforce: read_sig_enforce(root),
        })
    }

    /// [`module_signatures_required`] of these readings.
    pub(crate) fn required(&self) -> Option<bool> {
        module_signatures_required(Some(self.secure_boot), self.lockdown, self.sig_enforce)
    }

    /// What makes signatures mandatory, for messages.
    pub(crate) fn why(&self) -> String {
        let mut why = Vec::new();
        if self.secure_boot == SecureBoot::Enabled {
            why.push("Secure Boot is on".to_string());
        }
        if let Some(l @ (Lockdown::Integrity | Lockdown::Confidentiality)) = self.lockdown {
            why.push(format!("lockdown is {l:?}").to_lowercase());
        }
        if self.sig_enforce == Some(true) {
            why.push("module.sig_enforce=Y".to_string());
        }
        why.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_root::{HostRootSource, pid1_is_foreign};

    #[test]
    fn the_secure_boot_variable_is_under_efis_global_variable_guid() {
        // {8BE4DF61-93CA-11D2-AA0D-00E098032B8C}: an earlier constant had
        // e0bf0cfe7d8c as its last group, and every real node read unknown.
        assert_eq!(
            SECURE_BOOT_VAR,
            "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
        );
    }

    #[test]
    fn os_release_quoting() {
        let m = parse_os_release(
            "# comment\nNAME=\"Garden Linux\"\nID=gardenlinux\nX='single $x'\nY=\"a \\\"q\\\" \\$b\"\nbad line\n\nZ=\n",
        );
        assert_eq!(m["NAME"], "Garden Linux");
        assert_eq!(m["ID"], "gardenlinux");
        assert_eq!(m["X"], "single $x");
        assert_eq!(m["Y"], "a \"q\" $b");
        assert_eq!(m["Z"], "");
        assert!(!m.contains_key("bad line"));
    }

    #[test]
    fn gardenlinux_version_comes_from_gardenlinux_version() {
        let m = parse_os_release("ID=gardenlinux\nGARDENLINUX_VERSION=1592.4\n");
        let os = os_info_from(&m, "/etc/os-release").unwrap();
        assert_eq!(os.version.as_deref(), Some("1592.4"));
        let m = parse_os_release("ID=debian\nVERSION_ID=\"12\"\nVERSION_CODENAME=bookworm\n");
        let os = os_info_from(&m, "/etc/os-release").unwrap();
        assert_eq!(os.version.as_deref(), Some("12"));
        assert_eq!(os.version_codename.as_deref(), Some("bookworm"));
        assert!(os_info_from(&parse_os_release("NAME=x\n"), "/etc/os-release").is_err());
    }

    #[test]
    fn gardenlinux_version_forms() {
        let two = GardenLinuxVersion::parse("1592.4").unwrap();
        assert_eq!((two.major, two.minor, two.patch), (1592, 4, None));
        let three = GardenLinuxVersion::parse("2150.0.0").unwrap();
        assert_eq!((three.major, three.minor, three.patch), (2150, 0, Some(0)));
        assert!(GardenLinuxVersion::parse("1592").is_none());
        assert!(GardenLinuxVersion::parse("1592.x").is_none());
        assert!(GardenLinuxVersion::parse("1.2.3.4").is_none());
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(
            KernelVersion::parse("6.12.57+deb13-cloud-amd64"),
            Some(KernelVersion(6, 12, 57))
        );
        assert_eq!(
            KernelVersion::parse("6.1.0-50-cloud-amd64"),
            Some(KernelVersion(6, 1, 0))
        );
        assert_eq!(
            KernelVersion::parse("6.18-rc1"),
            Some(KernelVersion(6, 18, 0))
        );
        assert_eq!(KernelVersion::parse("garbage"), None);
        assert_eq!(KernelVersion(6, 6, 63).series(), "6.6");
    }

    #[test]
    fn pci_roles() {
        let dev = |vendor, class| PciDevice {
            address: "0000:00:04.0".into(),
            vendor,
            device: 0x1eb8,
            class,
            subsystem_vendor: None,
            subsystem_device: None,
        };
        assert_eq!(dev(0x10de, 0x030200).role(), PciRole::Gpu);
        assert_eq!(dev(0x10de, 0x030000).role(), PciRole::Gpu);
        assert_eq!(dev(0x10de, 0x068000).role(), PciRole::NvSwitch);
        assert_eq!(dev(0x10de, 0x040300).role(), PciRole::OtherNvidia);
        assert_eq!(dev(0x1af4, 0x030000).role(), PciRole::NotNvidia);
        assert_eq!(parse_hex::<u16>("0x10de\n"), Some(0x10de));
        assert_eq!(parse_hex::<u16>("0x10000"), None);
    }

    #[test]
    fn nvidia_version_file() {
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.195.03  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Fri Sep 12 19:31:12 UTC 2025\nGCC version:  gcc version 14.2.0 (Debian 14.2.0-19) \n";
        assert_eq!(
            parse_nvidia_version(open),
            Some(LoadedDriver {
                version: "570.195.03".into(),
                flavor: ModuleFlavor::Open
            })
        );
        let prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul 16 19:26:45 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n";
        assert_eq!(
            parse_nvidia_version(prop),
            Some(LoadedDriver {
                version: "535.261.03".into(),
                flavor: ModuleFlavor::Proprietary
            })
        );
        assert_eq!(parse_nvidia_version("garbage"), None);
    }

    #[test]
    fn proc_modules() {
        let text = "nvidia_uvm 1794048 0 - Live 0x0000000000000000\nnvidia 60743680 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000\next4 1060864 1 - Live 0x0000000000000000\n";
        let mods = parse_proc_modules(text).unwrap();
        assert_eq!(mods.len(), 2);
        assert_eq!(mods[0].name, "nvidia");
        assert_eq!(mods[0].used_by, vec!["nvidia_modeset", "nvidia_uvm"]);
        assert!(parse_proc_modules("nvidia notanumber").is_err());
    }

    #[test]
    fn lockdown_is_the_bracketed_mode() {
        assert_eq!(
            parse_lockdown("none [integrity] confidentiality\n"),
            Some(Lockdown::Integrity)
        );
        assert_eq!(
            parse_lockdown("[none] integrity confidentiality"),
            Some(Lockdown::None)
        );
        assert_eq!(parse_lockdown("none integrity"), None);
    }

    #[test]
    fn signatures_are_required_by_any_of_the_three() {
        use SecureBoot::*;
        let f = module_signatures_required;
        assert_eq!(f(Some(Enabled), None, None), Some(true));
        assert_eq!(
            f(Some(Disabled), Some(Lockdown::Integrity), None),
            Some(true)
        );
        assert_eq!(
            f(Some(NotEfi), Some(Lockdown::None), Some(true)),
            Some(true)
        );
        assert_eq!(
            f(Some(Disabled), Some(Lockdown::None), Some(false)),
            Some(false)
        );
        assert_eq!(f(Some(Unknown), None, None), None);
        assert_eq!(f(Some(Unknown), None, Some(false)), Some(false));
    }

    #[test]
    fn secure_boot_var() {
        assert_eq!(parse_secure_boot_var(&[6, 0, 0, 0, 1]), SecureBoot::Enabled);
        assert_eq!(
            parse_secure_boot_var(&[6, 0, 0, 0, 0]),
            SecureBoot::Disabled
        );
        assert_eq!(parse_secure_boot_var(&[6, 0]), SecureBoot::Unknown);
    }

    #[test]
    fn resolve_follows_absolute_links_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path(), HostRootSource::Flag);
        fs::create_dir_all(dir.path().join("usr/src/linux-headers-6.1.0")).unwrap();
        fs::create_dir_all(dir.path().join("lib/modules/6.1.0")).unwrap();
        std::os::unix::fs::symlink(
            "/usr/src/linux-headers-6.1.0",
            dir.path().join("lib/modules/6.1.0/build"),
        )
        .unwrap();
        // A link that tries to climb out of the root stays inside it.
        std::os::unix::fs::symlink("../../../../../../etc", dir.path().join("lib/escape")).unwrap();
        assert_eq!(
            root.resolve("/lib/modules/6.1.0/build"),
            Some(dir.path().join("usr/src/linux-headers-6.1.0"))
        );
        assert_eq!(root.resolve("/lib/escape"), None);
        assert_eq!(root.resolve("/lib/modules/6.1.0/missing"), None);
        std::os::unix::fs::symlink("loop", dir.path().join("loop")).unwrap();
        assert_eq!(root.resolve("/loop"), None);
    }

    #[test]
    fn auto_host_root() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        let proc = dir.path().join("proc");
        fs::create_dir_all(proc.join("1/root/etc")).unwrap();
        fs::create_dir_all(proc.join("1/ns")).unwrap();
        fs::create_dir_all(proc.join("self/ns")).unwrap();
        // Nothing readable: fall back to "/".
        assert_eq!(
            HostRoot::auto_from(&host, &proc).source(),
            HostRootSource::Root
        );
        // PID 1 in another mount namespace with an os-release: hostPID pod.
        fs::write(proc.join("1/root/etc/os-release"), "ID=debian\n").unwrap();
        std::os::unix::fs::symlink("mnt:[1]", proc.join("1/ns/mnt")).unwrap();
        std::os::unix::fs::symlink("mnt:[2]", proc.join("self/ns/mnt")).unwrap();
        let r = HostRoot::auto_from(&host, &proc);
        assert_eq!(r.source(), HostRootSource::Pid1Root);
        assert_eq!(r.path(), proc.join("1/root"));
        // A mounted /host wins.
        fs::create_dir_all(host.join("usr/lib")).unwrap();
        fs::write(host.join("usr/lib/os-release"), "ID=gardenlinux\n").unwrap();
        assert_eq!(
            HostRoot::auto_from(&host, &proc).source(),
            HostRootSource::HostMount
        );
        assert!(!pid1_is_foreign(Some(Path::new("a")), Some(Path::new("a"))));
        assert!(!pid1_is_foreign(None, Some(Path::new("a"))));
    }
}

#[cfg(test)]
mod bounded_read_tests {
    use super::*;

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("os-release");
        fs::write(&ok, "ID=debian\n").unwrap();
        assert_eq!(read_optional(&ok).unwrap().as_deref(), Some("ID=debian\n"));
        assert_eq!(read_optional(&dir.path().join("absent")).unwrap(), None);

        // A FIFO without a writer: refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let e = read_optional(&fifo).unwrap_err();
        assert_eq!(e.reason, Failure::HostReadFailed);
        assert!(e.to_string().contains("a FIFO"), "{e}");

        // A link to a device that never ends.
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read_optional(&zero).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");

        let big = dir.path().join("big");
        fs::write(&big, vec![b'x'; MAX_HOST_FILE_BYTES as usize + 1]).unwrap();
        let e = read_optional(&big).unwrap_err();
        assert_eq!(e.reason, Failure::HostReadFailed);
        assert!(e.to_string().contains("larger than"), "{e}");
    }
}
