//! Downloads: the cache, resumed and retried transfers, checksums,
//! mirrors, deadlines and size caps.

use super::*;

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
