//! Fabric Manager in the driver root, and the current link and
//! /run/nvidia/driver held by others.

use super::*;

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
        .arg(crate::support::bin::installer())
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
