//! Runs the built `gpu-driver-installer` against fixture host roots and
//! checks documents, reasons and exit codes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpu-driver-installer"));
    // Never touch a real /dev/termination-log from tests.
    c.args(["--termination-log", "/nonexistent/termination-log"]);
    c.env_remove("RUST_LOG");
    c
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts")
}

fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

struct Run {
    code: i32,
    doc: Value,
    stderr: String,
}

impl Run {
    fn message(&self) -> &str {
        self.doc["status"]["message"].as_str().unwrap()
    }
}

fn run(args: &[&str]) -> Run {
    let out: Output = bin().args(args).output().expect("run binary");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"));
    Run {
        code: out.status.code().unwrap(),
        doc,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn run_on(fixture_name: &str, args: &[&str]) -> Run {
    let root = fixture(fixture_name);
    let mut all = vec!["--host-root", root.to_str().unwrap()];
    all.extend_from_slice(args);
    run(&all)
}

fn exit_code_for(phase: &str, reason: &str) -> i32 {
    match (phase, reason) {
        ("Succeeded", _) => 0,
        ("Skipped", _) => 3,
        (_, "InvalidArgument" | "CatalogInvalid") => 4,
        (_, "UnsupportedOs" | "HostReadFailed") => 10,
        (_, "FlavorNotSupported" | "GpuNotSupported" | "IncompatibleKernel") => 11,
        _ => 1,
    }
}

/// The document's phase and reason are the fixture's, and the exit code
/// is the one they map to.
fn assert_outcome(r: &Run, phase: &Value, reason: &Value, name: &str) {
    let s = &r.doc["status"];
    assert_eq!(&s["phase"], phase, "{name}: {s}");
    assert_eq!(&s["reason"], reason, "{name}: {s}");
    assert_eq!(
        r.code,
        exit_code_for(phase.as_str().unwrap(), reason.as_str().unwrap()),
        "{name}"
    );
}

fn all_fixtures() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        let expected = path.join("expected.json");
        if expected.is_file() {
            let v = serde_json::from_str(&fs::read_to_string(expected).unwrap()).unwrap();
            out.push((path.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 12, "fixtures missing: {}", out.len());
    out
}

/// Address, device id and architecture of each GPU in `gpus`.
fn gpu_ids(gpus: &Value) -> Vec<(Value, Value, Value)> {
    gpus.as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["pciAddress"].clone(),
                g["deviceId"].clone(),
                g["architecture"].clone(),
            )
        })
        .collect()
}

#[test]
fn detect_matches_every_fixture() {
    for (name, want) in all_fixtures() {
        let r = run_on(&name, &with_arch(&want, &["detect"]));
        let d = &r.doc;
        let s = &d["status"];
        assert_eq!(
            d["apiVersion"], "gpu-driver.gardenlinux.io/v1alpha1",
            "{name}"
        );
        assert_eq!(d["kind"], "HostReport", "{name}");
        assert_eq!(d["spec"]["hostRootSource"], "flag", "{name}");
        assert_outcome(&r, &want["detectPhase"], &want["detectReason"], &name);
        assert_eq!(s["os"]["id"], want["osId"], "{name}");
        assert_eq!(s["os"]["version"], want["osVersion"], "{name}");
        assert_eq!(s["kernelRelease"], want["kernelRelease"], "{name}");
        assert!(
            s["bootId"].as_str().is_some_and(|b| b.len() == 36),
            "{name}"
        );
        assert_eq!(s["secureBoot"], want["secureBoot"], "{name}");
        if let Some(arch) = want.get("arch") {
            assert_eq!(&s["arch"], arch, "{name}");
        }
        let loaded = s["loadedDriver"]["version"].clone();
        assert_eq!(loaded, want["loadedDriverVersion"], "{name}");
        assert_eq!(gpu_ids(&s["gpus"]), gpu_ids(&want["gpus"]), "{name}");
    }
}

