//! `install` and `uninstall`: put a build artifact's modules into the running
//! kernel, safely.
//!
//! Order of events for `install` (one function each, in
//! `install_inner`'s order):
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
//!    use → `DriverInUse` unless `--force`;
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
//! nodes, `ld.so.conf.d`, removals) goes through [`crate::hostfs`], which
//! resolves paths inside the root: a link such as `var/lib -> /elsewhere`
//! in the host root never leads a write outside it.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::kmod::{DeleteModuleFlags, ModuleInitFlags};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::artifact::{self, Manifest};
use crate::error::{Error, Result};
use crate::host::{self, HostRoot, ModuleFlavor, PciRole};
use crate::hostfs::{HostFs, HostRootFs, Kind as FsKind};
use crate::modinfo::{self, ModInfo};
use crate::report::{Document, Kind, Outcome, Reason, StatusOutcome};

pub use gpu_driver_contract::layout::DRIVERS_DIR;
/// The name prefix of the directory an artifact is unpacked into.
const STAGING_PREFIX: &str = ".staging-";

/// The host lock every installer takes before touching modules.
pub const LOCK_PATH: &str = "/run/gpu-driver/install.lock";
/// NVIDIA's modules in load order; unloading goes the other way.
pub const NVIDIA_STACK: &[&str] = &[
    "nvidia",
    "nvidia_uvm",
    "nvidia_modeset",
    "nvidia_drm",
    "nvidia_peermem",
];
/// NVIDIA's fixed character major (`NV_MAJOR_DEVICE_NUMBER`).
pub const NVIDIA_MAJOR: u32 = 195;
const NVIDIACTL_MINOR: u32 = 255;
const NVIDIA_MODESET_MINOR: u32 = 254;

const LOCAL_IO: Reason = Reason::Internal;

// ------------------------------------------------------------ documents

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
                Reason::FabricManagerFailed,
                format!(
                    "{}: not named like NVIDIA's archive fabricmanager-linux-<platform>-<version>-archive.tar.xz",
                    path.display()
                ),
            )
        })?;
        let (sha256, _) = crate::files::sha256_file(path, Reason::FabricManagerFailed)?;
        Ok(FabricManagerArchive {
            path: path.to_path_buf(),
            sha256,
            version,
        })
    }
}

impl InstallStatus {
    fn new() -> Self {
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
}

pub type InstallResult = Document<InstallSpec, InstallStatus>;

impl StatusOutcome for InstallStatus {
    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

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

// ------------------------------------------------------------ module params

/// `--module-params`: `module key=value [key=value …]` lines; `#` starts a
/// comment. Module names are normalized (`nvidia-drm` → `nvidia_drm`); lines
/// for the same module add up.
pub fn parse_module_params(text: &str) -> Result<BTreeMap<String, String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let module = words.next().unwrap_or_default().replace('-', "_");
        let params: Vec<String> = words.map(str::to_string).collect();
        if params.is_empty() {
            return Err(Error::new(
                Reason::InvalidArgument,
                format!("module parameters line {}: {raw:?} has no key=value", n + 1),
            ));
        }
        for p in &params {
            if !p.contains('=') || p.starts_with('=') {
                return Err(Error::new(
                    Reason::InvalidArgument,
                    format!("module parameters line {}: {p:?} is not key=value", n + 1),
                ));
            }
        }
        out.entry(module).or_default().extend(params);
    }
    Ok(out.into_iter().map(|(k, v)| (k, v.join(" "))).collect())
}

// ------------------------------------------------------------ /proc

/// One line of `/proc/modules`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelModule {
    pub name: String,
    pub refcount: i32,
    pub used_by: Vec<String>,
}

/// Every module in `/proc/modules` (unlike [`host::parse_proc_modules`],
/// which keeps only NVIDIA's and nouveau).
pub fn parse_all_modules(text: &str) -> Result<BTreeMap<String, KernelModule>> {
    use procfs::FromBufRead;
    let mods = procfs::KernelModules::from_buf_read(text.as_bytes()).map_err(|e| {
        Error::new(
            Reason::HostReadFailed,
            format!("parsing /proc/modules: {e}"),
        )
    })?;
    Ok(mods
        .0
        .into_values()
        .map(|m| {
            let mut used_by: Vec<String> =
                m.used_by.into_iter().filter(|u| !u.is_empty()).collect();
            used_by.sort();
            (
                m.name.clone(),
                KernelModule {
                    name: m.name,
                    refcount: m.refcount,
                    used_by,
                },
            )
        })
        .collect())
}

fn read_modules(root: &HostRoot) -> Result<BTreeMap<String, KernelModule>> {
    let path = root.kernel_path("/proc/modules");
    match host::read_optional(&path)? {
        Some(text) => parse_all_modules(&text),
        None => Ok(BTreeMap::new()),
    }
}

/// Character majors by name from `/proc/devices`.
pub fn parse_char_majors(text: &str) -> Result<BTreeMap<String, u32>> {
    use procfs::FromBufRead;
    let devices = procfs::Devices::from_buf_read(text.as_bytes()).map_err(|e| {
        Error::new(
            Reason::HostReadFailed,
            format!("parsing /proc/devices: {e}"),
        )
    })?;
    Ok(devices
        .char_devices
        .into_iter()
        .map(|d| (d.name, d.major))
        .collect())
}

// ------------------------------------------------------------ /dev/kmsg

/// The kernel log from a point on: opened non-blocking and positioned at the
/// end before a load, so that reading afterwards yields exactly the records
/// written since.
pub struct KernelLog {
    file: Option<File>,
}

impl KernelLog {
    pub fn open(path: &Path) -> Self {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path)
            .and_then(|mut f| f.seek(SeekFrom::End(0)).map(|_| f));
        match file {
            Ok(f) => KernelLog { file: Some(f) },
            Err(e) => {
                tracing::warn!("kernel log {} not readable: {e}", path.display());
                KernelLog { file: None }
            }
        }
    }

    /// The messages of the records written since `open` (or the last call).
    pub fn read_new(&mut self) -> Vec<String> {
        let Some(file) = &mut self.file else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut buf = vec![0u8; 8192];
        // Each read returns one record; EPIPE means records were overwritten
        // (the reader skips ahead), EAGAIN that there are no more.
        for _ in 0..10_000 {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if let Some(msg) = parse_kmsg_record(&String::from_utf8_lossy(&buf[..n])) {
                        out.push(msg);
                    }
                }
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        out
    }
}

/// `6,1234,5678901,-;NVRM: No NVIDIA GPU found.\n SUBSYSTEM=…` → the message.
pub fn parse_kmsg_record(record: &str) -> Option<String> {
    let (_, rest) = record.split_once(';')?;
    let msg = rest.lines().next().unwrap_or("").trim_end();
    (!msg.is_empty()).then(|| msg.to_string())
}

// ------------------------------------------------------------ helpers

fn check_root() -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(Error::new(
            Reason::NotRoot,
            format!(
                "loading kernel modules needs root (effective uid is {})",
                nix::unistd::geteuid()
            ),
        )
        .with_hint("run as root: sudo, nsenter from a privileged pod, or a privileged container"))
    }
}

fn errno_text(e: Errno) -> String {
    format!("{e:?}: {}", e.desc())
}

/// What `/sys/module/<name>/version` (else `srcversion`) says.
fn loaded_identity(root: &HostRoot, name: &str) -> (Option<String>, Option<String>) {
    let read = |f: &str| {
        host::read_optional(&root.kernel_path(&format!("/sys/module/{name}/{f}")))
            .ok()
            .flatten()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    (read("version"), read("srcversion"))
}

fn field<'a>(info: &'a ModInfo, key: &str) -> Option<&'a str> {
    info.fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Same build or same version as what is loaded.
