//! install, uninstall, verify and run through the binary, on paths that
//! never load anything into the machine running the tests: refusals before
//! any load, verify without nvidia-smi, run on a node without a GPU. The
//! loads themselves are tested in a VM (`scripts/vm-test`, `tests/it/vm.rs`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::elf::tiny_module;
use crate::support::fabric as fabric_support;
use crate::support::host as host_support;
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

#[test]
fn another_kernels_module_is_refused_before_any_load() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, art) = empty_host_and_artifact(tmp.path());
    let (code, doc) = install(&host, "6.12.117+deb13-cloud-amd64", &art);
    assert_eq!(code, 14, "{doc}");
    assert_eq!(doc["kind"], "InstallResult");
    if !is_root() {
        assert_eq!(doc["status"]["reason"], "NotRoot");
        return;
    }
    assert_eq!(doc["status"]["reason"], "VermagicMismatch", "{doc}");
    let msg = message(&doc);
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

/// The host root `host` as a Secure Boot host sees it: the `SecureBoot`
/// variable set (efivarfs: 4 attribute bytes, then 1).
fn with_secure_boot(host: &Path) {
    let vars = host.join("sys/firmware/efi/efivars");
    fs::create_dir_all(&vars).unwrap();
    fs::write(
        vars.join("SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"),
        [6, 0, 0, 0, 1],
    )
    .unwrap();
}

/// Nothing placed: no driver root, no staging directory.
fn assert_nothing_placed(host: &Path) {
    let drivers = host.join("var/lib/gpu-driver/drivers");
    let left: Vec<_> = fs::read_dir(&drivers).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_unsigned_module_on_a_secure_boot_host_is_refused_before_any_load() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, art) = empty_host_and_artifact(tmp.path());
    with_secure_boot(&host);
    let (code, doc) = install(&host, RELEASE, &art);
    if skipped_without_root("install's lock and staging") {
        return;
    }
    assert_eq!(
        outcome(code, &doc),
        (14, Some("ModuleSignatureRequired")),
        "{doc}"
    );
    let msg = message(&doc);
    assert!(
        msg.contains("Secure Boot is on") && msg.contains("gpu_driver_test"),
        "{msg}"
    );
    assert!(doc.to_string().contains("--signing-key"), "{doc}");
    assert_eq!(doc["status"]["modules"][0]["action"], "notLoaded");
    assert_nothing_placed(&host);
}

#[test]
fn lockdown_or_sig_enforce_require_signatures_too() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, art) = empty_host_and_artifact(tmp.path());
    let security = host.join("sys/kernel/security");
    fs::create_dir_all(&security).unwrap();
    fs::write(
        security.join("lockdown"),
        "none [integrity] confidentiality\n",
    )
    .unwrap();
    let (code, doc) = install(&host, RELEASE, &art);
    if skipped_without_root("install's lock and staging") {
        return;
    }
    assert_eq!(
        outcome(code, &doc),
        (14, Some("ModuleSignatureRequired")),
        "{doc}"
    );
    assert!(message(&doc).contains("lockdown is integrity"), "{doc}");
    fs::write(
        security.join("lockdown"),
        "[none] integrity confidentiality\n",
    )
    .unwrap();
    let params = host.join("sys/module/module/parameters");
    fs::create_dir_all(&params).unwrap();
    fs::write(params.join("sig_enforce"), "Y\n").unwrap();
    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(
        outcome(code, &doc),
        (14, Some("ModuleSignatureRequired")),
        "{doc}"
    );
    assert!(message(&doc).contains("module.sig_enforce=Y"), "{doc}");
    assert_nothing_placed(&host);
}

#[test]
fn a_tampered_artifact_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, art) = empty_host_and_artifact(tmp.path());
    fs::write(art.join("modules/gpu_driver_test.ko"), b"tampered").unwrap();
    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(code, 14, "{doc}");
    if is_root() {
        assert_eq!(doc["status"]["reason"], "ArtifactInvalid", "{doc}");
        assert!(message(&doc).contains("sha256"));
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
        assert_eq!(outcome(code, &doc), (14, Some("NotRoot")));
    }
}

