//! The named steps of `install` and `uninstall`, in the order they run
//! (the module documentation of [`super`] tells the story). Each step
//! reads the [`Run`] and records what it did in the [`InstallStatus`];
//! the mechanics are in the sibling modules.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::documents::{InstallStatus, ModuleAction, ModuleState, user_space_status};
use super::kmod::{self, KernelModule, NVIDIA_STACK};
use super::options::{InstallOptions, LOCAL_IO, UninstallOptions};
use super::roots::{self, Staging, in_drivers};
use super::{devices, holders, services};
use crate::artifact::{self, Manifest};
use crate::confined_fs::{HostFs, HostRootFs};
use crate::error::Success;
use crate::error::{Error, Failure, Result};
use crate::host_root::HostRoot;
use crate::modinfo::{self, ModInfo};
use crate::node;
use crate::step::Done;

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
    /// Who signed the modules (the manifest's `signer`), for a refusal.
    signer: Option<node::Signer>,
}

/// The steps, in order; the first failure ends the install. Each step
/// that changes the host is a rename of something complete, so a kill at
/// any point leaves `current` on a complete root (docs/install.md).
pub(super) fn install(opts: &InstallOptions, st: &mut InstallStatus) -> Result<Done> {
    check_root()?;
    let run = prepare(opts, st)?;
    let _lock = run.fs.lock(LOCK_PATH)?;
    let (staging, manifest) = unpack(&run, st)?;
    let all = check_vermagic(&run, &staging, &manifest, st)?;
    check_signatures(&run, &staging, &all)?;
    let sel = select(&run, &all, st);
    let same = find_conflicts(&run, &sel, st)?;
    let placed = place_root(&run, staging, &manifest, st)?;
    set_firmware_path(&run, &manifest, &placed, st);
    let loaded_now = load_modules(&run, &sel, &same, &placed, st)?;
    make_device_nodes(&run, &sel, st)?;
    crate::failpoint::hit("install:loaded");
    let switched = switch_current(&run, &placed, st)?;
    // A daemon running on the driver that was replaced must restart.
    let restart = switched || !loaded_now.is_empty();
    services::start_daemons(
        run.root,
        &run.fs,
        &placed.real_dir,
        opts.persistenced,
        restart,
        st,
    )?;
    Ok(outcome(&run, &manifest, &placed, &same, &loaded_now, st))
}