fn same_as_loaded(root: &HostRoot, info: &ModInfo) -> bool {
    let (version, srcversion) = loaded_identity(root, &info.name);
    match (srcversion, field(info, "srcversion")) {
        (Some(a), Some(b)) if a == b => return true,
        _ => {}
    }
    matches!((version, &info.version), (Some(a), Some(b)) if &a == b)
}

/// Orders `names` so that every module comes after the ones it depends on
/// (within the set), NVIDIA's stack order breaking ties, then the name.
pub fn load_order(mods: &[(String, Vec<String>)]) -> Vec<String> {
    let rank = |n: &str| {
        NVIDIA_STACK
            .iter()
            .position(|s| *s == n)
            .unwrap_or(NVIDIA_STACK.len())
    };
    let names: BTreeSet<&str> = mods.iter().map(|(n, _)| n.as_str()).collect();
    let mut pending: Vec<&(String, Vec<String>)> = mods.iter().collect();
    pending.sort_by(|a, b| (rank(&a.0), &a.0).cmp(&(rank(&b.0), &b.0)));
    let mut done: Vec<String> = Vec::new();
    while !pending.is_empty() {
        let ready = pending.iter().position(|(_, deps)| {
            deps.iter()
                .all(|d| !names.contains(d.as_str()) || done.contains(d))
        });
        // A dependency cycle cannot load at all; keep the rank order and let
        // the kernel say what it thinks.
        let i = ready.unwrap_or(0);
        done.push(pending.remove(i).0.clone());
    }
    done
}

/// Unload order for loaded modules: holders first.
pub fn unload_order(
    set: &BTreeSet<String>,
    loaded: &BTreeMap<String, KernelModule>,
) -> Vec<String> {
    let mut remaining: Vec<String> = set.iter().cloned().collect();
    // Later in the stack first, then by name.
    remaining.sort_by_key(|n| {
        std::cmp::Reverse(
            NVIDIA_STACK
                .iter()
                .position(|s| s == n)
                .unwrap_or(NVIDIA_STACK.len()),
        )
    });
    let mut out = Vec::new();
    while !remaining.is_empty() {
        let i = remaining
            .iter()
            .position(|n| {
                loaded
                    .get(n)
                    .is_none_or(|m| m.used_by.iter().all(|u| !remaining.contains(u)))
            })
            .unwrap_or(0);
        out.push(remaining.remove(i));
    }
    out
}

