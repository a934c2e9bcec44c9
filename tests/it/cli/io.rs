//! The command line's contract: host roots, stdout and stderr, output
//! files, exit codes, the results schema and its documentation.

use super::*;

#[test]
fn a_root_without_os_release_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(&["--host-root", dir.path().to_str().unwrap(), "detect"]);
    assert_eq!(r.code, 10);
    assert_eq!(r.doc["status"]["reason"], "HostReadFailed");
    let msg = r.message();
    assert!(
        msg.contains(dir.path().to_str().unwrap()) && msg.contains("--host-root"),
        "{msg}"
    );
    assert!(r.stderr.contains("HostReadFailed"), "{}", r.stderr);
}

#[test]
fn kernel_release_override_changes_the_headers() {
    let r = run_on("debian-12-t4-headers", &["resolve"]);
    assert_eq!(r.doc["status"]["headers"]["source"], "installed");
    let r = run_on(
        "debian-12-t4-headers",
        &["--kernel-release", "6.12.12+bpo-cloud-amd64", "resolve"],
    );
    let h = &r.doc["status"]["headers"];
    assert_eq!(
        r.doc["spec"]["kernelReleaseOverride"],
        "6.12.12+bpo-cloud-amd64"
    );
    assert_eq!(h["source"], "package");
    assert_eq!(h["package"], "linux-headers-6.12.12+bpo-cloud-amd64");
    assert_eq!(h["suite"], "bookworm-backports");
    assert_eq!(h["kernelRelease"], "6.12.12+bpo-cloud-amd64");
}

#[test]
fn headers_behind_the_absolute_build_link_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    synthetic_root(root, &[0x1eb8]);
    let rel = "6.12.57-cloud-amd64";
    let real = root.join("usr/src/linux-headers-6.12.57-common");
    fs::create_dir_all(&real).unwrap();
    fs::write(real.join("Makefile"), "# kbuild\n").unwrap();
    fs::create_dir_all(root.join(format!("lib/modules/{rel}"))).unwrap();
    std::os::unix::fs::symlink(
        "/usr/src/linux-headers-6.12.57-common",
        root.join(format!("lib/modules/{rel}/build")),
    )
    .unwrap();
    let r = run(&["--host-root", root.to_str().unwrap(), "resolve"]);
    let h = &r.doc["status"]["headers"];
    assert_eq!(h["source"], "installed", "{}", r.doc);
    assert_eq!(h["path"], "/usr/src/linux-headers-6.12.57-common");
}

#[test]
fn stdout_is_data_and_stderr_is_diagnostics() {
    let out = bin()
        .args([
            "--host-root",
            fixture("ubuntu-2404-t4").to_str().unwrap(),
            "detect",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let _: Value = serde_json::from_str(&stdout).unwrap();
    assert!(stderr.contains("UnsupportedOs"), "{stderr}");
    assert!(!stdout.contains("ERROR"));
}

#[test]
fn output_file_and_termination_log() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("plan.json");
    let term = dir.path().join("termination-log");
    fs::write(&term, "").unwrap();
    let out = Command::new(crate::support::bin::installer())
        .args([
            "--host-root",
            fixture("gardenlinux-2150-h100").to_str().unwrap(),
            "--output",
            out_path.to_str().unwrap(),
            "--termination-log",
            term.to_str().unwrap(),
            "resolve",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty(), "stdout must be empty with --output");
    let doc: Value = serde_json::from_str(&fs::read_to_string(&out_path).unwrap()).unwrap();
    assert_eq!(doc["kind"], "InstallPlan");
    let t = fs::read_to_string(&term).unwrap();
    assert!(t.len() <= 4096, "{}", t.len());
    let tdoc: Value = serde_json::from_str(&t).unwrap();
    assert_eq!(tdoc["status"]["reason"], "Resolved");
    assert!(!t.contains('\n'), "termination copy is compact");
    // No leftover temp files beside the output.
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let out = bin().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = bin()
        .args(["resolve", "--flavor", "closed"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = bin().arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8(out.stdout).unwrap();
    for cmd in ["detect", "resolve", "schema", "--host-root", "--catalog"] {
        assert!(help.contains(cmd), "{cmd} missing from --help");
    }
}

#[test]
fn committed_schema_matches_the_types() {
    let out = bin().arg("schema").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let generated = String::from_utf8(out.stdout).unwrap();
    let path = crate::support::repo_root().join("schema/results.v1alpha1.json");
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        fs::write(&path, &generated).unwrap();
    }
    let committed = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date; regenerate with `UPDATE_SCHEMA=1 cargo test -p gpu-driver-tests --test it cli::io::committed_schema` \
         or `gpu-driver-installer schema > schema/results.v1alpha1.json`",
        path.display()
    );
    // Every result a command printed validates structurally: spot-check the
    // fields the operator reads.
    let schema: Value = serde_json::from_str(&generated).unwrap();
    let text = schema.to_string();
    for field in [
        "pciAddress",
        "deviceId",
        "kernelRelease",
        "driverVersion",
        "moduleFlavor",
        "headers",
    ] {
        assert!(text.contains(field), "schema lacks {field}");
    }
}

#[test]
fn every_reason_is_documented_with_its_exit_code() {
    let doc = fs::read_to_string(crate::support::repo_root().join("docs/results.md")).unwrap();
    for reason in gpu_driver_installer::report::Reason::ALL {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", reason.as_str())))
            .unwrap_or_else(|| panic!("docs/results.md has no row for {reason}"));
        let cols: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cols[2], format!("{:?}", reason.phase()), "{row}");
        assert_eq!(cols[3], reason.exit_code().to_string(), "{row}");
    }
}

#[test]
fn copy_self_hands_over_an_executable_copy() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("gpu-driver-installer");
    let out = bin().arg("copy-self").arg(&dest).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        dest.display().to_string()
    );
    let mode = fs::metadata(&dest).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    let v = std::process::Command::new(&dest)
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("gpu-driver-installer "));
}

#[test]
fn the_package_cache_stays_inside_a_host_root_whose_var_cache_is_a_link() {
    // A host root whose var/cache is an absolute link: in chroot terms it
    // names <root>/<outside>, never the installer's own <outside>.
    let host = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let root = host.path().join("root");
    fs::create_dir_all(root.join("var")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("var/cache")).unwrap();
    let sum = "0".repeat(64);
    let r = run(&[
        "--host-root",
        root.to_str().unwrap(),
        "fetch",
        "--url",
        "https://download.invalid/NVIDIA-Linux-x86_64-580.95.05.run",
        "--sha256",
        &sum,
        "--offline",
    ]);
    assert_eq!(r.doc["status"]["reason"], "NotCached", "{}", r.doc);
    assert_eq!(
        fs::read_dir(outside.path()).unwrap().count(),
        0,
        "a write left the host root"
    );
    let inside = root
        .join(outside.path().strip_prefix("/").unwrap())
        .join("gpu-driver/packages");
    assert!(
        inside.is_dir(),
        "the package cache was not made inside the root"
    );
}
