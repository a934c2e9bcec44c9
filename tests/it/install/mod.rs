//! install, uninstall, verify and run through the binary, on paths that
//! never load anything into the machine running the tests: refusals before
//! any load, verify without nvidia-smi, run on a node without a GPU. The
//! loads themselves are tested in a VM (`scripts/vm-test`, `tests/it/vm.rs`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::elf::tiny_module;
use crate::support::fabric as fabric_support;
use crate::support::host as host_support;
use serde_json::Value;
use sha2::{Digest, Sha256};

mod fabric;
mod host_root;
mod refusals;
mod user_space;

fn fixture(name: &str) -> PathBuf {
    crate::support::repo_root()
        .join("tests/fixtures/hosts")
        .join(name)
}

fn run(args: &[&str]) -> (i32, Value) {
    let out = Command::new(crate::support::bin::installer())
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

/// True (and says why) where the test cannot run as this user.
fn skipped_without_root(why: &str) -> bool {
    if is_root() {
        return false;
    }
    eprintln!("skipped: needs root ({why})");
    true
}

/// `install --artifact art` for `release` on the host root `host`.
fn install(host: &Path, release: &str, art: &Path) -> (i32, Value) {
    run(&install_args(
        host.to_str().unwrap(),
        release,
        art.to_str().unwrap(),
    ))
}

/// An empty host root `tmp/host` and a module-only artifact for `RELEASE`
/// in `tmp/artifact`.
fn empty_host_and_artifact(tmp: &Path) -> (PathBuf, PathBuf) {
    let host = tmp.join("host");
    fs::create_dir_all(&host).unwrap();
    let art = tmp.join("artifact");
    artifact(&art, RELEASE);
    (host, art)
}

fn message(doc: &Value) -> &str {
    doc["status"]["message"].as_str().unwrap()
}

/// The exit code and the status's reason, compared as one.
fn outcome(code: i32, doc: &Value) -> (i32, Option<&str>) {
    (code, doc["status"]["reason"].as_str())
}

/// Nothing was written under `outside` (what the host root's links name).
fn assert_nothing_outside(outside: &Path) {
    assert_eq!(
        tree(outside),
        Vec::<String>::new(),
        "written outside the host root"
    );
}

fn mode_bits(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
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

/// A host root for the placement tests: the T4 fixture (one GPU on the
/// PCI bus), the host's own static ldconfig, and a `/proc/modules` that
/// lists `gpu_driver_test` as loaded at `version`, so install finds its
/// module already in the kernel (`AlreadyInstalled`) and never calls
/// finit_module on the machine running the tests. Everything else
/// (unpack, checks, placement, links, ld.so.conf.d, ldconfig, the
/// `current` switch) is the real code path.
fn placement_host(dir: &Path, version: &str) -> PathBuf {
    let host = host_support::installable_host(dir);
    set_loaded(&host, version);
    host
}

fn set_loaded(host: &Path, version: &str) {
    set_module_loaded(host, "gpu_driver_test", version);
}

/// The host root lists `name` as loaded at `version` (beside the
/// fixture's own modules), so install never loads it.
fn set_module_loaded(host: &Path, name: &str, version: &str) {
    host_support::mark_loaded(
        host,
        &[host_support::Loaded {
            name,
            version: Some(version),
            srcversion: None,
        }],
    );
}

/// Compiles a real shared library (SONAME libnvidia-ml.so.1) and a real
/// program linked against it that prints nvidia-smi's CSV for one T4 with
/// `version`: the user space that install places and verify runs.
fn user_space(dir: &Path, version: &str) -> (Vec<u8>, Vec<u8>) {
    fs::create_dir_all(dir).unwrap();
    let lib_c = dir.join("nvml.c");
    fs::write(
        &lib_c,
        format!(
            "const char *nvml_csv(void) {{ return \"Tesla T4, GPU-00000000-0000-0000-0000-000000000001, {version}, 15360 MiB\"; }}\n"
        ),
    )
    .unwrap();
    let lib = dir.join(format!("libnvidia-ml.so.{version}"));
    let st = Command::new("gcc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o"])
        .arg(&lib)
        .arg(&lib_c)
        .status()
        .unwrap();
    assert!(st.success());
    let link = dir.join("libnvidia-ml.so");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(lib.file_name().unwrap(), &link).unwrap();
    let smi_c = dir.join("smi.c");
    fs::write(
        &smi_c,
        "#include <stdio.h>\nconst char *nvml_csv(void);\nint main(void) { puts(nvml_csv()); return 0; }\n",
    )
    .unwrap();
    let smi = dir.join("nvidia-smi");
    let st = Command::new("gcc")
        .arg("-o")
        .arg(&smi)
        .arg(&smi_c)
        .arg("-L")
        .arg(dir)
        .arg("-lnvidia-ml")
        .status()
        .unwrap();
    assert!(st.success());
    (fs::read(&smi).unwrap(), fs::read(&lib).unwrap())
}

fn lib_dir() -> String {
    format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH)
}

