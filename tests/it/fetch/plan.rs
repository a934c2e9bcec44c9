//! Fetching what the plan names: the driver package and Fabric Manager.

use super::*;

#[test]
fn without_url_the_plan_package_is_fetched_with_its_plan_errors() {
    // A node without a GPU has no package: the fetch fails with the plan's reason.
    let root = crate::support::repo_root().join("tests/fixtures/hosts/debian-12-nogpu");
    let dir = tempfile::tempdir().unwrap();
    let r = fetch(dir.path(), &["--host-root", root.to_str().unwrap()], &[]);
    assert_eq!(r.doc["status"]["reason"], "NoGpu");
    assert_eq!(r.code, 3);
    // A GPU node: the plan's URL is HTTPS at NVIDIA with the catalog's
    // digest, and offline the package is not cached: NotCached, no network.
    let root = crate::support::repo_root().join("tests/fixtures/hosts/gardenlinux-1592-t4");
    let r = fetch(
        dir.path(),
        &["--host-root", root.to_str().unwrap(), "--offline"],
        &[],
    );
    assert_eq!(r.doc["status"]["reason"], "NotCached", "{}", r.doc);
    assert_eq!(r.doc["status"]["checksumSource"], "catalog", "{}", r.doc);
    assert_eq!(
        r.doc["spec"]["url"],
        "https://download.nvidia.com/XFree86/Linux-x86_64/570.211.01/NVIDIA-Linux-x86_64-570.211.01.run"
    );
    // With a checksum given and the file pre-seeded, offline succeeds.
    let body = b"pre-seeded package";
    let sum = sha256_hex(body);
    fs::write(dir.path().join(&sum), body).unwrap();
    let r = fetch(
        dir.path(),
        &[
            "--host-root",
            root.to_str().unwrap(),
            "--offline",
            "--sha256",
            &sum,
        ],
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["cacheHit"], true);
}

/// The Fabric Manager archive the h100 fixture's plan names.
fn planned_fabric_manager() -> (String, String) {
    let host = crate::support::repo_root().join("tests/fixtures/hosts/gardenlinux-2150-h100");
    let out = Command::new(crate::support::bin::installer())
        .args(["--termination-log", "/nonexistent/t", "--host-root"])
        .arg(&host)
        .arg("resolve")
        .output()
        .unwrap();
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let fm = &plan["status"]["fabricManager"];
    (
        fm["version"]
            .as_str()
            .unwrap_or_else(|| panic!("no fabricManager: {plan}"))
            .to_string(),
        fm["package"]["url"].as_str().unwrap().to_string(),
    )
}

/// Fabric Manager comes as NVIDIA's redist archive at the URL the plan
/// names: its sha256 is taken from the release's redistrib manifest over
/// HTTPS (never invented), and an archive whose bytes differ from the
/// manifest's sha256 is refused. The loopback server stands in for
/// developer.download.nvidia.com/compute/nvidia-driver.
#[test]
fn a_fabric_manager_archive_is_verified_against_the_redistrib_manifest() {
    let (version, planned) = planned_fabric_manager();
    let nvidia = "https://developer.download.nvidia.com/compute/nvidia-driver";
    let rel = planned
        .strip_prefix(&format!("{nvidia}/redist/"))
        .unwrap_or_else(|| panic!("not NVIDIA's redist: {planned}"))
        .to_string();
    assert_eq!(
        rel,
        format!("fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-{version}-archive.tar.xz")
    );
    let dir = tempfile::tempdir().unwrap();
    let archive = fabric_support::archive(dir.path(), &version);
    let body = fs::read(&archive).unwrap();
    let manifest = |sum: &str| {
        format!(
            r#"{{"release_date": "2025-10-01", "fabricmanager": {{"name": "NVIDIA Fabric Manager", "license": "NVIDIA Driver", "version": "{version}", "linux-x86_64": {{"relative_path": "{rel}", "sha256": "{sum}", "size": "{}"}}}}}}"#,
            body.len()
        )
    };
    let good = manifest(&sha256_hex(&body));
    let bad = manifest(&sha256_hex(b"another archive"));
    let manifest_path = format!("/redist/redistrib_{version}.json");
    let b = body.clone();
    let handler = move |req: &Request| match req.path() {
        p if p == format!("/good{manifest_path}") => {
            Reply::Full(200, vec![], good.clone().into_bytes())
        }
        p if p == format!("/bad{manifest_path}") => {
            Reply::Full(200, vec![], bad.clone().into_bytes())
        }
        p if p.ends_with(".sha256sum") => Reply::Full(404, vec![], vec![]),
        _ => Reply::Ranged(b.clone()),
    };
    let (server, ca_pem) = Server::start_tls(handler);
    let ca = dir.path().join("ca.pem");
    fs::write(&ca, ca_pem).unwrap();
    let ca = ca.to_str().unwrap();

    let url = planned.replace(nvidia, &server.https_url("/good"));
    let cache = dir.path().join("c1");
    let r = fetch(&cache, &["--url", &url, "--ca-bundle", ca], &[]);
    assert_eq!(r.code, 0, "{}", r.doc);
    let s = &r.doc["status"];
    assert_eq!(s["reason"], "Fetched");
    assert_eq!(s["checksumSource"], "redistManifest");
    assert_eq!(s["sha256"], sha256_hex(&body));
    assert_eq!(fs::read(s["path"].as_str().unwrap()).unwrap(), body);

    let url = planned.replace(nvidia, &server.https_url("/bad"));
    let cache = dir.path().join("c2");
    let r = fetch(&cache, &["--url", &url, "--ca-bundle", ca], &[]);
    assert_eq!(r.code, 12, "{}", r.doc);
    assert_eq!(r.doc["status"]["reason"], "ChecksumMismatch", "{}", r.doc);
    assert_eq!(
        cache_files(&cache),
        Vec::<String>::new(),
        "the bad bytes stay"
    );
}