/// The kernel release, the module parameters, the host root's handle.
fn prepare<'a>(opts: &'a InstallOptions<'a>, st: &mut InstallStatus) -> Result<Run<'a>> {
    let root = opts.root;
    let release = match &opts.kernel_release {
        Some(r) => r.clone(),
        None => node::read_kernel_release(root)?,
    };
    st.kernel_release = Some(release.clone());
    let given = match &opts.module_params {
        Some(p) => kmod::parse_module_params(&kmod::MODULE_PARAMS.read_text(p)?)
            .map_err(|e| e.in_file(p))?,
        None => BTreeMap::new(),
    };
    let params = kmod::merge_params(&opts.planned_params, given);
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
    // Under the lock, anything half-made is a killed run's leftover.
    let staging = roots::open_staging(&run.fs)?;
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
            modinfo::read_modinfo(&path).map_err(|e| e.into_error(Failure::ArtifactInvalid))?;
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
            Failure::VermagicMismatch,
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

/// Where the host loads only signed modules, every module must carry a
/// signature, before anything is placed or loaded: the kernel would refuse
/// an unsigned one with the same `EKEYREJECTED` as a wrong key.
fn check_signatures(run: &Run, staging: &Staging, all: &[Selected]) -> Result<()> {
    let policy = node::SignaturePolicy::read(run.root)?;
    if policy.required() != Some(true) {
        return Ok(());
    }
    let mut unsigned = Vec::new();
    for m in all {
        let path = staging.path.join(&m.rel);
        if !crate::signing::is_signed_file(&path, Failure::ArtifactInvalid)? {
            unsigned.push(m.info.name.clone());
        }
    }
    if unsigned.is_empty() {
        return Ok(());
    }
    let why = policy.why();
    Err(Error::new(
        Failure::ModuleSignatureRequired,
        format!(
            "this host loads only signed modules ({why}), and {} in {} {} no module signature; nothing was loaded",
            unsigned.join(", "),
            run.opts.artifact.display(),
            if unsigned.len() == 1 { "carries" } else { "carry" }
        ),
    )
    .with_hint(
        "build with --signing-key and --signing-cert (the operator: spec.build.signingSecretName) and enroll the certificate on the host (mokutil --import); see docs/secure-boot.md",
    ))
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
    let order = kmod::load_order(
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
    let loaded = kmod::read_modules(run.root)?;
    let (same, conflicting) = sort_loaded(run.root, sel, &loaded);
    if !conflicting.is_empty() {
        let loaded = stop_daemons(run.root, &run.fs, loaded, st)?;
        let busy = kmod::in_use(&conflicting, &loaded);
        if !busy.is_empty() && !run.opts.force {
            return Err(Error::new(
                Failure::DriverInUse,
                format!(
                    "another driver is loaded and in use: {}{}",
                    busy.join("; "),
                    held_by(run.root)
                ),
            )
            .with_hint(
                "stop what uses the GPUs (pods, nvidia-persistenced, dcgm) or drain the node; --force tries the unload anyway",
            ));
        }
        st.replaced = kmod::unload_all(&conflicting, &loaded)?;
    }
    Ok(same)
}

/// The selected modules that are loaded: the same build (left alone), and
/// what conflicts with the selection (to unload).
fn sort_loaded(
    root: &HostRoot,
    sel: &Selection,
    loaded: &BTreeMap<String, KernelModule>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut same = BTreeSet::new();
    let mut conflicting = BTreeSet::new();
    for m in sel.by_name.values() {
        if loaded.contains_key(&m.info.name) {
            if kmod::same_as_loaded(root, &m.info) {
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
    (same, conflicting)
}

/// Our daemons hold the driver open: stopped before an unload (enabled,
/// they start again on the next install's driver). Returns what is loaded
/// afterwards.
fn stop_daemons(
    root: &HostRoot,
    fs: &HostFs,
    loaded: BTreeMap<String, KernelModule>,
    st: &mut InstallStatus,
) -> Result<BTreeMap<String, KernelModule>> {
    let notes = services::stop_ours(fs, services::host_systemd(root));
    let loaded = if notes.is_empty() {
        loaded
    } else {
        kmod::read_modules(root)?
    };
    st.notes.extend(notes);
    Ok(loaded)
}

/// `; held open by …` naming the processes (and pods) with an NVIDIA
/// device file open, for a `DriverInUse` message; empty when none is seen.
fn held_by(root: &HostRoot) -> String {
    let found = holders::find(root);
    if found.is_empty() {
        String::new()
    } else {
        format!("; held open by {}", holders::describe(&found))
    }
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
    let mut name = roots::root_name(&staging, manifest, &run.release)?;
    roots::arrange_firmware(&run.fs, &staging.rel, manifest)?;
    let files = roots::place_user_space(&run.fs, &staging.rel, manifest)?;
    let fabric_manager = run.opts.fabric_manager.as_ref();
    if let Some(fm) = fabric_manager {
        name.push_str(&roots::fabric_manager_suffix(fm));
        roots::place_fabric_manager(fm, &staging, manifest, st)?;
    }
    let has_user_space = staging
        .path
        .join(crate::userspace::BIN_DIR)
        .join("nvidia-smi")
        .is_file();
    let host_dir = in_drivers(&name);
    let real_dir = staging.drivers.join(&name);
    let with_fm = fabric_manager.is_some();
    roots::rename_into_place(run.root, &mut staging, &name, manifest, with_fm, st)?;
    crate::failpoint::hit("install:placed");
    st.driver_root = Some(host_dir.display().to_string());
    st.user_space = Some(user_space_status(has_user_space, &host_dir, files));
    Ok(Placed {
        name,
        host_dir,
        real_dir,
        has_user_space,
        signer: manifest.signer.clone(),
    })
}

/// Points the kernel's firmware search path at the driver root's
/// `firmware` directory; a failure is a note.
fn set_firmware_path(run: &Run, manifest: &Manifest, placed: &Placed, st: &mut InstallStatus) {
    if manifest.firmware.is_empty() {
        return;
    }
    let fw = placed.host_dir.join("firmware").display().to_string();
    let param = "/sys/module/firmware_class/parameters/path";
    match devices::write_kernel_param(run.root, &run.fs, param, &fw) {
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
        st.notes.extend(devices::iommu_passthrough(run.root)?);
    }
    for name in &sel.order {
        let Some(m) = sel.by_name.get(name.as_str()) else {
            continue;
        };
        if same.contains(name) {
            st.set_action(name, ModuleAction::AlreadyLoaded);
            continue;
        }
        if let Err(e) = load_dependencies(run, sel, m) {
            kmod::rollback(&loaded_now, st);
            return Err(e);
        }
        load_one(run, m, placed, &mut loaded_now, st)?;
    }
    Ok(loaded_now)
}

/// Dependencies outside the artifact (drm and drm_kms_helper for
/// nvidia-drm, ib_core for peermem, …) must be loaded already, else each
/// is modprobe'd, in the order `.modinfo` lists them.
fn load_dependencies(run: &Run, sel: &Selection, m: &Selected) -> Result<()> {
    let now = kmod::read_modules(run.root)?;
    let missing = m
        .info
        .depends
        .iter()
        .filter(|d| !sel.by_name.contains_key(d.as_str()) && !now.contains_key(*d));
    for dep in missing {
        if let Err(e) = kmod::modprobe(run.root, dep) {
            return Err(Error::new(
                Failure::ModuleLoadFailed,
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
            Failure::InvalidArgument,
            format!("parameters of {name} contain NUL"),
        )
    })?;
    // From the driver root: the staging directory was renamed to it.
    let path = placed.real_dir.join(&m.rel);
    let file = File::open(&path).map_err(|e| Error::io(LOCAL_IO, "opening", &path, e))?;
    tracing::info!("loading {name} from {}", path.display());
    let refusal = match kmod::load_file(run.root, &file, &cparam) {
        Ok(()) => {
            loaded_now.push(name.clone());
            st.set_action(name, ModuleAction::Loaded);
            return Ok(());
        }
        Err(refusal) => refusal,
    };
    if let Some(s) = st.modules.iter_mut().find(|s| &s.name == name) {
        s.action = ModuleAction::Failed;
        s.errno = Some(format!("{:?}", refusal.errno));
    }
    st.kernel_log = refusal.kernel_log.clone();
    kmod::rollback(loaded_now, st);
    let signed = crate::signing::is_signed_file(&path, LOCAL_IO).unwrap_or(false);
    Err(refusal_error(
        name,
        &placed.host_dir.join(&m.rel),
        &refusal,
        signed,
        placed.signer.as_ref(),
    ))
}

/// The error for a module the kernel refused. A key refusal
/// (`EKEYREJECTED`; `ENOKEY` on kernels before 5.4) of a signed module is
/// the certificate not being trusted there; of an unsigned one, the
/// signature the host requires.
fn refusal_error(
    name: &str,
    path: &Path,
    refusal: &kmod::Refusal,
    signed: bool,
    signer: Option<&node::Signer>,
) -> Error {
    use nix::errno::Errno;
    let kernel = if refusal.kernel_log.is_empty() {
        "the kernel logged nothing".to_string()
    } else {
        format!("kernel log: {}", refusal.kernel_log.join(" | "))
    };
    let what = format!(
        "loading {name} ({}): {}; {kernel}",
        path.display(),
        kmod::errno_text(refusal.errno)
    );
    let key_refusal = matches!(refusal.errno, Errno::EKEYREJECTED | Errno::ENOKEY);
    match (key_refusal, signed) {
        (true, true) => {
            let cert = signer.map_or_else(
                || "its signing certificate (the artifact's manifest names no signer)".to_string(),
                |s| format!("its signing certificate {:?} (SHA-256 {})", s.subject, s.sha256),
            );
            Error::new(
                Failure::ModuleKeyRejected,
                format!("{what}; the kernel does not trust {cert}: it is not enrolled on this host"),
            )
            .with_hint(
                "enroll the certificate as a Machine Owner Key: gpu-driver-installer signing-cert --signing-cert tls.crt --out signing.der; mokutil --import signing.der; reboot and confirm the enrollment in MokManager (docs/secure-boot.md)",
            )
        }
        (true, false) => Error::new(
            Failure::ModuleSignatureRequired,
            format!("{what}; the module is unsigned and this kernel loads only signed modules"),
        )
        .with_hint("build with --signing-key and --signing-cert (the operator: spec.build.signingSecretName); see docs/secure-boot.md"),
        (false, _) => Error::new(Failure::ModuleLoadFailed, what),
    }
}

/// `/dev/nvidia*` from `/proc/devices` (only when the artifact has
/// `nvidia`), created inside the host root.
fn make_device_nodes(run: &Run, sel: &Selection, st: &mut InstallStatus) -> Result<()> {
    if !sel.by_name.contains_key("nvidia") {
        return Ok(());
    }
    let modeset = sel.by_name.contains_key("nvidia_modeset");
    let (nodes, notes) = devices::wanted_nodes(run.root, modeset)?;
    st.notes.extend(notes);
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
    let previous = roots::point_current(&run.fs, &placed.name)?;
    let switched = previous.as_deref() != Some(Path::new(&placed.name));
    crate::failpoint::hit("install:switched");
    if placed.has_user_space {
        roots::register_user_space(run.root, &run.fs, st);
    }
    roots::collect_garbage(&run.fs, &placed.name, previous.as_deref());
    Ok(switched)
}

/// What the result says: installed (what was loaded, from where), or
/// already installed when nothing was loaded.
fn outcome(
    run: &Run,
    manifest: &Manifest,
    placed: &Placed,
    same: &BTreeSet<String>,
    loaded_now: &[String],
    st: &InstallStatus,
) -> Done {
    if loaded_now.is_empty() {
        return Done::new(
            Success::AlreadyInstalled,
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
    Done::new(Success::Installed, msg)
}

// ------------------------------------------------------------ uninstall

/// Unloads the modules asked for (NVIDIA's stack by default), holders
/// first, after stopping our daemons when the core goes.
pub(super) fn uninstall(opts: &UninstallOptions, st: &mut InstallStatus) -> Result<Done> {
    check_root()?;
    let root = opts.root;
    let _lock = root.fs()?.lock(LOCK_PATH)?;
    let wanted: Vec<String> = if opts.modules.is_empty() {
        NVIDIA_STACK.iter().map(|s| s.to_string()).collect()
    } else {
        opts.modules.iter().map(|m| m.replace('-', "_")).collect()
    };
    let mut loaded = kmod::read_modules(root)?;
    if wanted.iter().any(|n| n == "nvidia") && loaded.contains_key("nvidia") {
        loaded = stop_daemons(root, &root.fs()?, loaded, st)?;
    }
    let set: BTreeSet<String> = wanted
        .iter()
        .filter(|n| loaded.contains_key(*n))
        .cloned()
        .collect();
    if set.is_empty() {
        return Ok(Done::new(
            Success::Uninstalled,
            format!("none of {} is loaded; nothing to do", wanted.join(", ")),
        ));
    }
    let busy = kmod::in_use(&set, &loaded);
    if !busy.is_empty() && !opts.force {
        return Err(Error::new(
            Failure::DriverInUse,
            format!("in use: {}{}", busy.join("; "), held_by(root)),
        )
        .with_hint("stop what uses it first; --force tries the unload anyway"));
    }
    let done = kmod::unload_all(&set, &loaded)?;
    st.modules
        .extend(done.iter().map(|name| ModuleState::unloaded(name)));
    Ok(Done::new(
        Success::Uninstalled,
        format!("unloaded {}", done.join(", ")),
    ))
}

/// The host lock every installer takes before touching modules.
const LOCK_PATH: &str = "/run/gpu-driver/install.lock";

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
