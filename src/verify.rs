//! `verify`: asks the installed driver's own `nvidia-smi` what it sees and
//! compares that with detect (GPU count) and the installed driver version,
//! and runs the CUDA check ([`crate::cuda`]): the driver root's libcuda
//! through the CUDA driver API on every device. Both checks always run and
//! both are reported.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cuda::{self, CudaStatus};
use crate::error::{Error, Failure, Result, Success};
use crate::host_root::HostRoot;
use crate::install::DRIVERS_DIR;
use crate::node::{self, PciRole};
use crate::report::{Document, Kind, Outcome, Reason, StatusOutcome};
use crate::step::{self, Done, StepStatus};

/// nvidia-smi answers in seconds; one stuck in the kernel (a GPU fallen off
/// the bus) would hang the Job with no result.
const SMI_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// The query verify runs; its CSV columns are what [`parse_smi_csv`] reads.
pub(crate) const SMI_ARGS: &[&str] = &[
    "--query-gpu=name,uuid,driver_version,memory.total",
    "--format=csv,noheader",
];

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifySpec {
    pub host_root: String,
    pub nvidia_smi: String,
    /// The libcuda the CUDA check loads.
    #[serde(default)]
    pub libcuda: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
}

/// One GPU as nvidia-smi lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SmiGpu {
    pub name: String,
    pub uuid: String,
    pub driver_version: String,
    /// As printed, e.g. `15360 MiB`.
    pub memory_total: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifyStatus {
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_driver_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_gpu_count: Option<usize>,
    #[serde(default)]
    pub gpus: Vec<SmiGpu>,
    /// The CUDA check: driver API version, device count, each device's
    /// result; reported also when nvidia-smi failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<CudaStatus>,
}

pub(crate) type VerifyResult = Document<VerifySpec, VerifyStatus>;

impl StatusOutcome for VerifyStatus {
    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

pub(crate) struct VerifyOptions<'a> {
    pub root: &'a HostRoot,
    /// Default: `<host-root>/var/lib/gpu-driver/drivers/current/usr/bin/nvidia-smi`.
    pub nvidia_smi: Option<PathBuf>,
    /// Default: `<driver root>/usr/lib/<arch>-linux-gnu/libcuda.so.1`.
    pub libcuda: Option<PathBuf>,
    /// Default: the current driver root's manifest.
    pub driver_version: Option<String>,
}

/// Parses `nvidia-smi --query-gpu=name,uuid,driver_version,memory.total
/// --format=csv,noheader`: one line per GPU, fields separated by `, `.
/// The name comes first and is split from the right, so a comma in it does
/// no harm.
pub(crate) fn parse_smi_csv(text: &str) -> Result<Vec<SmiGpu>> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut parts: Vec<&str> = line.rsplitn(4, ',').map(str::trim).collect();
        if parts.len() != 4 || parts.iter().any(|p| p.is_empty()) {
            return Err(Error::new(
                Failure::VerifyFailed,
                format!(
                    "nvidia-smi printed {line:?}, not name, uuid, driver_version, memory.total"
                ),
            ));
        }
        parts.reverse();
        out.push(SmiGpu {
            name: parts[0].to_string(),
            uuid: parts[1].to_string(),
            driver_version: parts[2].to_string(),
            memory_total: parts[3].to_string(),
        });
    }
    Ok(out)
}

