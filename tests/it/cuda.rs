//! verify's CUDA check through the binary: the embedded helper run with the
//! host root's own dynamic loader and glibc (copies of this machine's, see
//! `support/host.rs`), on
//!
//! - NVIDIA's real libcuda (Debian bookworm non-free's libcuda1, from
//!   `scripts/fetch-test-data`) on this machine without a GPU: the real
//!   CUDA error it returns;
//! - the CUDA double compiled here (`tests/gpu-double/libcuda.c`) for the
//!   paths no GPU-less machine reaches: success on two devices, Fabric
//!   Manager's 802, one device failing, a corrupt copy round trip;
//! - a driver root without libcuda, a libcuda that is not a library, and a
//!   host root without a loader.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::host as host_support;

/// nvidia-smi's documented CSV for the fixture's one T4.
const SMI_OK: &str =
    "echo 'Tesla T4, GPU-00000000-0000-0000-0000-000000000001, 535.261.03, 15360 MiB'";

fn run(host: &Path, extra: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    let out = Command::new(crate::support::bin::installer())
        .args(["--termination-log", "/nonexistent/termination-log"])
        .args(["--host-root", host.to_str().unwrap(), "verify"])
        .args(["--driver-version", "535.261.03"])
        .args(extra)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), doc)
}

fn lib_dir() -> String {
    format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH)
}

/// The T4 fixture host with this machine's loader and glibc, and a
/// current driver root holding an nvidia-smi script running `smi` and,
/// when given, `libcuda` (copied with its name; `libcuda.so.1` links to
/// it unless that is its name).
fn host(dir: &Path, smi: &str, libcuda: Option<&Path>) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let host = host_support::installable_host(dir);
    let drivers = host.join("var/lib/gpu-driver/drivers");
    let root = drivers.join("535.261.03-open-test");
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    fs::create_dir_all(root.join(lib_dir())).unwrap();
    std::os::unix::fs::symlink("535.261.03-open-test", drivers.join("current")).unwrap();
    let script = root.join("usr/bin/nvidia-smi");
    fs::write(&script, format!("#!/bin/sh\n{smi}\n")).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    if let Some(lib) = libcuda {
        let real = fs::canonicalize(lib).unwrap();
        let name = real.file_name().unwrap();
        fs::copy(&real, root.join(lib_dir()).join(name)).unwrap();
        if name != "libcuda.so.1" {
            std::os::unix::fs::symlink(name, root.join(lib_dir()).join("libcuda.so.1")).unwrap();
        }
    }
    host
}

fn stub(dir: &Path, defines: &[&str]) -> PathBuf {
    host_support::stub_libcuda(&dir.join("stub"), defines)
}

fn test_data() -> PathBuf {
    let dir = crate::support::tools::test_data();
    let lib = dir.join("libcuda/libcuda.so.1");
    assert!(
        lib.exists(),
        "{} is missing: {}",
        lib.display(),
        crate::support::tools::HOW
    );
    lib
}

fn message(doc: &Value) -> &str {
    doc["status"]["message"].as_str().unwrap()
}

/// The run failed verification (exit code 15) for `reason`.
fn assert_failed(code: i32, doc: &Value, reason: &str) {
    assert_eq!(
        (code, doc["status"]["reason"].as_str()),
        (15, Some(reason)),
        "{doc}"
    );
}

/// A host whose driver root holds a stub libcuda built with `defines`,
/// and an `nvidia-smi` that succeeds.
fn stub_host(dir: &Path, defines: &[&str]) -> PathBuf {
    let lib = stub(dir, defines);
    host(dir, SMI_OK, Some(&lib))
}

