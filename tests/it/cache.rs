//! The artifact cache (`--cache-url`), end to end: the built installer
//! against a real S3 server on loopback (s3s-fs, installed by
//! `scripts/s3-server`) and against a `file://` store.
//!
//! The builds are real `build` runs: real headers layout, real `make`, real
//! `strip` and modinfo; only the driver's Makefile is a small one that
//! "compiles" by copying a real module (built for the test kernel) into
//! place, and counts its compiles in a file. So "compile once" is counted,
//! not inferred from timings.
//!
//! Needs `GPU_DRIVER_S3_SERVER` (the s3s-fs binary; `scripts/test` sets it
//! from `scripts/s3-server`). Without it the S3 tests fail, saying how to
//! get it, unless `GPU_DRIVER_SKIP_S3_TESTS=1` says to skip them; in CI
//! (`CI=true`) they always fail.

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use sha2::{Digest, Sha256};

const REL: &str = "6.1.0-50-cloud-amd64";
const DRIVER: &str = "535.261.03";
const KEY_ID: &str = "gpu-driver-test";
const SECRET: &str = "gpu-driver-test-secret-key";
const BUCKET: &str = "nodes";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpu-driver-installer"));
    c.args(["--termination-log", "/nonexistent/termination-log"]);
    c.env_remove("RUST_LOG");
    for v in [
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ALLOW_HTTP",
        "GPU_DRIVER_CACHE_URL",
    ] {
        c.env_remove(v);
    }
    c
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

use crate::support::run as run_support;
use run_support::{Run, finish};

impl Run {
    fn reason(&self) -> &str {
        self.doc["status"]["reason"].as_str().unwrap_or("")
    }
    fn cache(&self) -> &Value {
        &self.doc["status"]["cache"]
    }
    fn outcome(&self) -> &str {
        self.cache()["outcome"].as_str().unwrap_or("")
    }
    fn message(&self) -> &str {
        self.doc["status"]["message"].as_str().unwrap()
    }
    fn artifact(&self) -> PathBuf {
        PathBuf::from(self.doc["status"]["artifact"].as_str().unwrap())
    }
}

// ------------------------------------------------------------ the fixture

/// A driver "source" whose Makefile copies a real module for `REL` into
/// place and appends a line to `counter`; Debian-style split headers for
/// `REL`. Everything `build` checks is real.
struct Fixture {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    source: PathBuf,
    headers: PathBuf,
    counter: PathBuf,
}

impl Fixture {
    fn new(compile_seconds: u32) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().to_path_buf();
        let headers = install_headers(&base);

        let ko = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/modules/nvidia-peermem-535.261.03-open-6.1.0-50-cloud-amd64.ko");
        let counter = base.join("compiles");
        let source = base.join("driver");
        let tree = source.join("modules/nvidia-open-kernel");
        fs::create_dir_all(&tree).unwrap();
        fs::write(
            tree.join("Kbuild"),
            format!("ccflags-y += -DNV_VERSION_STRING=\\\"{DRIVER}\\\"\n"),
        )
        .unwrap();
        fs::write(
            tree.join("Makefile"),
            format!(
                "modules:\n\techo compiled >> {counter}\n\tsleep {compile_seconds}\n\tcp {ko} nvidia.ko\n",
                counter = counter.display(),
                ko = ko.display()
            ),
        )
        .unwrap();
        Fixture {
            _tmp: tmp,
            base,
            source,
            headers,
            counter,
        }
    }

    /// The driver "source" packed as a module-source tarball (both
    /// flavors' trees, the same Makefile), as `fetch` downloads it.
    fn tarball(&self) -> Vec<u8> {
        let proprietary = self.source.join("modules/nvidia-kernel");
        if !proprietary.exists() {
            let st = Command::new("cp")
                .arg("-a")
                .arg(self.source.join("modules/nvidia-open-kernel"))
                .arg(&proprietary)
                .status()
                .unwrap();
            assert!(st.success());
        }
        let out = Command::new("tar")
            .arg("-C")
            .arg(&self.source)
            .args(["-czf", "-", "modules"])
            .output()
            .unwrap();
        assert!(out.status.success(), "tar failed");
        out.stdout
    }

    /// A node's host root at `<base>/<name>`: a copy of the T4 fixture
    /// (Debian 12, one T4, kernel `REL`) with this fixture's headers
    /// installed. `run` never reaches a load on it: its tests pass
    /// `--module-params` naming a file that does not exist, which install
    /// reads first, before the artifact is unpacked.
    fn node(&self, name: &str) -> PathBuf {
        let host = self.base.join(name);
        let t4 =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts/debian-12-t4-headers");
        let st = Command::new("cp")
            .arg("-a")
            .arg(&t4)
            .arg(&host)
            .status()
            .unwrap();
        assert!(st.success());
        fs::remove_dir_all(host.join(format!("usr/src/linux-headers-{REL}"))).unwrap();
        install_headers(&host);
        host
    }

    /// A node without kernel headers (as a Garden Linux node: they are in
    /// the builder image only).
    fn bare_node(&self, name: &str) -> PathBuf {
        let host = self.node(name);
        fs::remove_dir_all(host.join(format!("usr/src/linux-headers-{REL}"))).unwrap();
        host
    }

    fn compiles(&self) -> usize {
        fs::read_to_string(&self.counter)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// `build` into `<base>/<out>` with the cache.
    fn build(&self, out: &str, cache_url: &str, extra: &[&str]) -> Command {
        let mut c = bin();
        c.args(["build", "--source"])
            .arg(&self.source)
            .args([
                "--kernel",
                REL,
                "--flavor",
                "open",
                "--jobs",
                "1",
                "--headers",
            ])
            .arg(&self.headers)
            .arg("--out")
            .arg(self.base.join(out))
            .args(["--cache-url", cache_url])
            .args(extra);
        c
    }
}