/// Modules of `set` that are in use by something outside it: open handles
/// (refcount above the holders inside the set) or holders outside the set.
pub fn in_use(set: &BTreeSet<String>, loaded: &BTreeMap<String, KernelModule>) -> Vec<String> {
    let mut out = Vec::new();
    for name in set {
        let Some(m) = loaded.get(name) else { continue };
        let inside = m.used_by.iter().filter(|u| set.contains(*u)).count() as i32;
        let outside: Vec<&String> = m.used_by.iter().filter(|u| !set.contains(*u)).collect();
        if !outside.is_empty() {
            out.push(format!(
                "{name} (used by {})",
                outside
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        } else if m.refcount > inside {
            out.push(format!(
                "{name} (refcount {}: open device files or other users)",
                m.refcount
            ));
        }
    }
    out
}

fn unload(name: &str) -> std::result::Result<(), Errno> {
    let c = CString::new(name).map_err(|_| Errno::EINVAL)?;
    nix::kmod::delete_module(&c, DeleteModuleFlags::O_NONBLOCK)
}

/// Unloads `set` in order; the first refusal ends it.
fn unload_all(
    set: &BTreeSet<String>,
    loaded: &BTreeMap<String, KernelModule>,
) -> Result<Vec<String>> {
    let mut done = Vec::new();
    for name in unload_order(set, loaded) {
        match unload(&name) {
            Ok(()) => done.push(name),
            Err(Errno::ENOENT) => {}
            Err(e) => {
                let reason = if e == Errno::EBUSY || e == Errno::EAGAIN || e == Errno::EWOULDBLOCK {
                    Reason::DriverInUse
                } else {
                    Reason::ModuleUnloadFailed
                };
                return Err(Error::new(
                    reason,
                    format!(
                        "unloading {name}: {}{}",
                        errno_text(e),
                        if done.is_empty() {
                            String::new()
                        } else {
                            format!(" (already unloaded: {})", done.join(", "))
                        }
                    ),
                ));
            }
        }
    }
    Ok(done)
}

/// A staging directory beside the driver roots that removes itself unless
/// kept (renamed into place).
struct Staging<'a> {
    fs: &'a HostFs,
    /// Relative to the host root, for confined changes.
    rel: PathBuf,
    /// Its real path, for the extractor and for reading.
    path: PathBuf,
    /// The real path of the driver roots' directory.
    drivers: PathBuf,
    keep: bool,
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if !self.keep {
            if let Err(e) = self.fs.remove_all(&self.rel) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// `DRIVERS_DIR/<name>`, relative to the host root.
fn in_drivers(name: impl AsRef<Path>) -> PathBuf {
    Path::new(DRIVERS_DIR).join(name)
}

/// Removes a tree under the driver roots, saying why; a failure is logged
/// (a leftover is retried by the next run).
fn remove_logged(fs: &HostFs, name: &OsStr, why: &str) {
    let rel = in_drivers(name);
    tracing::info!("removing {} ({why})", fs.host().join(&rel).display());
    if let Err(e) = fs.remove_all(&rel) {
        tracing::warn!("{e}");
    }
}

/// Staging directories, moved-aside roots and temporary links of runs that
/// were killed; called with the host lock held, so none is in use.
fn remove_leftovers(fs: &HostFs) {
    let Ok(entries) = fs.read_dir(DRIVERS_DIR) else {
        return;
    };
    for (name, _) in entries {
        let text = name.to_string_lossy();
        // The extractor's temporary tree beside a staging directory is
        // `..staging-PID.partial-*`.
        if [STAGING_PREFIX, ".old-", ".current."]
            .iter()
            .any(|p| text.starts_with(p))
            || crate::extract::is_partial_name(&text)
        {
            remove_logged(fs, &name, "left by an interrupted run");
        }
    }
}

/// Keeps the current and the previous driver root (to go back to); older
/// roots go.
fn collect_garbage(fs: &HostFs, current: &str, previous: Option<&Path>) {
    let keep_prev = previous
        .and_then(|p| p.file_name())
        .map(|n| n.to_os_string());
    let Ok(entries) = fs.read_dir(DRIVERS_DIR) else {
        return;
    };
    for (name, kind) in entries {
        if name == "current"
            || name == current
            || keep_prev.as_ref() == Some(&name)
            || name.to_string_lossy().starts_with('.')
        {
            continue;
        }
        if kind == FsKind::Dir {
            remove_logged(fs, &name, "an old driver root");
        }
    }
}

/// A placed root still holds every module and user-space file of the
/// manifest with its sha256 (firmware moved under `nvidia/<version>`).
fn root_intact(dir: &Path, manifest: &Manifest) -> bool {
    manifest
        .entries()
        .into_iter()
        .filter(|e| !e.file.starts_with("firmware/"))
        .all(|e| {
            crate::files::sha256_file(&dir.join(e.file), LOCAL_IO)
                .is_ok_and(|(sum, _)| sum.eq_ignore_ascii_case(e.sha256))
        })
}

/// Gives the user space its modes and creates its links, in the staging
/// directory (`staged`, relative to the host root). Returns what was
/// placed.
fn place_user_space(fs: &HostFs, staged: &Path, manifest: &Manifest) -> Result<Vec<String>> {
    let mut placed = Vec::new();
    for e in &manifest.user_space {
        fs.set_mode(staged.join(&e.file), e.mode & 0o755)?;
        placed.push(e.file.clone());
    }
    for l in &manifest.links {
        fs.replace_symlink(staged.join(&l.file), &l.target)?;
        placed.push(l.file.clone());
    }
    Ok(placed)
}

/// Makes the current driver root's libraries visible on the host:
/// `ld.so.conf.d` entry, ldconfig, `/run/nvidia/driver`. Failures are
/// notes: the modules are loaded, and verify runs nvidia-smi with the
/// driver root's library path regardless.
fn register_user_space(run: &Run, st: &mut InstallStatus) {
    use crate::userspace::{self, LD_SO_CONF, RUN_NVIDIA_DRIVER};
    let current = in_drivers("current");
    let Some(us) = st.user_space.as_mut() else {
        return;
    };
    match userspace::write_ld_so_conf(&run.fs, &current) {
        Ok(()) => us.ld_so_conf = Some(LD_SO_CONF.to_string()),
        Err(e) => st
            .notes
            .push(format!("ld.so.conf.d entry not written: {e}")),
    }
    match userspace::run_ldconfig(run.root) {
        Ok(cmd) => us.ldconfig = Some(cmd),
        Err(e) => {
            us.ldconfig = Some(format!("failed: {e}"));
            st.notes.push(format!("ldconfig: {e}"));
        }
    }
    match userspace::expose_driver_root(&run.fs, &current) {
        Ok(how) => {
            us.run_nvidia_driver = Some(RUN_NVIDIA_DRIVER.to_string());
            if how == userspace::Exposure::Mounted {
                st.notes.push(format!(
                    "{RUN_NVIDIA_DRIVER} was a directory: the driver root is bind-mounted onto it (read-only, propagating to pods that mount it)"
                ));
            }
        }
        Err(e) => st.notes.push(format!("{RUN_NVIDIA_DRIVER}: {e}")),
    }
}

/// The device nodes NVIDIA's user space expects (what `nvidia-modprobe`
/// would create): `/dev/nvidiactl`, `/dev/nvidia<N>` per GPU,
/// `/dev/nvidia-modeset`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`.
pub fn device_nodes(
    majors: &BTreeMap<String, u32>,
    gpus: usize,
    modeset: bool,
) -> (Vec<(String, u32, u32)>, Vec<String>) {
    let mut notes = Vec::new();
    let nvidia = ["nvidia-frontend", "nvidia"]
        .iter()
        .find_map(|n| majors.get(*n).copied());
    let nvidia = nvidia.unwrap_or_else(|| {
        notes.push(format!(
            "/proc/devices lists no nvidia major; using NVIDIA's fixed {NVIDIA_MAJOR}"
        ));
        NVIDIA_MAJOR
    });
    let mut nodes = vec![("/dev/nvidiactl".to_string(), nvidia, NVIDIACTL_MINOR)];
    for i in 0..gpus {
        nodes.push((format!("/dev/nvidia{i}"), nvidia, i as u32));
    }
    if modeset {
        nodes.push((
            "/dev/nvidia-modeset".to_string(),
            nvidia,
            NVIDIA_MODESET_MINOR,
        ));
    }
    match majors.get("nvidia-uvm") {
        Some(&uvm) => {
            nodes.push(("/dev/nvidia-uvm".to_string(), uvm, 0));
            nodes.push(("/dev/nvidia-uvm-tools".to_string(), uvm, 1));
        }
        None => notes.push("/proc/devices lists no nvidia-uvm major: no UVM nodes".into()),
    }
    (nodes, notes)
}

/// The device nodes beyond the GPUs' own that the hardware needs, from
/// the majors the modules registered (`/proc/devices`):
/// `/dev/nvidia-nvswitchctl` and `/dev/nvidia-nvswitch<N>` per NVSwitch
/// (Fabric Manager opens them), `/dev/nvidia-nvlink`, and the MIG
/// capability nodes `/dev/nvidia-caps/nvidia-cap<M>` whose minors
/// `/proc/driver/nvidia/capabilities/mig/{config,monitor}` give. A major
/// the kernel did not register means that part is absent: no node.
pub fn extra_device_nodes(
    majors: &BTreeMap<String, u32>,
    nvswitches: usize,
    caps: &[u32],
) -> Vec<(String, u32, u32)> {
    let mut nodes = Vec::new();
    if let Some(&m) = majors.get("nvidia-nvswitch") {
        if nvswitches > 0 {
            nodes.push(("/dev/nvidia-nvswitchctl".to_string(), m, NVIDIACTL_MINOR));
            for i in 0..nvswitches {
                nodes.push((format!("/dev/nvidia-nvswitch{i}"), m, i as u32));
            }
        }
    }
    if let Some(&m) = majors.get("nvidia-nvlink") {
        nodes.push(("/dev/nvidia-nvlink".to_string(), m, 0));
    }
    if let Some(&m) = majors.get("nvidia-caps") {
        for &minor in caps {
            nodes.push((format!("/dev/nvidia-caps/nvidia-cap{minor}"), m, minor));
        }
    }
    nodes
}

/// `DeviceFileMinor: N` of a `/proc/driver/nvidia/capabilities/…` file.
pub fn parse_cap_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|l| {
        l.strip_prefix("DeviceFileMinor:")
            .and_then(|v| v.trim().parse().ok())
    })
}

/// The MIG capabilities' minors, where the driver publishes them.
fn mig_cap_minors(root: &HostRoot) -> Result<Vec<u32>> {
    let mut minors = Vec::new();
    for cap in ["config", "monitor"] {
        let path = root.kernel_path(&format!("/proc/driver/nvidia/capabilities/mig/{cap}"));
        if let Some(minor) = host::read_optional(&path)?
            .as_deref()
            .and_then(parse_cap_minor)
        {
            minors.push(minor);
        }
    }
    Ok(minors)
}

fn nvswitch_count(root: &HostRoot) -> Result<usize> {
    Ok(host::read_pci_devices(&host::pci_devices_dir(root))?
        .iter()
        .filter(|d| d.role() == PciRole::NvSwitch)
        .count())
}

fn gpu_count(root: &HostRoot) -> Result<usize> {
    Ok(host::read_pci_devices(&host::pci_devices_dir(root))?
        .iter()
        .filter(|d| d.role() == PciRole::Gpu)
        .count())
}

/// GSP firmware is requested as `nvidia/<version>/<file>`: flat
/// `firmware/<file>` entries are moved under that path, in the staging
/// directory (`staged`, relative to the host root).
fn arrange_firmware(fs: &HostFs, staged: &Path, manifest: &Manifest) -> Result<()> {
    let target = staged
        .join("firmware/nvidia")
        .join(&manifest.driver_version);
    for entry in &manifest.firmware {
        let rel = Path::new(&entry.file);
        if rel.starts_with("firmware/nvidia") {
            continue;
        }
        let Some(name) = rel.file_name() else {
            continue;
        };
        fs.create_dir_all(&target)?;
        fs.rename(staged.join(rel), target.join(name))?;
    }
    Ok(())
}

/// Writes a kernel parameter file: through the host root when it carries
/// that kernel interface (confined like every other write there), else
/// our own, which describes the same kernel (see
/// [`HostRoot::kernel_path`]).
fn write_kernel_param(run: &Run, rel: &str, value: &str) -> Result<()> {
    let path = run.root.kernel_path(rel);
    if path == run.root.join(rel) {
        run.fs.write_existing(rel, value.as_bytes())
    } else {
        fs::write(&path, value).map_err(|e| Error::io(LOCAL_IO, "writing", &path, e))
    }
}

// ------------------------------------------------------------ install

pub fn install(opts: &InstallOptions) -> InstallResult {
    let mut status = InstallStatus::new();
    status.outcome = match install_inner(opts, &mut status) {
        Ok(outcome) => outcome,
        Err(e) => Outcome::from(&e),
    };
    Document::new(Kind::InstallResult, install_spec(opts), status)
}

/// An install refused before it began (e.g. an unreadable
/// `--fabric-manager` archive).
pub fn install_refused(opts: &InstallOptions, e: &Error) -> InstallResult {
    install_failed(install_spec(opts), Outcome::from(e))
}

fn install_spec(opts: &InstallOptions) -> InstallSpec {
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

pub fn install_failed(spec: InstallSpec, outcome: Outcome) -> InstallResult {
    let mut status = InstallStatus::new();
    status.outcome = outcome;
    Document::new(Kind::InstallResult, spec, status)
}

/// What every step of one install reads.
struct Run<'a> {
    opts: &'a InstallOptions<'a>,
    root: &'a HostRoot,
    /// Every write under the host root goes through it.
    fs: HostFs,
    /// The kernel the modules must be built for.
    release: String,
    /// `--module-params`, by module.
    params: BTreeMap<String, String>,
}

struct Selected {
    info: ModInfo,
    /// Path inside the artifact (and the driver root).
    rel: String,
}

/// The modules to load: by name, and in load order.
struct Selection<'a> {
    order: Vec<String>,
    by_name: BTreeMap<&'a str, &'a Selected>,
}