#[test]
fn verify_without_nvidia_smi_names_the_path() {
    let root = fixture("debian-12-t4-headers");
    let (code, doc) = run(&["--host-root", root.to_str().unwrap(), "verify"]);
    assert_eq!(code, 15, "{doc}");
    assert_eq!(doc["kind"], "VerifyResult");
    assert_eq!(doc["status"]["reason"], "VerifyFailed");
    let msg = message(&doc);
    assert!(
        msg.contains("var/lib/gpu-driver/drivers/current/usr/bin/nvidia-smi does not exist"),
        "{msg}"
    );
    assert_eq!(doc["status"]["expectedGpuCount"], 1);
}

#[test]
fn verify_runs_the_given_nvidia_smi_and_compares() {
    // A stand-in script printing NVIDIA's documented CSV for one T4: the
    // comparison logic on a real process boundary (no GPU here); CUDA's
    // check on a stub libcuda that succeeds, run with the host root's
    // loader and glibc.
    let tmp = tempfile::tempdir().unwrap();
    let smi = tmp.path().join("nvidia-smi");
    fs::write(
        &smi,
        "#!/bin/sh\necho 'Tesla T4, GPU-00000000-0000-0000-0000-000000000001, 535.261.03, 15360 MiB'\n",
    )
    .unwrap();
    fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let root = host_support::installable_host(tmp.path());
    let libcuda = host_support::stub_libcuda(&tmp.path().join("cuda"), &[]);
    let base = [
        "--host-root",
        root.to_str().unwrap(),
        "verify",
        "--nvidia-smi",
        smi.to_str().unwrap(),
        "--libcuda",
        libcuda.to_str().unwrap(),
    ];
    let mut args = base.to_vec();
    args.extend(["--driver-version", "535.261.03"]);
    let (code, doc) = run(&args);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["status"]["reason"], "Verified");
    assert_eq!(doc["status"]["gpus"][0]["name"], "Tesla T4");
    assert_eq!(doc["status"]["cuda"]["ok"], true, "{doc}");
    let mut args = base.to_vec();
    args.extend(["--driver-version", "550.163.01"]);
    let (code, doc) = run(&args);
    assert_eq!(outcome(code, &doc), (15, Some("VerifyFailed")));
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

// ------------------------------------------------- user space, kill -9

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

