//! NVML, loaded at run time (dlopen through nvml-wrapper): which library
//! to load, loading and initializing it with a bounded retry while it
//! fails (so the exporter recovers when the driver appears), reading every
//! GPU into [`GpuReading`]s, and a background event set counting critical
//! XID errors per GPU.
//!
//! A value a GPU does not support (NVML's NotSupported) is left out, not an
//! error; other failures of one value are logged at debug and left out too.
//! Only losing NVML as a whole (no library, init failing, the device count
//! failing) turns `nvml_up` to 0.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use crate::metrics::{
    DriverInfo, GpuReading, Health, Memory, MigReading, ProcessReading, XidCount,
};
use crate::nvml_ffi;
use gpu_driver_contract::host_root::HostRoot;

/// NVML's soname: what the driver installs and the NVIDIA container
/// toolkit injects into containers.
pub const LIBNVML: &str = "libnvidia-ml.so.1";

/// First wait after a failed load; doubled after each failure up to
/// [`RETRY_MAX`], so a node without a driver costs one dlopen per half
/// minute and a driver that appears is picked up within that.
pub const RETRY_MIN: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// The most GPUs read: a node has at most 16, and a library that reports
/// 2^32-1 must not make the exporter allocate or loop for them.
pub const MAX_DEVICES: u32 = 64;

/// NVML's device count, capped at [`MAX_DEVICES`].
fn device_count(nvml: &Nvml) -> Result<u32, NvmlError> {
    let n = nvml.device_count()?;
    if n > MAX_DEVICES {
        tracing::warn!("NVML reports {n} devices; reading the first {MAX_DEVICES}");
    }
    Ok(n.min(MAX_DEVICES))
}

/// How long the XID thread blocks in one wait: how fast it notices a stop.
const XID_WAIT_MS: u32 = 1000;

/// Where NVML comes from.
#[derive(Debug, Clone)]
pub struct NvmlConfig {
    /// `--nvml`: this file only.
    pub explicit: Option<PathBuf>,
    pub host_root: HostRoot,
}

/// The library to dlopen: an explicit path, the installed driver root's
/// copy, or the soname for the dynamic loader's search (the container
/// toolkit's injected library, or the system's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibChoice {
    Explicit(PathBuf),
    DriverRoot(PathBuf),
    Soname,
}

/// The driver root's `libnvidia-ml.so.1` (the contract's `layout::DRIVERS_DIR`
/// `current`), resolved inside the host root.
pub fn driver_root_lib(root: &HostRoot) -> PathBuf {
    let rel = Path::new(gpu_driver_contract::layout::DRIVERS_DIR)
        .join("current")
        .join(gpu_driver_contract::layout::lib_dir())
        .join(LIBNVML);
    root.resolve(&rel).unwrap_or_else(|| root.join(&rel))
}

pub fn choose_lib(cfg: &NvmlConfig) -> LibChoice {
    if let Some(p) = &cfg.explicit {
        return LibChoice::Explicit(p.clone());
    }
    let p = driver_root_lib(&cfg.host_root);
    if p.exists() {
        LibChoice::DriverRoot(p)
    } else {
        LibChoice::Soname
    }
}

/// NVML's own name for an error (`NVML_ERROR_DRIVER_NOT_LOADED`), where
/// nvml-wrapper keeps one.
fn nvml_code(e: &NvmlError) -> Option<&'static str> {
    Some(match e {
        NvmlError::Uninitialized => "NVML_ERROR_UNINITIALIZED",
        NvmlError::InvalidArg => "NVML_ERROR_INVALID_ARGUMENT",
        NvmlError::NotSupported => "NVML_ERROR_NOT_SUPPORTED",
        NvmlError::NoPermission => "NVML_ERROR_NO_PERMISSION",
        NvmlError::NotFound => "NVML_ERROR_NOT_FOUND",
        NvmlError::InsufficientPower => "NVML_ERROR_INSUFFICIENT_POWER",
        NvmlError::DriverNotLoaded => "NVML_ERROR_DRIVER_NOT_LOADED",
        NvmlError::Timeout => "NVML_ERROR_TIMEOUT",
        NvmlError::IrqIssue => "NVML_ERROR_IRQ_ISSUE",
        NvmlError::LibraryNotFound => "NVML_ERROR_LIBRARY_NOT_FOUND",
        NvmlError::FunctionNotFound => "NVML_ERROR_FUNCTION_NOT_FOUND",
        NvmlError::CorruptedInfoROM => "NVML_ERROR_CORRUPTED_INFOROM",
        NvmlError::GpuLost => "NVML_ERROR_GPU_IS_LOST",
        NvmlError::ResetRequired => "NVML_ERROR_RESET_REQUIRED",
        NvmlError::OperatingSystem => "NVML_ERROR_OPERATING_SYSTEM",
        NvmlError::LibRmVersionMismatch => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        NvmlError::Unknown => "NVML_ERROR_UNKNOWN",
        _ => return None,
    })
}