/// The driver root in place.
struct Placed {
    name: String,
    /// As the host sees it: `/var/lib/gpu-driver/drivers/<name>`.
    host_dir: PathBuf,
    /// Its real path (links resolved inside the host root), for reading.
    real_dir: PathBuf,
    has_user_space: bool,
}

/// The steps, in order; the first failure ends the install. Each step
/// that changes the host is a rename of something complete, so a kill at
/// any point leaves `current` on a complete root (docs/install.md).
fn install_inner(opts: &InstallOptions, st: &mut InstallStatus) -> Result<Outcome> {
    check_root()?;
    let run = prepare(opts, st)?;
    let _lock = run.fs.lock(LOCK_PATH)?;
    let (staging, manifest) = unpack(&run, st)?;
    let all = check_vermagic(&run, &staging, &manifest, st)?;
    let sel = select(&run, &all, st);
    let same = find_conflicts(&run, &sel, st)?;
    let placed = place_root(&run, staging, &manifest, st)?;
    set_firmware_path(&run, &manifest, &placed, st);
    let loaded_now = load_modules(&run, &sel, &same, &placed, st)?;
    make_device_nodes(&run, &sel, st)?;
    crate::failpoint::hit("install:loaded");
    let switched = switch_current(&run, &placed, st)?;
    // A daemon running on the driver that was replaced must restart.
    start_services(&run, &placed, switched || !loaded_now.is_empty(), st)?;
    Ok(outcome(&run, &manifest, &placed, &same, &loaded_now, st))
}

/// The kernel release, the module parameters, the host root's handle.
fn prepare<'a>(opts: &'a InstallOptions<'a>, st: &mut InstallStatus) -> Result<Run<'a>> {
    let root = opts.root;
    let release = match &opts.kernel_release {
        Some(r) => r.clone(),
        None => host::read_kernel_release(root)?,
    };
    st.kernel_release = Some(release.clone());
    let given = match &opts.module_params {
        Some(p) => parse_module_params(
            &fs::read_to_string(p)
                .map_err(|e| Error::io(Reason::InvalidArgument, "reading", p, e))?,
        )?,
        None => BTreeMap::new(),
    };
    let params = merge_params(&opts.planned_params, given);
    Ok(Run {
        opts,
        root,
        fs: root.fs()?,
        release,
        params,
    })
}

/// Unpacks and checks the artifact in a staging directory beside the
/// driver roots (so that placing it is a rename).
fn unpack<'a>(run: &'a Run, st: &mut InstallStatus) -> Result<(Staging<'a>, Manifest)> {
    // The extractor writes with std::fs: it gets the real path, links
    // already resolved inside the host root.
    let drivers = run.fs.real_dir(DRIVERS_DIR)?;
    // Under the lock, anything half-made is a killed run's leftover.
    remove_leftovers(&run.fs);
    let name = format!("{STAGING_PREFIX}{}", std::process::id());
    let staging = Staging {
        fs: &run.fs,
        rel: in_drivers(&name),
        path: drivers.join(&name),
        drivers,
        keep: false,
    };
    run.fs.remove_all(&staging.rel)?;
    let manifest = artifact::unpack(&run.opts.artifact, &staging.path)?;
    st.driver_version = Some(manifest.driver_version.clone());
    st.flavor = Some(manifest.flavor);
    Ok((staging, manifest))
}

/// Every module's vermagic must name the running kernel, before anything
/// is placed or loaded.
fn check_vermagic(
    run: &Run,
    staging: &Staging,
    manifest: &Manifest,
    st: &mut InstallStatus,
) -> Result<Vec<Selected>> {
    let mut all = Vec::new();
    for entry in &manifest.modules {
        let path = staging.path.join(&entry.file);
        let info =
            modinfo::read_modinfo(&path).map_err(|e| e.into_error(Reason::ArtifactInvalid))?;
        all.push(Selected {
            info,
            rel: entry.file.clone(),
        });
    }
    let release = &run.release;
    let wrong: Vec<String> = all
        .iter()
        .filter(|m| m.info.vermagic_release() != release)
        .map(|m| format!("{} is for {:?}", m.info.name, m.info.vermagic_release()))
        .collect();
    for m in &all {
        st.modules.push(ModuleState {
            name: m.info.name.clone(),
            file: Some(m.rel.clone()),
            vermagic: Some(m.info.vermagic.trim().to_string()),
            version: m.info.version.clone(),
            action: ModuleAction::NotLoaded,
            params: run.params.get(&m.info.name).cloned(),
            errno: None,
        });
    }
    if !wrong.is_empty() {
        return Err(Error::new(
            Reason::VermagicMismatch,
            format!(
                "the running kernel is {release}, but {} (artifact built for {}); nothing was loaded",
                wrong.join(", "),
                manifest.kernel_release
            ),
        )
        .with_hint("build the modules for this kernel (gpu-driver-installer build)"));
    }
    Ok(all)
}

/// The modules to load (`--drm`, `--peermem`) and their order.
fn select<'a>(run: &Run, all: &'a [Selected], st: &mut InstallStatus) -> Selection<'a> {
    let opts = run.opts;
    let skip =
        |n: &str| (n == "nvidia_drm" && !opts.drm) || (n == "nvidia_peermem" && !opts.peermem);
    let selected: Vec<&Selected> = all.iter().filter(|m| !skip(&m.info.name)).collect();
    for s in st.modules.iter_mut().filter(|s| skip(&s.name)) {
        s.action = ModuleAction::Skipped;
    }
    let order = load_order(
        &selected
            .iter()
            .map(|m| (m.info.name.clone(), m.info.depends.clone()))
            .collect::<Vec<_>>(),
    );
    let by_name = selected
        .iter()
        .map(|m| (m.info.name.as_str(), *m))
        .collect();
    Selection { order, by_name }
}