#[test]
fn resolve_matches_every_fixture() {
    let catalog = gpu_driver_installer::catalog::Catalog::embedded().unwrap();
    for (name, fixture) in all_fixtures() {
        let want = &fixture["resolve"];
        let r = run_on(&name, &with_arch(&fixture, &["resolve"]));
        let s = &r.doc["status"];
        assert_eq!(r.doc["kind"], "InstallPlan", "{name}");
        assert_outcome(&r, &want["phase"], &want["reason"], &name);
        if want["phase"] != "Succeeded" {
            continue;
        }
        assert_eq!(s["driverVersion"], want["driverVersion"], "{name}");
        assert_eq!(s["moduleFlavor"], want["moduleFlavor"], "{name}");
        for (k, v) in want["headers"].as_object().unwrap() {
            assert_eq!(&s["headers"][k], v, "{name}: headers.{k}");
        }
        assert_eq!(s["headers"]["kernelRelease"], s["kernelRelease"], "{name}");
        assert_eq!(s["package"]["url"], want["packageUrl"], "{name}");
        // Every default release carries its digest for the node's CPU.
        let version = s["driverVersion"].as_str().unwrap();
        let arch = fixture["arch"].as_str().unwrap_or("x86_64");
        let arch = gpu_driver_installer::host::CpuArch::parse(arch).unwrap();
        let digest = catalog
            .driver_for_version(version)
            .and_then(|d| d.sha256_for(arch))
            .unwrap_or_else(|| panic!("{name}: no {arch} digest for {version}"));
        assert_eq!(s["package"]["checksumKnown"], true, "{name}");
        assert_eq!(s["package"]["sha256"], digest, "{name}");
        assert_eq!(s["arch"], arch.nvidia_name(), "{name}");
        assert_eq!(
            s["warnings"].as_array().map_or(0, Vec::len),
            want["warnings"].as_u64().unwrap_or(0) as usize,
            "{name}: {s}"
        );
    }
}

/// `args` preceded by `--arch` when the fixture names one (a fixture cannot
/// carry `uname -m`).
fn with_arch<'a>(fixture: &'a Value, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = Vec::new();
    if let Some(arch) = fixture["arch"].as_str() {
        v.extend(["--arch", arch]);
    }
    v.extend_from_slice(args);
    v
}

#[test]
fn driver_version_flag_wins_and_is_validated() {
    let r = run_on(
        "gardenlinux-1592-t4",
        &["resolve", "--driver-version", "590.48.01"],
    );
    let s = &r.doc["status"];
    assert_eq!(r.code, 0);
    assert_eq!(s["driverVersion"], "590.48.01");
    assert_eq!(s["driverVersionSource"], "flag");
    // 6.6.63 on Garden Linux: only the proprietary modules work there.
    assert_eq!(s["moduleFlavor"], "proprietary");
    assert_eq!(
        s["package"]["url"],
        "https://download.nvidia.com/XFree86/Linux-x86_64/590.48.01/NVIDIA-Linux-x86_64-590.48.01.run"
    );

    let r = run_on(
        "gardenlinux-1592-t4",
        &["resolve", "--driver-version", "latest; rm -rf /"],
    );
    assert_eq!(r.code, 4);
    assert_eq!(r.doc["status"]["reason"], "InvalidArgument");
    assert!(r.message().contains("--driver-version"));
}

/// The branches users run beside NVIDIA's GPU Operator today: R595 (its
/// v26.7.0 default, 595.91.07) and R610 resolve to a package with a known
/// digest on both CPUs, from the XFree86 host the digest was taken from.
#[test]
fn r595_and_r610_resolve_with_a_known_checksum() {
    let cases = [
        (
            "gardenlinux-2150-h100",
            "595.91.07",
            "ca23c88dd24b07a191644e1e11cfb7bcdd7537305749af40f980018b095e6313",
        ),
        (
            "gardenlinux-2150-h100",
            "595.104.02",
            "e421c202e4c79f58c3c7f3161bbe71454ebb3d88936f88205a0e327cd04c59ca",
        ),
        (
            "gardenlinux-2150-h100",
            "610.57.04",
            "b2e935c66b83bb00c0c857bc8e0ee0fd52de9286b40c9cc1eec29a7ce7eb116d",
        ),
        (
            "gardenlinux-1877-arm64-t4g",
            "610.57.04",
            "40279facc0429a93b0b8ec97bf59391a3d2207609894f8271b7253a14c3f8f9e",
        ),
    ];
    for (host, version, sha) in cases {
        let fixture: Value = serde_json::from_str(
            &fs::read_to_string(fixture(host).join("expected.json"))
                .unwrap_or_else(|_| "{}".into()),
        )
        .unwrap_or(Value::Null);
        let args = with_arch(&fixture, &["resolve", "--driver-version", version]);
        let r = run_on(host, &args);
        let s = &r.doc["status"];
        assert_eq!(r.code, 0, "{host} {version}: {s}");
        assert_eq!(s["driverBranch"], version.split('.').next().unwrap());
        assert_eq!(s["package"]["sha256"], sha, "{host} {version}");
        assert_eq!(s["package"]["checksumKnown"], true);
        let arch = if host.contains("arm64") {
            "aarch64"
        } else {
            "x86_64"
        };
        assert_eq!(
            s["package"]["url"],
            format!(
                "https://download.nvidia.com/XFree86/Linux-{arch}/{version}/NVIDIA-Linux-{arch}-{version}.run"
            )
        );
    }
}

#[test]
fn default_branch_and_policy_are_reported() {
    let r = run_on("gardenlinux-2150-h100", &["resolve"]);
    assert_eq!(r.doc["status"]["driverVersionSource"], "default");
    assert_eq!(r.doc["status"]["driverBranch"], "580");
    let r = run_on("debian-12-v100", &["resolve"]);
    assert_eq!(r.doc["status"]["driverVersionSource"], "policy");
    assert_eq!(r.doc["status"]["policy"], "debian-bookworm-6.1");
}

