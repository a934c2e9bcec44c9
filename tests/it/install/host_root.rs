//! Links in the host root never lead a write outside it; the driver root
//! appears in pods that already hold it.

use super::*;

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
        .env("BIN", crate::support::bin::installer())
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
