//! `fetch` against real HTTP servers on loopback, with faults injected.

use crate::support::fabric as fabric_support;

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::support::http::{ConnectProxy, Reply, Request, Server, bytes, sha256_hex};
use serde_json::Value;

/// Every variable that could send the installer through a proxy.
fn proxy_vars() -> impl Iterator<Item = &'static str> {
    gpu_driver_installer::fetch::PROXY_VARS
        .into_iter()
        .chain(["NO_PROXY", "no_proxy"])
}

struct Run {
    code: i32,
    doc: Value,
}

impl Run {
    fn message(&self) -> &str {
        self.doc["status"]["message"].as_str().unwrap()
    }
}

fn fetch(cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpu-driver-installer"));
    for v in proxy_vars() {
        c.env_remove(v);
    }
    c.envs(env.iter().copied());
    c.args([
        "--termination-log",
        "/nonexistent/t",
        "fetch",
        "--cache-dir",
    ])
    .arg(cache)
    .args(["--backoff-ms", "10"])
    .args(args);
    let out = c.output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Run {
        code: out.status.code().unwrap(),
        doc,
    }
}

/// The common plain-HTTP fetch: `url` checked against `sum`, with `extra` flags.
fn fetch_http(cache: &Path, url: &str, sum: &str, extra: &[&str]) -> Run {
    fetch_http_env(cache, url, sum, extra, &[])
}

fn fetch_http_env(cache: &Path, url: &str, sum: &str, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let mut args = vec!["--url", url, "--sha256", sum, "--allow-http"];
    args.extend_from_slice(extra);
    fetch(cache, &args, env)
}

/// [`fetch_http`] of the server's `/p.run` into a fresh cache directory.
fn fetch_p_run(server: &Server, sum: &str, extra: &[&str]) -> (tempfile::TempDir, Run) {
    let dir = tempfile::tempdir().unwrap();
    let r = fetch_http(dir.path(), &server.url("/p.run"), sum, extra);
    (dir, r)
}

/// A server whose first answer is cut after `send` bytes of `body`; the
/// later ones are `then(body)`.
fn cut_once_then(body: &[u8], send: usize, then: fn(Vec<u8>) -> Reply) -> Server {
    let b = body.to_vec();
    Server::start(move |req: &Request| {
        if req.index == 0 {
            Reply::Cut {
                body: b.clone(),
                send,
            }
        } else {
            then(b.clone())
        }
    })
}

/// A body of `len` bytes (pattern `seed`), its sha256, and a server that
/// answers every request with it, honouring Range.
fn served(len: usize, seed: u64) -> (Vec<u8>, String, Server) {
    let body = bytes(len, seed);
    let sum = sha256_hex(&body);
    let b = body.clone();
    (body, sum, Server::start(move |_| Reply::Ranged(b.clone())))
}

fn cache_files(cache: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(cache)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn downloads_verifies_and_then_hits_the_cache_without_network() {
    let (body, sum, server) = served(300_000, 1);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/NVIDIA-Linux-x86_64-580.95.05.run");
    let args = ["--url", &url, "--sha256", &sum, "--allow-http"];

    let r = fetch(dir.path(), &args, &[]);
    let s = &r.doc["status"];
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["kind"], "FetchResult");
    assert_eq!(s["phase"], "Succeeded");
    assert_eq!(s["reason"], "Fetched");
    assert_eq!(s["cacheHit"], false);
    assert_eq!(s["sha256"], sum);
    assert_eq!(s["checksumSource"], "flag");
    assert_eq!(s["sizeBytes"], 300_000);
    let path = dir.path().join(&sum);
    assert_eq!(s["path"], path.to_str().unwrap());
    assert_eq!(fs::read(&path).unwrap(), body);
    assert_eq!(cache_files(dir.path()), vec![sum.clone()]);
    assert_eq!(server.count(), 1);

    // Cached and verified: no request at all, online or offline.
    for extra in [&[][..], &["--offline"][..]] {
        let mut a = args.to_vec();
        a.extend_from_slice(extra);
        let r = fetch(dir.path(), &a, &[]);
        assert_eq!(r.code, 0);
        assert_eq!(r.doc["status"]["cacheHit"], true);
        assert!(r.message().contains("no network"));
    }
    assert_eq!(server.count(), 1, "a cache hit must not touch the network");
}

