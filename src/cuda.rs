//! The CUDA half of `verify`: the driver root's `libcuda.so.1` loaded and
//! exercised through the CUDA driver API on every device (context, a small
//! allocation, a host→device→host copy compared byte for byte).
//!
//! The installer is a static binary, and `dlopen` from a statically linked
//! glibc program is not sound: the library would get a second, dynamically
//! loaded glibc next to the static one, of whatever version the container
//! has. So the work is done by a small dynamically linked C program
//! (`src/cuda-check.c`, compiled by `build.rs`, embedded here), which the
//! installer runs with the HOST's dynamic loader from the host root:
//!
//! ```text
//! <host-root>/lib64/ld-linux-x86-64.so.2 --inhibit-cache \
//!     --library-path <driver-root>/usr/lib/<triplet>:<host-root>/lib/<triplet>:… \
//!     /proc/self/fd/N <driver-root>/usr/lib/<triplet>/libcuda.so.1
//! ```
//!
//! The helper is handed over as a memfd (nothing written to disk, works in
//! a read-only or `noexec` container filesystem), falling back to a
//! temporary file; it runs with [`crate::process::command`]'s minimal
//! environment. It prints one JSON line, parsed here by [`parse_report`]
//! and judged by [`judge`], both tested on captured output.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Failure, Result};
use crate::host_root::HostRoot;

/// cuInit and a context per device take seconds, tens on a large HGX;
/// past this the helper is hung and is killed with its result missing.
const CUDA_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// The helper program, built from `src/cuda-check.c` by `build.rs`.
pub(crate) const HELPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gpu-driver-cuda-check"));

/// Its name, in messages and as the memfd's name.
pub(crate) const HELPER_NAME: &str = "gpu-driver-cuda-check";

/// The SONAME the check loads from the driver root's library directory.
pub(crate) const LIBCUDA: &str = "libcuda.so.1";

/// A failed call as the helper reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CudaError {
    /// `cuInit`, `cuDeviceGetCount`, `cuCtxCreate_v2`, …; `dlopen`,
    /// `dlsym <name>`, or `memcmp` (the bytes read back differ).
    pub call: String,
    /// The CUresult, for a CUDA call.
    pub code: Option<i64>,
    /// `cuGetErrorName`'s, e.g. `CUDA_ERROR_NO_DEVICE`.
    pub name: Option<String>,
    /// `cuGetErrorString`'s (or `dlerror`'s).
    pub message: Option<String>,
}

/// One device as the helper saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CudaDevice {
    /// The CUDA device ordinal.
    pub index: u32,
    /// `cuDeviceGetName`'s.
    pub name: Option<String>,
    /// Context, allocation, copy round trip, free and destroy all passed.
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CudaError>,
}

/// The helper's JSON line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HelperReport {
    /// The libcuda it loaded.
    pub library: String,
    /// `gnu_get_libc_version()`: the glibc it ran with.
    #[serde(default)]
    pub glibc: Option<String>,
    /// The path of that glibc's `libc.so.6`.
    #[serde(default)]
    pub libc: Option<String>,
    /// `cuDriverGetVersion`'s, e.g. 12020.
    #[serde(default)]
    pub driver_version: Option<i64>,
    #[serde(default)]
    pub device_count: Option<usize>,
    #[serde(default)]
    pub devices: Vec<CudaDevice>,
    /// A failure before the devices (dlopen, dlsym, cuInit, cuDeviceGetCount).
    #[serde(default)]
    pub error: Option<CudaError>,
}

/// `status.cuda` of a VerifyResult.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CudaStatus {
    /// Every device CUDA enumerates passed.
    pub ok: bool,
    pub message: String,
    /// The `libcuda.so.1` loaded (as the installer sees it).
    pub library: String,
    /// The host's dynamic loader that ran the helper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loader: Option<String>,
    /// The host's `libc.so.6` the helper and libcuda ran with, and its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libc: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub glibc: Option<String>,
    /// `cuDriverGetVersion` as MAJOR.MINOR, e.g. `12.2`: the newest CUDA
    /// version this driver supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_api_version: Option<String>,
    /// `cuDeviceGetCount`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_count: Option<usize>,
    #[serde(default)]
    pub devices: Vec<CudaDevice>,
    /// The failure before the devices, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CudaError>,
}