#[test]
fn user_space_is_placed_registered_and_verified() {
    if skipped_without_root("install refuses otherwise") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let host = placement_host(tmp.path(), "1.0");
    let art = tmp.path().join("a");
    artifact_with_user_space(&art, RELEASE, "1.0");
    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(code, 0, "{doc}");
    let s = &doc["status"];
    assert_eq!(s["reason"], "AlreadyInstalled", "{doc}");
    let us = &s["userSpace"];
    assert_eq!(us["present"], true, "{doc}");
    assert_eq!(us["ldSoConf"], "/etc/ld.so.conf.d/gpu-driver.conf");
    assert!(
        us["ldconfig"].as_str().unwrap().contains("ldconfig -r"),
        "{doc}"
    );
    assert_eq!(us["runNvidiaDriver"], "/run/nvidia/driver");
    let files: Vec<&str> = us["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(files.contains(&"usr/bin/nvidia-smi"), "{files:?}");

    // The versioned root, `current`, the link, modes.
    let root_name = current_target(&host);
    assert!(
        root_name.starts_with(&format!("1.0-open-{RELEASE}-")),
        "{root_name}"
    );
    let current = host.join("var/lib/gpu-driver/drivers/current");
    let ld = lib_dir();
    assert_eq!(
        fs::read_link(current.join(&ld).join("libnvidia-ml.so.1")).unwrap(),
        Path::new("libnvidia-ml.so.1.0")
    );
    assert_eq!(mode_bits(&current.join("usr/bin/nvidia-smi")), 0o755);
    // ld.so.conf.d names the current root's library directory, and the
    // host's cache (written by the real ldconfig -r) resolves the SONAME
    // through it.
    let conf = fs::read_to_string(host.join("etc/ld.so.conf.d/gpu-driver.conf")).unwrap();
    assert!(
        conf.contains(&format!("/var/lib/gpu-driver/drivers/current/{ld}\n")),
        "{conf}"
    );
    let cache = host_support::ld_cache(&host);
    assert!(
        cache.contains(&format!(
            "libnvidia-ml.so.1 (libc6,x86-64) => /var/lib/gpu-driver/drivers/current/{ld}/libnvidia-ml.so.1"
        )),
        "{cache}"
    );
    assert_eq!(
        fs::read_link(host.join("run/nvidia/driver")).unwrap(),
        Path::new("/var/lib/gpu-driver/drivers/current")
    );
    // verify runs the placed nvidia-smi, which needs the placed library.
    let doc = verifies(&host, "1.0");
    assert_eq!(doc["status"]["gpus"][0]["name"], "Tesla T4");

    // The same artifact again: nothing changes, the root is reused.
    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(outcome(code, &doc), (0, Some("AlreadyInstalled")));
    assert_eq!(current_target(&host), root_name);
}

#[test]
fn a_kill_9_at_any_point_leaves_a_usable_driver_and_the_next_run_completes() {
    if skipped_without_root("install refuses otherwise") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let host = placement_host(tmp.path(), "1.0");
    let hs = host.to_str().unwrap().to_string();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    artifact_with_user_space(&a, RELEASE, "1.0");
    artifact_with_user_space(&b, RELEASE, "2.0");
    let install = |art: &Path| {
        let (code, doc) = run(&install_args(&hs, RELEASE, art.to_str().unwrap()));
        assert_eq!(code, 0, "{doc}");
    };
    install(&a);
    let a_root = current_target(&host);
    let drivers = host.join("var/lib/gpu-driver/drivers");

    for point in [
        "install:staged",
        "install:placed",
        "install:loaded",
        "install:switched",
    ] {
        // The kernel side of B (its module loaded) is what a crash after
        // the load leaves; the fixture's /proc/modules says so.
        set_loaded(&host, "2.0");
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-driver-installer"))
            .args(["--termination-log", "/nonexistent/termination-log"])
            .args(install_args(&hs, RELEASE, b.to_str().unwrap()))
            .env("GPU_DRIVER_FAILPOINT", point)
            .output()
            .unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&out.status),
            Some(9),
            "{point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Still usable: `current` names a complete root whose nvidia-smi
        // runs: the old one until the switch, the new one after it.
        let (want_root_is_a, version) = if point == "install:switched" {
            (false, "2.0")
        } else {
            (true, "1.0")
        };
        assert_eq!(current_target(&host) == a_root, want_root_is_a, "{point}");
        verifies(&host, version);

        // The next run completes and cleans up what the killed one left.
        install(&b);
        assert_ne!(current_target(&host), a_root, "{point}");
        verifies(&host, "2.0");
        let left: Vec<String> = fs::read_dir(&drivers)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{point}: {left:?}");

        // Back to A for the next point (its root was kept as the previous).
        set_loaded(&host, "1.0");
        install(&a);
        assert_eq!(current_target(&host), a_root, "{point}");
    }
}

// ------------------------------------------------- links in the host root

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