/// Debian-style split headers for `REL` under `root`
/// (`usr/src/linux-headers-REL` including `usr/src/linux-headers-common`);
/// returns the release's directory.
fn install_headers(root: &Path) -> PathBuf {
    let headers = root.join(format!("usr/src/linux-headers-{REL}"));
    let common = root.join("usr/src/linux-headers-common");
    fs::create_dir_all(headers.join("include/generated")).unwrap();
    fs::create_dir_all(common.join("include/linux")).unwrap();
    fs::write(
        headers.join("Makefile"),
        format!("include {}/Makefile\n", common.display()),
    )
    .unwrap();
    fs::write(common.join("Makefile"), "# common\n").unwrap();
    fs::write(
        headers.join("include/generated/utsrelease.h"),
        format!("#define UTS_RELEASE \"{REL}\"\n"),
    )
    .unwrap();
    headers
}

// ------------------------------------------------------------ the S3 server

fn s3_server_binary() -> Option<PathBuf> {
    match std::env::var_os("GPU_DRIVER_S3_SERVER") {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "GPU_DRIVER_S3_SERVER={} does not exist",
                p.display()
            );
            Some(p)
        }
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            if !ci && std::env::var("GPU_DRIVER_SKIP_S3_TESTS").as_deref() == Ok("1") {
                eprintln!("skipped: GPU_DRIVER_SKIP_S3_TESTS=1");
                return None;
            }
            panic!(
                "the S3 tests need GPU_DRIVER_S3_SERVER, the s3s-fs binary: \
                 GPU_DRIVER_S3_SERVER=$(scripts/s3-server) (scripts/test sets it). \
                 To skip them outside CI, set GPU_DRIVER_SKIP_S3_TESTS=1."
            );
        }
    }
}

/// A real S3 server (s3s-fs) on 127.0.0.1, serving `<dir>/<bucket>/...`
/// from plain files; killed on drop.
struct S3Server {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    /// A copy of the binary that another user may run.
    _exe_dir: Option<tempfile::TempDir>,
}

impl S3Server {
    fn start() -> Option<S3Server> {
        Self::start_with(false)
    }

    /// A server that can read its bucket but not write it: every PUT
    /// fails, as with credentials that may only read. As root the server
    /// runs as nobody over a directory it may not write; otherwise the
    /// bucket directory is made read-only.
    fn start_read_only() -> Option<S3Server> {
        Self::start_with(true)
    }