#[test]
fn real_libcuda_without_a_gpu_reports_its_cuda_error() {
    let libcuda = test_data();
    let tmp = tempfile::tempdir().unwrap();
    let host = host(tmp.path(), SMI_OK, Some(&libcuda));
    let (code, doc) = run(&host, &[], &[]);
    eprintln!("verify with Debian's libcuda, no GPU: {}", message(&doc));
    assert_failed(code, &doc, "CudaCheckFailed");
    let cuda = &doc["status"]["cuda"];
    assert_eq!(cuda["ok"], false);
    // What NVIDIA's libcuda 535 returns here (no /dev/nvidia*, no module):
    // cuInit fails with CUDA_ERROR_NO_DEVICE, named by libcuda itself.
    assert_eq!(cuda["error"]["call"], "cuInit", "{doc}");
    assert_eq!(cuda["error"]["code"], 100, "{doc}");
    assert_eq!(cuda["error"]["name"], "CUDA_ERROR_NO_DEVICE", "{doc}");
    assert_eq!(
        cuda["error"]["message"],
        "no CUDA-capable device is detected"
    );
    // cuDriverGetVersion works without a device: 535 speaks CUDA 12.2.
    assert!(
        cuda["driverApiVersion"]
            .as_str()
            .unwrap()
            .starts_with("12."),
        "{doc}"
    );
    // libcuda ran with the host root's loader and glibc.
    for key in ["loader", "libc"] {
        assert!(
            cuda[key]
                .as_str()
                .unwrap()
                .starts_with(host.to_str().unwrap()),
            "{key}: {doc}"
        );
    }
    let msg = message(&doc);
    assert!(
        msg.starts_with("CUDA: cuInit failed with 100 CUDA_ERROR_NO_DEVICE"),
        "{msg}"
    );
    assert!(msg.contains("/dev/nvidia*"), "{msg}");
    // nvidia-smi's half passed, and is said too.
    assert!(msg.ends_with("Tesla T4"), "{msg}");
    assert_eq!(doc["status"]["gpus"][0]["name"], "Tesla T4");
}

#[test]
fn nvidia_smi_and_cuda_failing_are_both_reported() {
    let libcuda = test_data();
    let tmp = tempfile::tempdir().unwrap();
    let host = host(
        tmp.path(),
        "echo 'NVIDIA-SMI has failed because it couldn'\\''t communicate with the NVIDIA driver.'; exit 9",
        Some(&libcuda),
    );
    let (code, doc) = run(&host, &[], &[]);
    assert_failed(code, &doc, "VerifyFailed");
    let msg = message(&doc);
    assert!(
        msg.contains("couldn't communicate with the NVIDIA driver"),
        "{msg}"
    );
    assert!(
        msg.contains("; CUDA: cuInit failed with 100 CUDA_ERROR_NO_DEVICE"),
        "{msg}"
    );
    assert_eq!(
        doc["status"]["cuda"]["error"]["name"],
        "CUDA_ERROR_NO_DEVICE"
    );
}

#[test]
fn a_stub_libcuda_passes_on_every_device() {
    let tmp = tempfile::tempdir().unwrap();
    let host = stub_host(tmp.path(), &["STUB_DEVICES=2"]);
    let (code, doc) = run(&host, &[], &[]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["status"]["reason"], "Verified");
    let cuda = &doc["status"]["cuda"];
    assert_eq!(cuda["ok"], true);
    assert_eq!(cuda["driverApiVersion"], "12.2");
    assert_eq!(cuda["deviceCount"], 2);
    let devices = cuda["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1]["name"], "gpu-driver stub GPU 1");
    assert!(devices.iter().all(|d| d["ok"] == true), "{doc}");
    assert!(
        cuda["library"]
            .as_str()
            .unwrap()
            .ends_with(&format!("{}/libcuda.so.1", lib_dir())),
        "{doc}"
    );
    let msg = message(&doc);
    assert!(
        msg.contains("CUDA 12.2 (driver API) on 2 device(s)"),
        "{msg}"
    );
    assert!(msg.contains("detect found 1 GPU(s)"), "{msg}");
}

#[test]
fn fabric_manager_missing_is_cuda_check_failed_with_a_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let host = stub_host(tmp.path(), &["STUB_FAIL=\"cuInit\"", "STUB_CODE=802"]);
    let (code, doc) = run(&host, &[], &[]);
    assert_failed(code, &doc, "CudaCheckFailed");
    let msg = message(&doc);
    assert!(
        msg.starts_with(
            "CUDA: cuInit failed with 802 CUDA_ERROR_SYSTEM_NOT_READY (system not yet initialized): the system is not ready: Fabric Manager not running on an NVSwitch system; start nvidia-fabricmanager"
        ),
        "{msg}"
    );
}