#[test]
fn open_modules_are_refused_for_pre_turing_gpus() {
    for name in ["debian-12-v100", "debian-12-p100-mixed"] {
        let r = run_on(name, &["resolve", "--flavor", "open"]);
        let s = &r.doc["status"];
        assert_eq!(r.code, 11, "{name}");
        assert_eq!(s["phase"], "Failed");
        assert_eq!(s["reason"], "FlavorNotSupported");
        let msg = s["message"].as_str().unwrap();
        assert!(msg.contains("Turing") && msg.contains("--flavor"), "{msg}");
    }
}

#[test]
fn auto_flavor_follows_branch_and_architecture() {
    // Hopper with a pre-560 branch: proprietary; with 580: open.
    let r = run_on(
        "gardenlinux-2150-h100",
        &["resolve", "--driver-version", "550.163.01"],
    );
    assert_eq!(r.doc["status"]["moduleFlavor"], "proprietary");
    let r = run_on(
        "gardenlinux-2150-h100",
        &["resolve", "--driver-version", "580.95.05"],
    );
    assert_eq!(r.doc["status"]["moduleFlavor"], "open");
    // Volta with 580: still proprietary.
    let r = run_on(
        "debian-12-v100",
        &["resolve", "--driver-version", "580.95.05"],
    );
    assert_eq!(r.doc["status"]["moduleFlavor"], "proprietary");
    // An explicit proprietary choice on Turing is honoured.
    let r = run_on(
        "gardenlinux-1877-l4",
        &["resolve", "--flavor", "proprietary"],
    );
    assert_eq!(r.code, 0);
    assert_eq!(r.doc["status"]["moduleFlavor"], "proprietary");
}

#[test]
fn branches_that_dropped_a_gpu_are_refused() {
    let r = run_on(
        "debian-12-v100",
        &["resolve", "--driver-version", "590.48.01"],
    );
    let s = &r.doc["status"];
    assert_eq!(r.code, 11);
    assert_eq!(s["reason"], "GpuNotSupported");
    assert!(s["message"].as_str().unwrap().contains("volta"), "{s}");
}

/// Writes a minimal host root with the given NVIDIA device ids.
fn synthetic_root(dir: &Path, devices: &[u16]) {
    fs::create_dir_all(dir.join("etc")).unwrap();
    fs::write(
        dir.join("etc/os-release"),
        // 1877.8: past 6.12.56, where the open modules work again.
        "ID=gardenlinux\nGARDENLINUX_VERSION=1877.8\n",
    )
    .unwrap();
    fs::create_dir_all(dir.join("proc/sys/kernel/random")).unwrap();
    fs::write(
        dir.join("proc/sys/kernel/osrelease"),
        "6.12.57-cloud-amd64\n",
    )
    .unwrap();
    fs::write(
        dir.join("proc/sys/kernel/random/boot_id"),
        "00000000-0000-4000-8000-000000000001\n",
    )
    .unwrap();
    fs::write(dir.join("proc/modules"), "").unwrap();
    fs::create_dir_all(dir.join("sys/bus/pci/devices")).unwrap();
    for (i, id) in devices.iter().enumerate() {
        let addr = format!("0000:00:{:02x}.0", i + 4);
        let real = dir.join("sys/devices/pci0000:00").join(&addr);
        fs::create_dir_all(&real).unwrap();
        fs::write(real.join("vendor"), "0x10de\n").unwrap();
        fs::write(real.join("device"), format!("0x{id:04x}\n")).unwrap();
        fs::write(real.join("class"), "0x030200\n").unwrap();
        std::os::unix::fs::symlink(
            format!("../../../devices/pci0000:00/{addr}"),
            dir.join("sys/bus/pci/devices").join(&addr),
        )
        .unwrap();
    }
}

#[test]
fn blackwell_needs_open_modules() {
    let dir = tempfile::tempdir().unwrap();
    synthetic_root(dir.path(), &[0x2901]);
    let root = dir.path().to_str().unwrap();
    let r = run(&[
        "--host-root",
        root,
        "resolve",
        "--driver-version",
        "550.163.01",
    ]);
    assert_eq!(r.doc["status"]["reason"], "GpuNotSupported", "{}", r.doc);
    let r = run(&["--host-root", root, "resolve", "--flavor", "proprietary"]);
    assert_eq!(r.doc["status"]["reason"], "FlavorNotSupported");
    let r = run(&["--host-root", root, "resolve"]);
    assert_eq!(r.doc["status"]["moduleFlavor"], "open");

    // Blackwell beside a Volta: no flavor drives both.
    let dir = tempfile::tempdir().unwrap();
    synthetic_root(dir.path(), &[0x2901, 0x1db4]);
    let r = run(&["--host-root", dir.path().to_str().unwrap(), "resolve"]);
    assert_eq!(r.doc["status"]["reason"], "FlavorNotSupported");
    assert!(r.message().contains("no module flavor"));
}

