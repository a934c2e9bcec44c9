//! The host root every read goes through: the installer may run on the
//! node itself (`/`), in a pod with the host mounted at `/host`, or in a
//! hostPID pod that reaches the host through `/proc/1/root`.

use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the host root was chosen; recorded in every HostReport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum HostRootSource {
    /// `--host-root` was given.
    Flag,
    /// `/host` holds an os-release (the host's `/` mounted into a pod).
    HostMount,
    /// We share the host's PID namespace but not its mounts: `/proc/1/root`.
    Pid1Root,
    /// We run on the host itself (or nsenter'ed into its mount namespace).
    Root,
}

#[derive(Debug, Clone)]
pub struct HostRoot {
    path: PathBuf,
    source: HostRootSource,
}

pub const OS_RELEASE_PATHS: [&str; 2] = ["etc/os-release", "usr/lib/os-release"];

impl HostRoot {
    pub fn new(path: impl Into<PathBuf>, source: HostRootSource) -> Self {
        HostRoot {
            path: path.into(),
            source,
        }
    }

    /// `/host` if it holds an os-release; else `/proc/1/root` when PID 1 is a
    /// process of another mount namespace (hostPID pod) whose root we can
    /// read; else `/`.
    pub fn auto() -> Self {
        Self::auto_from(Path::new("/host"), Path::new("/proc"))
    }

    pub fn auto_from(host_mount: &Path, proc: &Path) -> Self {
        if has_os_release(host_mount) {
            return HostRoot::new(host_mount, HostRootSource::HostMount);
        }
        let pid1_mnt = fs::read_link(proc.join("1/ns/mnt")).ok();
        let self_mnt = fs::read_link(proc.join("self/ns/mnt")).ok();
        let pid1_root = proc.join("1/root");
        if pid1_is_foreign(pid1_mnt.as_deref(), self_mnt.as_deref()) && has_os_release(&pid1_root) {
            return HostRoot::new(pid1_root, HostRootSource::Pid1Root);
        }
        HostRoot::new("/", HostRootSource::Root)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn source(&self) -> HostRootSource {
        self.source
    }

    /// `<root>/<rel>`; `rel` is a host-absolute path such as `/etc/os-release`.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        self.path.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    /// Kernel interfaces (`/proc`, `/sys`) describe the one running kernel, so
    /// when the host root does not carry them at all (e.g. only `/etc` and
    /// `/usr` are mounted) our own view is equally true. When the root does
    /// have `/proc` or `/sys`, it alone is read, so that a host's answer is
    /// never mixed with ours.
    pub fn kernel_path(&self, rel: &str) -> PathBuf {
        let rel = rel.trim_start_matches('/');
        let top = rel.split('/').next().unwrap_or(rel);
        if self.path.join(top).is_dir() {
            self.path.join(rel)
        } else {
            Path::new("/").join(rel)
        }
    }

    /// Resolves `rel` inside the root, following symlinks as the host would:
    /// absolute link targets are taken relative to the root, and `..` never
    /// climbs above it. Debian's `/lib/modules/<rel>/build` is such an
    /// absolute link. Returns `None` if the path does not exist.
    pub fn resolve(&self, rel: impl AsRef<Path>) -> Option<PathBuf> {
        let mut pending: Vec<OsString> = components(rel.as_ref());
        pending.reverse();
        let mut resolved: Vec<OsString> = Vec::new();
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            if part == ".." {
                resolved.pop();
                continue;
            }
            let candidate = self
                .path
                .join(resolved.iter().collect::<PathBuf>())
                .join(&part);
            match fs::symlink_metadata(&candidate) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    hops += 1;
                    if hops > 40 {
                        return None; // ELOOP
                    }
                    let target = fs::read_link(&candidate).ok()?;
                    if target.is_absolute() {
                        resolved.clear();
                    }
                    for c in components(&target).into_iter().rev() {
                        pending.push(c);
                    }
                }
                Ok(_) => resolved.push(part),
                Err(_) => return None,
            }
        }
        Some(self.path.join(resolved.iter().collect::<PathBuf>()))
    }
}

/// The normal components of `p` (`..` kept, `/` and `.` dropped).
pub fn components(p: &Path) -> Vec<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

fn has_os_release(root: &Path) -> bool {
    OS_RELEASE_PATHS.iter().any(|p| root.join(p).is_file())
}

/// PID 1 lives in another mount namespace than we do: either we run in a
/// container with the host's PID namespace (hostPID), or PID 1 is another
/// container's process. Unknown (unreadable links) counts as "no".
pub fn pid1_is_foreign(pid1_mnt: Option<&Path>, self_mnt: Option<&Path>) -> bool {
    matches!((pid1_mnt, self_mnt), (Some(a), Some(b)) if a != b)
}