    fn start_with(read_only: bool) -> Option<S3Server> {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let exe = s3_server_binary()?;
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(BUCKET)).unwrap();
        let addr = free_port();
        let mut cmd = Command::new(&exe);
        let mut exe_dir = None;
        if read_only {
            let mode = |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m));
            if nix::unistd::geteuid().is_root() {
                // nobody may not enter root's home, where the binary is.
                let d = tempfile::tempdir().unwrap();
                mode(d.path(), 0o755).unwrap();
                let copy = d.path().join("s3s-fs");
                fs::copy(&exe, &copy).unwrap();
                cmd = Command::new(&copy);
                exe_dir = Some(d);
                mode(dir.path(), 0o755).unwrap();
                mode(&dir.path().join(BUCKET), 0o755).unwrap();
                cmd.uid(65534).gid(65534);
            } else {
                mode(&dir.path().join(BUCKET), 0o555).unwrap();
            }
        }
        let child = cmd
            .args(["--host", "127.0.0.1", "--port", &addr.port().to_string()])
            .args(["--access-key", KEY_ID, "--secret-key", SECRET])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting s3s-fs");
        let mut server = S3Server {
            child,
            addr,
            dir,
            _exe_dir: exe_dir,
        };
        // Until it listens (bounded; not a timing assertion).
        for _ in 0..200 {
            if TcpStream::connect(addr).is_ok() {
                return Some(server);
            }
            if let Ok(Some(st)) = server.child.try_wait() {
                panic!("s3s-fs exited: {st}");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = server.child.kill();
        panic!("s3s-fs did not listen on {addr} within 10 s");
    }

    fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The installer's environment for this server.
    fn env(&self, c: &mut Command) {
        c.env("AWS_ENDPOINT_URL", format!("http://{}", self.addr))
            .env("AWS_ACCESS_KEY_ID", KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_REGION", "us-east-1")
            .arg("--allow-http");
    }

    /// The server's backing directory of the bucket.
    fn bucket_dir(&self) -> PathBuf {
        self.dir.path().join(BUCKET)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The one file under `dir` whose name starts with `prefix`.
fn find(dir: &Path, prefix: &str) -> PathBuf {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(p);
            }
        }
    }
    assert_eq!(
        found.len(),
        1,
        "{prefix}* under {}: {found:?}",
        dir.display()
    );
    found.remove(0)
}

fn run_s3(server: &S3Server, mut c: Command) -> Run {
    server.env(&mut c);
    finish(c.output().unwrap())
}

/// A server, a fixture and a prefix `p` holding one artifact, stored by a
/// first build (output `a`) that missed; `None` where S3 tests are skipped.
fn s3_after_a_first_miss() -> Option<(S3Server, Fixture, String)> {
    let server = S3Server::start()?;
    let fx = Fixture::new(0);
    let url = server.url("p");
    let a = run_s3(&server, fx.build("a", &url, &[]));
    assert_eq!(a.outcome(), "Miss", "{}\n{}", a.doc, a.stderr);
    Some((server, fx, url))
}

/// A `file://` store in a temporary directory, after a first build of
/// the key (a Miss that stored the entry).
fn file_store_after_a_first_miss() -> (Fixture, tempfile::TempDir, String) {
    let fx = Fixture::new(0);
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}/cache", store.path().display());
    let a = finish(fx.build("a", &url, &[]).output().unwrap());
    assert_eq!(a.outcome(), "Miss", "{}\n{}", a.doc, a.stderr);
    (fx, store, url)
}

/// Rewrites the one stored artifact with `damage` of its bytes, then
/// builds again (output `b`).
fn rebuild_after_damage(
    server: &S3Server,
    fx: &Fixture,
    url: &str,
    damage: impl FnOnce(Vec<u8>) -> Vec<u8>,
) -> Run {
    let obj = find(&server.bucket_dir(), "artifact-");
    fs::write(&obj, damage(fs::read(&obj).unwrap())).unwrap();
    run_s3(server, fx.build("b", url, &[]))
}

// ------------------------------------------------------------ S3 tests

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

// ------------------------------------------------------------ file:// store