/// What to do about an init failure, for the message.
fn nvml_hint(e: &NvmlError) -> &'static str {
    match e {
        NvmlError::DriverNotLoaded => {
            "load the NVIDIA kernel modules (gpu-driver-installer install) and give the exporter \
             /dev/nvidiactl and /dev/nvidia*"
        }
        NvmlError::NoPermission => {
            "the exporter may not open /dev/nvidia*: run it with the NVIDIA runtime class or \
             device access to them"
        }
        NvmlError::LibRmVersionMismatch => {
            "libnvidia-ml and the loaded kernel module differ in version: use the installed \
             driver root's library (--nvml) or reload the modules"
        }
        _ => "see NVML's documentation of this error",
    }
}

/// The `error` label and log text of a failed load or init.
pub fn describe_failure(choice: &LibChoice, e: &NvmlError) -> String {
    let what = match choice {
        LibChoice::Explicit(p) | LibChoice::DriverRoot(p) => p.display().to_string(),
        LibChoice::Soname => LIBNVML.to_string(),
    };
    if let NvmlError::LibloadingError(le) = e {
        let missing = match choice {
            LibChoice::Explicit(p) => format!(
                "NVML library not found: {} (--nvml) could not be loaded",
                p.display()
            ),
            LibChoice::DriverRoot(p) => format!(
                "NVML library not found: the driver root's {} could not be loaded",
                p.display()
            ),
            LibChoice::Soname => format!(
                "NVML library not found: no installed driver root's {LIBNVML} and the dynamic \
                 loader finds none"
            ),
        };
        return format!(
            "{missing} ({le}); install the driver (gpu-driver-installer), run with the NVIDIA \
             runtime class, or point --nvml at libnvidia-ml.so.1"
        );
    }
    let code = nvml_code(e).map(|c| format!(" ({c})")).unwrap_or_default();
    format!("NVML init with {what} failed: {e}{code}; {}", nvml_hint(e))
}

/// Loads and initializes NVML from `choice`.
fn load(choice: &LibChoice) -> Result<Nvml, NvmlError> {
    let mut b = Nvml::builder();
    let path = match choice {
        LibChoice::Explicit(p) | LibChoice::DriverRoot(p) => p.as_os_str(),
        LibChoice::Soname => std::ffi::OsStr::new(LIBNVML),
    };
    b.lib_path(path);
    let nvml = b.init()?;
    if let Err(e) = &nvml.lib().nvmlShutdown {
        // nvml-wrapper's Drop calls nvmlShutdown and panics without it: this
        // one handle is leaked (once: the retry backs off), never dropped.
        let error = NvmlError::FailedToLoadSymbol(format!("nvmlShutdown: {e}"));
        std::mem::forget(nvml);
        return Err(error);
    }
    Ok(nvml)
}

/// Critical XID counts by GPU UUID, written by the XID thread.
type XidTable = Arc<Mutex<BTreeMap<String, XidCount>>>;

struct Live {
    nvml: Arc<Nvml>,
    xid: XidTable,
    stop: Arc<AtomicBool>,
}

impl Drop for Live {
    fn drop(&mut self) {
        // The XID thread holds the other Arc<Nvml>; it ends within one wait.
        self.stop.store(true, Ordering::Relaxed);
    }
}

enum State {
    Up(Live),
    Down {
        error: String,
        next_attempt: Instant,
        backoff: Duration,
    },
}

/// One collection: NVML's health, versions and per-GPU readings.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    pub health: Health,
    pub driver: Option<DriverInfo>,
    pub gpus: Vec<GpuReading>,
}

/// NVML for the exporter's lifetime: up, or down with the next attempt.
pub struct Source {
    cfg: NvmlConfig,
    state: State,
    /// The wait before reloading after NVML was lost: doubles with each
    /// loss that follows a reload, back to [`RETRY_MIN`] after a good read.
    reload_backoff: Duration,
}