/// What is loaded already: the same version is left alone (returned);
/// another version of the stack, or nouveau, is unloaded when unused.
fn find_conflicts(run: &Run, sel: &Selection, st: &mut InstallStatus) -> Result<BTreeSet<String>> {
    let loaded = read_modules(run.root)?;
    let mut same = BTreeSet::new();
    let mut conflicting = BTreeSet::new();
    for m in sel.by_name.values() {
        if loaded.contains_key(&m.info.name) {
            if same_as_loaded(run.root, &m.info) {
                same.insert(m.info.name.clone());
            } else {
                conflicting.insert(m.info.name.clone());
            }
        }
    }
    if conflicting.contains("nvidia") {
        // The core goes, so everything stacked on it goes too.
        for n in NVIDIA_STACK {
            if loaded.contains_key(*n) {
                conflicting.insert((*n).to_string());
                same.remove(*n);
            }
        }
    }
    if sel.by_name.contains_key("nvidia") && loaded.contains_key("nouveau") {
        conflicting.insert("nouveau".into());
    }
    if !conflicting.is_empty() {
        // Our daemons hold the driver open; stopped first, and started
        // again on the new driver after the switch.
        let notes = crate::fabric::stop_ours(&run.fs, crate::fabric::host_systemd(run.root));
        let loaded = if notes.is_empty() {
            loaded
        } else {
            read_modules(run.root)?
        };
        st.notes.extend(notes);
        let busy = in_use(&conflicting, &loaded);
        if !busy.is_empty() && !run.opts.force {
            return Err(Error::new(
                Reason::DriverInUse,
                format!(
                    "another driver is loaded and in use: {}",
                    busy.join("; ")
                ),
            )
            .with_hint(
                "stop what uses the GPUs (pods, nvidia-persistenced, dcgm) or drain the node; --force tries the unload anyway",
            ));
        }
        st.replaced = unload_all(&conflicting, &loaded)?;
    }
    Ok(same)
}

/// Renames the staging directory to the driver root (modules load from
/// there). Its name carries the manifest's hash, so a root is never
/// replaced in place: a kill -9 at any point leaves `current` pointing at
/// a complete root.
fn place_root(
    run: &Run,
    mut staging: Staging,
    manifest: &Manifest,
    st: &mut InstallStatus,
) -> Result<Placed> {
    crate::failpoint::hit("install:staged");
    let manifest_sum = crate::files::sha256_file(&staging.path.join("manifest.json"), LOCAL_IO)
        .map(|(sum, _)| sum)
        .map_err(|e| Error::new(Reason::ArtifactInvalid, e.message))?;
    let mut name = format!(
        "{}-{}-{}-{}",
        manifest.driver_version,
        manifest.flavor,
        run.release,
        &manifest_sum[..12.min(manifest_sum.len())]
    );
    arrange_firmware(&run.fs, &staging.rel, manifest)?;
    let files = place_user_space(&run.fs, &staging.rel, manifest)?;
    if let Some(fm) = &run.opts.fabric_manager {
        // A root is never changed in place: one with Fabric Manager is
        // another root, named after its archive too.
        name.push_str(&format!("-fm{}", &fm.sha256[..8.min(fm.sha256.len())]));
        place_fabric_manager(fm, &staging, manifest, st)?;
    }
    let has_user_space = staging
        .path
        .join(crate::userspace::BIN_DIR)
        .join("nvidia-smi")
        .is_file();
    let host_dir = in_drivers(&name);
    let real_dir = staging.drivers.join(&name);
    let fm_intact =
        run.opts.fabric_manager.is_none() || real_dir.join(crate::fabric::FM_BINARY).is_file();
    if real_dir.is_dir() && root_intact(&real_dir, manifest) && fm_intact {
        // The same artifact was placed before (maybe by a run that was
        // killed later): keep it, it may be in use.
        tracing::info!("{} is already in place", real_dir.display());
    } else {
        if run.fs.kind(&host_dir)?.is_some() {
            let old = in_drivers(format!(".old-{name}-{}", std::process::id()));
            run.fs.rename(&host_dir, &old)?;
            st.notes.push(format!(
                "{} was damaged and is replaced",
                run.root.join(&host_dir).display()
            ));
        }
        run.fs.rename(&staging.rel, &host_dir)?;
        staging.keep = true;
    }
    crate::failpoint::hit("install:placed");
    st.driver_root = Some(host_dir.display().to_string());
    st.user_space = Some(user_space_status(has_user_space, &host_dir, files));
    Ok(Placed {
        name,
        host_dir,
        real_dir,
        has_user_space,
    })
}

/// Fabric Manager's files into the staging root; its version must be the
/// driver's (it refuses to run against another).
fn place_fabric_manager(
    fm: &FabricManagerArchive,
    staging: &Staging,
    manifest: &Manifest,
    st: &mut InstallStatus,
) -> Result<()> {
    if fm.version != manifest.driver_version {
        return Err(Error::new(
            Reason::FabricManagerFailed,
            format!(
                "Fabric Manager {} does not match driver {}; it refuses to run against another driver version",
                fm.version, manifest.driver_version
            ),
        ));
    }
    let files = crate::fabric::place_archive(&fm.path, &staging.path)?;
    st.fabric_manager = Some(FabricManagerState {
        version: fm.version.clone(),
        archive: fm.path.display().to_string(),
        files,
    });
    Ok(())
}