#[test]
fn file_store_miss_hit_corrupt_and_stale_lease() {
    let fx = Fixture::new(0);
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}/cache", store.path().display());

    let a = finish(fx.build("a", &url, &[]).output().unwrap());
    assert_eq!(a.reason(), "Built", "{}\n{}", a.doc, a.stderr);
    assert_eq!(a.outcome(), "Miss", "{}", a.doc);
    assert_eq!(a.cache()["stored"], true);
    let b = finish(fx.build("b", &url, &[]).output().unwrap());
    assert_eq!(b.outcome(), "Hit", "{}\n{}", b.doc, b.stderr);
    assert_eq!(fx.compiles(), 1);

    let obj = find(store.path(), "artifact-");
    let bytes = fs::read(&obj).unwrap();
    fs::write(&obj, &bytes[..bytes.len() - 1]).unwrap();
    let c = finish(fx.build("c", &url, &[]).output().unwrap());
    assert_eq!(c.outcome(), "Corrupt", "{}\n{}", c.doc, c.stderr);
    assert_eq!(fx.compiles(), 2);
    let d = finish(fx.build("d", &url, &[]).output().unwrap());
    assert_eq!(d.outcome(), "Hit", "{}", d.doc);

    // Stale lease on the file store: taken over by delete + create.
    let manifest = find(store.path(), "manifest.json");
    fs::remove_file(&manifest).unwrap();
    fs::write(
        manifest.with_file_name("lease.json"),
        r#"{"owner":"gone/1/0","acquiredAtUnix":1,"ttlSeconds":60}"#,
    )
    .unwrap();
    let e = finish(fx.build("e", &url, &[]).output().unwrap());
    assert_eq!(e.outcome(), "Miss", "{}\n{}", e.doc, e.stderr);
    assert_eq!(
        e.cache()["lease"],
        "took over the expired lease of gone/1/0"
    );
    assert!(!manifest.with_file_name("lease.json").exists());
    assert_eq!(fx.compiles(), 3);
}

/// An entry whose manifest.json was rewritten for a forged artifact (the
/// same files, one module's bytes changed): size and sha256 agree with it,
/// so only the check of every file inside, which reads the download as it
/// streams in, can refuse it. It does, and the key is compiled again.
#[test]
fn file_store_a_forged_artifact_that_matches_its_entry_is_corrupt() {
    use std::io::Read;
    let (fx, store, url) = file_store_after_a_first_miss();

    let obj = find(store.path(), "artifact-");
    let dec = zstd::stream::read::Decoder::new(fs::File::open(&obj).unwrap()).unwrap();
    let mut archive = tar::Archive::new(dec);
    let mut out = tar::Builder::new(Vec::new());
    let mut changed = false;
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        let path = e.path().unwrap().into_owned();
        if path == Path::new("modules/nvidia.ko") {
            let mid = data.len() / 2;
            data[mid] ^= 0x55;
            changed = true;
        }
        let mut header = e.header().clone();
        out.append_data(&mut header, &path, &data[..]).unwrap();
    }
    assert!(changed, "the artifact holds no modules/nvidia.ko");
    let forged = zstd::encode_all(&out.into_inner().unwrap()[..], 3).unwrap();
    fs::write(&obj, &forged).unwrap();
    let manifest = find(store.path(), "manifest.json");
    let mut entry: Value = serde_json::from_slice(&fs::read(&manifest).unwrap()).unwrap();
    entry["artifactSha256"] = sha256(&forged).into();
    entry["artifactSizeBytes"] = forged.len().into();
    fs::write(&manifest, serde_json::to_vec(&entry).unwrap()).unwrap();

    let b = finish(fx.build("b", &url, &[]).output().unwrap());
    assert_eq!(b.outcome(), "Corrupt", "{}\n{}", b.doc, b.stderr);
    let warning = b.cache()["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("modules/nvidia.ko has sha256"),
        "{warning}"
    );
    assert_eq!(fx.compiles(), 2);
}

