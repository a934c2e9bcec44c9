//! The versioned driver roots under `DRIVERS_DIR`: the staging directory
//! an artifact is unpacked into, its arrangement (firmware, user space,
//! Fabric Manager), the rename that places it, the `current` switch, and
//! the garbage collection of old roots and killed runs' leftovers.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::documents::{FabricManagerState, InstallStatus};
use super::options::{FabricManagerArchive, LOCAL_IO};
use crate::artifact::Manifest;
use crate::confined_fs::{HostFs, Kind as FsKind};
use crate::error::{Error, Failure, Result};
use crate::host_root::HostRoot;
use gpu_driver_contract::layout::DRIVERS_DIR;

/// The name prefix of the directory an artifact is unpacked into.
const STAGING_PREFIX: &str = ".staging-";

/// A staging directory beside the driver roots that removes itself unless
/// kept (renamed into place).
pub(super) struct Staging<'a> {
    fs: &'a HostFs,
    /// Relative to the host root, for confined changes.
    pub(super) rel: PathBuf,
    /// Its real path, for the extractor and for reading.
    pub(super) path: PathBuf,
    /// The real path of the driver roots' directory.
    pub(super) drivers: PathBuf,
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
pub(super) fn in_drivers(name: impl AsRef<Path>) -> PathBuf {
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
pub(super) fn collect_garbage(fs: &HostFs, current: &str, previous: Option<&Path>) {
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
            crate::digest::sha256_file(&dir.join(e.file), LOCAL_IO)
                .is_ok_and(|(sum, _)| sum.eq_ignore_ascii_case(e.sha256))
        })
}

