//! detect and resolve over the fixture hosts: driver versions, branches,
//! flavors and architectures.

use super::*;

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
        let arch = gpu_driver_installer::node::CpuArch::parse(arch).unwrap();
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