#[test]
fn links_in_the_host_root_never_lead_a_write_outside_it() {
    if skipped_without_root("install refuses otherwise") {
        return;
    }
    // `var/lib`, `etc/ld.so.conf.d`, `dev`, `run/nvidia` and
    // `lib/firmware` of the host root are absolute links naming a directory
    // of the machine running the test. A host resolves them inside its own
    // root (as a chroot does); followed from outside, every write of
    // install would land in `outside`.
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let host = host_support::installable_host(tmp.path());
    // `nvidia`, so that device nodes are made; the fixture lists it as
    // loaded at this version, so nothing reaches the kernel.
    set_module_loaded(&host, "nvidia", "1.0");
    let param = host.join("sys/module/firmware_class/parameters/path");
    fs::create_dir_all(param.parent().unwrap()).unwrap();
    fs::write(&param, "").unwrap();
    let o = outside.path();
    for (link, target) in [
        ("var/lib", o.join("var-lib")),
        ("etc/ld.so.conf.d", o.join("ld.so.conf.d")),
        ("dev", o.join("dev")),
        ("run/nvidia", o.join("run-nvidia")),
        ("lib/firmware", o.join("firmware")),
    ] {
        let at = host.join(link);
        let _ = fs::remove_dir_all(&at);
        fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&target, &at).unwrap();
    }
    let art = tmp.path().join("a");
    artifact_with(&art, RELEASE, "1.0", "nvidia", Some(b"gsp"));

    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["status"]["reason"], "AlreadyInstalled", "{doc}");
    assert_nothing_outside(o);

    // Everything landed where the links resolve inside the host root.
    let inside = host.join(o.strip_prefix("/").unwrap());
    let drivers = inside.join("var-lib/gpu-driver/drivers");
    let root_name = fs::read_link(drivers.join("current")).unwrap();
    let root = drivers.join(&root_name);
    assert!(root.join("usr/bin/nvidia-smi").is_file());
    assert!(root.join("firmware/nvidia/1.0/gsp_test.bin").is_file());
    assert_eq!(
        fs::read_to_string(&param).unwrap(),
        format!(
            "/var/lib/gpu-driver/drivers/{}/firmware",
            root_name.display()
        )
    );
    let conf = fs::read_to_string(inside.join("ld.so.conf.d/gpu-driver.conf")).unwrap();
    assert!(
        conf.contains("/var/lib/gpu-driver/drivers/current/"),
        "{conf}"
    );
    // The host's ldconfig (chrooted into the host root) followed the same
    // links to the library.
    assert!(
        host_support::ld_cache(&host).contains("libnvidia-ml.so.1 "),
        "{}",
        host_support::ld_cache(&host)
    );
    assert_eq!(
        fs::read_link(inside.join("run-nvidia/driver")).unwrap(),
        Path::new("/var/lib/gpu-driver/drivers/current")
    );
    assert_eq!(
        doc["status"]["deviceNodes"],
        serde_json::json!(["/dev/nvidiactl", "/dev/nvidia0"]),
        "{doc}"
    );
    let ctl = fs::symlink_metadata(inside.join("dev/nvidiactl")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &ctl.file_type()
    ));
    assert_eq!(
        std::os::unix::fs::MetadataExt::rdev(&ctl),
        nix::sys::stat::makedev(195, 255)
    );
    assert!(host.join("run/gpu-driver/install.lock").is_file());

    // A second run (root reused, `current` switched again, old roots
    // collected through the links) still writes nothing outside.
    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(code, 0, "{doc}");
    assert_nothing_outside(o);
}