/// The store is not trusted to be small or sane: a 3 GiB `manifest.json`
/// (sparse, so the test costs no disk) is refused by its size, never read
/// whole; a FIFO in its place is refused, not waited on. Either way the
/// build goes on without the cache.
#[test]
fn file_store_a_huge_or_fifo_manifest_is_refused_unread() {
    let (fx, store, url) = file_store_after_a_first_miss();
    let manifest = find(store.path(), "manifest.json");
    let deadline = std::time::Duration::from_secs(300);

    fs::remove_file(&manifest).unwrap();
    fs::File::create(&manifest)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    let b = finish(run_support::output_within(
        fx.build("b", &url, &[]),
        deadline,
    ));
    assert_eq!(b.reason(), "Built", "{}\n{}", b.doc, b.stderr);
    assert_eq!(b.outcome(), "Unavailable", "{}", b.doc);
    let warnings = b.cache()["warnings"].to_string();
    assert!(warnings.contains("is over 4096 KiB; not read"), "{}", b.doc);

    fs::remove_file(&manifest).unwrap();
    nix::unistd::mkfifo(&manifest, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let c = finish(run_support::output_within(
        fx.build("c", &url, &[]),
        deadline,
    ));
    assert_eq!(c.reason(), "Built", "{}\n{}", c.doc, c.stderr);
    assert_eq!(c.outcome(), "Unavailable", "{}", c.doc);
    let warnings = c.cache()["warnings"].to_string();
    assert!(warnings.contains("is not a regular file"), "{}", c.doc);
    assert_eq!(fx.compiles(), 3);
}

#[test]
fn file_store_two_builders_racing_build_it_once() {
    let fx = Fixture::new(3);
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let children: Vec<Child> = ["a", "b"]
        .iter()
        .map(|out| {
            fx.build(out, &url, &["--cache-poll-ms", "200"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outcomes: Vec<String> = children
        .into_iter()
        .map(|c| {
            let r = finish(c.wait_with_output().unwrap());
            assert_eq!(r.reason(), "Built", "{}\n{}", r.doc, r.stderr);
            r.outcome().to_string()
        })
        .collect();
    outcomes.sort();
    assert_eq!(outcomes, ["Hit", "Miss"]);
    assert_eq!(fx.compiles(), 1);
}

#[test]
fn without_a_cache_url_the_cache_is_disabled() {
    let fx = Fixture::new(0);
    let mut c = bin();
    c.args(["build", "--source"])
        .arg(&fx.source)
        .args(["--kernel", REL, "--flavor", "open", "--headers"])
        .arg(&fx.headers)
        .arg("--out")
        .arg(fx.base.join("out"));
    let r = finish(c.output().unwrap());
    assert_eq!(r.reason(), "Built", "{}\n{}", r.doc, r.stderr);
    assert_eq!(r.outcome(), "Disabled", "{}", r.doc);
}

// ------------------------------------------------------------ package mirror

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
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("catalog/catalog.toml"))
            .unwrap();
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

// ------------------------------------------- build Jobs and install Jobs

/// `prebuild`'s target: what the T4 fixture node reports.
const TARGET: [&str; 8] = [
    "--os-id",
    "debian",
    "--os-version",
    "12",
    "--kernel-release",
    REL,
    "--arch",
    "amd64",
];

/// A web server for the fixture's driver tarball, and its sha256.
fn package_server(fx: &Fixture) -> (crate::support::http::Server, String) {
    let tarball = fx.tarball();
    let sum = sha256(&tarball);
    let server = crate::support::http::Server::start(move |_| {
        crate::support::http::Reply::Ranged(tarball.clone())
    });
    (server, sum)
}

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

/// A build Job: `prebuild` for [`TARGET`] in the fixture's base (its
/// headers are installed there, as in a builder image).
fn prebuild(fx: &Fixture, pkg: &[String], cache_url: &str, extra: &[&str]) -> Command {
    let mut c = bin();
    c.arg("--host-root")
        .arg(&fx.base)
        .arg("prebuild")
        .args(TARGET)
        .args(pkg)
        .args(["--cache-url", cache_url])
        .args(extra);
    c
}

/// An install Job: `run` on a node (see [`Fixture::node`]: install stops
/// at its missing `--module-params`, before anything is unpacked).
fn run_node(host: &Path, pkg: &[String], cache_url: &str, extra: &[&str]) -> Command {
    let mut c = bin();
    c.arg("--host-root")
        .arg(host)
        .arg("run")
        .args(pkg)
        .args(["--cache-url", cache_url, "--module-params"])
        .arg(host.join("no-such-module-params"))
        .args(extra);
    c
}

/// A step's whole document, as `run` and `prebuild` log it on stderr
/// (`<Kind>: {json}`); the last one of that kind.
fn step(r: &Run, kind: &str) -> Value {
    let marker = format!("{kind}: {{");
    let line = r
        .stderr
        .lines()
        .rfind(|l| l.contains(&marker))
        .unwrap_or_else(|| panic!("no {kind} logged:\n{}", r.stderr));
    let at = line.find(&marker).unwrap() + kind.len() + 2;
    serde_json::from_str(&line[at..]).unwrap_or_else(|e| panic!("{kind} ({e}): {line}"))
}

/// The kinds of the run's steps, in order.
fn step_kinds(r: &Run) -> Vec<String> {
    r.doc["status"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap().to_string())
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

#[test]
fn s3_a_build_job_stores_the_artifact_and_read_only_install_jobs_use_only_it() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let fx = Fixture::new(0);
    let (packages, sum) = package_server(&fx);
    let pkg = package_args(&packages, &sum);
    let url = server.url("cluster-a");
    let node = fx.node("node");

    // Before any build Job: an install Job that may not compile fails,
    // and, read-only, writes nothing (not even the package it fetched).
    let empty = snapshot(&server.bucket_dir());
    let r = run_s3(
        &server,
        run_node(&node, &pkg, &url, &["--cache-read-only", "--no-compile"]),
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
    fn only(expected: &str) -> Vec<&str> {
        vec![
            "--cache-read-only",
            "--no-compile",
            "--artifact-sha256",
            expected,
        ]
    }
    let r = run_s3(&server, run_node(&node, &pkg, &url, &only(&wrong)));
    assert_eq!(r.reason(), "ChecksumMismatch", "{}\n{}", r.doc, r.stderr);
    assert_eq!(r.code, 12);
    let msg = r.message();
    assert!(msg.contains(&wrong) && msg.contains(&sha), "{msg}");
    assert_eq!(fx.compiles(), 1);

    let r = run_s3(
        &server,
        run_node(&node, &pkg, &url, &only(&sha.to_uppercase())),
    );
    let build = step(&r, "BuildResult");
    assert_eq!(build["status"]["reason"], "Built", "{build}\n{}", r.stderr);
    assert_eq!(build["status"]["cache"]["outcome"], "Hit", "{build}");
    assert_eq!(build["status"]["artifactSha256"], sha.as_str());
    // Then install, stopped at the missing --module-params.
    assert_eq!(step_kinds(&r).last().unwrap(), "InstallResult", "{}", r.doc);
    assert_eq!(fx.compiles(), 1);

    // Allowed to compile, a node refuses the entry all the same, compiles
    // its own, and neither replaces the entry nor stores anything.
    let r = run_s3(
        &server,
        run_node(
            &node,
            &pkg,
            &url,
            &["--cache-read-only", "--artifact-sha256", &wrong],
        ),
    );
    let build = step(&r, "BuildResult");
    assert_eq!(build["status"]["reason"], "Built", "{build}\n{}", r.stderr);
    let cache = &build["status"]["cache"];
    assert_eq!(cache["outcome"], "Miss", "{build}");
    assert_eq!(cache["stored"], false, "{build}");
    assert!(
        cache["warnings"][0]
            .as_str()
            .unwrap()
            .contains("--artifact-sha256"),
        "{build}"
    );
    assert_eq!(fx.compiles(), 2);
    assert_eq!(
        snapshot(&server.bucket_dir()),
        stored,
        "a read-only run wrote"
    );
}

#[test]
fn s3_a_build_job_that_cannot_write_the_store_fails_cache_write_failed() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let fx = Fixture::new(0);
    let (packages, sum) = package_server(&fx);
    let pkg = package_args(&packages, &sum);

    // Credentials the store refuses.
    let mut c = prebuild(&fx, &pkg, &server.url("p"), &[]);
    server.env(&mut c);
    c.env("AWS_SECRET_ACCESS_KEY", "not-the-secret-key");
    let r = finish(c.output().unwrap());
    assert_eq!(r.reason(), "CacheWriteFailed", "{}\n{}", r.doc, r.stderr);
    assert_eq!(r.code, 13);
    let msg = r.message();
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
    assert_eq!(r.reason(), "CacheWriteFailed", "{}\n{}", r.doc, r.stderr);
    assert_eq!(r.code, 13);
    let msg = r.message();
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
    let build = step(&r, "BuildResult");
    assert_eq!(build["status"]["reason"], "Built", "{build}\n{}", r.stderr);
    let cache = &build["status"]["cache"];
    assert_eq!(cache["outcome"], "Miss", "{build}");
    assert_eq!(cache["stored"], false, "{build}");
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
    let Some(server) = S3Server::start() else {
        return;
    };
    let fx = Fixture::new(0);
    let (packages, sum) = package_server(&fx);
    let pkg = package_args(&packages, &sum);
    let url = server.url("cluster-b");
    let node = fx.node("node");
    fn pinned(sha: &str) -> Vec<&str> {
        vec![
            "--cache-read-only",
            "--no-compile",
            "--artifact-sha256",
            sha,
        ]
    }

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

    // Allowed to compile and missing (another digest pinned): fetched (from
    // the store's package copy, which the build Job left) and built as
    // before the lookup came first.
    let r = run_s3(
        &server,
        run_node(
            &node,
            &pkg,
            &url,
            &["--cache-read-only", "--artifact-sha256", &sha256(b"x")],
        ),
    );
    assert_eq!(
        step(&r, "FetchResult")["status"]["reason"],
        "Fetched",
        "{}",
        r.stderr
    );
    assert_eq!(step(&r, "BuildResult")["status"]["reason"], "Built");
    assert_eq!(fx.compiles(), 2);
}