#[test]
fn a_failing_device_and_a_corrupt_round_trip_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let lib = stub(
        tmp.path(),
        &[
            "STUB_DEVICES=2",
            "STUB_FAIL=\"cuCtxCreate_v2\"",
            "STUB_FAIL_DEVICE=1",
        ],
    );
    let host1 = host(&tmp.path().join("a"), SMI_OK, Some(&lib));
    let (code, doc) = run(&host1, &[], &[]);
    assert_failed(code, &doc, "CudaCheckFailed");
    let devices = doc["status"]["cuda"]["devices"].as_array().unwrap();
    assert_eq!(devices[0]["ok"], true);
    assert_eq!(devices[1]["ok"], false);
    assert_eq!(devices[1]["error"]["call"], "cuCtxCreate_v2");
    assert_eq!(devices[1]["error"]["name"], "CUDA_ERROR_UNKNOWN");
    assert!(
        message(&doc).starts_with(
            "CUDA: 1 of 2 device(s) failed: device 1 (gpu-driver stub GPU 1): cuCtxCreate_v2 failed with 999 CUDA_ERROR_UNKNOWN"
        ),
        "{doc}"
    );

    let lib = stub(&tmp.path().join("corrupt"), &["STUB_FAIL=\"memcmp\""]);
    let host2 = host(&tmp.path().join("b"), SMI_OK, Some(&lib));
    let (code, doc) = run(&host2, &[], &[]);
    assert_eq!(code, 15, "{doc}");
    let dev = &doc["status"]["cuda"]["devices"][0];
    assert_eq!(dev["error"]["call"], "memcmp", "{doc}");
    assert!(
        message(&doc).contains(
            "memcmp failed (the bytes read back from the device differ from those written)"
        ),
        "{doc}"
    );
}

#[test]
fn a_driver_root_without_libcuda_names_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let host = host(tmp.path(), SMI_OK, None);
    let (code, doc) = run(&host, &[], &[]);
    assert_failed(code, &doc, "CudaCheckFailed");
    let msg = message(&doc);
    assert!(
        msg.starts_with(&format!(
            "CUDA: {}/var/lib/gpu-driver/drivers/535.261.03-open-test/{}/libcuda.so.1 does not exist; ",
            host.display(),
            lib_dir()
        )),
        "{msg}"
    );
    assert!(msg.contains("no CUDA user space"), "{msg}");

    // A file that is not a library: dlopen's own words, naming the path.
    let bogus = tmp.path().join("bogus/libcuda.so.1");
    fs::create_dir_all(bogus.parent().unwrap()).unwrap();
    fs::write(&bogus, "not an ELF file\n").unwrap();
    let (code, doc) = run(&host, &["--libcuda", bogus.to_str().unwrap()], &[]);
    assert_eq!(code, 15, "{doc}");
    let msg = message(&doc);
    assert!(
        msg.starts_with(&format!("CUDA: dlopen failed ({}: ", bogus.display())),
        "{msg}"
    );
    assert!(
        msg.contains("could not be loaded with the host's glibc"),
        "{msg}"
    );
}

#[test]
fn a_host_root_without_a_loader_is_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let host = stub_host(tmp.path(), &[]);
    fs::remove_dir_all(host.join("lib64")).unwrap();
    fs::remove_file(
        host.join(lib_dir())
            .join(if std::env::consts::ARCH == "aarch64" {
                "ld-linux-aarch64.so.1"
            } else {
                "ld-linux-x86-64.so.2"
            }),
    )
    .unwrap();
    let (code, doc) = run(&host, &[], &[]);
    assert_failed(code, &doc, "CudaCheckFailed");
    assert!(
        message(&doc).starts_with(&format!(
            "CUDA: no dynamic loader under the host root {}",
            host.display()
        )),
        "{doc}"
    );
}