#[test]
fn a_manifest_field_cannot_lead_a_write_out_of_the_host_root() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, art) = empty_host_and_artifact(tmp.path());
    let outside = tmp.path().join("escaped");
    let manifest = fs::read_to_string(art.join("manifest.json")).unwrap();
    // From <host>/var/lib/gpu-driver/drivers/ up to tmp, then "escaped".
    let evil = manifest.replace(
        r#""driverVersion":"1.0""#,
        r#""driverVersion":"../../../../../escaped""#,
    );
    assert_ne!(evil, manifest);
    fs::write(art.join("manifest.json"), evil).unwrap();
    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(code, 14, "{doc}");
    if !is_root() {
        return;
    }
    assert_eq!(doc["status"]["reason"], "ArtifactInvalid", "{doc}");
    assert!(message(&doc).contains("driverVersion"), "{doc}");
    assert!(!outside.exists(), "written outside the host root");
    let drivers = host.join("var/lib/gpu-driver/drivers");
    let left: Vec<_> = fs::read_dir(&drivers)
        .map(|d| d.collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn what_a_killed_install_left_is_removed_by_the_next_one() {
    if !is_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    let drivers = host.join("var/lib/gpu-driver/drivers");
    // The extractor's temporary tree beside a staging directory, as a
    // kill -9 during unpacking leaves it (167 MB for a real driver).
    let left = drivers.join("..staging-4242.partial-Ab12Cd");
    fs::create_dir_all(left.join("modules")).unwrap();
    fs::write(left.join("modules/nvidia.ko"), vec![0u8; 1 << 20]).unwrap();
    let art = tmp.path().join("artifact");
    artifact(&art, RELEASE);
    let (_, doc) = install(&host, "6.12.117+deb13-cloud-amd64", &art);
    assert_eq!(doc["status"]["reason"], "VermagicMismatch", "{doc}");
    assert!(!left.exists(), "the killed run's leftover is still there");
}

/// After a reboot NVIDIA's toolkit may create `/run/nvidia/driver` as an
/// empty directory (hostPath `DirectoryOrCreate`) and hold it mounted
/// before our Job runs. The driver root must then appear in that pod: a
/// process in another mount namespace, holding a slave mount of the
/// directory, sees it once the installer has run. Everything happens in
/// namespaces of their own (unshare), so nothing is left mounted here.
#[test]
fn the_driver_root_appears_in_pods_already_holding_run_nvidia_driver() {
    if skipped_without_root("mount namespaces") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    let pod_view = tmp.path().join("pod-view");
    let work = tmp.path().join("w");
    let root = host.join("var/lib/gpu-driver/drivers/v1");
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    fs::write(root.join("usr/bin/nvidia-smi"), b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("v1", host.join("var/lib/gpu-driver/drivers/current")).unwrap();
    fs::create_dir_all(host.join("run/nvidia/driver")).unwrap();
    fs::create_dir_all(&pod_view).unwrap();
    fs::create_dir_all(&work).unwrap();
    let script = r#"
set -e
mount --bind "$T" "$T"
mount --make-rshared "$T"
unshare --mount --propagation slave sh -c '
  mount --bind "$T/run/nvidia/driver" "$P"
  touch "$W/ready"
  while [ ! -e "$W/go" ]; do sleep 0.05; done
  ls "$P/usr/bin" > "$W/seen"
' &
while [ ! -e "$W/ready" ]; do sleep 0.05; done
"$BIN" --host-root "$T" expose-driver-root
touch "$W/go"
wait
if touch "$T/run/nvidia/driver/x" 2>/dev/null; then echo writable > "$W/ro"; else echo read-only > "$W/ro"; fi
"$BIN" --host-root "$T" expose-driver-root
grep -c " $T/run/nvidia/driver " /proc/self/mountinfo > "$W/mounts" || true
"#;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("T", &host)
        .env("P", &pod_view)
        .env("W", &work)
        .env("BIN", env!("CARGO_BIN_EXE_gpu-driver-installer"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = fs::read_to_string(work.join("seen")).unwrap();
    assert_eq!(
        seen.trim(),
        "nvidia-smi",
        "the pod did not see the driver root"
    );
    assert_eq!(
        fs::read_to_string(work.join("ro")).unwrap().trim(),
        "read-only"
    );
    // A second run replaces its mount instead of stacking another.
    assert_eq!(fs::read_to_string(work.join("mounts")).unwrap().trim(), "1");
    // Nothing leaked into this namespace.
    assert!(
        fs::read_dir(host.join("run/nvidia/driver"))
            .unwrap()
            .next()
            .is_none()
    );
}

// ------------------------------------------------- Fabric Manager

/// `install --fabric-manager ARCHIVE --persistenced` on a fixture host
/// root: Fabric Manager's files go into the driver root (so `current`
/// names driver and Fabric Manager at once), its config finds the
/// topologies there, and the units are written and enabled inside the
/// host root. The host root's `etc/systemd` is an absolute link naming a
/// directory of the machine running the test: every write stays inside
/// the root. A fixture's systemd cannot be reached, so nothing is started
/// (the document says so).
#[test]
fn fabric_manager_is_placed_into_the_driver_root_and_its_units_stay_in_the_host_root() {
    if skipped_without_root("install refuses otherwise") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let host = placement_host(tmp.path(), "1.0");
    let o = outside.path();
    fs::create_dir_all(host.join("etc")).unwrap();
    std::os::unix::fs::symlink(o.join("systemd"), host.join("etc/systemd")).unwrap();
    let art = tmp.path().join("a");
    artifact_with_user_space(&art, RELEASE, "1.0");
    // nvidia-persistenced, as the .run's user space would bring it.
    let daemon = b"#!/bin/sh\n";
    fs::write(art.join("usr/bin/nvidia-persistenced"), daemon).unwrap();
    let mut manifest: Value =
        serde_json::from_slice(&fs::read(art.join("manifest.json")).unwrap()).unwrap();
    manifest["userSpace"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "file": "usr/bin/nvidia-persistenced",
            "sha256": hex::encode(Sha256::digest(daemon)),
            "sizeBytes": daemon.len(),
            "mode": 0o755,
        }));
    fs::write(
        art.join("manifest.json"),
        serde_json::to_vec(&manifest).unwrap(),
    )
    .unwrap();
    let fm = fabric_support::archive(tmp.path(), "1.0");
    let mut args = install_args(host.to_str().unwrap(), RELEASE, art.to_str().unwrap());
    args.extend(["--fabric-manager", fm.to_str().unwrap(), "--persistenced"]);
    let (code, doc) = run(&args);
    assert_eq!(code, 0, "{doc}");
    let s = &doc["status"];
    assert_eq!(s["reason"], "AlreadyInstalled", "{doc}");
    assert_nothing_outside(o);

    let root_name = current_target(&host);
    assert!(root_name.contains("-fm"), "{root_name}");
    let root = host.join("var/lib/gpu-driver/drivers").join(&root_name);
    for f in [
        "usr/bin/nv-fabricmanager",
        "usr/bin/nvswitch-audit",
        "usr/share/nvidia/nvswitch/dgxh100_hgxh100_topology",
        "usr/share/nvidia/nvswitch/dgxa100_hgxa100_topology",
        "etc/fabricmanager.cfg",
    ] {
        assert!(root.join(f).is_file(), "{f} missing in {}", root.display());
    }
    assert_eq!(mode_bits(&root.join("usr/bin/nv-fabricmanager")), 0o755);
    // NVIDIA's unit, SDK and headers are not placed.
    assert!(!root.join("systemd").exists() && !root.join("include").exists());
    let cfg = fs::read_to_string(root.join("etc/fabricmanager.cfg")).unwrap();
    assert_eq!(
        cfg,
        fabric_support::SHIPPED_CFG
            .replace(
                "TOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch",
                "TOPOLOGY_FILE_PATH=/var/lib/gpu-driver/drivers/current/usr/share/nvidia/nvswitch"
            )
            .replace(
                "DATABASE_PATH=/usr/share/nvidia/nvswitch",
                "DATABASE_PATH=/var/lib/gpu-driver/drivers/current/usr/share/nvidia/nvswitch"
            )
    );
    assert_eq!(s["fabricManager"]["version"], "1.0", "{doc}");

    // The units, where `etc/systemd` resolves inside the host root.
    let systemd = host
        .join(o.strip_prefix("/").unwrap())
        .join("systemd/system");
    let unit = fs::read_to_string(systemd.join("nvidia-fabricmanager.service")).unwrap();
    assert!(unit.contains(
        "ExecStart=/var/lib/gpu-driver/drivers/current/usr/bin/nv-fabricmanager -c /var/lib/gpu-driver/drivers/current/etc/fabricmanager.cfg"
    ), "{unit}");
    assert!(systemd.join("nvidia-persistenced.service").is_file());
    for unit in [
        "nvidia-fabricmanager.service",
        "nvidia-persistenced.service",
    ] {
        assert_eq!(
            fs::read_link(systemd.join("multi-user.target.wants").join(unit)).unwrap(),
            Path::new("/etc/systemd/system").join(unit)
        );
    }
    let services = s["services"].as_array().unwrap();
    assert_eq!(services.len(), 2, "{doc}");
    assert_eq!(services[0]["unit"], "nvidia-fabricmanager.service");
    assert_eq!(
        services[0]["unitFile"],
        "/etc/systemd/system/nvidia-fabricmanager.service"
    );
    assert_eq!(services[0]["enabled"], true);
    assert!(services[0].get("started").is_none(), "{doc}");
    let notes = s["notes"].to_string();
    assert!(
        notes.contains("not started: the host's systemd cannot be reached"),
        "{notes}"
    );

    // Fabric Manager of another version is refused before anything moves.
    let other = tempfile::tempdir().unwrap();
    let fm2 = fabric_support::archive(other.path(), "2.0");
    let mut args = install_args(host.to_str().unwrap(), RELEASE, art.to_str().unwrap());
    args.extend(["--fabric-manager", fm2.to_str().unwrap()]);
    let (code, doc) = run(&args);
    assert_eq!(code, 14, "{doc}");
    assert_eq!(doc["status"]["reason"], "FabricManagerFailed", "{doc}");
    assert!(message(&doc).contains("Fabric Manager 2.0 does not match driver 1.0"));
    assert_eq!(current_target(&host), root_name);
}

/// `drivers/current` made a directory before the first install (a pod's
/// `DirectoryOrCreate` hostPath): empty, the install replaces it with the
/// link (it failed with EISDIR on every retry); with files in it, the
/// install refuses with `DriverRootOccupied` and leaves it as it was.
#[test]
fn a_directory_where_the_current_link_belongs_is_replaced_if_empty_else_refused() {
    if skipped_without_root("install refuses otherwise") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let art = tmp.path().join("a");
    artifact_with_user_space(&art, RELEASE, "1.0");

    let dir = |name: &str| {
        let d = tmp.path().join(name);
        fs::create_dir_all(&d).unwrap();
        d
    };
    let host = placement_host(&dir("empty"), "1.0");
    let current = host.join("var/lib/gpu-driver/drivers/current");
    fs::create_dir_all(&current).unwrap();
    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(outcome(code, &doc), (0, Some("AlreadyInstalled")), "{doc}");
    assert!(current.is_symlink(), "{doc}");
    assert!(current.join("usr/bin/nvidia-smi").is_file());

    let host = placement_host(&dir("occupied"), "1.0");
    let current = host.join("var/lib/gpu-driver/drivers/current");
    fs::create_dir_all(current.join("usr/bin")).unwrap();
    fs::write(current.join("usr/bin/nvidia-smi"), b"someone else's").unwrap();
    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(
        outcome(code, &doc),
        (14, Some("DriverRootOccupied")),
        "{doc}"
    );
    let msg = message(&doc);
    assert!(
        msg.contains("drivers/current is a directory with files in it"),
        "{msg}"
    );
    assert!(msg.contains("move the directory away"), "{msg}");
    assert_eq!(
        fs::read(current.join("usr/bin/nvidia-smi")).unwrap(),
        b"someone else's"
    );
    // A second try says the same, rather than failing differently.
    let (code, doc) = install(&host, RELEASE, &art);
    assert_eq!(
        outcome(code, &doc),
        (14, Some("DriverRootOccupied")),
        "{doc}"
    );
}

/// A `/run/nvidia/driver` that holds another driver's files (NVIDIA's
/// driver container mounts its root there) is not mounted over:
/// `DriverRootOccupied`, the files untouched. An empty one, or our own
/// mount of a driver root, is (the test above).
#[test]
fn another_drivers_run_nvidia_driver_is_not_mounted_over() {
    if skipped_without_root("mount namespaces") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    let root = host.join("var/lib/gpu-driver/drivers/v1");
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::os::unix::fs::symlink("v1", host.join("var/lib/gpu-driver/drivers/current")).unwrap();
    let run = host.join("run/nvidia/driver");
    fs::create_dir_all(run.join("usr/bin")).unwrap();
    fs::write(
        run.join("usr/bin/nvidia-smi"),
        b"NVIDIA's driver container's",
    )
    .unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .arg(env!("CARGO_BIN_EXE_gpu-driver-installer"))
        .arg("--host-root")
        .arg(&host)
        .arg("expose-driver-root")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(14), "{stderr}");
    assert!(
        stderr.contains("holds files that are not one of this installer's driver roots"),
        "{stderr}"
    );
    assert_eq!(
        fs::read(run.join("usr/bin/nvidia-smi")).unwrap(),
        b"NVIDIA's driver container's"
    );
}