impl Source {
    /// Not loaded yet: the first [`Source::collect`] tries.
    pub fn new(cfg: NvmlConfig) -> Self {
        Source {
            cfg,
            state: State::Down {
                error: "NVML not loaded yet".into(),
                next_attempt: Instant::now(),
                backoff: RETRY_MIN,
            },
            reload_backoff: Duration::ZERO,
        }
    }

    /// Tries to load NVML when it is down and its retry time has come.
    fn ensure(&mut self, now: Instant) {
        let State::Down {
            next_attempt,
            backoff,
            error: old,
        } = &self.state
        else {
            return;
        };
        if now < *next_attempt {
            return;
        }
        let backoff = *backoff;
        let choice = choose_lib(&self.cfg);
        match load(&choice) {
            Ok(nvml) => {
                tracing::info!(library = ?choice, "NVML is up");
                self.state = State::Up(start_live(nvml));
            }
            Err(e) => {
                let error = describe_failure(&choice, &e);
                if &error != old {
                    tracing::warn!(
                        "{error} (retrying on scrapes, at most every {}s)",
                        RETRY_MAX.as_secs()
                    );
                }
                self.state = State::Down {
                    error,
                    next_attempt: now + backoff,
                    backoff: (backoff * 2).min(RETRY_MAX),
                };
            }
        }
    }

    /// Reads every GPU, loading NVML first if it is down and due.
    pub fn collect(&mut self, now: Instant) -> Collected {
        self.ensure(now);
        let live = match &self.state {
            State::Up(live) => live,
            State::Down { error, .. } => {
                return Collected {
                    health: Health {
                        up: false,
                        error: Some(error.clone()),
                    },
                    ..Default::default()
                };
            }
        };
        match read_all(&live.nvml, &live.xid) {
            Ok((driver, gpus)) => {
                self.reload_backoff = Duration::ZERO;
                Collected {
                    health: Health {
                        up: true,
                        error: None,
                    },
                    driver: Some(driver),
                    gpus,
                }
            }
            Err(e) => {
                // The driver went away under us (unloaded, upgraded): drop
                // NVML and load it afresh on the next scrape.
                let code = nvml_code(&e).map(|c| format!(" ({c})")).unwrap_or_default();
                let error =
                    format!("NVML lost: counting devices failed: {e}{code}; reloading NVML");
                tracing::warn!("{error}");
                // The first loss reloads at once (a driver upgrade); one
                // that keeps coming back waits longer each time.
                let wait = self.reload_backoff;
                self.reload_backoff = (wait * 2).clamp(RETRY_MIN, RETRY_MAX);
                self.state = State::Down {
                    error: error.clone(),
                    next_attempt: now + wait,
                    backoff: self.reload_backoff,
                };
                Collected {
                    health: Health {
                        up: false,
                        error: Some(error),
                    },
                    ..Default::default()
                }
            }
        }
    }
}

fn start_live(nvml: Nvml) -> Live {
    let nvml = Arc::new(nvml);
    let xid: XidTable = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let (n, x, s) = (nvml.clone(), xid.clone(), stop.clone());
    let spawned = thread::Builder::new()
        .name("nvml-xid".into())
        .spawn(move || watch_xid(&n, &x, &s));
    if let Err(e) = spawned {
        tracing::warn!("cannot start the XID event thread, XID errors go unreported: {e}");
    }
    Live { nvml, xid, stop }
}

/// Registers every GPU that can report critical XID events in one event
/// set and counts them until `stop`. A GPU without the event reports no
/// XID metrics.
fn watch_xid(nvml: &Nvml, table: &Mutex<BTreeMap<String, XidCount>>, stop: &AtomicBool) {
    let Ok(count) = device_count(nvml) else {
        return;
    };
    let mut set = match nvml.create_event_set() {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("NVML cannot create an event set, XID errors go unreported: {e}");
            return;
        }
    };
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let supported = dev
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        let (Some(s), true, Ok(uuid)) = (set.take(), supported, dev.uuid()) else {
            continue;
        };
        match dev.register_events(EventTypes::CRITICAL_XID_ERROR, s) {
            Ok(s) => {
                set = Some(s);
                lock(table).entry(uuid).or_default();
            }
            // NVML frees a set whose registration failed: start a new one.
            Err(e) => {
                tracing::debug!(gpu = i, "no XID events: {e}");
                set = nvml.create_event_set().ok();
            }
        }
    }
    let Some(set) = set else { return };
    if lock(table).is_empty() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        match set.wait(XID_WAIT_MS) {
            Ok(ev) if ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) => {
                let code = match ev.event_data {
                    Some(XidError::Value(v)) => v,
                    _ => 0,
                };
                if let Ok(uuid) = ev.device.uuid() {
                    tracing::warn!(gpu = %uuid, xid = code, "critical XID error");
                    let mut t = lock(table);
                    let c = t.entry(uuid).or_default();
                    c.count += 1;
                    c.last = code;
                }
            }
            Ok(_) | Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::debug!("waiting for XID events: {e}");
                thread::sleep(Duration::from_millis(u64::from(XID_WAIT_MS)));
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain counters stay usable after a panic elsewhere.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A value NVML may not support: NotSupported and other failures are
/// both "no value"; only the latter are worth a debug line.
fn opt<T>(r: Result<T, NvmlError>, what: &str, gpu: u32) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            tracing::debug!(gpu, "{what}: {e}");
            None
        }
    }
}