fn user_space_status(present: bool, host_dir: &Path, files: Vec<String>) -> UserSpace {
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

/// Points the kernel's firmware search path at the driver root's
/// `firmware` directory; a failure is a note.
fn set_firmware_path(run: &Run, manifest: &Manifest, placed: &Placed, st: &mut InstallStatus) {
    if manifest.firmware.is_empty() {
        return;
    }
    let fw = placed.host_dir.join("firmware").display().to_string();
    match write_kernel_param(run, "/sys/module/firmware_class/parameters/path", &fw) {
        Ok(()) => st.firmware_path = Some(fw),
        Err(e) => st.notes.push(format!("firmware path not set: {e}")),
    }
}

/// `finit_module` in order; returns what this run loaded. A refusal
/// unloads what this run loaded before it.
fn load_modules(
    run: &Run,
    sel: &Selection,
    same: &BTreeSet<String>,
    placed: &Placed,
    st: &mut InstallStatus,
) -> Result<Vec<String>> {
    let mut loaded_now: Vec<String> = Vec::new();
    let loads_nvidia = sel.by_name.contains_key("nvidia") && !same.contains("nvidia");
    if run.opts.iommu_passthrough && loads_nvidia {
        st.notes.extend(iommu_passthrough(run.root)?);
    }
    for name in &sel.order {
        let Some(m) = sel.by_name.get(name.as_str()) else {
            continue;
        };
        if same.contains(name) {
            set_action(st, name, ModuleAction::AlreadyLoaded);
            continue;
        }
        if let Err(e) = load_dependencies(run, sel, m) {
            rollback(&loaded_now, st);
            return Err(e);
        }
        load_one(run, m, placed, &mut loaded_now, st)?;
    }
    Ok(loaded_now)
}

/// The plan's module parameters, then the `--module-params` file's after
/// them: the kernel takes the last value of a repeated key, so the file
/// overrides the plan.
pub fn merge_params(
    planned: &BTreeMap<String, String>,
    given: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut params = planned.clone();
    for (module, p) in given {
        let joined = match params.remove(&module) {
            Some(planned) => format!("{planned} {p}"),
            None => p,
        };
        params.insert(module, joined);
    }
    params
}

/// Switches each NVIDIA GPU's IOMMU group to passthrough (`identity`)
/// before `nvidia` binds, where it is not already; returns what it did.
/// A group that refuses is noted, not fatal: the load then says whether it
/// mattered.
pub fn iommu_passthrough(root: &HostRoot) -> Result<Vec<String>> {
    let fs = root.fs()?;
    let mut notes = Vec::new();
    for dev in host::read_pci_devices(&host::pci_devices_dir(root))? {
        if dev.role() != PciRole::Gpu {
            continue;
        }
        let rel = format!("/sys/bus/pci/devices/{}/iommu_group/type", dev.address);
        let path = root.kernel_path(&rel);
        let Some(current) = host::read_optional(&path)? else {
            continue; // no IOMMU, or no group: nothing to switch
        };
        let current = current.trim().to_string();
        if current == "identity" {
            continue;
        }
        let written = if path == root.join(&rel) {
            fs.write_existing(&rel, b"identity")
        } else {
            fs::write(&path, "identity").map_err(|e| Error::io(LOCAL_IO, "writing", &path, e))
        };
        notes.push(match written {
            Ok(()) => format!("IOMMU group of {}: {current} -> identity", dev.address),
            Err(e) => format!(
                "IOMMU group of {} stays {current}: {}",
                dev.address, e.message
            ),
        });
    }
    Ok(notes)
}

fn set_action(st: &mut InstallStatus, name: &str, action: ModuleAction) {
    if let Some(s) = st.modules.iter_mut().find(|s| s.name == name) {
        s.action = action;
    }
}

/// Dependencies outside the artifact (drm and drm_kms_helper for
/// nvidia-drm, ib_core for peermem, …) must be loaded already, else each
/// is modprobe'd, in the order `.modinfo` lists them.
fn load_dependencies(run: &Run, sel: &Selection, m: &Selected) -> Result<()> {
    let now = read_modules(run.root)?;
    let missing = m
        .info
        .depends
        .iter()
        .filter(|d| !sel.by_name.contains_key(d.as_str()) && !now.contains_key(*d));
    for dep in missing {
        if let Err(e) = modprobe(run.root, dep) {
            return Err(Error::new(
                Reason::ModuleLoadFailed,
                format!(
                    "{} depends on {dep}, which is not loaded, and modprobe {dep} failed: {e}",
                    m.info.name
                ),
            ));
        }
    }
    Ok(())
}

/// Loads one module from the driver root. A refusal quotes the kernel log
/// records written meanwhile and rolls back `loaded_now`.
fn load_one(
    run: &Run,
    m: &Selected,
    placed: &Placed,
    loaded_now: &mut Vec<String>,
    st: &mut InstallStatus,
) -> Result<()> {
    let name = &m.info.name;
    let param = run.params.get(name).cloned().unwrap_or_default();
    let cparam = CString::new(param).map_err(|_| {
        Error::new(
            Reason::InvalidArgument,
            format!("parameters of {name} contain NUL"),
        )
    })?;
    // From the driver root: the staging directory was renamed to it.
    let path = placed.real_dir.join(&m.rel);
    let file = File::open(&path).map_err(|e| Error::io(LOCAL_IO, "opening", &path, e))?;
    let mut log = KernelLog::open(&run.root.kernel_path("/dev/kmsg"));
    tracing::info!("loading {name} from {}", path.display());
    match nix::kmod::finit_module(&file, &cparam, ModuleInitFlags::empty()) {
        Ok(()) | Err(Errno::EEXIST) => {
            loaded_now.push(name.clone());
            set_action(st, name, ModuleAction::Loaded);
            Ok(())
        }
        Err(e) => {
            let lines = log.read_new();
            if let Some(s) = st.modules.iter_mut().find(|s| &s.name == name) {
                s.action = ModuleAction::Failed;
                s.errno = Some(format!("{e:?}"));
            }
            st.kernel_log = lines.clone();
            rollback(loaded_now, st);
            let kernel = if lines.is_empty() {
                "the kernel logged nothing".to_string()
            } else {
                format!("kernel log: {}", lines.join(" | "))
            };
            Err(Error::new(
                Reason::ModuleLoadFailed,
                format!(
                    "loading {name} ({}): {}; {kernel}",
                    placed.host_dir.join(&m.rel).display(),
                    errno_text(e)
                ),
            ))
        }
    }
}

/// `/dev/nvidia*` from `/proc/devices` (only when the artifact has
/// `nvidia`), created inside the host root.
fn make_device_nodes(run: &Run, sel: &Selection, st: &mut InstallStatus) -> Result<()> {
    if !sel.by_name.contains_key("nvidia") {
        return Ok(());
    }
    let devices = run.root.kernel_path("/proc/devices");
    let majors = match host::read_optional(&devices)? {
        Some(t) => parse_char_majors(&t)?,
        None => BTreeMap::new(),
    };
    let modeset = sel.by_name.contains_key("nvidia_modeset");
    let (mut nodes, notes) = device_nodes(&majors, gpu_count(run.root)?, modeset);
    st.notes.extend(notes);
    nodes.extend(extra_device_nodes(
        &majors,
        nvswitch_count(run.root)?,
        &mig_cap_minors(run.root)?,
    ));
    for (path, major, minor) in nodes {
        run.fs.mknod_char(&path, major, minor, 0o666)?;
        st.device_nodes.push(path);
    }
    Ok(())
}

/// `drivers/current` → the new root, by renaming a fresh link over it;
/// then the user space is registered and old roots go.
/// Returns whether `current` named another root before.
fn switch_current(run: &Run, placed: &Placed, st: &mut InstallStatus) -> Result<bool> {
    let current = in_drivers("current");
    let previous = run.fs.read_link(&current).ok();
    let switched = previous.as_deref() != Some(Path::new(&placed.name));
    run.fs.replace_symlink(&current, &placed.name)?;
    crate::failpoint::hit("install:switched");
    if placed.has_user_space {
        register_user_space(run, st);
    }
    collect_garbage(&run.fs, &placed.name, previous.as_deref());
    Ok(switched)
}

/// Writes and enables the units of the daemons the root carries (Fabric
/// Manager when placed; nvidia-persistenced when planned and present),
/// then (re)starts them in the host's namespace. Fabric Manager's failure
/// is `FabricManagerFailed` (CUDA does not work without it);
/// persistenced's is a note (it only keeps the driver initialized).
fn start_services(run: &Run, placed: &Placed, restart: bool, st: &mut InstallStatus) -> Result<()> {
    use crate::fabric::{self, FABRIC_MANAGER_UNIT, PERSISTENCED_UNIT};
    let how = fabric::host_systemd(run.root);
    if st.fabric_manager.is_some() {
        let unit_file =
            fabric::write_unit(&run.fs, FABRIC_MANAGER_UNIT, &fabric::fabric_manager_unit())?;
        let config =
            fs::read_to_string(placed.real_dir.join(fabric::FM_CONFIG)).unwrap_or_default();
        let log_tail = |_: &str| fabric::config_log_tail(run.root, &config);
        let started = fabric::start_units(how, &[FABRIC_MANAGER_UNIT], restart, &log_tail)?;
        st.services
            .push(service_state(FABRIC_MANAGER_UNIT, unit_file, how, &started));
    }
    let has_persistenced = placed.real_dir.join(fabric::PERSISTENCED_BINARY).is_file();
    if run.opts.persistenced && has_persistenced {
        let started = fabric::write_unit(&run.fs, PERSISTENCED_UNIT, &fabric::persistenced_unit())
            .and_then(|f| {
                Ok((
                    f,
                    fabric::start_units(how, &[PERSISTENCED_UNIT], restart, &|_| None)?,
                ))
            });
        match started {
            Ok((f, started)) => {
                st.services
                    .push(service_state(PERSISTENCED_UNIT, f, how, &started))
            }
            Err(e) => st.notes.push(format!("nvidia-persistenced: {}", e.message)),
        }
    } else if run.opts.persistenced {
        st.notes.push(format!(
            "nvidia-persistenced was planned, but the driver root has no {}: the package had none",
            fabric::PERSISTENCED_BINARY
        ));
    }
    if how == fabric::HostSystemd::Unreachable && !st.services.is_empty() {
        st.notes.push(format!(
            "the units are written and enabled but not started: the host's systemd cannot be reached from the host root {} (only / and /proc/1/root with hostPID can); they start at the next boot, or by an install run in the host's namespace",
            run.root.path().display()
        ));
    }
    Ok(())
}

fn service_state(
    unit: &str,
    unit_file: String,
    how: crate::fabric::HostSystemd,
    started: &crate::fabric::Started,
) -> ServiceState {
    ServiceState {
        unit: unit.to_string(),
        unit_file,
        enabled: true,
        started: (how != crate::fabric::HostSystemd::Unreachable)
            .then(|| started.commands.last().cloned())
            .flatten(),
    }
}

fn outcome(
    run: &Run,
    manifest: &Manifest,
    placed: &Placed,
    same: &BTreeSet<String>,
    loaded_now: &[String],
    st: &InstallStatus,
) -> Outcome {
    if loaded_now.is_empty() {
        return Outcome::new(
            Reason::AlreadyInstalled,
            format!(
                "{} {} is already loaded ({}); nothing was reloaded",
                manifest.driver_version,
                manifest.flavor,
                same.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        );
    }
    let mut msg = format!(
        "loaded {} ({} {} for {}) from {}",
        loaded_now.join(", "),
        manifest.driver_version,
        manifest.flavor,
        run.release,
        placed.host_dir.display()
    );
    if !st.replaced.is_empty() {
        msg.push_str(&format!("; unloaded first: {}", st.replaced.join(", ")));
    }
    if !placed.has_user_space {
        msg.push_str("; the artifact has no user space (nvidia-smi): install it separately");
    }
    Outcome::new(Reason::Installed, msg)
}

/// Unloads what this run loaded, newest first, so that a failed install
/// leaves the kernel as it found it.
fn rollback(loaded_now: &[String], st: &mut InstallStatus) {
    for name in loaded_now.iter().rev() {
        match unload(name) {
            Ok(()) => set_action(st, name, ModuleAction::RolledBack),
            Err(e) => st
                .notes
                .push(format!("rolling back {name}: {}", errno_text(e))),
        }
    }
}

/// `modprobe DEP` for a dependency from the host's own module tree.
fn modprobe(root: &HostRoot, dep: &str) -> Result<()> {
    let mut cmd = crate::process::command("modprobe");
    if root.path() != Path::new("/") {
        cmd.arg("-d").arg(root.path());
    }
    cmd.arg(dep);
    crate::process::run(&mut cmd, Reason::ModuleLoadFailed).map(drop)
}

// ------------------------------------------------------------ uninstall

pub fn uninstall(opts: &UninstallOptions) -> InstallResult {
    let spec = InstallSpec {
        action: Action::Uninstall,
        host_root: opts.root.path().display().to_string(),
        artifact: None,
        kernel_release_override: None,
        module_params: None,
        modules: opts.modules.clone(),
        drm: true,
        peermem: true,
        force: opts.force,
    };
    let mut status = InstallStatus::new();
    status.outcome = match uninstall_inner(opts, &mut status) {
        Ok(o) => o,
        Err(e) => Outcome::from(&e),
    };
    Document::new(Kind::InstallResult, spec, status)
}

fn uninstall_inner(opts: &UninstallOptions, st: &mut InstallStatus) -> Result<Outcome> {
    check_root()?;
    let root = opts.root;
    let _lock = root.fs()?.lock(LOCK_PATH)?;
    let wanted: Vec<String> = if opts.modules.is_empty() {
        NVIDIA_STACK.iter().map(|s| s.to_string()).collect()
    } else {
        opts.modules.iter().map(|m| m.replace('-', "_")).collect()
    };
    let mut loaded = read_modules(root)?;
    if wanted.iter().any(|n| n == "nvidia") && loaded.contains_key("nvidia") {
        // Our daemons hold the driver open; enabled, they start again
        // with the next install.
        let notes = crate::fabric::stop_ours(&root.fs()?, crate::fabric::host_systemd(root));
        if !notes.is_empty() {
            loaded = read_modules(root)?;
        }
        st.notes.extend(notes);
    }
    let set: BTreeSet<String> = wanted
        .iter()
        .filter(|n| loaded.contains_key(*n))
        .cloned()
        .collect();
    if set.is_empty() {
        return Ok(Outcome::new(
            Reason::Uninstalled,
            format!("none of {} is loaded; nothing to do", wanted.join(", ")),
        ));
    }
    let busy = in_use(&set, &loaded);
    if !busy.is_empty() && !opts.force {
        return Err(
            Error::new(Reason::DriverInUse, format!("in use: {}", busy.join("; ")))
                .with_hint("stop what uses it first; --force tries the unload anyway"),
        );
    }
    let done = unload_all(&set, &loaded)?;
    for name in &done {
        st.modules.push(ModuleState {
            name: name.clone(),
            file: None,
            vermagic: None,
            version: None,
            action: ModuleAction::Unloaded,
            params: None,
            errno: None,
        });
    }
    Ok(Outcome::new(
        Reason::Uninstalled,
        format!("unloaded {}", done.join(", ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn km(name: &str, refcount: i32, used_by: &[&str]) -> (String, KernelModule) {
        (
            name.to_string(),
            KernelModule {
                name: name.to_string(),
                refcount,
                used_by: used_by.iter().map(|s| s.to_string()).collect(),
            },
        )
    }

    #[test]
    fn module_params_file() {
        let p = parse_module_params(
            "# comment\nnvidia NVreg_OpenRmEnableUnsupportedGpus=1 NVreg_EnableGpuFirmware=1\n\nnvidia-drm modeset=1 # kms\nnvidia NVreg_X=2\n",
        )
        .unwrap();
        assert_eq!(
            p["nvidia"],
            "NVreg_OpenRmEnableUnsupportedGpus=1 NVreg_EnableGpuFirmware=1 NVreg_X=2"
        );
        assert_eq!(p["nvidia_drm"], "modeset=1");
        let e = parse_module_params("nvidia\n").unwrap_err();
        assert!(e.message.contains("line 1"), "{e}");
        assert!(parse_module_params("nvidia =1\n").is_err());
    }

    #[test]
    fn load_order_follows_dependencies_then_nvidia_order() {
        let mods = vec![
            (
                "nvidia_drm".to_string(),
                vec!["nvidia_modeset".into(), "drm".into()],
            ),
            ("nvidia_uvm".to_string(), vec!["nvidia".into()]),
            ("nvidia_modeset".to_string(), vec!["nvidia".into()]),
            ("nvidia".to_string(), vec![]),
            ("hello".to_string(), vec![]),
        ];
        assert_eq!(
            load_order(&mods),
            [
                "nvidia",
                "nvidia_uvm",
                "nvidia_modeset",
                "nvidia_drm",
                "hello"
            ]
        );
        // A dependency listed later is still loaded first.
        let mods = vec![
            ("a".to_string(), vec!["b".into()]),
            ("b".to_string(), vec![]),
        ];
        assert_eq!(load_order(&mods), ["b", "a"]);
    }

    #[test]
    fn unload_order_and_in_use() {
        let loaded: BTreeMap<_, _> = [
            km("nvidia", 2, &["nvidia_uvm", "nvidia_modeset"]),
            km("nvidia_uvm", 0, &[]),
            km("nvidia_modeset", 1, &["nvidia_drm"]),
            km("nvidia_drm", 0, &[]),
        ]
        .into_iter()
        .collect();
        let set: BTreeSet<String> = loaded.keys().cloned().collect();
        let order = unload_order(&set, &loaded);
        assert_eq!(
            order,
            ["nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]
        );
        assert!(in_use(&set, &loaded).is_empty());
        // An open /dev/nvidia0 raises nvidia's refcount above its holders.
        let mut busy = loaded.clone();
        busy.insert(
            "nvidia".into(),
            km("nvidia", 5, &["nvidia_uvm", "nvidia_modeset"]).1,
        );
        let u = in_use(&set, &busy);
        assert_eq!(u.len(), 1);
        assert!(u[0].contains("refcount 5"), "{u:?}");
        // A holder outside the set.
        let only_core: BTreeSet<String> = ["nvidia".to_string()].into();
        assert!(in_use(&only_core, &loaded)[0].contains("used by nvidia_uvm, nvidia_modeset"));
    }

    #[test]
    fn proc_devices_and_nodes() {
        // Layout of /proc/devices as fs/proc/devices.c prints it; the
        // NVIDIA names are what the modules register (written here, not
        // captured from a GPU machine).
        let text = "Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia-frontend\n511 nvidia-uvm\n\nBlock devices:\n  8 sd\n";
        let majors = parse_char_majors(text).unwrap();
        assert_eq!(majors["nvidia-uvm"], 511);
        let (nodes, notes) = device_nodes(&majors, 2, true);
        assert!(notes.is_empty());
        assert_eq!(
            nodes,
            vec![
                ("/dev/nvidiactl".to_string(), 195, 255),
                ("/dev/nvidia0".to_string(), 195, 0),
                ("/dev/nvidia1".to_string(), 195, 1),
                ("/dev/nvidia-modeset".to_string(), 195, 254),
                ("/dev/nvidia-uvm".to_string(), 511, 0),
                ("/dev/nvidia-uvm-tools".to_string(), 511, 1),
            ]
        );
        let (nodes, notes) = device_nodes(&BTreeMap::new(), 1, false);
        assert_eq!(nodes.len(), 2);
        assert_eq!(notes.len(), 2);
    }

    #[test]
    fn the_module_params_file_comes_after_the_plans() {
        let planned = BTreeMap::from([("nvidia_uvm".to_string(), "uvm_disable_hmm=1".to_string())]);
        let given =
            parse_module_params("nvidia_uvm uvm_disable_hmm=0\nnvidia NVreg_X=1\n").unwrap();
        let p = merge_params(&planned, given);
        assert_eq!(p["nvidia_uvm"], "uvm_disable_hmm=1 uvm_disable_hmm=0");
        assert_eq!(p["nvidia"], "NVreg_X=1");
        assert_eq!(merge_params(&planned, BTreeMap::new()), planned);
    }

    #[test]
    fn nvswitch_nvlink_and_mig_capability_nodes() {
        // An HGX board: majors as the modules register them (names from
        // NVIDIA's open modules: nvswitch, nvlink core, caps).
        let text = "Character devices:\n195 nvidia-frontend\n234 nvidia-caps\n235 nvidia-nvswitch\n236 nvidia-nvlink\n511 nvidia-uvm\n";
        let majors = parse_char_majors(text).unwrap();
        let caps = [
            parse_cap_minor("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
                .unwrap(),
            parse_cap_minor("DeviceFileMinor: 2\nDeviceFileMode: 292\n").unwrap(),
        ];
        let nodes = extra_device_nodes(&majors, 2, &caps);
        assert_eq!(
            nodes,
            vec![
                ("/dev/nvidia-nvswitchctl".to_string(), 235, 255),
                ("/dev/nvidia-nvswitch0".to_string(), 235, 0),
                ("/dev/nvidia-nvswitch1".to_string(), 235, 1),
                ("/dev/nvidia-nvlink".to_string(), 236, 0),
                ("/dev/nvidia-caps/nvidia-cap1".to_string(), 234, 1),
                ("/dev/nvidia-caps/nvidia-cap2".to_string(), 234, 2),
            ]
        );
        // A PCIe card: no NVSwitch, no caps published, no nvlink major.
        let plain = parse_char_majors("Character devices:\n195 nvidia\n").unwrap();
        assert!(extra_device_nodes(&plain, 0, &[]).is_empty());
        assert_eq!(parse_cap_minor("garbage"), None);
    }

    #[test]
    fn kmsg_records() {
        assert_eq!(
            parse_kmsg_record("4,1234,5678901,-;NVRM: No NVIDIA GPU found.\n"),
            Some("NVRM: No NVIDIA GPU found.".into())
        );
        assert_eq!(
            parse_kmsg_record("6,1,2,-;usb 1-1: new device\n SUBSYSTEM=usb\n DEVICE=c189:1\n"),
            Some("usb 1-1: new device".into())
        );
        assert_eq!(parse_kmsg_record("garbage"), None);
    }

    #[test]
    fn all_modules_parse() {
        let m = parse_all_modules(
            "hello 16384 0 - Live 0x0000000000000000\nnvidia 60743680 1 nvidia_uvm, Live 0x0\n",
        )
        .unwrap();
        assert_eq!(m["hello"].refcount, 0);
        assert!(m["hello"].used_by.is_empty());
        assert_eq!(m["nvidia"].used_by, ["nvidia_uvm"]);
    }
}

#[cfg(test)]
mod iommu_tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A host root with NVIDIA GPUs at 04.0 (group 7, DMA), 05.0 (group 8,
    /// already identity) and 06.0 (no IOMMU group), laid out as sysfs is:
    /// `iommu_group` a relative link into /sys/kernel/iommu_groups.
    fn host() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        fs::create_dir_all(r.join("sys/bus/pci/devices")).unwrap();
        for (slot, group, kind) in [
            ("04", Some(7), "DMA"),
            ("05", Some(8), "identity"),
            ("06", None, ""),
        ] {
            let addr = format!("0000:00:{slot}.0");
            let dev = r.join("sys/devices/pci0000:00").join(&addr);
            fs::create_dir_all(&dev).unwrap();
            fs::write(dev.join("vendor"), "0x10de\n").unwrap();
            fs::write(dev.join("device"), "0x2901\n").unwrap();
            fs::write(dev.join("class"), "0x030200\n").unwrap();
            symlink(
                format!("../../../devices/pci0000:00/{addr}"),
                r.join("sys/bus/pci/devices").join(&addr),
            )
            .unwrap();
            if let Some(g) = group {
                let gdir = r.join(format!("sys/kernel/iommu_groups/{g}"));
                fs::create_dir_all(&gdir).unwrap();
                fs::write(gdir.join("type"), format!("{kind}\n")).unwrap();
                symlink(
                    format!("../../../kernel/iommu_groups/{g}"),
                    dev.join("iommu_group"),
                )
                .unwrap();
            }
        }
        dir
    }

    #[test]
    fn gpu_iommu_groups_go_to_passthrough_before_the_load() {
        let dir = host();
        let root = HostRoot::new(dir.path(), host::HostRootSource::Flag);
        let notes = iommu_passthrough(&root).unwrap();
        assert_eq!(
            notes,
            vec!["IOMMU group of 0000:00:04.0: DMA -> identity".to_string()]
        );
        let t = |g: u32| {
            fs::read_to_string(dir.path().join(format!("sys/kernel/iommu_groups/{g}/type")))
                .unwrap()
        };
        assert_eq!(t(7), "identity");
        assert_eq!(t(8).trim(), "identity");
        // Done once: nothing more to switch.
        assert!(iommu_passthrough(&root).unwrap().is_empty());
    }
}