/// Compares nvidia-smi's view with what was expected.
pub(crate) fn check(
    gpus: &[SmiGpu],
    want_version: Option<&str>,
    want_count: usize,
) -> Result<String> {
    if gpus.len() != want_count {
        return Err(Error::new(
            Failure::VerifyFailed,
            format!(
                "nvidia-smi lists {} GPU(s), detect found {want_count} on the PCI bus",
                gpus.len()
            ),
        ));
    }
    if let Some(v) = want_version {
        let wrong: Vec<String> = gpus
            .iter()
            .filter(|g| g.driver_version != v)
            .map(|g| format!("{} reports {}", g.uuid, g.driver_version))
            .collect();
        if !wrong.is_empty() {
            return Err(Error::new(
                Failure::VerifyFailed,
                format!("expected driver {v}, but {}", wrong.join(", ")),
            ));
        }
    }
    Ok(format!(
        "nvidia-smi sees {} GPU(s) with driver {}: {}",
        gpus.len(),
        want_version.unwrap_or("(version not checked)"),
        gpus.iter()
            .map(|g| g.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The current driver root, its links resolved inside the host root (a
/// host whose `var/lib` is an absolute link keeps its drivers inside it).
fn current_root(root: &HostRoot) -> PathBuf {
    let rel = Path::new(DRIVERS_DIR).join("current");
    root.resolve(&rel).unwrap_or_else(|| root.join(&rel))
}

/// The current driver root's manifest version.
fn installed_version(root: &HostRoot) -> Option<String> {
    let bytes = crate::artifact::MANIFEST
        .read(&current_root(root).join("manifest.json"))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("driverVersion")?.as_str().map(str::to_string)
}

/// `current/usr/bin/nvidia-smi` (the artifact's layout); a hand-placed
/// `current/bin/nvidia-smi` is taken when only that exists.
pub(crate) fn default_nvidia_smi(root: &HostRoot) -> PathBuf {
    let current = current_root(root);
    let usr = current.join(crate::userspace::BIN_DIR).join("nvidia-smi");
    let flat = current.join("bin/nvidia-smi");
    if !usr.is_file() && flat.is_file() {
        flat
    } else {
        usr
    }
}

/// `<driver root>/usr/lib/<arch>-linux-gnu/libcuda.so.1`.
pub(crate) fn default_libcuda(root: &HostRoot) -> PathBuf {
    current_root(root)
        .join(crate::userspace::lib_dir())
        .join(cuda::LIBCUDA)
}

pub(crate) fn verify(opts: &VerifyOptions) -> VerifyResult {
    let smi = opts
        .nvidia_smi
        .clone()
        .unwrap_or_else(|| default_nvidia_smi(opts.root));
    let libcuda = opts
        .libcuda
        .clone()
        .unwrap_or_else(|| default_libcuda(opts.root));
    let spec = VerifySpec {
        host_root: opts.root.path().display().to_string(),
        nvidia_smi: smi.display().to_string(),
        libcuda: libcuda.display().to_string(),
        driver_version: opts.driver_version.clone(),
    };
    let mut status = VerifyStatus::unfinished();
    status.expected_driver_version = opts
        .driver_version
        .clone()
        .or_else(|| installed_version(opts.root));
    let result = step::attempt(status, |status| {
        let smi_result = gpu_count(opts.root).and_then(|count| {
            status.expected_gpu_count = Some(count);
            smi_check(opts.root, &smi, status, count)
        });
        let cuda = cuda::check(opts.root, &libcuda, status.expected_gpu_count);
        let done = combine(smi_result, &cuda);
        status.cuda = Some(cuda);
        done
    });
    step::document(spec, result)
}

/// Both checks' outcome: nvidia-smi's failure first (its reason, with the
/// CUDA check's result after it), else the CUDA check's
/// (`CudaCheckFailed`), else `Verified`; the message always says both.
pub(crate) fn combine(smi: Result<String>, cuda: &CudaStatus) -> Result<Done> {
    match smi {
        Err(e) => Err(Error::new(e.reason, format!("{e}; {}", cuda.message)).with_source(e)),
        Ok(msg) if !cuda.ok => Err(Error::new(
            Failure::CudaCheckFailed,
            format!("{}; {msg}", cuda.message),
        )),
        Ok(msg) => Ok(Done::new(
            Success::Verified,
            format!("{msg}; {}", cuda.message),
        )),
    }
}

impl StepStatus for VerifyStatus {
    const KIND: Kind = Kind::VerifyResult;
    fn unfinished() -> Self {
        VerifyStatus {
            outcome: Outcome::new(Reason::Internal, "verify did not finish"),
            expected_driver_version: None,
            expected_gpu_count: None,
            gpus: Vec::new(),
            cuda: None,
        }
    }
    fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

/// The GPUs detect counts on the PCI bus.
fn gpu_count(root: &HostRoot) -> Result<usize> {
    Ok(node::read_pci_devices(&node::pci_devices_dir(root))?
        .iter()
        .filter(|d| d.role() == PciRole::Gpu)
        .count())
}

fn smi_check(root: &HostRoot, smi: &Path, st: &mut VerifyStatus, count: usize) -> Result<String> {
    if !smi.is_file() {
        return Err(Error::new(
            Failure::VerifyFailed,
            format!("{} does not exist", smi.display()),
        )
        .with_hint(
            "the artifact carried no user space (built from module sources without one); build from NVIDIA's .run, install nvidia-smi into the driver root's usr/bin/, or pass --nvidia-smi",
        ));
    }
    // The driver root's own libraries (libnvidia-ml) before the system's.
    let mut libs: Vec<PathBuf> = Vec::new();
    for dir in smi.ancestors().skip(2).take(2) {
        for l in [crate::userspace::lib_dir(), "lib".into(), "lib64".into()] {
            let p = dir.join(l);
            if p.is_dir() && !libs.contains(&p) {
                libs.push(p);
            }
        }
    }
    let mut cmd = smi_command(root, smi, &libs);
    cmd.args(SMI_ARGS);
    let out = crate::process::run_within(&mut cmd, Failure::VerifyFailed, SMI_DEADLINE)?;
    st.gpus = parse_smi_csv(&String::from_utf8_lossy(&out.stdout))?;
    check(&st.gpus, st.expected_driver_version.as_deref(), count)
}

/// How `nvidia-smi` is started. NVIDIA's is a dynamically linked ELF: from
/// an image without a dynamic loader (the installer image is `FROM
/// scratch`, what a node that installs a cached artifact runs in) it
/// cannot be executed directly, so it runs under the host's loader from
/// the host root with the driver root's and the host's libraries, as the
/// CUDA check does. Anything else (a script given with `--nvidia-smi`), or
/// a host root without a loader, is executed directly, with the driver
/// root's libraries first on `LD_LIBRARY_PATH`.
fn smi_command(root: &HostRoot, smi: &Path, libs: &[PathBuf]) -> std::process::Command {
    let elf = std::fs::File::open(smi)
        .and_then(|mut f| {
            let mut magic = [0u8; 4];
            std::io::Read::read_exact(&mut f, &mut magic).map(|()| magic)
        })
        .is_ok_and(|m| m == *b"\x7fELF");
    let joined = |dirs: &[PathBuf]| -> Option<std::ffi::OsString> {
        let mut out = std::ffi::OsString::new();
        for (i, d) in dirs.iter().enumerate() {
            if d.as_os_str().as_encoded_bytes().contains(&b':') {
                return None;
            }
            if i > 0 {
                out.push(":");
            }
            out.push(d);
        }
        Some(out)
    };
    if elf && let Ok(loader) = cuda::find_loader(root) {
        let mut dirs = libs.to_vec();
        for d in cuda::library_path(root, smi).into_iter().skip(1) {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        if let Some(path) = joined(&dirs) {
            let mut cmd = crate::process::command(&loader);
            cmd.arg("--inhibit-cache")
                .arg("--library-path")
                .arg(path)
                .arg(smi);
            return cmd;
        }
    }
    let mut cmd = crate::process::command(smi);
    if let Some(path) = joined(libs).filter(|p| !p.is_empty()) {
        cmd.env("LD_LIBRARY_PATH", path);
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written from NVIDIA's documented `--format=csv,noheader` output of
    /// this query (nvidia-smi --help-query-gpu), not captured from a GPU.
    const TWO_GPUS: &str = "Tesla T4, GPU-5b6a9c1e-8f3a-2b7d-41c0-9e2f7a6d3b11, 535.261.03, 15360 MiB\n\
NVIDIA H100 80GB HBM3, GPU-0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b, 535.261.03, 81559 MiB\n";

    #[test]
    fn parses_documented_csv() {
        let gpus = parse_smi_csv(TWO_GPUS).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "Tesla T4");
        assert_eq!(gpus[1].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(gpus[1].driver_version, "535.261.03");
        assert_eq!(gpus[1].memory_total, "81559 MiB");
        // A comma in the name is kept.
        let g = parse_smi_csv("A, B, GPU-1, 550.54, 1 MiB").unwrap();
        assert_eq!(g[0].name, "A, B");
        assert!(parse_smi_csv("No devices were found").is_err());
        assert!(parse_smi_csv("").unwrap().is_empty());
    }

    #[test]
    fn both_checks_are_reported() {
        let combine = |smi, cuda| match super::combine(smi, cuda) {
            Ok(done) => Outcome::from(done),
            Err(e) => Outcome::from(&e),
        };
        let cuda_ok = CudaStatus {
            ok: true,
            message: "CUDA 12.2 (driver API) on 1 device(s): …".into(),
            ..CudaStatus::default()
        };
        let cuda_failed = CudaStatus {
            ok: false,
            message: "CUDA: cuInit failed with 802 CUDA_ERROR_SYSTEM_NOT_READY".into(),
            ..CudaStatus::default()
        };
        let o = combine(Ok("nvidia-smi sees 1 GPU(s)".into()), &cuda_ok);
        assert_eq!(o.reason, Reason::Verified);
        assert_eq!(
            o.message,
            "nvidia-smi sees 1 GPU(s); CUDA 12.2 (driver API) on 1 device(s): …"
        );
        // nvidia-smi works, CUDA does not (Fabric Manager on NVSwitch).
        let o = combine(Ok("nvidia-smi sees 8 GPU(s)".into()), &cuda_failed);
        assert_eq!(o.reason, Reason::CudaCheckFailed);
        assert!(
            o.message.starts_with("CUDA: cuInit failed with 802"),
            "{}",
            o.message
        );
        assert!(
            o.message.ends_with("; nvidia-smi sees 8 GPU(s)"),
            "{}",
            o.message
        );
        // Both fail: nvidia-smi's reason, both messages.
        let smi = Err(Error::new(
            Failure::VerifyFailed,
            "nvidia-smi exited with 9",
        ));
        let o = combine(smi, &cuda_failed);
        assert_eq!(o.reason, Reason::VerifyFailed);
        assert_eq!(
            o.message,
            "nvidia-smi exited with 9; CUDA: cuInit failed with 802 CUDA_ERROR_SYSTEM_NOT_READY"
        );
    }

    #[test]
    fn checks_count_and_version() {
        let gpus = parse_smi_csv(TWO_GPUS).unwrap();
        assert!(check(&gpus, Some("535.261.03"), 2).is_ok());
        let e = check(&gpus, Some("550.163.01"), 2).unwrap_err();
        assert_eq!(e.reason, Reason::VerifyFailed);
        assert!(e.to_string().contains("expected driver 550.163.01"), "{e}");
        let e = check(&gpus, None, 3).unwrap_err();
        assert!(
            e.to_string().contains("lists 2 GPU(s), detect found 3"),
            "{e}"
        );
    }
}