fn read_all(nvml: &Nvml, xid: &XidTable) -> Result<(DriverInfo, Vec<GpuReading>), NvmlError> {
    let count = device_count(nvml)?;
    let cuda = nvml.sys_cuda_driver_version().ok();
    let driver = DriverInfo {
        driver_version: nvml.sys_driver_version().unwrap_or_default(),
        nvml_version: nvml.sys_nvml_version().unwrap_or_default(),
        cuda_version: cuda
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
            .unwrap_or_default(),
    };
    let xids = lock(xid).clone();
    let mut gpus = Vec::with_capacity(count as usize);
    for i in 0..count {
        match nvml.device_by_index(i) {
            Ok(dev) => gpus.push(read_gpu(&dev, i, &xids)),
            Err(e) => tracing::warn!(gpu = i, "NVML cannot open GPU {i}: {e}"),
        }
    }
    Ok((driver, gpus))
}

fn memory(dev: &Device, gpu: u32) -> Option<Memory> {
    opt(dev.memory_info(), "memory", gpu).map(|m| Memory {
        total: m.total,
        used: m.used,
        free: m.free,
    })
}

/// One GPU's values; everything it does not support stays `None`.
pub fn read_gpu(dev: &Device, index: u32, xids: &BTreeMap<String, XidCount>) -> GpuReading {
    let i = index;
    let uuid = opt(dev.uuid(), "uuid", i).unwrap_or_default();
    let util = opt(dev.utilization_rates(), "utilization", i);
    let ecc = |t, c| opt(dev.total_ecc_errors(t, c), "ECC errors", i);
    let mig_enabled = opt(dev.mig_mode(), "MIG mode", i).map(|m| m.current == 1);
    GpuReading {
        index,
        model: opt(dev.name(), "name", i).unwrap_or_default(),
        pci_bus_id: opt(dev.pci_info(), "PCI info", i)
            .map(|p| p.bus_id)
            .unwrap_or_default(),
        gpu_util: util.as_ref().map(|u| u.gpu),
        mem_util: util.as_ref().map(|u| u.memory),
        memory: memory(dev, i),
        power_mw: opt(dev.power_usage(), "power", i),
        power_limit_mw: opt(dev.enforced_power_limit(), "power limit", i),
        energy_mj: opt(dev.total_energy_consumption(), "energy", i),
        temperature_c: opt(dev.temperature(TemperatureSensor::Gpu), "temperature", i),
        sm_clock_mhz: opt(dev.clock_info(Clock::SM), "SM clock", i),
        mem_clock_mhz: opt(dev.clock_info(Clock::Memory), "memory clock", i),
        clock_event_reasons: opt(dev.current_throttle_reasons(), "clock event reasons", i)
            .map(|r| r.bits()),
        ecc_sbe_volatile: ecc(MemoryError::Corrected, EccCounter::Volatile),
        ecc_dbe_volatile: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
        ecc_sbe_aggregate: ecc(MemoryError::Corrected, EccCounter::Aggregate),
        ecc_dbe_aggregate: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
        pcie_replay: opt(dev.pcie_replay_counter(), "PCIe replays", i).map(u64::from),
        xid: xids.get(&uuid).copied(),
        mig: if mig_enabled == Some(true) {
            read_mig(dev, i)
        } else {
            Vec::new()
        },
        mig_enabled,
        processes: processes(dev, i),
        uuid,
    }
}

