//! The artifact cache (`--cache-url`), end to end: the built installer
//! against a real S3 server on loopback (s3s-fs, installed by
//! `cargo xtask tool s3-server`) and against a `file://` store.
//!
//! The builds are real `build` runs: real headers layout, real `make`, real
//! `strip` and modinfo; only the driver's Makefile is a small one that
//! "compiles" by copying a real module (built for the test kernel) into
//! place, and counts its compiles in a file. So "compile once" is counted,
//! not inferred from timings.
//!
//! Needs the tools file's `s3Server` (the s3s-fs binary, from
//! `cargo xtask tool s3-server`). Without it the S3 tests fail, saying how to get
//! it, unless its `skip` holds "s3"; in CI (`CI=true`) they always fail.

use crate::support::tools;

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
    let mut c = Command::new(crate::support::bin::installer());
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

mod file_store;
mod jobs;
mod mirror;
mod s3;

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

        let ko = crate::support::repo_root()
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
        let t4 = crate::support::repo_root().join("tests/fixtures/hosts/debian-12-t4-headers");
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

fn s3_server_binary() -> Option<PathBuf> {
    let tools = tools::tools();
    match tools.s3_server() {
        Some(p) => {
            assert!(p.is_file(), "s3Server {} does not exist", p.display());
            Some(p)
        }
        None => {
            if tools.skipped(tools::Group::S3) {
                eprintln!("skipped: the tools file's skip holds \"s3\"");
                return None;
            }
            tools::missing(
                "s3Server",
                "the s3s-fs binary `cargo xtask tool s3-server` prints; to skip the S3 tests outside CI, \
                 put \"s3\" in its skip",
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