#[test]
fn unknown_device_ids_are_reported_without_architecture() {
    let dir = tempfile::tempdir().unwrap();
    synthetic_root(dir.path(), &[0x3f00]);
    let root = dir.path().to_str().unwrap();
    let r = run(&["--host-root", root, "detect"]);
    let gpu = &r.doc["status"]["gpus"][0];
    assert_eq!(gpu["deviceId"], "0x3f00");
    assert!(gpu.get("architecture").is_none());
    // Auto cannot prove open support, so it stays with proprietary.
    let r = run(&["--host-root", root, "resolve"]);
    assert_eq!(r.doc["status"]["moduleFlavor"], "proprietary");
    assert!(
        r.doc["status"]["flavorReason"]
            .as_str()
            .unwrap()
            .contains("unknown")
    );
}

#[test]
fn catalog_exclusions_refuse_known_broken_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let cat = dir.path().join("catalog.toml");
    let embedded =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("catalog/catalog.toml"))
            .unwrap();
    fs::write(
        &cat,
        format!(
            "{embedded}\n[[exclusions]]\ndriver = \"550\"\nkernelMin = \"6.12\"\nreason = \"test: kernel API changed\"\nevidence = \"measured: this test\"\n"
        ),
    )
    .unwrap();
    let r = run_on(
        "debian-13-hgx-a100",
        &[
            "--catalog",
            cat.to_str().unwrap(),
            "resolve",
            "--driver-version",
            "550.163.01",
        ],
    );
    let s = &r.doc["status"];
    assert_eq!(r.code, 11);
    assert_eq!(s["reason"], "IncompatibleKernel");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("test: kernel API changed")
    );
    assert_eq!(r.doc["spec"]["catalog"], cat.to_str().unwrap());
    // The same pair on an older kernel is fine.
    let r = run_on(
        "debian-12-t4-headers",
        &[
            "--catalog",
            cat.to_str().unwrap(),
            "resolve",
            "--driver-version",
            "550.163.01",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
}

#[test]
fn a_broken_catalog_is_a_clear_failure() {
    let dir = tempfile::tempdir().unwrap();
    let cat = dir.path().join("catalog.toml");
    fs::write(&cat, "schemaVersion = 1\ndefaultBranch = 7\n").unwrap();
    for cmd in ["detect", "resolve"] {
        let r = run_on(
            "gardenlinux-1592-t4",
            &["--catalog", cat.to_str().unwrap(), cmd],
        );
        assert_eq!(r.code, 4, "{cmd}");
        assert_eq!(r.doc["status"]["reason"], "CatalogInvalid");
        assert!(r.message().contains(cat.to_str().unwrap()));
    }
    let r = run_on(
        "gardenlinux-1592-t4",
        &["--catalog", "/nonexistent/catalog.toml", "resolve"],
    );
    assert_eq!(r.code, 4);
    assert!(
        r.message()
            .starts_with("the catalog (--catalog) /nonexistent/catalog.toml does not exist"),
        "{}",
        r.message()
    );
}

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
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-driver-installer"))
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
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/results.v1alpha1.json");
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        fs::write(&path, &generated).unwrap();
    }
    let committed = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date; regenerate with `UPDATE_SCHEMA=1 cargo test --test it cli::committed_schema` \
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
    let doc =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/results.md")).unwrap();
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
fn the_embedded_catalog_refuses_measured_broken_pairs() {
    // Measured: 550.163.01 open fails to compile on 6.12.117+deb13.
    let r = run_on(
        "debian-13-hgx-a100",
        &[
            "--kernel-release",
            "6.12.117+deb13-cloud-amd64",
            "resolve",
            "--driver-version",
            "550.163.01",
            "--flavor",
            "open",
        ],
    );
    assert_eq!(r.code, 11, "{}", r.doc);
    assert_eq!(r.doc["status"]["reason"], "IncompatibleKernel");
    assert!(r.message().contains("pci_resize_resource"));
    // The proprietary flavor of the same pair builds, and auto picks it.
    let r = run_on(
        "debian-13-hgx-a100",
        &[
            "--kernel-release",
            "6.12.117+deb13-cloud-amd64",
            "resolve",
            "--driver-version",
            "550.163.01",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["moduleFlavor"], "proprietary");
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

fn catalog() -> gpu_driver_installer::catalog::Catalog {
    gpu_driver_installer::catalog::Catalog::embedded().unwrap()
}

#[test]
fn a_branch_resolves_to_its_newest_release_with_a_digest() {
    let cat = catalog();
    let x86 = gpu_driver_installer::host::CpuArch::X86_64;
    for branch in ["535", "570", "580", "590"] {
        let want = cat.default_release(branch, x86).unwrap().version.clone();
        let r = run_on(
            "gardenlinux-2150-h100",
            &["resolve", "--driver-version", branch],
        );
        let s = &r.doc["status"];
        assert_eq!(s["driverVersion"], want.as_str(), "{branch}: {s}");
        assert_eq!(s["driverVersionSource"], "flag");
        assert_eq!(s["package"]["checksumKnown"], true);
    }
    assert_eq!(
        cat.default_release("580", x86).unwrap().version,
        "580.178.04"
    );
    // A branch the catalog does not list: the message names those it does.
    let r = run_on(
        "gardenlinux-2150-h100",
        &["resolve", "--driver-version", "999"],
    );
    assert_eq!(r.code, 4);
    assert_eq!(r.doc["status"]["reason"], "InvalidArgument");
    let msg = r.message();
    assert!(msg.contains("branch 999") && msg.contains("580"), "{msg}");
}

#[test]
fn garden_linux_2150_8_refuses_the_drivers_that_cannot_compile_on_6_18_41() {
    // The default (580 newest) builds on 6.18.41.
    let r = run_on("gardenlinux-2150.8-l40s", &["resolve"]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["moduleFlavor"], "open");
    // 570 (any release) and 580 before 580.126.09 call pci_resize_resource
    // with 3 arguments.
    for v in ["570", "570.211.01", "580.95.05", "535.309.01"] {
        let r = run_on(
            "gardenlinux-2150.8-l40s",
            &["resolve", "--driver-version", v, "--flavor", "open"],
        );
        assert_eq!(
            r.doc["status"]["reason"], "IncompatibleKernel",
            "{v}: {}",
            r.doc
        );
        let msg = r.message();
        assert!(msg.contains("pci_resize_resource"), "{msg}");
    }
    // 580.126.09 is the first 580 that builds there.
    let r = run_on(
        "gardenlinux-2150.8-l40s",
        &["resolve", "--driver-version", "580.126.09"],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
    // The same 570 on 2150.0.0 (kernel 6.18.2) is fine.
    let r = run_on(
        "gardenlinux-2150-h100",
        &["resolve", "--driver-version", "570"],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
}

#[test]
fn old_garden_linux_kernels_take_the_proprietary_modules_with_the_reason() {
    for name in [
        "gardenlinux-1592-t4",
        "gardenlinux-1760-a10g",
        "gardenlinux-1877-l4",
    ] {
        let r = run_on(name, &["resolve"]);
        let s = &r.doc["status"];
        assert_eq!(s["moduleFlavor"], "proprietary", "{name}: {s}");
        let why = s["flavorReason"].as_str().unwrap();
        assert!(why.contains("signed firmware"), "{name}: {why}");
        // Asking for the open modules there is refused, with the reason.
        let r = run_on(name, &["resolve", "--flavor", "open"]);
        assert_eq!(r.doc["status"]["reason"], "FlavorNotSupported", "{name}");
        let msg = r.message();
        assert!(msg.contains("GSP firmware"), "{name}: {msg}");
    }
    // From 1877.6 (6.12.56) and on other OSes, auto picks open again.
    let r = run_on(
        "gardenlinux-1877-arm64-t4g",
        &["--arch", "arm64", "resolve"],
    );
    assert_eq!(r.doc["status"]["moduleFlavor"], "open", "{}", r.doc);
    let r = run_on(
        "debian-13-hgx-a100",
        &["resolve", "--driver-version", "580"],
    );
    assert_eq!(r.doc["status"]["moduleFlavor"], "open", "{}", r.doc);
}

#[test]
fn secure_boot_on_is_a_warning_in_the_plan() {
    let r = run_on("gardenlinux-1877-l4", &["resolve"]);
    assert_eq!(r.code, 0);
    let warnings = r.doc["status"]["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| {
            let w = w.as_str().unwrap();
            w.contains("Secure Boot") && w.contains("ModuleSignatureRequired")
        }),
        "{warnings:?}"
    );
    assert_eq!(r.doc["status"]["signedModules"], true, "{}", r.doc);
    let r = run_on("gardenlinux-2150-h100", &["resolve"]);
    assert!(r.doc["status"].get("warnings").is_none());
    assert!(r.doc["status"].get("signedModules").is_none());
}

#[test]
fn arm64_nodes_get_the_aarch64_package_and_its_digest() {
    let r = run_on(
        "gardenlinux-1877-arm64-t4g",
        &["--arch", "arm64", "resolve"],
    );
    let s = &r.doc["status"];
    assert_eq!(r.code, 0, "{s}");
    assert_eq!(s["arch"], "aarch64");
    let url = s["package"]["url"].as_str().unwrap();
    assert!(url.contains("NVIDIA-Linux-aarch64-"), "{url}");
    let want = catalog()
        .driver_for_version(s["driverVersion"].as_str().unwrap())
        .unwrap()
        .sha256_for(gpu_driver_installer::host::CpuArch::Aarch64)
        .unwrap()
        .to_string();
    assert_eq!(s["package"]["sha256"], want.as_str());
    // The same node read as x86_64 gets the other file.
    let r = run_on(
        "gardenlinux-1877-arm64-t4g",
        &["--arch", "x86_64", "resolve"],
    );
    assert!(
        r.doc["status"]["package"]["url"]
            .as_str()
            .unwrap()
            .contains("NVIDIA-Linux-x86_64-")
    );
}

#[test]
fn the_catalog_check_passes_on_the_embedded_catalog_and_names_problems() {
    let r = run(&["catalog-check"]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["kind"], "CatalogCheck");
    assert_eq!(r.doc["status"]["reason"], "CatalogChecked");

    let dir = tempfile::tempdir().unwrap();
    let cat = dir.path().join("catalog.toml");
    let embedded =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("catalog/catalog.toml"))
            .unwrap();
    // A default branch whose only release has no digest, a policy that
    // sends Garden Linux 2150 (6.18) to 570, and an exclusion whose
    // evidence is hearsay.
    let broken = embedded
        .replace("defaultBranch = \"580\"", "defaultBranch = \"600\"")
        .replace(
            "# ---------------------------------------------------------------- policies",
            "[[drivers]]\nbranch = \"600\"\nversion = \"600.10.01\"\nchannel = \"datacenter\"\n\n[[policies]]\nname = \"gl-2150-570\"\nos = \"gardenlinux\"\nosVersions = [\"2150\"]\nbranch = \"570\"\n",
        )
        .replace(
            "[[flavorRules]]",
            "[[exclusions]]\ndriver = \"590\"\nreason = \"x\"\nevidence = \"a forum said so\"\n\n[[flavorRules]]",
        );
    assert_ne!(broken, embedded);
    fs::write(&cat, broken).unwrap();
    let r = run(&["--catalog", cat.to_str().unwrap(), "catalog-check"]);
    assert_eq!(r.code, 4, "{}", r.doc);
    assert_eq!(r.doc["status"]["reason"], "CatalogInvalid");
    let problems: Vec<String> = r.doc["status"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("600.10.01 has no aarch64 digest")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("Garden Linux 2150")
            && p.contains("570.211.01 (open) is excluded on 6.18.255")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("a forum said so")),
        "{problems:?}"
    );
}