#[test]
fn a_loader_that_refuses_the_helper_is_quoted() {
    // A stand-in for a host whose glibc is older than the helper's 2.34
    // (none is at hand here): a "loader" that says what ld.so would.
    if std::env::consts::ARCH != "x86_64" {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let host = stub_host(tmp.path(), &[]);
    let loader = host.join(lib_dir()).join("ld-linux-x86-64.so.2");
    fs::write(
        &loader,
        "#!/bin/sh\necho \"$3: /lib/x86_64-linux-gnu/libc.so.6: version \\`GLIBC_2.34' not found\" >&2\nexit 127\n",
    )
    .unwrap();
    fs::set_permissions(&loader, fs::Permissions::from_mode(0o755)).unwrap();
    let (code, doc) = run(&host, &[], &[]);
    assert_failed(code, &doc, "CudaCheckFailed");
    let msg = message(&doc);
    assert!(
        msg.starts_with(&format!(
            "CUDA: {} --inhibit-cache --library-path ",
            loader.display()
        )),
        "{msg}"
    );
    assert!(msg.contains("exited with exit status: 127"), "{msg}");
    assert!(msg.contains("version `GLIBC_2.34' not found"), "{msg}");
    assert!(
        msg.contains("older than the 2.34 gpu-driver-cuda-check needs"),
        "{msg}"
    );
}

#[test]
fn the_helper_never_sees_the_installers_environment() {
    // The stub fails cuInit with 304 when the variable reaches it; the
    // installer's own environment has it.
    let tmp = tempfile::tempdir().unwrap();
    let host = stub_host(
        tmp.path(),
        &[
            "STUB_FAIL_IF_ENV=\"GPU_DRIVER_TEST_SECRET\"",
            "STUB_CODE=304",
        ],
    );
    let (code, doc) = run(&host, &[], &[("GPU_DRIVER_TEST_SECRET", "must-not-leak")]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["status"]["cuda"]["ok"], true, "{doc}");
}

/// The CUDA double of `tests/gpu-double/` in its profile mode: the devices
/// are the profile's, read beside the library in the driver root; with no
/// profile there is no GPU, and cuInit says so as NVIDIA's libcuda does.
#[test]
fn the_cuda_double_reports_its_profiles_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let libs = host_support::gpu_double(
        &tmp.path().join("double"),
        "cuda_version = 12020\ngpus = 1\ngpu0.name = Tesla T4\n",
    );
    let host = host(tmp.path(), SMI_OK, Some(&libs.join("libcuda.so.1")));
    let profile = host
        .join("var/lib/gpu-driver/drivers/current")
        .join(lib_dir())
        .join("gpu-double.profile");
    fs::copy(libs.join("gpu-double.profile"), &profile).unwrap();
    let (code, doc) = run(&host, &[], &[]);
    assert_eq!(
        (code, doc["status"]["reason"].as_str()),
        (0, Some("Verified")),
        "{doc}"
    );
    let cuda = &doc["status"]["cuda"];
    assert_eq!(cuda["deviceCount"], 1, "{doc}");
    assert_eq!(cuda["devices"][0]["name"], "Tesla T4", "{doc}");

    fs::remove_file(&profile).unwrap();
    let (code, doc) = run(&host, &[], &[]);
    assert_failed(code, &doc, "CudaCheckFailed");
    assert_eq!(
        doc["status"]["cuda"]["error"]["name"], "CUDA_ERROR_NO_DEVICE",
        "{doc}"
    );
}

/// What keeps verify's nvidia-smi check off the GPU double (docs/
/// gpu-double.md): NVIDIA's real nvidia-smi 535 looks up
/// `nvmlInternalGetExportTable`, a private entry point that nvml.h does
/// not declare, and without NVIDIA's table behind it refuses the library.
/// The double models documented NVML only, so this must stay a refusal;
/// if it ever passes, verify's nvidia-smi check can run on the double.
#[test]
fn nvidias_nvidia_smi_refuses_an_nvml_without_its_private_export_table() {
    let smi = test_data()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("nvidia-smi/bin/nvidia-smi");
    let tmp = tempfile::tempdir().unwrap();
    let libs = host_support::gpu_double(
        &tmp.path().join("double"),
        "driver_version = 535.261.03\ngpus = 1\ngpu0.name = Tesla T4\n",
    );
    let out = std::process::Command::new(&smi)
        .arg("-L")
        .env("LD_LIBRARY_PATH", &libs)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", smi.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(255), "{stdout}");
    assert!(
        stdout.contains("Mismatch in versions between nvidia-smi and NVML"),
        "{stdout}"
    );
}