/// Parses the helper's stdout: one JSON object on its last non-empty line
/// (libcuda itself prints nothing there, but a line before it is ignored).
pub(crate) fn parse_report(stdout: &str) -> Result<HelperReport> {
    let line = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("");
    serde_json::from_str(line).map_err(|e| {
        Error::new(
            Failure::CudaCheckFailed,
            format!(
                "{HELPER_NAME} printed {:?}, not its JSON report ({e})",
                crate::text::truncate(line, 300)
            ),
        )
    })
}

/// `cuDriverGetVersion`'s 1000 × major + 10 × minor as `major.minor`.
pub(crate) fn api_version(v: i64) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// What a CUresult usually means on a node, and what to do about it.
/// `None` for codes without node-specific advice (libcuda's own
/// `cuGetErrorString` text is quoted for every code).
pub(crate) fn explain(code: i64) -> Option<(&'static str, &'static str)> {
    Some(match code {
        3 => (
            "CUDA was not initialized",
            "cuInit failed or was not called; the first error reported is the one to fix",
        ),
        35 => (
            "libcuda is newer than the loaded kernel module",
            "the driver root's user space and the loaded nvidia modules must be the same driver version: reinstall, or unload the old modules (uninstall) and install again",
        ),
        46 => (
            "the devices are busy or unavailable",
            "a GPU in exclusive-process compute mode is held by another process, or the GPUs are in use; check `nvidia-smi -q -d COMPUTE`",
        ),
        100 => (
            "no CUDA-capable device is visible",
            "the nvidia modules are not loaded, /dev/nvidia* (nvidiactl, nvidia<N>, nvidia-uvm) is missing or not accessible where verify runs, or the GPUs are bound to another driver (vfio-pci); check /proc/driver/nvidia/gpus and `ls -l /dev/nvidia*`",
        ),
        101 => (
            "a device ordinal is invalid",
            "CUDA's device list changed during the check; run verify again",
        ),
        214 => (
            "an uncorrectable ECC error was detected",
            "the GPU needs a reset or service; see `nvidia-smi -q -d ECC` and the kernel log (Xid)",
        ),
        304 => (
            "an operating-system call failed",
            "often /dev/nvidia* permissions or the container's device cgroup rules; run verify privileged or on the host",
        ),
        802 => (
            "the system is not ready: Fabric Manager not running on an NVSwitch system",
            "start nvidia-fabricmanager of exactly the installed driver version (HGX/NVSwitch systems need it before CUDA works; nvidia-smi works without it)",
        ),
        803 => (
            "the kernel driver and libcuda are of different versions",
            "the driver root's user space must match the loaded modules: reinstall the same version",
        ),
        804 => (
            "forward-compatibility libcuda on a GPU that does not support it",
            "use the libcuda of the installed driver, not a cuda-compat package (CUDA forward compatibility is for data-center GPUs only)",
        ),
        999 => (
            "an unknown CUDA error",
            "commonly /dev/nvidia-uvm missing (nvidia-uvm not loaded), a kernel module and libcuda of different versions, or a GPU that fell off the bus; see the kernel log (NVRM, Xid)",
        ),
        _ => return None,
    })
}

/// `cuInit failed with 100 CUDA_ERROR_NO_DEVICE (no CUDA-capable device is
/// detected)`, with [`explain`]'s meaning and hint when known.
pub(crate) fn describe(err: &CudaError) -> String {
    let mut text = match err.code {
        Some(code) => format!(
            "{} failed with {code} {}",
            err.call,
            err.name.as_deref().unwrap_or("(unnamed CUresult)")
        ),
        None => format!("{} failed", err.call),
    };
    if let Some(m) = &err.message {
        text.push_str(&format!(" ({m})"));
    }
    if let Some((meaning, hint)) = err.code.and_then(explain) {
        text.push_str(&format!(": {meaning}; {hint}"));
    }
    text
}

