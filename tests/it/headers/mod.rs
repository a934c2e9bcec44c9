//! Kernel headers from apt packages, against Debian's real bookworm
//! `linux-headers-<abi>-cloud-amd64`, `linux-headers-<abi>-common` and
//! `linux-kbuild-6.1` .debs in a local apt repository that
//! `scripts/fetch-test-data` builds (`apt-bookworm` in the tools file's `testData`),
//! served by a real HTTP server on loopback. Faults (a tampered .deb, a
//! missing InRelease, an index listing only `.gz`, a broken .deb) are made
//! by serving changed bytes or a regenerated index; nothing is mocked.
//!
//! Garden Linux's repository has the same layout (`dists/<version>/main`)
//! and goes through the same code; it is not reachable from here.
//!
//! The kbuild test compiles a module and needs `gcc` and `make`.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::support::aptsign::{self, TEST_FP, UNKNOWN_FP};
use crate::support::http::{Reply, Server, sha256_hex};
use gpu_driver_installer::Reason;
use gpu_driver_installer::apt::{self, AptSource};
use gpu_driver_installer::fetch::{FetchPolicy, FetchRequest, RetryPolicy, Timeouts};
use gpu_driver_installer::headers::{HeadersTree, fetch_headers, fetch_headers_from};

mod packages;
mod signatures;

const SUITE: &str = "bookworm";
const INDEX_DIR: &str = "dists/bookworm/main/binary-amd64";

fn test_data() -> PathBuf {
    let dir = crate::support::tools::test_data();
    assert!(
        dir.join("apt-bookworm/dists/bookworm/Release").is_file(),
        "{} has no apt-bookworm repository: run scripts/fetch-test-data (it needs dpkg-dev); {}",
        dir.display(),
        crate::support::tools::HOW
    );
    dir
}

/// The repository at `url`, its Release checked against the test key (the
/// test repositories are signed with it, see [`Repo::real`]).
fn signed_source(url: &str, suite: &str) -> AptSource {
    AptSource::new(url, suite).with_keyring(Some(aptsign::test_keyring()))
}

/// The real repository on disk, plus per-test changes: paths answered with
/// other bytes, or with 404.
struct Repo {
    dir: PathBuf,
    release: String,
    overrides: HashMap<String, Vec<u8>>,
    missing: Vec<String>,
    /// Paths served one byte every 50 ms.
    drip: Vec<String>,
}

impl Repo {
    fn real() -> Repo {
        let data = test_data();
        let release = fs::read_to_string(data.join("kernel-release"))
            .unwrap()
            .trim()
            .to_string();
        let dir = data.join("apt-bookworm");
        // scripts/fetch-test-data signs with a throwaway key; re-signed here
        // with the committed test key the tests trust.
        let text = fs::read_to_string(dir.join("dists/bookworm/Release")).unwrap();
        let mut overrides = HashMap::new();
        overrides.insert("dists/bookworm/InRelease".into(), aptsign::clearsign(&text));
        Repo {
            dir,
            release,
            overrides,
            missing: Vec::new(),
            drip: Vec::new(),
        }
    }

    fn read(&self, path: &str) -> Vec<u8> {
        fs::read(self.dir.join(path)).unwrap()
    }

    /// Repository path of the .deb whose name starts with `prefix`.
    fn deb(&self, prefix: &str) -> String {
        let pool = self.dir.join("pool/main/l/linux");
        let name = fs::read_dir(&pool)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with(prefix) && n.ends_with(".deb"))
            .unwrap_or_else(|| panic!("no {prefix}*.deb in {}", pool.display()));
        format!("pool/main/l/linux/{name}")
    }

    /// Replaces the index with `packages` (a Packages text) published as the
    /// given index files, and a Release listing exactly those; served as
    /// Release with a detached Release.gpg (no InRelease), as older
    /// repositories are signed.
    fn reindex(&mut self, packages: &str, names: &[&str]) {
        let mut release = format!(
            "Origin: test\nSuite: {SUITE}\nCodename: {SUITE}\nComponents: main\nArchitectures: amd64\nSHA256:\n"
        );
        for name in names {
            let bytes = match *name {
                "Packages" => packages.as_bytes().to_vec(),
                "Packages.gz" => {
                    let mut e =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                    e.write_all(packages.as_bytes()).unwrap();
                    e.finish().unwrap()
                }
                "Packages.xz" => {
                    let mut e = liblzma::write::XzEncoder::new(Vec::new(), 6);
                    e.write_all(packages.as_bytes()).unwrap();
                    e.finish().unwrap()
                }
                other => panic!("{other}"),
            };
            release.push_str(&format!(
                " {} {} main/binary-amd64/{name}\n",
                sha256_hex(&bytes),
                bytes.len()
            ));
            self.overrides.insert(format!("{INDEX_DIR}/{name}"), bytes);
        }
        for name in ["Packages", "Packages.gz", "Packages.xz"] {
            if !names.contains(&name) {
                self.missing.push(format!("{INDEX_DIR}/{name}"));
            }
        }
        self.overrides.insert(
            "dists/bookworm/Release.gpg".into(),
            aptsign::detach_sign(release.as_bytes()),
        );
        self.overrides
            .insert("dists/bookworm/Release".into(), release.into_bytes());
        self.overrides.remove("dists/bookworm/InRelease");
        self.missing.push("dists/bookworm/InRelease".into());
    }

    fn packages_text(&self) -> String {
        String::from_utf8(self.read(&format!("{INDEX_DIR}/Packages"))).unwrap()
    }

    /// Serves the repository over HTTP on loopback.
    fn serve(self) -> (Server, Arc<Repo>) {
        let repo = Arc::new(self);
        let r = repo.clone();
        let server = Server::start(move |req| {
            let path = req.path().trim_start_matches('/').to_string();
            if path.split('/').any(|c| c == ".." || c.is_empty()) || r.missing.contains(&path) {
                return Reply::Full(404, vec![], b"not found".to_vec());
            }
            if r.drip.contains(&path) {
                let body = r
                    .overrides
                    .get(&path)
                    .cloned()
                    .unwrap_or_else(|| r.read(&path));
                return Reply::Drip { body, every_ms: 50 };
            }
            if let Some(body) = r.overrides.get(&path) {
                return Reply::Ranged(body.clone());
            }
            match fs::read(r.dir.join(&path)) {
                Ok(body) => Reply::Ranged(body),
                Err(_) => Reply::Full(404, vec![], b"not found".to_vec()),
            }
        });
        (server, repo)
    }
}