/// A driver root carrying the whole GPU double (its nvidia-smi, NVML and
/// libcuda, and the profile beside the libraries): verify passes with the
/// profile's GPU, and fails, naming both counts, when the profile has more
/// GPUs than detect found on the PCI bus.
#[test]
fn verify_passes_on_a_driver_root_carrying_the_gpu_double() {
    let profile = |gpus: u32| {
        let mut p = "driver_version = 535.261.03\ncuda_version = 12020\n".to_string();
        p.push_str(&format!("gpus = {gpus}\n"));
        for i in 0..gpus {
            p.push_str(&format!(
                "gpu{i}.name = Tesla T4\ngpu{i}.uuid = GPU-00000000-0000-0000-0000-00000000000{i}\n\
                 gpu{i}.memory_total = 16106127360\n"
            ));
        }
        p
    };
    let tmp = tempfile::tempdir().unwrap();
    let double = host_support::gpu_double(&tmp.path().join("double"), &profile(1));
    let host = host(tmp.path(), "exit 99", Some(&double.join("libcuda.so.1")));
    let root = host.join("var/lib/gpu-driver/drivers/current");
    fs::remove_file(root.join("usr/bin/nvidia-smi")).unwrap();
    fs::copy(double.join("nvidia-smi"), root.join("usr/bin/nvidia-smi")).unwrap();
    for f in ["libnvidia-ml.so.1", "gpu-double.profile"] {
        fs::copy(double.join(f), root.join(lib_dir()).join(f)).unwrap();
    }
    let (code, doc) = run(&host, &[], &[]);
    assert_eq!(
        (code, doc["status"]["reason"].as_str()),
        (0, Some("Verified")),
        "{doc}"
    );
    let gpus = &doc["status"]["gpus"];
    assert_eq!(gpus[0]["name"], "Tesla T4", "{doc}");
    assert_eq!(
        gpus[0]["uuid"], "GPU-00000000-0000-0000-0000-000000000000",
        "{doc}"
    );
    assert_eq!(
        doc["status"]["cuda"]["devices"][0]["name"], "Tesla T4",
        "{doc}"
    );

    fs::write(root.join(lib_dir()).join("gpu-double.profile"), profile(2)).unwrap();
    let (code, doc) = run(&host, &[], &[]);
    assert_failed(code, &doc, "VerifyFailed");
    let msg = message(&doc);
    assert!(
        msg.contains("nvidia-smi lists 2 GPU(s), detect found 1 on the PCI bus"),
        "{msg}"
    );
}

/// A profile naming `kernel_module` is a driver only while that module is
/// loaded (`/sys/module/<name>`), as NVIDIA's libraries find no driver
/// after a reboot until the module is back (scripts/real-node's reboot).
#[test]
fn the_nvml_double_needs_the_kernel_module_its_profile_names() {
    let tmp = tempfile::tempdir().unwrap();
    // A module this kernel has (built in or loaded), and one it has not.
    let loaded = fs::read_dir("/sys/module")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|n| n.len() < 30)
        .expect("a module under /sys/module");
    let smi = |module: &str| {
        let dir = tmp.path().join(module);
        let profile = format!(
            "driver_version = 580.178.04\nkernel_module = {module}\ngpus = 1\n\
             gpu0.name = NVIDIA H100 80GB HBM3\ngpu0.uuid = GPU-1\n"
        );
        let double = host_support::gpu_double(&dir, &profile);
        Command::new(double.join("nvidia-smi"))
            .arg("-L")
            .env("LD_LIBRARY_PATH", &double)
            .env_remove("GPU_DOUBLE_PROFILE")
            .output()
            .unwrap()
    };
    let out = smi(&loaded);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("GPU 0: NVIDIA H100 80GB HBM3"), "{stdout}");

    let out = smi("gpu_double_not_loaded");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("Driver Not Loaded"), "{text}");
}