/// The defaults table in docs/compatibility.md, from `catalog-check`.
fn defaults_table(defaults: &[Value]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    for d in defaults {
        let flavors: Vec<&str> = d["flavorsForTuringAndNewer"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let flavor = match flavors.as_slice() {
            [one] => one.to_string(),
            [first, then] => format!("{first}, then {then} (flavor rule)"),
            _ => flavors.join(", "),
        };
        let row = format!(
            "| {} | {} | {} | {} | {} | {} |",
            d["os"].as_str().unwrap(),
            d["osVersion"].as_str().unwrap(),
            d["kernelSeries"].as_str().unwrap(),
            d["driverVersion"].as_str().unwrap(),
            d["chosenBy"].as_str().unwrap(),
            flavor
        );
        let arch = d["arch"].as_str().unwrap().to_string();
        match rows.iter_mut().find(|(r, _)| *r == row) {
            Some((_, archs)) => archs.push(arch),
            None => rows.push((row, vec![arch])),
        }
    }
    let mut out = String::from(
        "| OS | version | kernel series | default driver | chosen by | auto flavor (Turing and newer) | CPU |\n|---|---|---|---|---|---|---|\n",
    );
    for (row, archs) in rows {
        out.push_str(&format!("{row} {} |\n", archs.join(", ")));
    }
    out
}

#[test]
fn the_compatibility_table_is_the_catalogs() {
    let r = run(&["catalog-check"]);
    let table = defaults_table(r.doc["status"]["defaults"].as_array().unwrap());
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/compatibility.md");
    let doc = fs::read_to_string(&path).unwrap();
    const BEGIN: &str =
        "<!-- catalog defaults: generated by tests/it/cli.rs from catalog-check -->\n";
    const END: &str = "<!-- end of catalog defaults -->";
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/compatibility.md lacks the generated section markers");
    };
    let current = &doc[b + BEGIN.len()..e];
    if current != table {
        if std::env::var("UPDATE_DOCS").as_deref() == Ok("1") {
            let new = format!("{}{BEGIN}{table}{}", &doc[..b], &doc[e..]);
            fs::write(&path, new).unwrap();
        } else {
            panic!(
                "docs/compatibility.md's defaults table is out of date; regenerate with `UPDATE_DOCS=1 cargo test --test it cli::the_compatibility_table`:\n{table}"
            );
        }
    }
}