/// Judges a report: `Ok` with a summary when every device CUDA
/// enumerates passed, else `CudaCheckFailed` naming each failure. A device
/// count other than detect's is said but not a failure (nvidia-smi's check
/// compares counts; CUDA does not enumerate GPUs in MIG mode without
/// instances).
pub(crate) fn judge(report: &HelperReport, expected_gpus: Option<usize>) -> Result<String> {
    if let Some(err) = &report.error {
        let mut msg = format!("CUDA: {}", describe(err));
        if err.call == "dlopen" || err.call.starts_with("dlsym") {
            msg.push_str(&format!(
                "; {} could not be loaded with the host's glibc {}",
                report.library,
                report.glibc.as_deref().unwrap_or("(unknown version)")
            ));
        }
        return Err(Error::new(Failure::CudaCheckFailed, msg));
    }
    let count = report.device_count.unwrap_or(report.devices.len());
    let failed: Vec<String> = report
        .devices
        .iter()
        .filter(|d| !d.ok)
        .map(|d| {
            let what = d
                .error
                .as_ref()
                .map_or_else(|| "failed without an error report".to_string(), describe);
            format!(
                "device {} ({}): {what}",
                d.index,
                d.name.as_deref().unwrap_or("unnamed")
            )
        })
        .collect();
    if !failed.is_empty() || report.devices.len() != count {
        let mut msg = format!("CUDA: {} of {count} device(s) failed", failed.len());
        if report.devices.len() != count {
            msg.push_str(&format!(
                ", {} reported for {count} enumerated",
                report.devices.len()
            ));
        }
        if !failed.is_empty() {
            msg.push_str(": ");
            msg.push_str(&failed.join("; "));
        }
        return Err(Error::new(Failure::CudaCheckFailed, msg));
    }
    let names: Vec<&str> = report
        .devices
        .iter()
        .map(|d| d.name.as_deref().unwrap_or("unnamed"))
        .collect();
    let mut msg = format!(
        "CUDA {} (driver API) on {count} device(s): context, allocation and copy round trip passed: {}",
        report
            .driver_version
            .map_or_else(|| "(version unknown)".to_string(), api_version),
        names.join(", ")
    );
    if let Some(n) = expected_gpus.filter(|n| *n != count) {
        msg.push_str(&format!(
            " (detect found {n} GPU(s) on the PCI bus; GPUs in MIG mode without instances are not CUDA devices)"
        ));
    }
    Ok(msg)
}

// ------------------------------------------------------------ running it

/// The host's dynamic loader for this CPU architecture, resolved inside
/// the host root (Debian's `/lib64/ld-linux-x86-64.so.2` is an absolute
/// link).
pub(crate) fn find_loader(root: &HostRoot) -> Result<PathBuf> {
    let candidates: &[&str] = match std::env::consts::ARCH {
        "aarch64" => &[
            "/lib/ld-linux-aarch64.so.1",
            "/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
            "/usr/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
        ],
        _ => &[
            "/lib64/ld-linux-x86-64.so.2",
            "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            "/usr/lib64/ld-linux-x86-64.so.2",
        ],
    };
    candidates
        .iter()
        .find_map(|c| root.resolve(c).filter(|p| p.is_file()))
        .ok_or_else(|| {
            Error::new(
                Failure::CudaCheckFailed,
                format!(
                    "CUDA: no dynamic loader under the host root {} (looked for {})",
                    root.path().display(),
                    candidates.join(", ")
                ),
            )
            .with_hint(
                "the CUDA check runs libcuda with the host's own glibc; pass the host's root filesystem as --host-root",
            )
        })
}

/// `--library-path`: libcuda's own directory (the driver root's, for the
/// libraries libcuda loads itself), then the host's library directories
/// that exist, resolved inside the host root. With `--inhibit-cache` the
/// container's `ld.so.cache` is not read; the loader's built-in default
/// directories (as the installer's mount namespace shows them) come only
/// after these, which hold the host's libc, libm, libdl, libpthread and
/// librt.
pub(crate) fn library_path(root: &HostRoot, libcuda: &Path) -> Vec<PathBuf> {
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    let mut dirs: Vec<PathBuf> = libcuda
        .parent()
        .map(Path::to_path_buf)
        .into_iter()
        .collect();
    let host = [
        format!("/lib/{triplet}"),
        format!("/usr/lib/{triplet}"),
        "/lib64".into(),
        "/usr/lib64".into(),
        "/lib".into(),
        "/usr/lib".into(),
    ];
    for rel in host {
        if let Some(p) = root.resolve(&rel).filter(|p| p.is_dir()) {
            if !dirs.contains(&p) {
                dirs.push(p);
            }
        }
    }
    dirs
}

