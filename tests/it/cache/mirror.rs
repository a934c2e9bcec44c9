//! The store as a package mirror: checksummed packages come from it and
//! are stored for the other nodes; a ConfigMap catalog adds versions.

use super::*;

#[test]
fn packages_come_from_the_store_when_checksummed_and_never_otherwise() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let pkg = b"a driver package, as the store holds it".to_vec();
    let sum = sha256(&pkg);
    fs::create_dir_all(store.path().join("packages")).unwrap();
    fs::write(
        store
            .path()
            .join("packages/NVIDIA-Linux-x86_64-535.261.03.run"),
        &pkg,
    )
    .unwrap();
    let cache_root = tempfile::tempdir().unwrap();
    // Offline (an air-gapped cluster): the store is the only source. Each
    // call is a new node's first run: its package cache does not exist yet.
    let fetch = |sha: &str, cache_dir: &Path| {
        let mut c = bin();
        c.args([
            "fetch",
            "--url",
            "https://download.invalid/NVIDIA-Linux-x86_64-535.261.03.run",
            "--sha256",
            sha,
            "--offline",
            "--cache-url",
            &url,
        ])
        .arg("--cache-dir")
        .arg(cache_dir);
        finish(c.output().unwrap())
    };
    // A checksum the store's copy does not have: not used.
    let wrong = sha256(b"another package");
    let r = fetch(&wrong, &cache_root.path().join("node-1"));
    assert_eq!(r.reason(), "NotCached", "{}\n{}", r.doc, r.stderr);
    assert!(r.stderr.contains("not the trusted"), "{}", r.stderr);

    let cache_dir = cache_root.path().join("node-2");
    let r = fetch(&sum, &cache_dir);
    assert_eq!(r.reason(), "Fetched", "{}\n{}", r.doc, r.stderr);
    assert!(
        r.message().contains("came from the cache store"),
        "{}",
        r.doc
    );
    assert_eq!(fs::read(cache_dir.join(&sum)).unwrap(), pkg);
}

#[test]
fn a_package_downloaded_elsewhere_is_stored_for_the_other_nodes() {
    let pkg = crate::support::http::bytes(50_000, 7);
    let sum = crate::support::http::sha256_hex(&pkg);
    let served = pkg.clone();
    let server = crate::support::http::Server::start(move |_| {
        crate::support::http::Reply::Ranged(served.clone())
    });
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let fetch = |cache_dir: &Path| {
        let mut c = bin();
        c.args([
            "fetch",
            "--url",
            &server.url("/NVIDIA-Linux-x86_64-535.261.03.run"),
        ])
        .args([
            "--sha256",
            &sum,
            "--allow-http",
            "--retries",
            "0",
            "--cache-url",
            &url,
        ])
        .arg("--cache-dir")
        .arg(cache_dir);
        finish(c.output().unwrap())
    };
    let first = tempfile::tempdir().unwrap();
    let r = fetch(first.path());
    assert_eq!(r.reason(), "Fetched", "{}\n{}", r.doc, r.stderr);
    let stored = store
        .path()
        .join("packages/NVIDIA-Linux-x86_64-535.261.03.run");
    assert_eq!(fs::read(&stored).unwrap(), pkg, "not stored in the mirror");
    assert_eq!(server.count(), 1);
    // Another node (an empty package cache) gets it from the store: the
    // web server sees no second request.
    let second = tempfile::tempdir().unwrap();
    let r = fetch(second.path());
    assert_eq!(r.reason(), "Fetched", "{}\n{}", r.doc, r.stderr);
    assert!(
        r.message().contains("came from the cache store"),
        "{}",
        r.doc
    );
    assert_eq!(server.count(), 1, "downloaded again despite the mirror");
}

/// The embedded catalog with the geforce URL template pointed at `base`
/// and `extra` appended: what an owner puts in a GpuDriver's ConfigMap.
fn catalog_with(base: &str, extra: &str) -> String {
    let embedded =
        fs::read_to_string(crate::support::repo_root().join("catalog/catalog.toml")).unwrap();
    let template = "geforce = \"https://download.nvidia.com/XFree86/Linux-{arch}/{version}/NVIDIA-Linux-{arch}-{version}.run\"";
    assert!(
        embedded.contains(template),
        "the embedded geforce template moved"
    );
    let ours = format!("geforce = \"{base}/{{version}}/NVIDIA-Linux-{{arch}}-{{version}}.run\"");
    format!("{}\n{extra}", embedded.replace(template, &ours))
}