/// Gives the user space its modes and creates its links, in the staging
/// directory (`staged`, relative to the host root). Returns what was
/// placed.
pub(super) fn place_user_space(
    fs: &HostFs,
    staged: &Path,
    manifest: &Manifest,
) -> Result<Vec<String>> {
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
pub(super) fn register_user_space(root: &HostRoot, fs: &HostFs, st: &mut InstallStatus) {
    use crate::userspace::{self, LD_SO_CONF, RUN_NVIDIA_DRIVER};
    let current = in_drivers("current");
    let Some(us) = st.user_space.as_mut() else {
        return;
    };
    match userspace::write_ld_so_conf(fs, &current) {
        Ok(()) => us.ld_so_conf = Some(LD_SO_CONF.to_string()),
        Err(e) => st
            .notes
            .push(format!("ld.so.conf.d entry not written: {e}")),
    }
    match userspace::run_ldconfig(root) {
        Ok(cmd) => us.ldconfig = Some(cmd),
        Err(e) => {
            us.ldconfig = Some(format!("failed: {e}"));
            st.notes.push(format!("ldconfig: {e}"));
        }
    }
    match userspace::expose_driver_root(fs, &current) {
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

/// GSP firmware is requested as `nvidia/<version>/<file>`: flat
/// `firmware/<file>` entries are moved under that path, in the staging
/// directory (`staged`, relative to the host root).
pub(super) fn arrange_firmware(fs: &HostFs, staged: &Path, manifest: &Manifest) -> Result<()> {
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

/// Fabric Manager's files into the staging root; its version must be the
/// driver's (it refuses to run against another).
pub(super) fn place_fabric_manager(
    fm: &FabricManagerArchive,
    staging: &Staging,
    manifest: &Manifest,
    st: &mut InstallStatus,
) -> Result<()> {
    if fm.version != manifest.driver_version {
        return Err(Error::new(
            Failure::FabricManagerFailed,
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

/// A fresh staging directory beside the driver roots, after removing what
/// killed runs left (the caller holds the host lock, so none is in use).
pub(super) fn open_staging(fs: &HostFs) -> Result<Staging<'_>> {
    // The extractor writes with std::fs: it gets the real path, links
    // already resolved inside the host root.
    let drivers = fs.real_dir(DRIVERS_DIR)?;
    remove_leftovers(fs);
    let name = format!("{STAGING_PREFIX}{}", std::process::id());
    let staging = Staging {
        fs,
        rel: in_drivers(&name),
        path: drivers.join(&name),
        drivers,
        keep: false,
    };
    fs.remove_all(&staging.rel)?;
    Ok(staging)
}

/// The driver root's name: driver version, flavor, kernel release and the
/// start of the manifest's sha256, so that another artifact is another
/// root.
pub(super) fn root_name(staging: &Staging, manifest: &Manifest, release: &str) -> Result<String> {
    let manifest_sum = crate::digest::sha256_file(&staging.path.join("manifest.json"), LOCAL_IO)
        .map(|(sum, _)| sum)
        .map_err(|e| Error::new(Failure::ArtifactInvalid, e.to_string()))?;
    Ok(format!(
        "{}-{}-{}-{}",
        manifest.driver_version,
        manifest.flavor,
        release,
        &manifest_sum[..12.min(manifest_sum.len())]
    ))
}

/// The suffix a root with Fabric Manager gets: a root is never changed
/// in place, so one with Fabric Manager is another root, named after its
/// archive too.
pub(super) fn fabric_manager_suffix(fm: &FabricManagerArchive) -> String {
    format!("-fm{}", &fm.sha256[..8.min(fm.sha256.len())])
}

/// Renames the staging directory to the root `name`, unless an intact
/// root of that name is in place already (placed before, maybe by a run
/// that was killed later: kept, it may be in use). A damaged one is moved
/// aside first. A staging directory not renamed goes when dropped.
pub(super) fn rename_into_place(
    root: &HostRoot,
    staging: &mut Staging,
    name: &str,
    manifest: &Manifest,
    with_fabric_manager: bool,
    st: &mut InstallStatus,
) -> Result<()> {
    let fs = staging.fs;
    let host_dir = in_drivers(name);
    let real_dir = staging.drivers.join(name);
    let fm_intact = !with_fabric_manager || real_dir.join(crate::fabric::FM_BINARY).is_file();
    if real_dir.is_dir() && root_intact(&real_dir, manifest) && fm_intact {
        tracing::info!("{} is already in place", real_dir.display());
        return Ok(());
    }
    if fs.kind(&host_dir)?.is_some() {
        let old = in_drivers(format!(".old-{name}-{}", std::process::id()));
        fs.rename(&host_dir, &old)?;
        st.notes.push(format!(
            "{} was damaged and is replaced",
            root.join(&host_dir).display()
        ));
    }
    fs.rename(&staging.rel, &host_dir)?;
    staging.keep = true;
    Ok(())
}

/// Points `current` at the root `name` by renaming a fresh link over it;
/// returns the root it named before.
pub(super) fn point_current(fs: &HostFs, name: &str) -> Result<Option<PathBuf>> {
    let current = in_drivers("current");
    clear_placeholder(fs, &current)?;
    let previous = fs.read_link(&current).ok();
    fs.replace_symlink(&current, name)?;
    Ok(previous)
}

/// A directory where the `current` link belongs: a pod with a
/// `DirectoryOrCreate` hostPath on it (as NVIDIA's toolkit mounts its driver
/// root) that started before the first install made it, empty; the rename
/// of the link over it failed with EISDIR on every retry. An empty one is
/// removed (the pod that made it sees the driver after a restart); one with
/// files is someone else's and is refused untouched.
fn clear_placeholder(fs: &HostFs, rel: &Path) -> Result<()> {
    if fs.kind(rel)? != Some(FsKind::Dir) {
        return Ok(());
    }
    let shown = fs.host().join(rel);
    if !fs.read_dir(rel)?.is_empty() {
        return Err(Error::new(
            Failure::DriverRootOccupied,
            format!(
                "{} is a directory with files in it, not the link to the driver root that this \
                 installer keeps there; not touched",
                shown.display()
            ),
        )
        .with_hint(
            "another installer's driver root? Remove that installer, or move the directory away, then retry",
        ));
    }
    tracing::warn!(
        "{} was an empty directory (a hostPath of a pod that started before the first install?); \
         replacing it with the link: restart pods that mounted it to see the driver",
        shown.display()
    );
    fs.remove_all(rel)
}