/// The helper as a file the loader can map: a memfd (inherited by the
/// child, named by `/proc/self/fd/N` there), or a temporary file where
/// memfds are refused. The returned value keeps it alive.
enum HelperFile {
    Memfd(File),
    Temp(tempfile::TempPath),
}

impl HelperFile {
    fn create() -> Result<Self> {
        let fail = |e: String| {
            Error::new(
                Failure::CudaCheckFailed,
                format!("CUDA: writing {HELPER_NAME}: {e}"),
            )
        };
        // No MFD_CLOEXEC: the child must inherit it.
        if let Ok(fd) =
            nix::sys::memfd::memfd_create(HELPER_NAME, nix::sys::memfd::MFdFlags::empty())
        {
            let mut file = File::from(fd);
            file.write_all(HELPER).map_err(|e| fail(e.to_string()))?;
            if Path::new("/proc/self/fd").is_dir() {
                return Ok(HelperFile::Memfd(file));
            }
        }
        let mut tmp = tempfile::Builder::new()
            .prefix(HELPER_NAME)
            .tempfile()
            .map_err(|e| fail(e.to_string()))?;
        tmp.write_all(HELPER).map_err(|e| fail(e.to_string()))?;
        Ok(HelperFile::Temp(tmp.into_temp_path()))
    }

    /// The path the child opens.
    fn path(&self) -> PathBuf {
        match self {
            HelperFile::Memfd(f) => PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())),
            HelperFile::Temp(p) => p.to_path_buf(),
        }
    }
}

/// The command that runs the helper on `libcuda` with the host's loader.
pub(crate) fn helper_command(
    loader: &Path,
    library_path: &[PathBuf],
    helper: &Path,
    libcuda: &Path,
) -> Result<std::process::Command> {
    let mut joined = std::ffi::OsString::new();
    for (i, dir) in library_path.iter().enumerate() {
        if dir.as_os_str().as_encoded_bytes().contains(&b':') {
            return Err(Error::new(
                Failure::CudaCheckFailed,
                format!(
                    "CUDA: {} contains ':', which a loader's library path cannot hold",
                    dir.display()
                ),
            ));
        }
        if i > 0 {
            joined.push(":");
        }
        joined.push(dir);
    }
    let mut cmd = crate::process::command(loader);
    cmd.arg("--inhibit-cache")
        .arg("--library-path")
        .arg(joined)
        .arg(helper)
        .arg(libcuda);
    Ok(cmd)
}

/// Runs the helper and parses what it printed; a helper that printed no
/// report (the loader refused it, it crashed) is `CudaCheckFailed` with its
/// exit status and stderr.
pub(crate) fn run_helper(root: &HostRoot, libcuda: &Path) -> Result<(PathBuf, HelperReport)> {
    if !libcuda.is_file() {
        return Err(Error::new(
            Failure::CudaCheckFailed,
            format!("CUDA: {} does not exist", libcuda.display()),
        )
        .with_hint(
            "the artifact carried no CUDA user space (built from module sources without one); build from NVIDIA's .run, or install libcuda.so.1 into the driver root's library directory",
        ));
    }
    let loader = find_loader(root)?;
    let helper = HelperFile::create()?;
    let mut cmd = helper_command(
        &loader,
        &library_path(root, libcuda),
        &helper.path(),
        libcuda,
    )?;
    let prefixed = |e: Error| e.context("CUDA");
    let out = crate::process::output_within(&mut cmd, Failure::CudaCheckFailed, CUDA_DEADLINE)
        .map_err(prefixed)?;
    drop(helper);
    let stdout = String::from_utf8_lossy(&out.stdout);
    match parse_report(&stdout) {
        Ok(report) => Ok((loader, report)),
        // The loader refused the helper (e.g. a glibc older than 2.34) or
        // it crashed: its exit status and stderr say why.
        Err(_) => Err(prefixed(crate::process::exit_error(
            &cmd,
            &out,
            Failure::CudaCheckFailed,
        ))
        .with_hint(format!(
            "when the loader says a GLIBC version is not found, the host's glibc is older than the 2.34 {HELPER_NAME} needs (docs/install.md, \"The CUDA check\")"
        ))),
    }
}

