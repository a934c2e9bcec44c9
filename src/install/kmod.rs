//! Kernel modules: what `/proc/modules` lists, the load and unload
//! order, loading one file (`finit_module`) and reading the kernel's log
//! records written meanwhile (`/dev/kmsg`) for a refusal, unloading, and
//! the module parameters.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::kmod::{DeleteModuleFlags, ModuleInitFlags};

use super::documents::{InstallStatus, ModuleAction};
use crate::error::{Error, Failure, Result};
use crate::host_root::HostRoot;
use crate::modinfo::ModInfo;
use crate::node;

/// NVIDIA's modules in load order; unloading goes the other way.
pub(super) const NVIDIA_STACK: &[&str] = &[
    "nvidia",
    "nvidia_uvm",
    "nvidia_modeset",
    "nvidia_drm",
    "nvidia_peermem",
];

/// The `--module-params` file: small text, read bounded. It is named by a
/// flag of a privileged Job, so its content is never quoted in a message.
pub(super) const MODULE_PARAMS: crate::named_file::Named = crate::named_file::Named {
    what: "the module parameters file (--module-params)",
    max: 64 << 10,
    reason: Failure::InvalidArgument,
    hint: "--module-params takes a small text file of `module key=value ...` lines",
};

/// A malformed line of the `--module-params` file: its number only, never
/// its text (the file may be one that was never meant to be read, such as
/// `/proc/self/environ`).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BadLine {
    pub line: usize,
    pub what: &'static str,
}

impl BadLine {
    /// The error naming `path` and the line.
    pub(super) fn in_file(&self, path: &std::path::Path) -> Error {
        Error::new(
            Failure::InvalidArgument,
            format!(
                "{} {}: line {} {}",
                MODULE_PARAMS.what,
                path.display(),
                self.line,
                self.what
            ),
        )
        .with_hint(MODULE_PARAMS.hint)
    }
}

/// `--module-params`: `module key=value [key=value …]` lines; `#` starts a
/// comment. Module names are normalized (`nvidia-drm` → `nvidia_drm`); lines
/// for the same module add up.
pub(super) fn parse_module_params(
    text: &str,
) -> std::result::Result<BTreeMap<String, String>, BadLine> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (n, raw) in text.lines().enumerate() {
        let bad = |what| BadLine { line: n + 1, what };
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let module = words.next().unwrap_or_default().replace('-', "_");
        if !module
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(bad("does not start with a module name"));
        }
        let params: Vec<String> = words.map(str::to_string).collect();
        if params.is_empty() {
            return Err(bad("has no key=value"));
        }
        if params
            .iter()
            .any(|p| !p.contains('=') || p.starts_with('='))
        {
            return Err(bad("holds a word that is not key=value"));
        }
        out.entry(module).or_default().extend(params);
    }
    Ok(out.into_iter().map(|(k, v)| (k, v.join(" "))).collect())
}

/// One line of `/proc/modules`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KernelModule {
    pub(super) name: String,
    pub(super) refcount: i32,
    pub(super) used_by: Vec<String>,
}