#[test]
fn the_plan_carries_module_parameters_and_iommu_passthrough_from_the_catalog() {
    // B200-class (Blackwell): nvidia-uvm's HMM off.
    let dir = tempfile::tempdir().unwrap();
    synthetic_root(dir.path(), &[0x2901]);
    let r = run(&["--host-root", dir.path().to_str().unwrap(), "resolve"]);
    let params = &r.doc["status"]["moduleParams"];
    assert_eq!(params[0]["module"], "nvidia_uvm", "{}", r.doc);
    assert_eq!(params[0]["params"], "uvm_disable_hmm=1");
    assert!(r.doc["status"].get("iommuPassthrough").is_none());
    // A Turing node: no parameters.
    let r = run_on("gardenlinux-1592-t4", &["resolve"]);
    assert!(r.doc["status"].get("moduleParams").is_none(), "{}", r.doc);
    // Garden Linux metal (VARIANT_ID metal-…): IOMMU passthrough.
    let r = run_on("gardenlinux-2150-h100", &["resolve"]);
    let why = r.doc["status"]["iommuPassthrough"].as_str().unwrap();
    assert!(why.contains("IO_PAGE_FAULT"), "{why}");
    assert!(
        run_on("gardenlinux-1877-l4", &["resolve"]).doc["status"]
            .get("iommuPassthrough")
            .is_none()
    );
}

