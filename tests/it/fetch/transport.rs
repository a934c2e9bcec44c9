//! Transport security: plain HTTP only on opt-in, proxies, a private CA,
//! no downgrade, no credentials in any output.

use super::*;

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
fn proxies_from_the_environment_are_used_unless_no_proxy() {
    let (body, sum, origin) = served(5_000, 10);
    let proxy = ConnectProxy::start();
    let url = origin.url("/p.run");
    let origin_addr = format!("127.0.0.1:{}", origin.port);
    // Each fetch into a fresh cache, so that each one downloads; it succeeds.
    let fetch_plain = |env: &[(&str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        let r = fetch_http_env(dir.path(), &url, &sum, &[], env);
        assert_eq!(r.code, 0, "{}", r.doc);
    };

    fetch_plain(&[("HTTPS_PROXY", &proxy.url())]);
    assert_eq!(*proxy.targets.lock().unwrap(), vec![origin_addr.clone()]);
    assert_eq!(origin.count(), 1);

    fetch_plain(&[("HTTPS_PROXY", &proxy.url()), ("NO_PROXY", "127.0.0.1")]);
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

/// Runs the installer with a termination log that exists (as Kubernetes
/// makes it) and returns stdout, stderr and the termination log.
fn fetch_all_outputs(args: &[&str], env: &[(&str, &str)]) -> (Value, String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let tlog = dir.path().join("termination-log");
    fs::write(&tlog, "").unwrap();
    let mut c = Command::new(crate::support::bin::installer());
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
