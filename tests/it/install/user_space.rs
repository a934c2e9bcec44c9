//! User space: placed, registered and verified; a kill -9 at any point
//! leaves a usable driver.

use super::*;

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
        let out = Command::new(crate::support::bin::installer())
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