/// NVSwitch hosts get Fabric Manager of exactly the driver's version, as
/// NVIDIA's redist archive (its sha256 comes from the release manifest at
/// fetch time); hosts without NVSwitches do not. Data-center GPUs (3D
/// controllers) get nvidia-persistenced, VGA boards do not.
#[test]
fn nvswitch_hosts_plan_fabric_manager_of_the_drivers_version() {
    for (name, switches) in [("gardenlinux-2150-h100", 4), ("debian-13-hgx-a100", 6)] {
        let r = run_on(name, &["resolve"]);
        let s = &r.doc["status"];
        assert_eq!(s["reason"], "Resolved", "{name}: {}", r.doc);
        let version = s["driverVersion"].as_str().unwrap();
        let fm = &s["fabricManager"];
        assert_eq!(fm["version"], version, "{name}");
        assert_eq!(
            fm["package"]["url"],
            format!(
                "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-{version}-archive.tar.xz"
            ),
            "{name}"
        );
        assert_eq!(
            fm["package"]["fileName"],
            format!("fabricmanager-linux-x86_64-{version}-archive.tar.xz")
        );
        assert_eq!(fm["package"]["checksumKnown"], false);
        assert!(fm["package"].get("sha256").is_none(), "never invented");
        let why = fm["reason"].as_str().unwrap();
        assert!(
            why.starts_with(&format!("{switches} NVSwitch(es)")),
            "{why}"
        );
        assert!(why.contains("error 802"), "{why}");
        assert!(s["persistenced"].as_str().unwrap().contains("data-center"));
    }
    // An explicit version is followed, and aarch64 is NVIDIA's linux-sbsa.
    let r = run_on(
        "gardenlinux-2150-h100",
        &[
            "--arch",
            "aarch64",
            "resolve",
            "--driver-version",
            "580.95.05",
        ],
    );
    let fm = &r.doc["status"]["fabricManager"];
    assert_eq!(fm["version"], "580.95.05", "{}", r.doc);
    assert_eq!(
        fm["package"]["url"],
        "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-sbsa/fabricmanager-linux-sbsa-580.95.05-archive.tar.xz"
    );

    let r = run_on("gardenlinux-1592-t4", &["resolve"]);
    assert_eq!(r.doc["status"]["reason"], "Resolved", "{}", r.doc);
    assert!(r.doc["status"].get("fabricManager").is_none(), "{}", r.doc);
    assert!(
        r.doc["status"]["persistenced"].is_string(),
        "a T4 is a 3D controller"
    );
    let r = run_on("debian-12-workstation-audio", &["resolve"]);
    assert!(r.doc["status"].get("fabricManager").is_none(), "{}", r.doc);
    assert!(r.doc["status"].get("persistenced").is_none(), "{}", r.doc);
}