/// A catalog handed in with `--catalog` (the operator mounts a GpuDriver's
/// ConfigMap there) adds a driver version the embedded one lacks, as an
/// owner does on the day NVIDIA ships it: the build Job resolves it,
/// fetches the package from the catalog's URL and checks it against the
/// catalog's digest, and builds; the install Job resolves the same and
/// installs the built artifact (stopping at the fixture node's missing
/// module parameters, as every install here). A wrong digest in such a
/// catalog stops the download, and a catalog whose defaults lack a digest
/// is refused before anything is fetched.
#[test]
fn a_configmap_catalog_adds_a_driver_version_that_resolves_and_installs() {
    let fx = Fixture::new(0);
    let (packages, sum) = package_server(&fx);
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let node = fx.node("node");
    let dir = tempfile::tempdir().unwrap();
    let base = packages.url("/packages");
    let entry = |sha: &str| {
        format!(
            "[[drivers]]\nbranch = \"535\"\nversion = \"{DRIVER}\"\nchannel = \"geforce\"\nsha256 = {{ x86_64 = \"{sha}\" }}\ndigestSource = \"test: the fixture tarball\"\n"
        )
    };
    let cat = dir.path().join("catalog.toml");
    fs::write(&cat, catalog_with(&base, &entry(&sum))).unwrap();
    let cat = cat.to_str().unwrap().to_string();
    let pkg: Vec<String> = ["--driver-version", DRIVER, "--allow-http", "--retries", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // --catalog is a global flag: before the subcommand.
    let with_catalog = |c: Command, catalog: &str| {
        // bin()'s own two arguments lead `c`'s.
        let args: Vec<std::ffi::OsString> = c.get_args().skip(2).map(|a| a.to_owned()).collect();
        let mut fresh = bin();
        fresh.args(["--catalog", catalog]).args(args);
        finish(fresh.output().unwrap())
    };

    let a = with_catalog(prebuild(&fx, &pkg, &url, &[]), &cat);
    assert_eq!(a.reason(), "Built", "{}\n{}", a.doc, a.stderr);
    let plan = step(&a, "InstallPlan");
    assert_eq!(plan["spec"]["catalog"], cat.as_str(), "{plan}");
    assert_eq!(plan["status"]["package"]["sha256"], sum.as_str(), "{plan}");
    assert_eq!(
        plan["status"]["package"]["url"],
        format!("{base}/{DRIVER}/NVIDIA-Linux-x86_64-{DRIVER}.run").as_str()
    );
    assert_eq!(
        packages.count(),
        1,
        "the package came from the catalog's URL"
    );
    assert_eq!(a.doc["status"]["built"]["driverVersion"], DRIVER);
    assert_eq!(fx.compiles(), 1);

    let r = with_catalog(run_node(&node, &pkg, &url, &[]), &cat);
    let build = step(&r, "BuildResult");
    assert_eq!(
        build["status"]["cache"]["outcome"], "Hit",
        "{build}\n{}",
        r.stderr
    );
    assert_eq!(step_kinds(&r).last().unwrap(), "InstallResult", "{}", r.doc);
    assert_eq!(fx.compiles(), 1);

    // The same catalog with another digest for the version: the download
    // does not match it and nothing is built.
    let wrong = dir.path().join("wrong.toml");
    fs::write(
        &wrong,
        catalog_with(&base, &entry(&sha256(b"not the package"))),
    )
    .unwrap();
    let empty = tempfile::tempdir().unwrap();
    let url2 = format!("file://{}", empty.path().display());
    let r = with_catalog(prebuild(&fx, &pkg, &url2, &[]), wrong.to_str().unwrap());
    assert_eq!(r.reason(), "ChecksumMismatch", "{}\n{}", r.doc, r.stderr);
    assert_eq!(fx.compiles(), 1);

    // A catalog whose default branch has no release with a digest:
    // refused as it is read, before resolve; the web server sees nothing.
    let before = packages.count();
    let embedded = catalog_with(&base, "");
    let broken = embedded.replace("defaultBranch = \"580\"", "defaultBranch = \"612\"");
    assert_ne!(broken, embedded, "the default branch line moved");
    let bad = dir.path().join("bad.toml");
    fs::write(&bad, broken).unwrap();
    let r = with_catalog(run_node(&node, &pkg, &url, &[]), bad.to_str().unwrap());
    assert_eq!(r.reason(), "CatalogInvalid", "{}\n{}", r.doc, r.stderr);
    assert!(r.message().contains("612"), "{}", r.message());
    assert_eq!(packages.count(), before);
}
