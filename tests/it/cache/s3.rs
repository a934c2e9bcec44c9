//! The cache against a real S3 server (s3s-fs): hits, corruption, an
//! unreachable server, racing builders, expired leases, plain HTTP.

use super::*;

#[test]
fn s3_miss_stores_then_every_later_build_is_a_verified_hit() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let fx = Fixture::new(0);
    let url = server.url("cluster-a");

    let a = run_s3(&server, fx.build("a", &url, &[]));
    assert_eq!(a.reason(), "Built", "{}\n{}", a.doc, a.stderr);
    assert_eq!(a.outcome(), "Miss", "{}", a.doc);
    assert_eq!(a.cache()["stored"], true, "{}", a.doc);
    assert_eq!(a.cache()["lease"], "acquired", "{}", a.doc);
    assert!(
        a.cache()["bytesUploaded"].as_u64().unwrap() > 1000,
        "{}",
        a.doc
    );
    let key = a.cache()["key"].as_str().unwrap().to_string();
    assert!(key.contains(&format!("/{REL}/{DRIVER}/open/cc-")), "{key}");
    assert_eq!(fx.compiles(), 1);
    // Manifest last, lease released: the entry is complete and free.
    let entry = server.bucket_dir().join("cluster-a").join(&key);
    assert!(entry.join("manifest.json").is_file());
    assert!(!entry.join("lease.json").exists(), "lease left behind");

    // Without --driver-version (looked up after extraction) and with it
    // (looked up before): both hits, nothing compiled.
    for extra in [&[][..], &["--driver-version", DRIVER][..]] {
        let b = run_s3(&server, fx.build("b", &url, extra));
        assert_eq!(b.reason(), "Built", "{}\n{}", b.doc, b.stderr);
        assert_eq!(b.code, 0);
        assert_eq!(b.outcome(), "Hit", "{}", b.doc);
        assert_eq!(b.cache()["key"], key.as_str());
        assert_eq!(b.cache()["stored"], false);
        assert!(b.cache()["bytesDownloaded"].as_u64().unwrap() > 1000);
        assert_eq!(
            b.doc["status"]["artifactSha256"],
            a.doc["status"]["artifactSha256"]
        );
        assert_eq!(b.doc["status"]["modules"], a.doc["status"]["modules"]);
        let bytes = fs::read(b.artifact()).unwrap();
        assert_eq!(
            sha256(&bytes),
            b.doc["status"]["artifactSha256"].as_str().unwrap()
        );
        assert!(
            b.doc["status"]["message"]
                .as_str()
                .unwrap()
                .contains("nothing compiled"),
            "{}",
            b.doc
        );
    }
    assert_eq!(fx.compiles(), 1, "a hit compiled");

    // Another prefix is another cache.
    let c = run_s3(&server, fx.build("c", &server.url("cluster-b"), &[]));
    assert_eq!(c.outcome(), "Miss", "{}", c.doc);
    assert_eq!(fx.compiles(), 2);
}

#[test]
fn s3_corrupted_artifact_is_detected_rebuilt_and_replaced() {
    let Some((server, fx, url)) = s3_after_a_first_miss() else {
        return;
    };

    // One flipped byte in the middle of the stored artifact.
    let b = rebuild_after_damage(&server, &fx, &url, |mut bytes| {
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x55;
        bytes
    });
    assert_eq!(b.reason(), "Built", "{}\n{}", b.doc, b.stderr);
    assert_eq!(b.outcome(), "Corrupt", "{}", b.doc);
    let warning = b.cache()["warnings"][0].as_str().unwrap();
    assert!(warning.contains("sha256"), "{warning}");
    assert_eq!(b.cache()["stored"], true, "{}", b.doc);
    assert_eq!(fx.compiles(), 2, "a corrupt entry must be rebuilt");

    let c = run_s3(&server, fx.build("c", &url, &[]));
    assert_eq!(c.outcome(), "Hit", "replaced entry not served: {}", c.doc);
    assert_eq!(fx.compiles(), 2);
}

#[test]
fn s3_truncated_objects_are_corrupt() {
    let Some((server, fx, url)) = s3_after_a_first_miss() else {
        return;
    };

    let b = rebuild_after_damage(&server, &fx, &url, |bytes| {
        bytes[..bytes.len() / 3].to_vec()
    });
    assert_eq!(b.outcome(), "Corrupt", "{}\n{}", b.doc, b.stderr);
    let warning = b.cache()["warnings"][0].as_str().unwrap();
    assert!(warning.contains("truncated"), "{warning}");
    assert_eq!(fx.compiles(), 2);

    // A truncated manifest (a writer that died mid-upload on a store
    // without atomic puts) is corrupt too, and replaced.
    let manifest = find(&server.bucket_dir(), "manifest.json");
    let text = fs::read(&manifest).unwrap();
    fs::write(&manifest, &text[..text.len() / 2]).unwrap();
    let c = run_s3(&server, fx.build("c", &url, &[]));
    assert_eq!(c.outcome(), "Corrupt", "{}\n{}", c.doc, c.stderr);
    assert!(
        c.cache()["warnings"][0]
            .as_str()
            .unwrap()
            .contains("manifest.json"),
        "{}",
        c.doc
    );
    assert_eq!(fx.compiles(), 3);
    let d = run_s3(&server, fx.build("d", &url, &[]));
    assert_eq!(d.outcome(), "Hit", "{}", d.doc);
}