/// `matrix-exclusions` prints what `scripts/matrix-exclusions` printed when
/// it was Python (expected-exclusions.toml is that script's output for the
/// fixture matrix): a covered pair and an unreadable one as comments, one
/// suggestion per branch, flavor and series with its lowest kernel.
#[test]
fn matrix_exclusions_suggest_what_the_catalog_lacks() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/matrix");
    let want = fs::read_to_string(dir.join("expected-exclusions.toml")).unwrap();
    let catalog = Path::new(env!("CARGO_MANIFEST_DIR")).join("catalog/catalog.toml");
    let catalog = catalog.to_str().unwrap();
    for args in [
        &[
            "matrix-exclusions",
            "--matrix",
            "matrix.json",
            "--catalog",
            catalog,
        ][..],
        // The embedded catalog is catalog/catalog.toml.
        &["matrix-exclusions", "--matrix", "matrix.json"][..],
    ] {
        let out = bin().args(args).current_dir(&dir).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{args:?}");
    }
    let out = bin()
        .args(["matrix-exclusions", "--matrix", "/nonexistent/matrix.json"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/matrix.json"));
}

/// `--module-params` names a file in a privileged container: `/dev/zero`
/// is not read until memory runs out, a FIFO does not hang the Job, and a
/// file that is not module parameters (`/proc/self/environ`, a secret) is
/// refused by its path and line, its content never in the result or on
/// stderr.
#[test]
fn the_module_params_file_is_read_bounded_and_never_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let secret = dir.path().join("environ");
    fs::write(
        &secret,
        "nvidia NVreg_X=1\nAWS_SECRET_ACCESS_KEY=hunter2-never-shown\0HOME=/root\0",
    )
    .unwrap();
    let artifact = dir.path().join("no-artifact.tar.zst");
    for (file, want) in [
        (
            Path::new("/dev/zero"),
            "is not a regular file (a character device)",
        ),
        (fifo.as_path(), "is not a regular file (a FIFO)"),
        (secret.as_path(), "line 2 does not start with a module name"),
    ] {
        let mut c = bin();
        c.arg("--host-root")
            .arg(fixture("gardenlinux-1592-t4"))
            .arg("install")
            .arg("--artifact")
            .arg(&artifact)
            .arg("--module-params")
            .arg(file);
        let out = crate::support::run::output_within(c, std::time::Duration::from_secs(120));
        let r = crate::support::run::finish(out);
        assert_eq!(r.doc["status"]["reason"], "InvalidArgument", "{}", r.doc);
        let msg = r.doc["status"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{msg}");
        assert!(msg.contains(&file.display().to_string()), "{msg}");
        assert!(
            !r.doc.to_string().contains("hunter2") && !r.stderr.contains("hunter2"),
            "{}\n{}",
            r.doc,
            r.stderr
        );
    }
}

/// A memory cgroup of this process's own with `limit` bytes (v2 where the
/// unified hierarchy is mounted, else v1's memory controller), removed on
/// drop. These machines run the tests as root with a writable hierarchy.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    fn new(name: &str, limit: u64) -> MemoryCgroup {
        let own = fs::read_to_string("/proc/self/cgroup").unwrap();
        let unified = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let (mount, path, file) = if unified {
            let p = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
            ("/sys/fs/cgroup", p, "memory.max")
        } else {
            let p = own
                .lines()
                .find_map(|l| l.split_once(":memory:").map(|(_, p)| p))
                .unwrap();
            ("/sys/fs/cgroup/memory", p, "memory.limit_in_bytes")
        };
        let dir = Path::new(mount)
            .join(path.trim_start_matches('/'))
            .join(format!("{name}-{}", std::process::id()));
        fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "making the memory cgroup {} (this test needs root and a writable cgroup hierarchy): {e}",
                dir.display()
            )
        });
        fs::write(dir.join(file), limit.to_string()).unwrap();
        MemoryCgroup(dir)
    }

    /// `cmd` started inside the cgroup (a shell moves itself in first).
    fn wrap(&self, cmd: &Command) -> Command {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(r#"echo $$ >"$0/cgroup.procs" && exec "$@""#)
            .arg(&self.0)
            .arg(cmd.get_program())
            .args(cmd.get_args());
        sh
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.0);
    }
}

/// Without `--jobs`, a build runs one compiler per CPU but no more than
/// its cgroup's memory limit holds (320 MiB plus 128 MiB each), and says
/// so; `--jobs` still wins.
#[test]
fn a_memory_limit_lowers_the_default_compile_jobs() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let jobs_in = |limit: u64, extra: &[&str]| {
        let cg = MemoryCgroup::new("gpu-driver-jobs", limit);
        let mut cmd = bin();
        cmd.args(["--log-level", "info", "build", "--source", "/nonexistent"])
            .args([
                "--kernel",
                "6.1.0",
                "--flavor",
                "open",
                "--out",
                "/nonexistent/out",
            ])
            .args(extra);
        let out = cg.wrap(&cmd).output().unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            doc["spec"]["jobs"].as_u64().unwrap() as usize,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (jobs, stderr) = jobs_in(400 << 20, &[]);
    assert_eq!(jobs, 1);
    if cpus > 1 {
        assert!(
            stderr.contains(&format!(
                "compiling with -j1, not -j{cpus}: the container's memory limit is 400 MiB"
            )),
            "{stderr}"
        );
    }
    assert_eq!(jobs_in(64 << 30, &[]).0, cpus);
    assert_eq!(jobs_in(400 << 20, &["--jobs", "3"]).0, 3);
}