/// `1g.10gb` from a MIG device's name (`NVIDIA A100-SXM4-80GB MIG 1g.10gb`).
pub fn mig_profile(name: &str) -> String {
    name.rsplit_once(" MIG ")
        .map_or(name, |(_, p)| p)
        .trim()
        .to_string()
}

fn read_mig(dev: &Device, gpu: u32) -> Vec<MigReading> {
    let Some(n) = opt(dev.mig_device_count(), "MIG device count", gpu) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for k in 0..n {
        // Empty slots answer NotFound.
        let Ok(m) = dev.mig_device_by_index(k) else {
            continue;
        };
        out.push(MigReading {
            gpu_instance_id: opt(nvml_ffi::gpu_instance_id(&m), "GPU instance ID", gpu),
            profile: opt(m.name(), "MIG name", gpu)
                .map(|n| mig_profile(&n))
                .unwrap_or_default(),
            uuid: opt(m.uuid(), "MIG uuid", gpu).unwrap_or_default(),
            memory: memory(&m, gpu),
        });
    }
    out
}

/// Compute and graphics processes, one entry per PID.
fn processes(dev: &Device, gpu: u32) -> Vec<ProcessReading> {
    let mut by_pid: BTreeMap<u32, ProcessReading> = BTreeMap::new();
    let lists = [
        opt(dev.running_compute_processes(), "compute processes", gpu),
        opt(dev.running_graphics_processes(), "graphics processes", gpu),
    ];
    for p in lists.into_iter().flatten().flatten() {
        let used = match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        };
        let e = by_pid.entry(p.pid).or_insert(ProcessReading {
            pid: p.pid,
            used_bytes: None,
            gpu_instance_id: p.gpu_instance_id,
        });
        e.used_bytes = e.used_bytes.max(used);
    }
    by_pid.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_driver_contract::host_root::HostRootSource;

    #[test]
    fn mig_profiles_come_from_the_device_name() {
        assert_eq!(mig_profile("NVIDIA A100-SXM4-80GB MIG 1g.10gb"), "1g.10gb");
        assert_eq!(mig_profile("NVIDIA H100 80GB HBM3 MIG 3g.40gb"), "3g.40gb");
        assert_eq!(mig_profile("odd"), "odd");
    }

    #[test]
    fn the_driver_roots_library_is_preferred_to_the_soname() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path(), HostRootSource::Flag);
        let cfg = NvmlConfig {
            explicit: None,
            host_root: root.clone(),
        };
        assert_eq!(choose_lib(&cfg), LibChoice::Soname);
        let lib = dir
            .path()
            .join("var/lib/gpu-driver/drivers/535-open")
            .join(gpu_driver_contract::layout::lib_dir());
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join(LIBNVML), b"").unwrap();
        // An absolute link, as the installer may leave it, stays inside the root.
        std::os::unix::fs::symlink(
            "/var/lib/gpu-driver/drivers/535-open",
            dir.path().join("var/lib/gpu-driver/drivers/current"),
        )
        .unwrap();
        assert_eq!(choose_lib(&cfg), LibChoice::DriverRoot(lib.join(LIBNVML)));
        let explicit = NvmlConfig {
            explicit: Some("/x/libnvidia-ml.so.1".into()),
            host_root: root,
        };
        assert_eq!(
            choose_lib(&explicit),
            LibChoice::Explicit("/x/libnvidia-ml.so.1".into())
        );
    }

    #[test]
    fn a_missing_library_is_retried_with_a_bounded_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join(LIBNVML);
        let mut src = Source::new(NvmlConfig {
            explicit: Some(missing.clone()),
            host_root: HostRoot::new(dir.path(), HostRootSource::Flag),
        });
        let t0 = Instant::now();
        let c = src.collect(t0);
        let err = c.health.error.unwrap_or_default();
        assert!(!c.health.up);
        assert!(err.contains("NVML library not found"), "{err}");
        assert!(err.contains(&missing.display().to_string()), "{err}");
        let mut waits = Vec::new();
        let mut t = t0;
        for _ in 0..8 {
            let State::Down { next_attempt, .. } = &src.state else {
                panic!("loaded a missing library")
            };
            waits.push(next_attempt.duration_since(t));
            t = *next_attempt;
            src.collect(t);
        }
        assert_eq!(waits[0], RETRY_MIN);
        assert_eq!(waits[1], RETRY_MIN * 2);
        assert_eq!(*waits.last().unwrap_or(&Duration::ZERO), RETRY_MAX);
    }
}