#[test]
fn a_corrupted_cache_entry_is_replaced() {
    let (body, sum, server) = served(50_000, 2);
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(&sum), b"tampered").unwrap();
    let url = server.url("/p.run");
    let r = fetch_http(dir.path(), &url, &sum, &[]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["cacheHit"], false);
    assert_eq!(fs::read(dir.path().join(&sum)).unwrap(), body);
}

#[test]
fn offline_without_cache_is_not_cached_and_silent() {
    let server = Server::start(|_| Reply::Full(200, vec![], b"x".to_vec()));
    let dir = tempfile::tempdir().unwrap();
    let sum = "0".repeat(64);
    let url = server.url("/p.run");
    let r = fetch(
        dir.path(),
        &["--url", &url, "--sha256", &sum, "--offline", "--allow-http"],
        &[],
    );
    assert_eq!(r.code, 12);
    assert_eq!(r.doc["status"]["reason"], "NotCached");
    assert_eq!(server.count(), 0);
}

#[test]
fn a_cut_connection_resumes_with_range() {
    let body = bytes(1_000_000, 3);
    let sum = sha256_hex(&body);
    let server = cut_once_then(&body, 400_000, Reply::Ranged);
    let (dir, r) = fetch_p_run(&server, &sum, &[]);
    let s = &r.doc["status"];
    assert_eq!(r.code, 0, "{}", r.doc);
    let log = server.log();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].range_start(), None);
    let start = log[1]
        .range_start()
        .expect("second request must resume with Range");
    assert!(start > 0 && start <= 400_000, "{start}");
    assert_eq!(s["attempts"][1]["httpStatus"], 206);
    assert_eq!(s["attempts"][1]["resumed"], true);
    assert_eq!(s["attempts"][1]["bytes"], 1_000_000 - start);
    assert_eq!(fs::read(dir.path().join(&sum)).unwrap(), body);
}

#[test]
fn a_server_that_ignores_range_gets_a_fresh_download() {
    let body = bytes(600_000, 4);
    let sum = sha256_hex(&body);
    // Ignores Range: answers 200 with the whole body.
    let server = cut_once_then(&body, 200_000, |b| Reply::Full(200, vec![], b));
    let (dir, r) = fetch_p_run(&server, &sum, &[]);
    assert_eq!(r.code, 0, "{}", r.doc);
    let a = &r.doc["status"]["attempts"][1];
    assert_eq!(a["httpStatus"], 200);
    assert!(a.get("resumed").is_none());
    assert_eq!(a["bytes"], 600_000);
    assert!(server.log()[1].range_start().is_some());
    assert_eq!(fs::read(dir.path().join(&sum)).unwrap(), body);
}

#[test]
fn transient_errors_are_retried_then_give_up() {
    let body = bytes(10_000, 5);
    let sum = sha256_hex(&body);
    let b = body.clone();
    let server = Server::start(move |req: &Request| match req.index {
        0 => Reply::Full(503, vec![], b"busy".to_vec()),
        1 => Reply::Full(429, vec![("Retry-After".into(), "0".into())], vec![]),
        _ => Reply::Full(200, vec![], b.clone()),
    });
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/p.run");
    let r = fetch_http(dir.path(), &url, &sum, &[]);
    assert_eq!(r.code, 0, "{}", r.doc);
    let codes: Vec<Value> = r.doc["status"]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["httpStatus"].clone())
        .collect();
    assert_eq!(
        codes,
        vec![Value::from(503), Value::from(429), Value::from(200)]
    );

    // Always 503, with a limit of 2 retries: 3 attempts, then DownloadFailed.
    let server = Server::start(|_| Reply::Full(503, vec![], vec![]));
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/p.run");
    let r = fetch_http(dir.path(), &url, &sum, &["--retries", "2"]);
    assert_eq!(r.code, 12);
    assert_eq!(r.doc["status"]["reason"], "DownloadFailed");
    assert_eq!(server.count(), 3);
    assert!(r.message().contains("HTTP 503"));

    // A 404 is not retried.
    let server = Server::start(|_| Reply::Full(404, vec![], vec![]));
    let url = server.url("/p.run");
    let r = fetch_http(dir.path(), &url, &sum, &[]);
    assert_eq!(r.doc["status"]["reason"], "DownloadFailed");
    assert_eq!(server.count(), 1);
}