/// Every module in `/proc/modules` (unlike [`crate::node::parse_proc_modules`],
/// which keeps only NVIDIA's and nouveau).
pub(super) fn parse_all_modules(text: &str) -> Result<BTreeMap<String, KernelModule>> {
    use procfs::FromBufRead;
    let mods = procfs::KernelModules::from_buf_read(text.as_bytes()).map_err(|e| {
        Error::new(
            Failure::HostReadFailed,
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

pub(super) fn read_modules(root: &HostRoot) -> Result<BTreeMap<String, KernelModule>> {
    let path = root.kernel_path("/proc/modules");
    match node::read_optional(&path)? {
        Some(text) => parse_all_modules(&text),
        None => Ok(BTreeMap::new()),
    }
}

/// The kernel log from a point on: opened non-blocking and positioned at the
/// end before a load, so that reading afterwards yields exactly the records
/// written since.
pub(super) struct KernelLog {
    file: Option<File>,
}

impl KernelLog {
    pub(super) fn open(path: &Path) -> Self {
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
    pub(super) fn read_new(&mut self) -> Vec<String> {
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
pub(super) fn parse_kmsg_record(record: &str) -> Option<String> {
    let (_, rest) = record.split_once(';')?;
    let msg = rest.lines().next().unwrap_or("").trim_end();
    (!msg.is_empty()).then(|| msg.to_string())
}

pub(super) fn errno_text(e: Errno) -> String {
    format!("{e:?}: {}", e.desc())
}

/// What `/sys/module/<name>/version` (else `srcversion`) says.
fn loaded_identity(root: &HostRoot, name: &str) -> (Option<String>, Option<String>) {
    let read = |f: &str| {
        node::read_optional(&root.kernel_path(&format!("/sys/module/{name}/{f}")))
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
pub(super) fn same_as_loaded(root: &HostRoot, info: &ModInfo) -> bool {
    let (version, srcversion) = loaded_identity(root, &info.name);
    match (srcversion, field(info, "srcversion")) {
        (Some(a), Some(b)) if a == b => return true,
        _ => {}
    }
    matches!((version, &info.version), (Some(a), Some(b)) if &a == b)
}

/// Orders `names` so that every module comes after the ones it depends on
/// (within the set), NVIDIA's stack order breaking ties, then the name.
pub(super) fn load_order(mods: &[(String, Vec<String>)]) -> Vec<String> {
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
pub(super) fn unload_order(
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
pub(super) fn in_use(
    set: &BTreeSet<String>,
    loaded: &BTreeMap<String, KernelModule>,
) -> Vec<String> {
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
pub(super) fn unload_all(
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
                    Failure::DriverInUse
                } else {
                    Failure::ModuleUnloadFailed
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

/// The plan's module parameters, then the `--module-params` file's after
/// them: the kernel takes the last value of a repeated key, so the file
/// overrides the plan.
pub(super) fn merge_params(
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

/// The kernel's refusal of a module: its errno and the log records it
/// wrote meanwhile.
pub(super) struct Refusal {
    pub(super) errno: Errno,
    pub(super) kernel_log: Vec<String>,
}

/// `finit_module` of `file` with `params`; `EEXIST` (loaded meanwhile)
/// counts as loaded. A refusal carries the kernel log records written
/// since the attempt.
pub(super) fn load_file(
    root: &HostRoot,
    file: &File,
    params: &CStr,
) -> std::result::Result<(), Refusal> {
    let mut log = KernelLog::open(&root.kernel_path("/dev/kmsg"));
    match nix::kmod::finit_module(file, params, ModuleInitFlags::empty()) {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(errno) => Err(Refusal {
            errno,
            kernel_log: log.read_new(),
        }),
    }
}

/// Unloads what this run loaded, newest first, so that a failed install
/// leaves the kernel as it found it.
pub(super) fn rollback(loaded_now: &[String], st: &mut InstallStatus) {
    for name in loaded_now.iter().rev() {
        match unload(name) {
            Ok(()) => st.set_action(name, ModuleAction::RolledBack),
            Err(e) => st
                .notes
                .push(format!("rolling back {name}: {}", errno_text(e))),
        }
    }
}

/// `modprobe DEP` for a dependency from the host's own module tree.
pub(super) fn modprobe(root: &HostRoot, dep: &str) -> Result<()> {
    let mut cmd = crate::process::command("modprobe");
    if root.path() != Path::new("/") {
        cmd.arg("-d").arg(root.path());
    }
    cmd.arg(dep);
    crate::process::run(&mut cmd, Failure::ModuleLoadFailed).map(drop)
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
        assert_eq!(e.line, 1);
        assert!(parse_module_params("nvidia =1\n").is_err());
    }

    /// A file that was never meant as module parameters (a process's
    /// environment, a secret) is named by its path and line, never quoted.
    #[test]
    fn a_bad_module_params_file_is_never_quoted() {
        for text in [
            "AWS_SECRET_ACCESS_KEY=hunter2-secret\n",
            "# ok\nnvidia NVreg_X=1\nhunter2-secret\n",
            "nvidia hunter2-secret\n",
            "hunter2-secret=1\0PATH=/bin\0",
        ] {
            let bad = parse_module_params(text).unwrap_err();
            let e = bad.in_file(std::path::Path::new("/proc/self/environ"));
            let shown = format!("{e} {:?}", e.hint);
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("/proc/self/environ"), "{shown}");
            assert!(shown.contains(&format!("line {}", bad.line)), "{shown}");
        }
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