/// The whole CUDA check of `verify`, reported whatever happens.
pub(crate) fn check(root: &HostRoot, libcuda: &Path, expected_gpus: Option<usize>) -> CudaStatus {
    let mut status = CudaStatus {
        library: libcuda.display().to_string(),
        ..CudaStatus::default()
    };
    let judged = run_helper(root, libcuda).and_then(|(loader, report)| {
        status.loader = Some(loader.display().to_string());
        status.libc = report.libc.clone();
        status.glibc = report.glibc.clone();
        status.driver_api_version = report.driver_version.map(api_version);
        status.device_count = report.device_count;
        status.devices = report.devices.clone();
        status.error = report.error.clone();
        judge(&report, expected_gpus)
    });
    match judged {
        Ok(msg) => {
            status.ok = true;
            status.message = msg;
        }
        Err(e) => status.message = e.to_string(),
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

    /// Captured on this project's CI machine (no GPU): Debian bookworm's
    /// libcuda1 535.261.03, run through the host loader.
    const NO_DEVICE: &str = r#"{"library":"/var/lib/gpu-driver/drivers/current/usr/lib/x86_64-linux-gnu/libcuda.so.1","glibc":"2.36","libc":"/lib/x86_64-linux-gnu/libc.so.6","driverVersion":12020,"error":{"call":"cuInit","code":100,"name":"CUDA_ERROR_NO_DEVICE","message":"no CUDA-capable device is detected"}}
"#;

    /// Captured from the helper on a path that does not exist.
    const NO_LIBRARY: &str = r#"{"library":"/nonexistent","glibc":"2.36","error":{"call":"dlopen","code":null,"name":null,"message":"/nonexistent: cannot open shared object file: No such file or directory"}}
"#;

    /// Written in the helper's format (not captured from a GPU): two
    /// devices, the second failing its context.
    const TWO_DEVICES: &str = r#"{"library":"/l/libcuda.so.1","glibc":"2.36","libc":"/lib/x86_64-linux-gnu/libc.so.6","driverVersion":12080,"deviceCount":2,"devices":[{"index":0,"name":"NVIDIA H100 80GB HBM3","ok":true},{"index":1,"name":"NVIDIA H100 80GB HBM3","ok":false,"error":{"call":"cuCtxCreate_v2","code":999,"name":"CUDA_ERROR_UNKNOWN","message":"unknown error"}}]}"#;

    #[test]
    fn parses_the_real_no_device_report() {
        let r = parse_report(NO_DEVICE).unwrap();
        assert_eq!(r.driver_version, Some(12020));
        assert_eq!(api_version(12020), "12.2");
        let e = r.error.as_ref().unwrap();
        assert_eq!((e.call.as_str(), e.code), ("cuInit", Some(100)));
        let err = judge(&r, Some(1)).unwrap_err();
        assert_eq!(err.reason, Reason::CudaCheckFailed);
        assert!(
            err.to_string().starts_with(
                "CUDA: cuInit failed with 100 CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected): no CUDA-capable device is visible; the nvidia modules are not loaded"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_library_that_does_not_load_is_named() {
        let r = parse_report(NO_LIBRARY).unwrap();
        let err = judge(&r, None).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("CUDA: dlopen failed (/nonexistent: cannot open shared object file"),
            "{err}"
        );
        assert!(
            err.to_string()
                .ends_with("/nonexistent could not be loaded with the host's glibc 2.36"),
            "{err}"
        );
    }

    #[test]
    fn each_failed_device_is_named() {
        let r = parse_report(TWO_DEVICES).unwrap();
        assert_eq!(r.devices.len(), 2);
        let err = judge(&r, Some(2)).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "CUDA: 1 of 2 device(s) failed: device 1 (NVIDIA H100 80GB HBM3): cuCtxCreate_v2 failed with 999 CUDA_ERROR_UNKNOWN (unknown error): an unknown CUDA error;"
            ),
            "{err}"
        );
        let mut ok = r.clone();
        ok.devices[1].ok = true;
        ok.devices[1].error = None;
        let msg = judge(&ok, Some(2)).unwrap();
        assert_eq!(
            msg,
            "CUDA 12.8 (driver API) on 2 device(s): context, allocation and copy round trip passed: NVIDIA H100 80GB HBM3, NVIDIA H100 80GB HBM3"
        );
        // A count other than detect's is said, not failed.
        assert!(
            judge(&ok, Some(3))
                .unwrap()
                .contains("detect found 3 GPU(s)")
        );
        // Fewer device reports than enumerated devices: a truncated report.
        ok.devices.pop();
        assert!(judge(&ok, Some(2)).is_err());
    }

    #[test]
    fn fabric_manager_is_named_for_802() {
        let e = CudaError {
            call: "cuInit".into(),
            code: Some(802),
            name: Some("CUDA_ERROR_SYSTEM_NOT_READY".into()),
            message: Some("system not yet initialized".into()),
        };
        let text = describe(&e);
        assert!(
            text.contains("Fabric Manager not running on an NVSwitch system"),
            "{text}"
        );
        for code in [3, 35, 100, 802, 804, 999] {
            assert!(explain(code).is_some(), "{code}");
        }
    }

    #[test]
    fn garbage_is_not_a_report() {
        let e = parse_report("Segmentation fault\n").unwrap_err();
        assert_eq!(e.reason, Reason::CudaCheckFailed);
        assert!(e.to_string().contains("not its JSON report"), "{e}");
        assert!(parse_report("").is_err());
    }

    #[test]
    fn the_loader_and_library_path_stay_inside_the_host_root() {
        let tmp = tempfile::tempdir().unwrap();
        let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
        let lib = tmp.path().join("usr/lib").join(&triplet);
        std::fs::create_dir_all(&lib).unwrap();
        let ld = if std::env::consts::ARCH == "aarch64" {
            "ld-linux-aarch64.so.1"
        } else {
            "ld-linux-x86-64.so.2"
        };
        std::fs::write(lib.join(ld), b"").unwrap();
        // Debian's layout: /lib -> usr/lib, and /lib64/ld-linux… an
        // absolute link, which must resolve inside the root.
        std::os::unix::fs::symlink("usr/lib", tmp.path().join("lib")).unwrap();
        std::fs::create_dir(tmp.path().join("lib64")).unwrap();
        std::os::unix::fs::symlink(
            format!("/lib/{triplet}/{ld}"),
            tmp.path().join("lib64").join(ld),
        )
        .unwrap();
        let root = HostRoot::new(
            tmp.path().to_path_buf(),
            crate::host_root::HostRootSource::Flag,
        );
        let loader = find_loader(&root).unwrap();
        assert!(loader.starts_with(tmp.path()), "{}", loader.display());
        let libcuda = Path::new("/drivers/current/usr/lib/x/libcuda.so.1");
        let path = library_path(&root, libcuda);
        assert_eq!(path[0], Path::new("/drivers/current/usr/lib/x"));
        assert!(
            path[1..].iter().all(|p| p.starts_with(tmp.path())),
            "{path:?}"
        );
        assert!(path.contains(&lib), "{path:?}");
        let empty = tempfile::tempdir().unwrap();
        let none = HostRoot::new(
            empty.path().to_path_buf(),
            crate::host_root::HostRootSource::Flag,
        );
        let e = find_loader(&none).unwrap_err();
        assert_eq!(e.reason, Reason::CudaCheckFailed);
        assert!(
            e.to_string()
                .contains("no dynamic loader under the host root"),
            "{e}"
        );
    }

    #[test]
    fn the_helper_is_embedded_and_dynamically_linked() {
        assert_eq!(&HELPER[..4], b"\x7fELF");
        let text = String::from_utf8_lossy(HELPER);
        assert!(text.contains("libc.so.6"));
        assert!(text.contains("GLIBC_2.34"));
    }
}