#[test]
fn s3_server_down_builds_anyway_with_a_warning() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let fx = Fixture::new(0);
    let addr = server.addr;
    drop(server); // nothing listens there any more
    let mut c = fx.build("a", &format!("s3://{BUCKET}/p"), &[]);
    c.env("AWS_ENDPOINT_URL", format!("http://{addr}"))
        .env("AWS_ACCESS_KEY_ID", KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_REGION", "us-east-1")
        .arg("--allow-http");
    let r = finish(c.output().unwrap());
    assert_eq!(r.reason(), "Built", "{}\n{}", r.doc, r.stderr);
    assert_eq!(r.code, 0, "the cache must never fail a node");
    assert_eq!(r.outcome(), "Unavailable", "{}", r.doc);
    assert_eq!(r.cache()["stored"], false);
    assert!(!r.cache()["warnings"].as_array().unwrap().is_empty());
    assert!(
        r.doc["status"]["message"]
            .as_str()
            .unwrap()
            .contains("Unavailable"),
        "{}",
        r.doc
    );
    assert_eq!(fx.compiles(), 1);
    // The secret never shows, in the result or on stderr.
    assert!(!r.stderr.contains(SECRET) && !r.doc.to_string().contains(SECRET));
}

#[test]
fn s3_two_builders_racing_for_one_key_build_it_once() {
    let Some(server) = S3Server::start() else {
        return;
    };
    // The compile takes long enough for the second builder to find the
    // first one's lease.
    let fx = Fixture::new(4);
    let url = server.url("race");
    let mut children = Vec::new();
    for out in ["a", "b"] {
        let mut c = fx.build(out, &url, &["--cache-poll-ms", "200"]);
        server.env(&mut c);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        children.push(c.spawn().unwrap());
    }
    let runs: Vec<Run> = children
        .into_iter()
        .map(|c| finish(c.wait_with_output().unwrap()))
        .collect();
    for r in &runs {
        assert_eq!(r.reason(), "Built", "{}\n{}", r.doc, r.stderr);
    }
    let mut outcomes: Vec<&str> = runs.iter().map(Run::outcome).collect();
    outcomes.sort();
    assert_eq!(
        outcomes,
        ["Hit", "Miss"],
        "{}\n{}",
        runs[0].doc,
        runs[1].doc
    );
    assert_eq!(fx.compiles(), 1, "two builders of one key compiled twice");
    let hit = runs.iter().find(|r| r.outcome() == "Hit").unwrap();
    assert!(
        hit.cache()["lease"]
            .as_str()
            .unwrap_or("")
            .starts_with("waited"),
        "{}",
        hit.doc
    );
    assert_eq!(
        runs[0].doc["status"]["artifactSha256"],
        runs[1].doc["status"]["artifactSha256"]
    );
}

#[test]
fn s3_a_crashed_builders_lease_expires_and_is_taken_over() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let fx = Fixture::new(0);
    let url = server.url("p");
    // Learn the key's directory from a first build, then leave a lease as
    // a builder that crashed an hour ago would have.
    let a = run_s3(&server, fx.build("a", &url, &[]));
    let key = a.cache()["key"].as_str().unwrap().to_string();
    let entry = server.bucket_dir().join("p").join(&key);
    fs::remove_file(entry.join("manifest.json")).unwrap();
    let old = serde_json::json!({
        "owner": "crashed-node/1/0",
        "acquiredAtUnix": 1_000_000_000u64,
        "ttlSeconds": 1800
    });
    fs::write(entry.join("lease.json"), old.to_string()).unwrap();
    let b = run_s3(&server, fx.build("b", &url, &["--cache-wait", "600"]));
    assert_eq!(b.reason(), "Built", "{}\n{}", b.doc, b.stderr);
    assert_eq!(b.outcome(), "Miss", "{}", b.doc);
    assert_eq!(
        b.cache()["lease"],
        "took over the expired lease of crashed-node/1/0",
        "{}",
        b.doc
    );
    assert_eq!(b.cache()["stored"], true);
    assert!(!entry.join("lease.json").exists());

    // A live lease makes a builder wait; with --cache-wait 0 it gives up at
    // once and compiles, saying so.
    fs::remove_file(entry.join("manifest.json")).unwrap();
    let live = serde_json::json!({
        "owner": "busy-node/1/0",
        "acquiredAtUnix": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
        "ttlSeconds": 1800
    });
    fs::write(entry.join("lease.json"), live.to_string()).unwrap();
    let c = run_s3(&server, fx.build("c", &url, &["--cache-wait", "0"]));
    assert_eq!(c.reason(), "Built", "{}\n{}", c.doc, c.stderr);
    assert_eq!(c.outcome(), "Miss");
    assert!(
        c.cache()["warnings"][0]
            .as_str()
            .unwrap()
            .contains("busy-node/1/0"),
        "{}",
        c.doc
    );
    // Not its lease: left alone.
    assert!(entry.join("lease.json").exists());
    assert_eq!(fx.compiles(), 3);
}

#[test]
fn s3_plain_http_endpoint_needs_allow_http() {
    // Refused before anything is contacted: no server needed.
    let fx = Fixture::new(0);
    let mut c = fx.build("a", "s3://nodes/p", &[]);
    c.env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .env("AWS_ACCESS_KEY_ID", KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET);
    let r = finish(c.output().unwrap());
    assert_eq!(r.reason(), "InsecureUrl", "{}", r.doc);
    assert_eq!(r.code, 12, "{}", r.doc);
    let msg = r.message();
    assert!(msg.contains("AWS_ENDPOINT_URL=http://127.0.0.1:9"), "{msg}");
    assert!(msg.contains("--allow-http"), "{msg}");
    assert_eq!(fx.compiles(), 0);
    // A malformed URL is the operator's mistake, too.
    let r = finish(fx.build("a", "ftp://x/y", &[]).output().unwrap());
    assert_eq!(r.reason(), "InvalidArgument", "{}", r.doc);
}
