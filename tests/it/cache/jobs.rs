//! Build Jobs (prebuild) and install Jobs (`run --cache-read-only`): the
//! build stores the artifact, the installs use only it.

use super::*;

/// The fetch flags of `run` and `prebuild` for that server (plain http:
/// `--allow-http` comes with the S3 environment or is added for file://).
fn package_args(server: &crate::support::http::Server, sum: &str) -> Vec<String> {
    [
        "--url",
        &server.url(&format!("/nvidia-fixture-{DRIVER}.tar.gz")),
        "--sha256",
        sum,
        "--retries",
        "0",
        "--driver-version",
        DRIVER,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Every file under `dir` with its bytes: a store before and after.
fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

/// What [`s3_with_packages`] sets up.
type S3WithPackages = (
    S3Server,
    Fixture,
    crate::support::http::Server,
    Vec<String>,
    String,
);

/// An S3 store, a fixture, a web server for the fixture's driver tarball,
/// the fetch flags for it and the store's URL for `prefix`; `None` where S3
/// tests are skipped.
fn s3_with_packages(prefix: &str) -> Option<S3WithPackages> {
    let server = S3Server::start()?;
    let fx = Fixture::new(0);
    let (packages, sum) = package_server(&fx);
    let pkg = package_args(&packages, &sum);
    let url = server.url(prefix);
    Some((server, fx, packages, pkg, url))
}

/// An install Job's flags: read-only, never compiling, and only the
/// artifact `sha`.
fn pinned(sha: &str) -> Vec<&str> {
    vec![
        "--cache-read-only",
        "--no-compile",
        "--artifact-sha256",
        sha,
    ]
}

/// An install Job that may compile: read-only, and only the artifact `sha`
/// from the store.
fn run_compiling_pinned(
    server: &S3Server,
    node: &Path,
    pkg: &[String],
    url: &str,
    sha: &str,
) -> Run {
    run_s3(
        server,
        run_node(
            node,
            pkg,
            url,
            &["--cache-read-only", "--artifact-sha256", sha],
        ),
    )
}

/// The run's BuildResult: built, a cache miss, nothing stored.
fn built_on_an_unstored_miss(r: &Run) -> Value {
    let build = step(r, "BuildResult");
    assert_eq!(build["status"]["reason"], "Built", "{build}\n{}", r.stderr);
    assert_eq!(build["status"]["cache"]["outcome"], "Miss", "{build}");
    assert_eq!(build["status"]["cache"]["stored"], false, "{build}");
    build
}

#[test]
fn s3_a_build_job_stores_the_artifact_and_read_only_install_jobs_use_only_it() {
    let Some((server, fx, _packages, pkg, url)) = s3_with_packages("cluster-a") else {
        return;
    };
    let node = fx.node("node");

    assert_an_install_before_any_build_fails_unwritten(&server, &fx, &node, &pkg, &url);

    // The build Job: no GPU known, so auto is what resolve picks without
    // GPUs (535 predates open-by-default: proprietary), and says so.
    let a = run_s3(&server, prebuild(&fx, &pkg, &url, &[]));
    assert_eq!(a.reason(), "Built", "{}\n{}", a.doc, a.stderr);
    assert_eq!(a.code, 0);
    assert_eq!(a.doc["kind"], "RunResult");
    assert_eq!(
        step_kinds(&a),
        ["InstallPlan", "FetchResult", "BuildResult"],
        "{}",
        a.doc
    );
    let plan = step(&a, "InstallPlan");
    assert!(
        plan["status"]["flavorReason"]
            .as_str()
            .unwrap()
            .starts_with("no GPU known (prebuild for a target)"),
        "{plan}"
    );
    let built = a.doc["status"]["built"].clone();
    assert_eq!(built["driverVersion"], DRIVER, "{built}");
    assert_eq!(built["flavor"], "proprietary", "{built}");
    assert_eq!(built["kernelRelease"], REL, "{built}");
    assert_eq!(built["arch"], "x86_64", "{built}");
    let key = built["cacheKey"].as_str().unwrap().to_string();
    let sha = built["artifactSha256"].as_str().unwrap().to_string();
    // What the store really holds: its manifest's sha256 and the bytes.
    let entry = server.bucket_dir().join("cluster-a").join(&key);
    let manifest: Value =
        serde_json::from_slice(&fs::read(entry.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["artifactSha256"], sha.as_str(), "{manifest}");
    let object = entry.join(manifest["artifact"].as_str().unwrap());
    assert_eq!(sha256(&fs::read(object).unwrap()), sha);
    assert_eq!(fx.compiles(), 1);

    // A second build Job finds it: a verified hit, nothing compiled.
    let b = run_s3(&server, prebuild(&fx, &pkg, &url, &[]));
    assert_eq!(b.reason(), "Built", "{}\n{}", b.doc, b.stderr);
    assert_eq!(step(&b, "BuildResult")["status"]["cache"]["outcome"], "Hit");
    assert_eq!(b.doc["status"]["built"], built);
    assert_eq!(fx.compiles(), 1);

    // Install Jobs: read-only, never compiling, and only the artifact the
    // build Job reported.
    let stored = snapshot(&server.bucket_dir());
    let wrong = sha256(b"another artifact");
    let r = run_s3(&server, run_node(&node, &pkg, &url, &pinned(&wrong)));
    assert_eq!(r.reason(), "ChecksumMismatch", "{}\n{}", r.doc, r.stderr);
    assert_eq!(r.code, 12);
    let msg = r.message();
    assert!(msg.contains(&wrong) && msg.contains(&sha), "{msg}");
    assert_eq!(fx.compiles(), 1);

    let r = run_s3(
        &server,
        run_node(&node, &pkg, &url, &pinned(&sha.to_uppercase())),
    );
    let build = step(&r, "BuildResult");
    assert_eq!(build["status"]["reason"], "Built", "{build}\n{}", r.stderr);
    assert_eq!(build["status"]["cache"]["outcome"], "Hit", "{build}");
    assert_eq!(build["status"]["artifactSha256"], sha.as_str());
    // Then install, stopped at the missing --module-params.
    assert_eq!(step_kinds(&r).last().unwrap(), "InstallResult", "{}", r.doc);
    assert_eq!(fx.compiles(), 1);
    assert_a_refused_entry_is_compiled_not_stored(&server, &fx, &node, &pkg, &url, &wrong, &stored);
}

/// Allowed to compile, a node refuses the entry all the same, compiles
/// its own, and neither replaces the entry nor stores anything.
fn assert_a_refused_entry_is_compiled_not_stored(
    server: &S3Server,
    fx: &Fixture,
    node: &Path,
    pkg: &[String],
    url: &str,
    wrong: &str,
    stored: &std::collections::BTreeMap<PathBuf, Vec<u8>>,
) {
    // Allowed to compile, a node refuses the entry all the same, compiles
    // its own, and neither replaces the entry nor stores anything.
    let r = run_compiling_pinned(server, node, pkg, url, wrong);
    let build = built_on_an_unstored_miss(&r);
    assert!(
        build["status"]["cache"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("--artifact-sha256"),
        "{build}"
    );
    assert_eq!(fx.compiles(), 2);
    assert_eq!(
        snapshot(&server.bucket_dir()),
        *stored,
        "a read-only run wrote"
    );
}

/// Before any build Job: an install Job that may not compile fails,
/// and, read-only, writes nothing (not even the package it fetched).
fn assert_an_install_before_any_build_fails_unwritten(
    server: &S3Server,
    fx: &Fixture,
    node: &Path,
    pkg: &[String],
    url: &str,
) {
    // Before any build Job: an install Job that may not compile fails,
    // and, read-only, writes nothing (not even the package it fetched).
    let empty = snapshot(&server.bucket_dir());
    let r = run_s3(
        server,
        run_node(node, pkg, url, &["--cache-read-only", "--no-compile"]),
    );
    assert_eq!(r.reason(), "ArtifactNotCached", "{}\n{}", r.doc, r.stderr);
    assert_eq!(r.code, 13, "{}", r.doc);
    let msg = r.message();
    assert!(
        msg.contains("artifacts/v") && msg.contains("prebuild"),
        "{msg}"
    );
    assert_eq!(step_kinds(&r).last().unwrap(), "BuildResult");
    assert_eq!(fx.compiles(), 0, "--no-compile compiled");
    assert_eq!(
        snapshot(&server.bucket_dir()),
        empty,
        "a read-only run wrote"
    );
}

/// The run failed with CacheWriteFailed (exit 13): its message.
fn cache_write_failed(r: &Run) -> &str {
    assert_eq!(r.reason(), "CacheWriteFailed", "{}\n{}", r.doc, r.stderr);
    assert_eq!(r.code, 13);
    r.message()
}

#[test]
fn s3_a_build_job_that_cannot_write_the_store_fails_cache_write_failed() {
    let Some((server, fx, _packages, pkg, url)) = s3_with_packages("p") else {
        return;
    };

    // Credentials the store refuses.
    let mut c = prebuild(&fx, &pkg, &url, &[]);
    server.env(&mut c);
    c.env("AWS_SECRET_ACCESS_KEY", "not-the-secret-key");
    let r = finish(c.output().unwrap());
    let msg = cache_write_failed(&r);
    assert!(
        msg.contains("not in the cache") && msg.contains("Unavailable"),
        "{msg}"
    );
    assert!(r.doc["status"].get("built").is_none(), "{}", r.doc);
    assert!(
        !r.stderr.contains("not-the-secret-key")
            && !r.doc.to_string().contains("not-the-secret-key")
    );
    assert_eq!(fx.compiles(), 1);
    assert!(snapshot(&server.bucket_dir()).is_empty());

    // A store that may be read but not written (read-only credentials
    // given to a build Job): the lookup works, every write fails.
    let Some(read_only) = S3Server::start_read_only() else {
        return;
    };
    let r = run_s3(
        &read_only,
        prebuild(&fx, &pkg, &read_only.url("p"), &["--cache-wait", "0"]),
    );
    let msg = cache_write_failed(&r);
    assert!(
        msg.contains("(cache Miss: ") && msg.contains("not stored"),
        "{msg}"
    );
    assert_eq!(fx.compiles(), 2);
    assert!(snapshot(&read_only.bucket_dir()).is_empty());
}

#[test]
fn file_store_a_read_only_run_writes_nothing_even_on_a_miss() {
    let fx = Fixture::new(0);
    let (packages, sum) = package_server(&fx);
    let mut pkg = package_args(&packages, &sum);
    pkg.push("--allow-http".into());
    let store = tempfile::tempdir().unwrap();
    fs::write(store.path().join("README"), "the cluster owner's store\n").unwrap();
    let url = format!("file://{}", store.path().display());
    let node = fx.node("node");
    let before = snapshot(store.path());

    let r = finish(
        run_node(&node, &pkg, &url, &["--cache-read-only"])
            .output()
            .unwrap(),
    );
    let build = built_on_an_unstored_miss(&r);
    let cache = &build["status"]["cache"];
    assert!(cache.get("lease").is_none(), "{build}");
    assert!(
        cache["warnings"][0].as_str().unwrap().contains("read-only"),
        "{build}"
    );
    assert_eq!(fx.compiles(), 1);
    assert_eq!(step_kinds(&r).last().unwrap(), "InstallResult", "{}", r.doc);
    assert_eq!(snapshot(store.path()), before, "a read-only run wrote");

    // The same run allowed to write stores the artifact and the package:
    // what the read-only run left out.
    let r = finish(run_node(&node, &pkg, &url, &[]).output().unwrap());
    let build = step(&r, "BuildResult");
    assert_eq!(
        build["status"]["cache"]["stored"], true,
        "{build}\n{}",
        r.stderr
    );
    assert_eq!(fx.compiles(), 2);
    let after = snapshot(store.path());
    assert!(
        after.keys().any(|p| p.ends_with("manifest.json")),
        "{:?}",
        after.keys()
    );
    assert!(
        after.contains_key(Path::new(&format!(
            "packages/nvidia-fixture-{DRIVER}.tar.gz"
        ))),
        "{:?}",
        after.keys()
    );
}

/// `prebuild` for [`TARGET`] without the flag `missing` (and its value),
/// then `extra`.
fn prebuild_args<'a>(missing: Option<&str>, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["prebuild"];
    for pair in TARGET.chunks(2) {
        if Some(pair[0]) != missing {
            args.extend_from_slice(pair);
        }
    }
    args.extend_from_slice(extra);
    args
}

#[test]
fn prebuild_and_install_job_flags_are_checked_before_anything_runs() {
    let fx = Fixture::new(0);
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let any_sha = "a".repeat(64);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            prebuild_args(Some("--kernel-release"), &["--cache-url", &url]),
            "--kernel-release",
        ),
        (
            prebuild_args(Some("--arch"), &["--cache-url", &url]),
            "--arch",
        ),
        (prebuild_args(None, &[]), "--cache-url"),
        (
            prebuild_args(None, &["--cache-url", &url, "--cache-read-only"]),
            "--cache-read-only",
        ),
        (
            vec!["run", "--cache-url", &url, "--artifact-sha256", "abc"],
            "64 hex digits",
        ),
        (
            vec!["run", "--no-compile"],
            "--no-compile without --cache-url",
        ),
        (
            vec!["run", "--artifact-sha256", &any_sha],
            "there is no --cache-url",
        ),
        (
            vec![
                "run",
                "--cache-url",
                &url,
                "--cache-entry",
                "artifacts/v1.1/x86_64/k",
            ],
            "without --artifact-sha256",
        ),
        (
            vec![
                "run",
                "--cache-url",
                &url,
                "--artifact-sha256",
                &any_sha,
                "--cache-entry",
                "artifacts/../../etc",
            ],
            "is not an entry of the cache",
        ),
        (
            vec![
                "run",
                "--artifact-sha256",
                &any_sha,
                "--cache-entry",
                "artifacts/v1/x/k",
            ],
            "there is no --cache-url",
        ),
    ];
    for (args, says) in cases {
        let mut c = bin();
        c.arg("--host-root").arg(&fx.base).args(&args);
        let r = finish(c.output().unwrap());
        assert_eq!(
            r.reason(),
            "InvalidArgument",
            "{args:?}: {}\n{}",
            r.doc,
            r.stderr
        );
        assert_eq!(r.code, 4, "{args:?}");
        let msg = r.message();
        assert!(msg.contains(says), "{args:?}: {msg}");
        assert!(
            r.doc["status"]["steps"].as_array().unwrap().is_empty(),
            "{}",
            r.doc
        );
    }
    assert!(snapshot(store.path()).is_empty(), "a refused command wrote");
    // A target the catalog does not list: refused before resolve.
    let mut c = bin();
    c.arg("--host-root")
        .arg(&fx.base)
        .args(["prebuild", "--os-id", "ubuntu", "--os-version", "24.04"])
        .args([
            "--kernel-release",
            REL,
            "--arch",
            "amd64",
            "--cache-url",
            &url,
        ]);
    let r = finish(c.output().unwrap());
    assert_eq!(r.reason(), "UnsupportedOs", "{}", r.doc);
    assert_eq!(r.code, 10);
    assert_eq!(fx.compiles(), 0);
}

/// Look up first: an install Job whose artifact a build Job stored
/// downloads the artifact and nothing else (the package server's request
/// log stays as it was, and the run's `bytesDownloaded` is the artifact's
/// objects only); one that may not compile and finds no entry fails before
/// any package byte; one that may compile and misses fetches and builds as
/// before.
#[test]
fn s3_a_node_whose_artifact_is_cached_downloads_only_the_artifact() {
    let Some((server, fx, packages, pkg, url)) = s3_with_packages("cluster-b") else {
        return;
    };
    let node = fx.node("node");

    let nothing = sha256(b"nothing stored yet");
    let r = run_s3(&server, run_node(&node, &pkg, &url, &pinned(&nothing)));
    assert_eq!(r.reason(), "ArtifactNotCached", "{}\n{}", r.doc, r.stderr);
    assert!(
        !step_kinds(&r).contains(&"FetchResult".to_string()),
        "{}",
        r.doc
    );
    assert_eq!(
        packages.count(),
        0,
        "a --no-compile miss downloaded the package"
    );

    let a = run_s3(&server, prebuild(&fx, &pkg, &url, &[]));
    assert_eq!(a.reason(), "Built", "{}\n{}", a.doc, a.stderr);
    let sha = a.doc["status"]["built"]["artifactSha256"]
        .as_str()
        .unwrap()
        .to_string();
    let after_build = packages.count();
    assert!(after_build > 0);
    assert!(
        a.doc["status"]["bytesDownloaded"].as_u64().unwrap() > 0,
        "{}",
        a.doc
    );

    // A second build Job of the key: a hit, without the package either.
    let b = run_s3(&server, prebuild(&fx, &pkg, &url, &[]));
    assert_eq!(b.reason(), "Built", "{}\n{}", b.doc, b.stderr);
    assert_eq!(step_kinds(&b), ["InstallPlan", "BuildResult"], "{}", b.doc);
    assert_eq!(packages.count(), after_build, "{:?}", packages.log());

    let r = run_s3(&server, run_node(&node, &pkg, &url, &pinned(&sha)));
    let kinds = step_kinds(&r);
    assert!(!kinds.contains(&"FetchResult".to_string()), "{kinds:?}");
    let build = step(&r, "BuildResult");
    assert_eq!(
        build["status"]["cache"]["outcome"], "Hit",
        "{build}\n{}",
        r.stderr
    );
    assert_eq!(packages.count(), after_build, "{:?}", packages.log());
    let cache_bytes = build["status"]["cache"]["bytesDownloaded"]
        .as_u64()
        .unwrap();
    assert!(cache_bytes > 0, "{build}");
    assert_eq!(r.doc["status"]["bytesDownloaded"], cache_bytes, "{}", r.doc);
    assert_eq!(fx.compiles(), 1);

    // Named by the build Job (`--cache-entry`): a node without headers
    // (and so without a key of its own) installs the same artifact.
    let bare = fx.bare_node("bare");
    let entry = a.doc["status"]["built"]["cacheKey"]
        .as_str()
        .unwrap()
        .to_string();
    let mut named = pinned(&sha);
    named.extend(["--cache-entry", &entry]);
    let r = run_s3(&server, run_node(&bare, &pkg, &url, &named));
    let build = step(&r, "BuildResult");
    assert_eq!(
        build["status"]["cache"]["outcome"], "Hit",
        "{build}\n{}",
        r.stderr
    );
    assert_eq!(build["status"]["artifactSha256"], sha.as_str(), "{build}");
    assert!(build["status"].get("headers").is_none(), "{build}");
    assert!(
        !step_kinds(&r).contains(&"FetchResult".to_string()),
        "{}",
        r.doc
    );
    assert_eq!(step_kinds(&r).last().unwrap(), "InstallResult", "{}", r.doc);
    assert_eq!(packages.count(), after_build, "{:?}", packages.log());
    // Without it, the same node has no key: it falls back to fetching.
    let r = run_s3(&server, run_node(&bare, &pkg, &url, &pinned(&sha)));
    assert!(
        step_kinds(&r).contains(&"FetchResult".to_string()),
        "{}",
        r.doc
    );
    assert_ne!(
        step(&r, "BuildResult")["status"]["reason"],
        "Built",
        "{}",
        r.doc
    );

    assert_a_missing_digest_is_fetched_and_built(&server, &fx, &node, &pkg, &url);
}

/// Allowed to compile and missing (another digest pinned): fetched (from
/// the store's package copy, which the build Job left) and built as
/// before the lookup came first.
fn assert_a_missing_digest_is_fetched_and_built(
    server: &S3Server,
    fx: &Fixture,
    node: &Path,
    pkg: &[String],
    url: &str,
) {
    let r = run_compiling_pinned(server, node, pkg, url, &sha256(b"x"));
    assert_eq!(
        step(&r, "FetchResult")["status"]["reason"],
        "Fetched",
        "{}",
        r.stderr
    );
    assert_eq!(step(&r, "BuildResult")["status"]["reason"], "Built");
    assert_eq!(fx.compiles(), 2);
}