/// An artifact directory in build's layout with user space: the module
/// (version `version`), `usr/bin/nvidia-smi`, the library and its SONAME
/// link, and a stub libcuda (`libcuda.so.<version>`, `libcuda.so.1`) that
/// passes verify's CUDA check.
fn artifact_with_user_space(dir: &Path, release: &str, version: &str) {
    artifact_with(dir, release, version, "gpu_driver_test", None);
}

/// As [`artifact_with_user_space`], with the module named `module` and,
/// when given, one flat firmware file `firmware/gsp_test.bin`.
fn artifact_with(dir: &Path, release: &str, version: &str, module: &str, fw: Option<&[u8]>) {
    let (smi, lib) = user_space(&dir.with_extension("src"), version);
    let cuda = fs::read(host_support::stub_libcuda(&dir.with_extension("cuda"), &[])).unwrap();
    let cuda_name = format!("libcuda.so.{version}");
    let lib_name = format!("libnvidia-ml.so.{version}");
    let ld = lib_dir();
    fs::create_dir_all(dir.join("modules")).unwrap();
    fs::create_dir_all(dir.join("usr/bin")).unwrap();
    fs::create_dir_all(dir.join(&ld)).unwrap();
    let ko = tiny_module(
        format!("name={module}\0version={version}\0vermagic={release} SMP mod_unload \0")
            .as_bytes(),
    );
    let ko_file = format!("modules/{module}.ko");
    fs::write(dir.join(&ko_file), &ko).unwrap();
    fs::write(dir.join("usr/bin/nvidia-smi"), &smi).unwrap();
    fs::write(dir.join(&ld).join(&lib_name), &lib).unwrap();
    fs::write(dir.join(&ld).join(&cuda_name), &cuda).unwrap();
    let sum = |b: &[u8]| hex::encode(Sha256::digest(b));
    let mut firmware = Vec::new();
    if let Some(fw) = fw {
        fs::create_dir_all(dir.join("firmware")).unwrap();
        fs::write(dir.join("firmware/gsp_test.bin"), fw).unwrap();
        firmware.push(serde_json::json!({"file": "firmware/gsp_test.bin", "sha256": sum(fw), "sizeBytes": fw.len()}));
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "driverVersion": version,
        "flavor": "open",
        "kernelRelease": release,
        "modules": [{"name": module, "file": ko_file, "sha256": sum(&ko)}],
        "firmware": firmware,
        "userSpace": [
            {"file": "usr/bin/nvidia-smi", "sha256": sum(&smi), "sizeBytes": smi.len(), "mode": 0o755},
            {"file": format!("{ld}/{lib_name}"), "sha256": sum(&lib), "sizeBytes": lib.len(), "mode": 0o755},
            {"file": format!("{ld}/{cuda_name}"), "sha256": sum(&cuda), "sizeBytes": cuda.len(), "mode": 0o755},
        ],
        "links": [
            {"file": format!("{ld}/libnvidia-ml.so.1"), "target": lib_name},
            {"file": format!("{ld}/libcuda.so.1"), "target": cuda_name},
        ],
    });
    fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
}

const RELEASE: &str = "6.1.0-50-cloud-amd64";

fn install_args<'a>(host: &'a str, release: &'a str, art: &'a str) -> Vec<&'a str> {
    vec![
        "--host-root",
        host,
        "--kernel-release",
        release,
        "install",
        "--artifact",
        art,
    ]
}

fn current_target(host: &Path) -> String {
    fs::read_link(host.join("var/lib/gpu-driver/drivers/current"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// verify with the driver root's own nvidia-smi, expecting `version`.
fn verifies(host: &Path, version: &str) -> Value {
    let (code, doc) = run(&[
        "--host-root",
        host.to_str().unwrap(),
        "verify",
        "--driver-version",
        version,
    ]);
    assert_eq!(outcome(code, &doc), (0, Some("Verified")), "{doc}");
    doc
}

/// Every file, directory and link under `dir`, relative to it.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            out.push(e.path().strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                pending.push(e.path());
            }
        }
    }
    out.sort();
    out
}
