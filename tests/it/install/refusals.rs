//! What install refuses before any load (another kernel's module, an
//! unsigned one under Secure Boot, a tampered artifact), uninstall, verify.

use super::*;

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

/// `install` of `art` on `host`, refused for want of a signature (exit 14):
/// its document; `None` where the test is skipped without root.
fn refused_for_a_signature(host: &Path, art: &Path) -> Option<Value> {
    let (code, doc) = install(host, RELEASE, art);
    if skipped_without_root("install's lock and staging") {
        return None;
    }
    assert_eq!(
        outcome(code, &doc),
        (14, Some("ModuleSignatureRequired")),
        "{doc}"
    );
    Some(doc)
}

#[test]
fn an_unsigned_module_on_a_secure_boot_host_is_refused_before_any_load() {
    let tmp = tempfile::tempdir().unwrap();
    let (host, art) = empty_host_and_artifact(tmp.path());
    with_secure_boot(&host);
    let Some(doc) = refused_for_a_signature(&host, &art) else {
        return;
    };
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
    let Some(doc) = refused_for_a_signature(&host, &art) else {
        return;
    };
    assert!(message(&doc).contains("lockdown is integrity"), "{doc}");
    fs::write(
        security.join("lockdown"),
        "[none] integrity confidentiality\n",
    )
    .unwrap();
    let params = host.join("sys/module/module/parameters");
    fs::create_dir_all(&params).unwrap();
    fs::write(params.join("sig_enforce"), "Y\n").unwrap();
    let Some(doc) = refused_for_a_signature(&host, &art) else {
        return;
    };
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

/// `command` on the fixture host `host`: it exits `code` with a document
/// of `kind` and `reason`, which it returns.
fn run_on_fixture(host: &str, command: &str, code: i32, kind: &str, reason: &str) -> Value {
    let root = fixture(host);
    let (got, doc) = run(&["--host-root", root.to_str().unwrap(), command]);
    assert_eq!(got, code, "{doc}");
    assert_eq!(doc["kind"], kind);
    assert_eq!(doc["status"]["reason"], reason);
    doc
}

#[test]
fn verify_without_nvidia_smi_names_the_path() {
    let doc = run_on_fixture(
        "debian-12-t4-headers",
        "verify",
        15,
        "VerifyResult",
        "VerifyFailed",
    );
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
    let doc = run_on_fixture("debian-12-nogpu", "run", 3, "RunResult", "NoGpu");
    assert_eq!(doc["status"]["steps"].as_array().unwrap().len(), 1);
}