#[test]
fn the_wrong_body_is_a_checksum_mismatch_and_is_deleted() {
    let server = Server::start(|_| Reply::Ranged(bytes(80_000, 6)));
    let dir = tempfile::tempdir().unwrap();
    let sum = sha256_hex(b"what we expected");
    let url = server.url("/p.run");
    let r = fetch_http(dir.path(), &url, &sum, &[]);
    let s = &r.doc["status"];
    assert_eq!(r.code, 12);
    assert_eq!(s["phase"], "Failed");
    assert_eq!(s["reason"], "ChecksumMismatch");
    assert!(s["message"].as_str().unwrap().contains(&sum));
    assert_eq!(
        cache_files(dir.path()),
        Vec::<String>::new(),
        "bad bytes must not stay"
    );
}

#[test]
fn mirrors_are_tried_in_order() {
    let body = bytes(20_000, 7);
    let sum = sha256_hex(&body);
    let primary = Server::start(|_| Reply::Full(404, vec![], vec![]));
    let bad_mirror = Server::start(|_| Reply::Full(200, vec![], b"evil".to_vec()));
    let b = body.clone();
    let good_mirror = Server::start(move |_| Reply::Ranged(b.clone()));
    let dir = tempfile::tempdir().unwrap();
    let url = primary.url("/tesla/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run");
    let m1 = bad_mirror.url("/m");
    let m2 = good_mirror.url("/{version}/{file}");
    let r = fetch_http(dir.path(), &url, &sum, &["--mirror", &m1, "--mirror", &m2]);
    // {version} is unknown for a bare --url: that mirror is refused clearly.
    assert_eq!(r.doc["status"]["reason"], "InvalidArgument", "{}", r.doc);

    let m2 = good_mirror.url("/nv/");
    let r = fetch_http(dir.path(), &url, &sum, &["--mirror", &m1, "--mirror", &m2]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(
        r.doc["status"]["sourceUrl"],
        good_mirror.url("/nv/NVIDIA-Linux-x86_64-580.95.05.run")
    );
    assert_eq!(
        bad_mirror.log()[0].path(),
        "/m/NVIDIA-Linux-x86_64-580.95.05.run"
    );
    assert_eq!(fs::read(dir.path().join(&sum)).unwrap(), body);
}

#[test]
fn plain_http_is_refused_without_opt_in() {
    let server = Server::start(|_| Reply::Full(200, vec![], b"x".to_vec()));
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/p.run");
    let r = fetch(
        dir.path(),
        &["--url", &url, "--sha256", &"a".repeat(64)],
        &[],
    );
    assert_eq!(r.code, 12);
    assert_eq!(r.doc["status"]["reason"], "InsecureUrl");
    assert!(r.message().contains("--allow-http"));
    assert_eq!(server.count(), 0);
}

#[test]
fn checksums_come_from_companions_and_manifests() {
    let body = bytes(40_000, 8);
    let sum = sha256_hex(&body);
    let b = body.clone();
    let s2 = sum.clone();
    let handler = move |req: &Request| {
        match req.path() {
        "/a/NVIDIA-Linux-x86_64-580.95.05.run.sha256sum" => Reply::Full(
            200,
            vec![],
            format!("{s2}  NVIDIA-Linux-x86_64-580.95.05.run\n").into_bytes(),
        ),
        "/redist/redistrib_580.95.05.json" => Reply::Full(
            200,
            vec![],
            format!(
                r#"{{"nvidia_driver": {{"linux-x86_64": {{"relative_path": "nvidia_driver/linux-x86_64/nvidia_driver-linux-x86_64-580.95.05-archive.tar.xz", "sha256": "{s2}"}}}}}}"#
            )
            .into_bytes(),
        ),
        p if p.ends_with(".sha256sum") => Reply::Full(404, vec![], vec![]),
        _ => Reply::Ranged(b.clone()),
    }
    };
    let (server, ca_pem) = Server::start_tls(handler.clone());
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    fs::write(&ca, ca_pem).unwrap();
    let ca = ca.to_str().unwrap();
    let cache = dir.path().join("c1");
    let url = server.https_url("/a/NVIDIA-Linux-x86_64-580.95.05.run");
    let r = fetch(&cache, &["--url", &url, "--ca-bundle", ca], &[]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["checksumSource"], "companion");
    assert_eq!(r.doc["status"]["sha256"], sum);

    let cache = dir.path().join("c2");
    let url = server.https_url(
        "/redist/nvidia_driver/linux-x86_64/nvidia_driver-linux-x86_64-580.95.05-archive.tar.xz",
    );
    let r = fetch(&cache, &["--url", &url, "--ca-bundle", ca], &[]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["checksumSource"], "redistManifest");

    // No companion, no manifest: a checksum is required.
    let cache = dir.path().join("c3");
    let url = server.https_url("/b/other.run");
    let r = fetch(&cache, &["--url", &url, "--ca-bundle", ca], &[]);
    assert_eq!(r.code, 12);
    assert_eq!(r.doc["status"]["reason"], "ChecksumMissing");
    assert!(r.message().contains("--sha256"));
    assert_eq!(cache_files(&cache), Vec::<String>::new());

    // The same companion and manifest over plain HTTP (allowed for the
    // package) are not trusted for its checksum: nothing is requested.
    let plain = Server::start(handler);
    for path in [
        "/a/NVIDIA-Linux-x86_64-580.95.05.run",
        "/redist/nvidia_driver/linux-x86_64/nvidia_driver-linux-x86_64-580.95.05-archive.tar.xz",
    ] {
        let cache = dir.path().join("c4");
        let r = fetch(&cache, &["--url", &plain.url(path), "--allow-http"], &[]);
        assert_eq!(r.doc["status"]["reason"], "ChecksumMissing", "{}", r.doc);
        let msg = r.message();
        assert!(msg.contains("plain HTTP"), "{msg}");
        assert_eq!(cache_files(&cache), Vec::<String>::new());
    }
    assert_eq!(plain.count(), 0);
}

#[test]
fn a_stalled_read_times_out() {
    let body = bytes(1000, 9);
    let sum = sha256_hex(&body);
    let server = Server::start(move |_| Reply::Stall {
        body: body.clone(),
        secs: 5,
    });
    let (_dir, r) = fetch_p_run(&server, &sum, &["--read-timeout", "1", "--retries", "0"]);
    assert_eq!(r.code, 12);
    assert_eq!(r.doc["status"]["reason"], "DownloadFailed");
    let msg = r.message().to_lowercase();
    assert!(
        msg.contains("timeout") || msg.contains("timed out"),
        "{msg}"
    );
}

#[test]
fn proxies_from_the_environment_are_used_unless_no_proxy() {
    let (body, sum, origin) = served(5_000, 10);
    let proxy = ConnectProxy::start();
    let url = origin.url("/p.run");
    let origin_addr = format!("127.0.0.1:{}", origin.port);

    let dir = tempfile::tempdir().unwrap();
    let r = fetch_http_env(
        dir.path(),
        &url,
        &sum,
        &[],
        &[("HTTPS_PROXY", &proxy.url())],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(*proxy.targets.lock().unwrap(), vec![origin_addr.clone()]);
    assert_eq!(origin.count(), 1);

    let dir = tempfile::tempdir().unwrap();
    let r = fetch_http_env(
        dir.path(),
        &url,
        &sum,
        &[],
        &[("HTTPS_PROXY", &proxy.url()), ("NO_PROXY", "127.0.0.1")],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(
        proxy.targets.lock().unwrap().len(),
        1,
        "NO_PROXY must bypass the proxy"
    );
    assert_eq!(origin.count(), 2);
    // Plain HTTP (allowed here) is forwarded by the proxy.
    assert_eq!(*proxy.methods.lock().unwrap(), vec!["GET".to_string()]);

    // HTTPS goes through a CONNECT tunnel, TLS end to end with the origin;
    // ALL_PROXY or HTTP_PROXY serve when HTTPS_PROXY is not set.
    let b = body.clone();
    let (tls_origin, ca_pem) = Server::start_tls(move |_| Reply::Ranged(b.clone()));
    let tls_addr = format!("127.0.0.1:{}", tls_origin.port);
    let ca = tempfile::NamedTempFile::new().unwrap();
    fs::write(ca.path(), ca_pem).unwrap();
    let url = tls_origin.https_url("/p.run");
    // Each fetch into a fresh cache, so that each one downloads.
    let fetch_tls = |env: &[(&str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        let args = ["--url", &url, "--sha256", &sum, "--ca-bundle"];
        fetch(
            dir.path(),
            &[&args[..], &[ca.path().to_str().unwrap()]].concat(),
            env,
        )
    };
    for var in ["HTTPS_PROXY", "ALL_PROXY", "HTTP_PROXY"] {
        let r = fetch_tls(&[(var, &proxy.url())]);
        assert_eq!(r.code, 0, "{var}: {}", r.doc);
        assert_eq!(
            proxy.targets.lock().unwrap().last(),
            Some(&tls_addr),
            "{var}"
        );
        assert_eq!(
            proxy.methods.lock().unwrap().last().map(String::as_str),
            Some("CONNECT"),
            "{var}"
        );
    }
    assert_eq!(tls_origin.count(), 3);
    let r = fetch_tls(&[("HTTPS_PROXY", &proxy.url()), ("NO_PROXY", "127.0.0.1")]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(
        proxy.targets.lock().unwrap().len(),
        4,
        "NO_PROXY must bypass the proxy for HTTPS too"
    );
    assert_eq!(tls_origin.count(), 4);
}

#[test]
fn without_url_the_plan_package_is_fetched_with_its_plan_errors() {
    // A node without a GPU has no package: the fetch fails with the plan's reason.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts/debian-12-nogpu");
    let dir = tempfile::tempdir().unwrap();
    let r = fetch(dir.path(), &["--host-root", root.to_str().unwrap()], &[]);
    assert_eq!(r.doc["status"]["reason"], "NoGpu");
    assert_eq!(r.code, 3);
    // A GPU node: the plan's URL is HTTPS at NVIDIA with the catalog's
    // digest, and offline the package is not cached: NotCached, no network.
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts/gardenlinux-1592-t4");
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

#[test]
fn https_with_a_private_ca_and_no_downgrade() {
    let body = bytes(70_000, 11);
    let sum = sha256_hex(&body);
    let b = body.clone();
    let s2 = sum.clone();
    let plain = Server::start(|_| Reply::Full(200, vec![], b"plain".to_vec()));
    let plain_url = plain.url("/p.run");
    let (server, ca_pem) = Server::start_tls(move |req: &Request| match req.path() {
        "/p.run.sha256sum" => Reply::Full(200, vec![], format!("{s2}  p.run\n").into_bytes()),
        "/downgrade.run" => Reply::Full(302, vec![("Location".into(), plain_url.clone())], vec![]),
        _ => Reply::Ranged(b.clone()),
    });
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    fs::write(&ca, ca_pem).unwrap();
    let cache = dir.path().join("cache");
    let url = server.https_url("/p.run");

    // Unknown CA: the TLS handshake fails, nothing is written, and it is
    // not retried (the default policy would retry a network error 4 times).
    let r = fetch(&cache, &["--url", &url, "--sha256", &sum], &[]);
    assert_eq!(r.doc["status"]["reason"], "DownloadFailed", "{}", r.doc);
    assert!(!cache.join(&sum).exists());
    assert_eq!(
        r.doc["status"]["attempts"].as_array().unwrap().len(),
        1,
        "{}",
        r.doc
    );
    let msg = r.message();
    assert!(
        msg.contains("TLS certificate not trusted") && msg.contains("--ca-bundle"),
        "{msg}"
    );

    // Trusted CA, checksum from the HTTPS companion.
    let r = fetch(
        &cache,
        &["--url", &url, "--ca-bundle", ca.to_str().unwrap()],
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["checksumSource"], "companion");
    assert_eq!(fs::read(cache.join(&sum)).unwrap(), body);

    // A redirect from HTTPS to plain HTTP is not followed.
    let cache = dir.path().join("cache2");
    let url = server.https_url("/downgrade.run");
    let downgraded = |extra: &[&str]| {
        let mut args = vec!["--url", &url, "--sha256", &sum, "--ca-bundle"];
        args.extend([ca.to_str().unwrap(), "--retries", "0"]);
        args.extend_from_slice(extra);
        fetch(&cache, &args, &[])
    };
    let r = downgraded(&[]);
    assert_eq!(r.doc["status"]["reason"], "DownloadFailed", "{}", r.doc);
    assert_eq!(plain.count(), 0);

    // Nor with --allow-http: it permits URLs given as http://, never a
    // redirect's (this one was followed before, and the result still
    // named the https:// source).
    let r = downgraded(&["--allow-http"]);
    assert_eq!(r.doc["status"]["reason"], "DownloadFailed", "{}", r.doc);
    let msg = r.message();
    assert!(msg.contains("HTTPS only"), "{msg}");
    assert_eq!(plain.count(), 0);
    assert!(!cache.join(&sum).exists());

    // A redirect to HTTPS is followed, and the result names where the
    // bytes came from.
    let cache = dir.path().join("cache3");
    let moved_to = server.https_url("/p.run");
    let (hop, hop_ca) = Server::start_tls(move |_: &Request| {
        Reply::Full(302, vec![("Location".into(), moved_to.clone())], vec![])
    });
    let both = dir.path().join("both.pem");
    fs::write(
        &both,
        format!("{}{}", fs::read_to_string(&ca).unwrap(), hop_ca),
    )
    .unwrap();
    let start = hop.https_url("/moved.run");
    let r = fetch(
        &cache,
        &[
            "--url",
            &start,
            "--sha256",
            &sum,
            "--ca-bundle",
            both.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["sourceUrl"], server.https_url("/p.run"));
    assert_eq!(r.doc["status"]["attempts"][0]["url"], start);
    assert_eq!(
        r.doc["status"]["attempts"][0]["finalUrl"],
        server.https_url("/p.run")
    );
}

#[test]
fn a_plain_http_url_may_not_redirect_to_another_plain_http_url() {
    let body = bytes(1000, 3);
    let sum = sha256_hex(&body);
    let target = Server::start(move |_| Reply::Ranged(body.clone()));
    let to = target.url("/p.run");
    let hop =
        Server::start(move |_| Reply::Full(302, vec![("Location".into(), to.clone())], vec![]));
    let dir = tempfile::tempdir().unwrap();
    let r = fetch_http(dir.path(), &hop.url("/p.run"), &sum, &["--retries", "0"]);
    assert_eq!(r.doc["status"]["reason"], "DownloadFailed", "{}", r.doc);
    assert_eq!(target.count(), 0);
}

#[test]
fn a_resumed_prefix_of_another_file_is_not_trusted() {
    let old = bytes(500_000, 12);
    let new = bytes(500_000, 13);
    let sum = sha256_hex(&new);
    let server = Server::start(move |req: &Request| match req.index {
        0 => Reply::Cut {
            body: old.clone(),
            send: 250_000,
        },
        _ => Reply::Ranged(new.clone()),
    });
    let (dir, r) = fetch_p_run(&server, &sum, &[]);
    assert_eq!(r.code, 0, "{}", r.doc);
    let log = server.log();
    assert_eq!(log.len(), 3, "{}", r.doc);
    assert!(log[1].range_start().is_some());
    assert_eq!(log[2].range_start(), None, "the restart must not resume");
    assert_eq!(sha256_hex(&fs::read(dir.path().join(&sum)).unwrap()), sum);
}

/// Runs the installer with a termination log that exists (as Kubernetes
/// makes it) and returns stdout, stderr and the termination log.
fn fetch_all_outputs(args: &[&str], env: &[(&str, &str)]) -> (Value, String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let tlog = dir.path().join("termination-log");
    fs::write(&tlog, "").unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpu-driver-installer"));
    for v in proxy_vars() {
        c.env_remove(v);
    }
    let out = c
        .envs(env.iter().copied())
        .arg("--termination-log")
        .arg(&tlog)
        .args(["fetch", "--cache-dir"])
        .arg(dir.path().join("cache"))
        .args(["--backoff-ms", "10", "--retries", "0"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let stderr = String::from_utf8(out.stderr).unwrap();
    (doc, stdout, stderr, fs::read_to_string(&tlog).unwrap())
}

#[test]
fn credentials_in_urls_appear_in_no_output() {
    const SECRET: &str = "hunter2";
    let server = Server::start(|_| Reply::Full(404, vec![], vec![]));
    let sum = "a".repeat(64);
    let with_creds = server
        .url("/p.run")
        .replace("http://", "http://user:hunter2@");
    let mirror = server.url("/m/").replace("http://", "http://m:hunter2@");
    let endpoint = server.url("").replace("http://", "http://u:hunter2@");
    let env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "AKIATEST"),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
        ("AWS_REGION", "us-east-1"),
    ];
    let cases: [Vec<&str>; 3] = [
        // The package URL and a mirror carry credentials; both fail.
        vec![
            "--url",
            &with_creds,
            "--mirror",
            &mirror,
            "--sha256",
            &sum,
            "--allow-http",
        ],
        // An s3:// cache URL with credentials in it, and a plain-http
        // endpoint with user:password without --allow-http: refused.
        vec![
            "--url",
            &with_creds,
            "--sha256",
            &sum,
            "--cache-url",
            "s3://AKIA:hunter2@bucket/p",
        ],
        // Allowed: the store is asked (and fails), its warnings recorded.
        vec![
            "--url",
            &with_creds,
            "--sha256",
            &sum,
            "--allow-http",
            "--cache-url",
            "s3://bucket/p",
        ],
    ];
    for args in cases {
        let (doc, stdout, stderr, tlog) = fetch_all_outputs(&args, &env);
        assert_eq!(doc["status"]["phase"], "Failed", "{doc}");
        for (what, text) in [
            ("stdout", &stdout),
            ("stderr", &stderr),
            ("termination log", &tlog),
        ] {
            assert!(
                !text.contains(SECRET),
                "{args:?}: the secret is in {what}: {text}"
            );
        }
        assert!(stdout.contains("***@"), "{args:?}: {stdout}");
        assert!(!tlog.is_empty());
    }
}

#[test]
fn a_server_that_drips_forever_meets_the_download_deadline() {
    // One byte every 200 ms: each read is quick, so only the deadline ends
    // the download (before it, this took 50 s per attempt and retried).
    let body = bytes(250, 21);
    let sum = sha256_hex(&body);
    let server = Server::start(move |_| Reply::Drip {
        body: body.clone(),
        every_ms: 200,
    });
    let (dir, r) = fetch_p_run(&server, &sum, &["--download-timeout", "2"]);
    assert_eq!(r.doc["status"]["reason"], "DownloadFailed", "{}", r.doc);
    let msg = r.message();
    assert!(
        msg.contains("deadline of 2 s") && msg.contains("--download-timeout"),
        "{msg}"
    );
    assert!(!dir.path().join(&sum).exists());
}

#[test]
fn downloads_over_the_size_cap_are_refused_and_nothing_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    // Content-Length: 10^15 is refused before a byte is written.
    let liar = Server::start(|_| Reply::Announce {
        announce: 1_000_000_000_000_000,
        body: vec![0; 1000],
    });
    let sum = "b".repeat(64);
    let r = fetch_http(dir.path(), &liar.url("/p.run"), &sum, &[]);
    assert_eq!(r.doc["status"]["reason"], "UnsafeArchive", "{}", r.doc);
    let msg = r.message();
    assert!(msg.contains("--max-download-size"), "{msg}");
    assert_eq!(liar.count(), 1, "not retried");
    assert_eq!(cache_files(dir.path()), Vec::<String>::new());

    // A body that grows past the cap while streaming: stopped, and its
    // partial file removed.
    let body = bytes(3 << 20, 22);
    let sum = sha256_hex(&body);
    let big = Server::start(move |_| Reply::Ranged(body.clone()));
    let r = fetch_http(
        dir.path(),
        &big.url("/p.run"),
        &sum,
        &["--max-download-size", "2"],
    );
    assert_eq!(r.doc["status"]["reason"], "UnsafeArchive", "{}", r.doc);
    assert_eq!(cache_files(dir.path()), Vec::<String>::new());
}

#[test]
fn a_fetch_that_fills_the_disk_leaves_no_partial_file() {
    // The partial file is a link to /dev/full: every write gets ENOSPC from
    // the kernel, as on a full filesystem.
    let body = bytes(100_000, 23);
    let sum = sha256_hex(&body);
    let server = Server::start(move |_| Reply::Ranged(body.clone()));
    let dir = tempfile::tempdir().unwrap();
    let partial = dir.path().join(format!("{sum}.partial"));
    std::os::unix::fs::symlink("/dev/full", &partial).unwrap();
    let r = fetch_http(dir.path(), &server.url("/p.run"), &sum, &[]);
    assert_eq!(r.doc["status"]["reason"], "InsufficientDisk", "{}", r.doc);
    assert!(
        fs::symlink_metadata(&partial).is_err(),
        "the partial file was left behind"
    );
    assert_eq!(cache_files(dir.path()), Vec::<String>::new());
}

/// The Fabric Manager archive the h100 fixture's plan names.
fn planned_fabric_manager() -> (String, String) {
    let host =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts/gardenlinux-2150-h100");
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-driver-installer"))
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