fn options(cache: &Path) -> FetchPolicy {
    FetchPolicy {
        cache_dir: cache.to_path_buf(),
        offline: false,
        allow_http: true,
        retry: RetryPolicy {
            retries: 1,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(10),
        },
        timeouts: Timeouts::default(),
        ca_bundle: None,
        progress_bar: false,
    }
}

/// A headers fetch of the repository's release, served on loopback, that
/// must fail: its error, its package cache and the scratch directory its
/// root (`<scratch>/root`) was to be unpacked in.
struct Refused {
    err: gpu_driver_installer::Error,
    cache: tempfile::TempDir,
    scratch: tempfile::TempDir,
    root: PathBuf,
}

fn refused_headers(repo: Repo) -> Refused {
    let release = repo.release.clone();
    let (server, _repo) = repo.serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    let err = fetch_headers_from(
        &signed_source(&server.url(""), SUITE),
        &release,
        &options(cache.path()),
        &root,
    )
    .unwrap_err();
    Refused {
        err,
        cache,
        scratch,
        root,
    }
}

fn requested(server: &Server) -> Vec<String> {
    server.log().iter().map(|r| r.path().to_string()).collect()
}

fn assert_usable_tree(tree: &HeadersTree) {
    let arch = &tree.arch_dir;
    assert_eq!(
        arch,
        &tree
            .root
            .join(format!("usr/src/linux-headers-{}", tree.release))
    );
    assert!(arch.join("Makefile").is_file(), "{}", arch.display());
    assert!(tree.common_dir.join("Makefile").is_file());
    assert!(
        tree.common_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with("-common"),
        "{}",
        tree.common_dir.display()
    );
    assert!(arch.join(".config").is_file());
    assert!(arch.join("include/config/auto.conf").is_file());
    assert!(arch.join("Module.symvers").is_file());
    // scripts/ and tools/ are links into linux-kbuild; they must lead there.
    assert!(arch.join("scripts/Makefile.build").is_file());
    assert!(arch.join("scripts/basic/fixdep").is_file());
    assert!(arch.join("scripts/mod/modpost").is_file());
    assert!(tree.common_dir.join("scripts/Makefile.build").is_file());
    assert!(tree.common_dir.join("include/linux/module.h").is_file());
    // The absolute /lib/modules/<rel>/build link now leads inside the root.
    let build = tree
        .root
        .join(format!("lib/modules/{}/build", tree.release));
    let target = fs::read_link(&build).unwrap();
    assert!(target.is_relative(), "{}", target.display());
    assert_eq!(
        fs::canonicalize(&build).unwrap(),
        fs::canonicalize(arch).unwrap()
    );
    // And no symlink anywhere points outside it.
    for entry in walk(&tree.root) {
        if entry.is_symlink() {
            let t = fs::read_link(&entry).unwrap();
            assert!(t.is_relative(), "{} -> {}", entry.display(), t.display());
        }
    }
    // The arch Makefile no longer includes the host's /usr/src.
    let makefile = fs::read_to_string(arch.join("Makefile")).unwrap();
    assert!(
        !makefile
            .lines()
            .any(|l| l.trim_start().starts_with("include /")),
        "{makefile}"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                pending.push(e.path());
            }
            out.push(e.path());
        }
    }
    out
}

fn require_tool(tool: &str) {
    crate::support::tools::require_tool(
        tool,
        "the kbuild test compiles a kernel module against bookworm's headers and needs \
         gcc-12 and make (on Debian 12: `apt-get install gcc make libc6-dev`, or run `bash .ci/run`)",
    );
}

/// Copies tests/fixtures/kmod-hello and builds it with `make ARGS modules`.
fn build_hello(args: &[String]) -> PathBuf {
    let fixture = crate::support::repo_root().join("tests/fixtures/kmod-hello");
    let work = tempfile::tempdir().unwrap().keep();
    for f in ["Kbuild", "hello.c"] {
        fs::copy(fixture.join(f), work.join(f)).unwrap();
    }
    let out = Command::new("make")
        .args(args)
        .arg(format!("M={}", work.display()))
        .arg("modules")
        .output()
        .expect("running make");
    assert!(
        out.status.success(),
        "make {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    work
}
