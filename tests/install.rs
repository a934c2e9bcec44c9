//! install, uninstall, verify and run through the binary, on paths that
//! never load anything into the machine running the tests: refusals before
//! any load, verify without nvidia-smi, run on a node without a GPU. The
//! loads themselves are tested in a VM (`scripts/vm-test`, `tests/vm.rs`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hosts")
        .join(name)
}

fn run(args: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-driver-installer"))
        .args(["--termination-log", "/nonexistent/termination-log"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), doc)
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A minimal ELF64 whose `.modinfo` holds `modinfo` (as in
/// src/modinfo.rs's tests): enough for the vermagic preflight, never loaded.
fn tiny_module(modinfo: &[u8]) -> Vec<u8> {
    let shstrtab = b"\0.shstrtab\0.modinfo\0";
    let mut out = vec![0u8; 64];
    out[..4].copy_from_slice(b"\x7fELF");
    out[4] = 2;
    out[5] = 1;
    out[6] = 1;
    let strtab_off = out.len() as u64;
    out.extend_from_slice(shstrtab);
    let modinfo_off = out.len() as u64;
    out.extend_from_slice(modinfo);
    while !out.len().is_multiple_of(8) {
        out.push(0);
    }
    let shoff = out.len() as u64;
    let mut sh = |name: u32, kind: u32, off: u64, size: u64| {
        let mut h = [0u8; 64];
        h[0..4].copy_from_slice(&name.to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&off.to_le_bytes());
        h[32..40].copy_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&h);
    };
    sh(0, 0, 0, 0);
    sh(1, 3, strtab_off, shstrtab.len() as u64);
    sh(11, 1, modinfo_off, modinfo.len() as u64);
    out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    out[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    out[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
    out
}

fn artifact(dir: &Path, release: &str) {
    fs::create_dir_all(dir.join("modules")).unwrap();
    let ko = tiny_module(
        format!("name=gpu_driver_test\0version=1.0\0vermagic={release} SMP mod_unload \0")
            .as_bytes(),
    );
    fs::write(dir.join("modules/gpu_driver_test.ko"), &ko).unwrap();
    let sum = hex::encode(Sha256::digest(&ko));
    fs::write(
        dir.join("manifest.json"),
        format!(
            r#"{{"schemaVersion":1,"driverVersion":"1.0","flavor":"open","kernelRelease":"{release}","modules":[{{"name":"gpu_driver_test","file":"modules/gpu_driver_test.ko","sha256":"{sum}"}}],"firmware":[]}}"#
        ),
    )
    .unwrap();
}

#[test]
fn another_kernels_module_is_refused_before_any_load() {
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    fs::create_dir_all(&host).unwrap();
    let art = tmp.path().join("artifact");
    artifact(&art, "6.1.0-50-cloud-amd64");
    let (code, doc) = run(&[
        "--host-root",
        host.to_str().unwrap(),
        "--kernel-release",
        "6.12.117+deb13-cloud-amd64",
        "install",
        "--artifact",
        art.to_str().unwrap(),
    ]);
    assert_eq!(code, 14, "{doc}");
    assert_eq!(doc["kind"], "InstallResult");
    if !is_root() {
        assert_eq!(doc["status"]["reason"], "NotRoot");
        return;
    }
    assert_eq!(doc["status"]["reason"], "VermagicMismatch", "{doc}");
    let msg = doc["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("6.1.0-50-cloud-amd64") && msg.contains("6.12.117"),
        "{msg}"
    );
    assert_eq!(doc["status"]["modules"][0]["action"], "notLoaded");
    // Neither a driver root nor a staging directory is left behind.
    let drivers = host.join("var/lib/gpu-driver/drivers");
    let left: Vec<_> = fs::read_dir(&drivers).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(host.join("run/gpu-driver/install.lock").exists());
}

#[test]
fn a_tampered_artifact_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    fs::create_dir_all(&host).unwrap();
    let art = tmp.path().join("artifact");
    artifact(&art, "6.1.0-50-cloud-amd64");
    fs::write(art.join("modules/gpu_driver_test.ko"), b"tampered").unwrap();
    let (code, doc) = run(&[
        "--host-root",
        host.to_str().unwrap(),
        "--kernel-release",
        "6.1.0-50-cloud-amd64",
        "install",
        "--artifact",
        art.to_str().unwrap(),
    ]);
    assert_eq!(code, 14, "{doc}");
    if is_root() {
        assert_eq!(doc["status"]["reason"], "ArtifactInvalid", "{doc}");
        assert!(
            doc["status"]["message"]
                .as_str()
                .unwrap()
                .contains("sha256")
        );
    }
}

#[test]
fn uninstall_of_a_module_that_is_not_loaded_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, doc) = run(&[
        "--host-root",
        tmp.path().to_str().unwrap(),
        "uninstall",
        "--module",
        "gpu_driver_test_never_loaded",
    ]);
    if is_root() {
        assert_eq!(code, 0, "{doc}");
        assert_eq!(doc["status"]["reason"], "Uninstalled");
    } else {
        assert_eq!(
            (code, doc["status"]["reason"].as_str()),
            (14, Some("NotRoot"))
        );
    }
}

#[test]
fn verify_without_nvidia_smi_names_the_path() {
    let root = fixture("debian-12-t4-headers");
    let (code, doc) = run(&["--host-root", root.to_str().unwrap(), "verify"]);
    assert_eq!(code, 15, "{doc}");
    assert_eq!(doc["kind"], "VerifyResult");
    assert_eq!(doc["status"]["reason"], "VerifyFailed");
    let msg = doc["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("var/lib/gpu-driver/drivers/current/bin/nvidia-smi does not exist"),
        "{msg}"
    );
    assert_eq!(doc["status"]["expectedGpuCount"], 1);
}

#[test]
fn verify_runs_the_given_nvidia_smi_and_compares() {
    // A stand-in script printing NVIDIA's documented CSV for one T4: the
    // comparison logic on a real process boundary (no GPU here).
    let tmp = tempfile::tempdir().unwrap();
    let smi = tmp.path().join("nvidia-smi");
    fs::write(
        &smi,
        "#!/bin/sh\necho 'Tesla T4, GPU-00000000-0000-0000-0000-000000000001, 535.261.03, 15360 MiB'\n",
    )
    .unwrap();
    fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let root = fixture("debian-12-t4-headers");
    let base = [
        "--host-root",
        root.to_str().unwrap(),
        "verify",
        "--nvidia-smi",
        smi.to_str().unwrap(),
    ];
    let mut args = base.to_vec();
    args.extend(["--driver-version", "535.261.03"]);
    let (code, doc) = run(&args);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["status"]["reason"], "Verified");
    assert_eq!(doc["status"]["gpus"][0]["name"], "Tesla T4");
    let mut args = base.to_vec();
    args.extend(["--driver-version", "550.163.01"]);
    let (code, doc) = run(&args);
    assert_eq!(
        (code, doc["status"]["reason"].as_str()),
        (15, Some("VerifyFailed"))
    );
}

#[test]
fn run_skips_a_node_without_gpu() {
    let root = fixture("debian-12-nogpu");
    let (code, doc) = run(&["--host-root", root.to_str().unwrap(), "run"]);
    assert_eq!(code, 3, "{doc}");
    assert_eq!(doc["kind"], "RunResult");
    assert_eq!(doc["status"]["reason"], "NoGpu");
    assert_eq!(doc["status"]["steps"].as_array().unwrap().len(), 1);
}
