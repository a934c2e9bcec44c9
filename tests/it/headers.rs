//! Kernel headers from apt packages, against Debian's real bookworm
//! `linux-headers-<abi>-cloud-amd64`, `linux-headers-<abi>-common` and
//! `linux-kbuild-6.1` .debs in a local apt repository that
//! `scripts/fetch-test-data` builds (`GPU_DRIVER_TEST_DATA/apt-bookworm`),
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

const SUITE: &str = "bookworm";
const INDEX_DIR: &str = "dists/bookworm/main/binary-amd64";

// ---------------------------------------------------------------- helpers

fn test_data() -> PathBuf {
    let dir = std::env::var_os("GPU_DRIVER_TEST_DATA").unwrap_or_else(|| {
        panic!(
            "GPU_DRIVER_TEST_DATA is not set: run `scripts/test`, or \
             `export GPU_DRIVER_TEST_DATA=$(scripts/fetch-test-data)` before `cargo test`"
        )
    });
    let dir = PathBuf::from(dir);
    assert!(
        dir.join("apt-bookworm/dists/bookworm/Release").is_file(),
        "{} has no apt-bookworm repository: run scripts/fetch-test-data (it needs dpkg-dev) \
         and point GPU_DRIVER_TEST_DATA at the directory it prints",
        dir.display()
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
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kmod-hello");
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

// ---------------------------------------------------------------- tests

#[test]
fn real_headers_are_found_verified_and_unpacked() {
    let (server, repo) = Repo::real().serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    let tree = fetch_headers_from(
        &signed_source(&server.url(""), SUITE),
        &repo.release,
        &options(cache.path()),
        &root,
    )
    .unwrap();
    assert_eq!(tree.release, repo.release);
    assert_eq!(tree.root, root);
    assert_usable_tree(&tree);

    // The headers, its -common and linux-kbuild; not the compiler package
    // it also depends on.
    let names: Vec<&str> = tree.packages.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(names[0], format!("linux-headers-{}", repo.release));
    assert!(names.iter().any(|n| n.ends_with("-common")), "{names:?}");
    assert!(names.contains(&"linux-kbuild-6.1"), "{names:?}");
    for p in &tree.packages {
        let file = repo.deb(&format!("{}_", p.name));
        assert_eq!(p.sha256, sha256_hex(&repo.read(&file)), "{}", p.name);
        assert!(file.contains(&p.version), "{file} {}", p.version);
    }
    let log = requested(&server);
    assert_eq!(log[0], "/dists/bookworm/InRelease", "{log:?}");
    assert!(
        log.contains(&format!("/{INDEX_DIR}/Packages.xz")),
        "{log:?}"
    );
    assert!(!log.iter().any(|p| p.contains("compiler")), "{log:?}");

    // Each .deb is in the package cache, verified: an offline fetch of
    // its sha256 is a cache hit (a second headers run downloads no .deb).
    for p in &tree.packages {
        let mut opts = options(cache.path());
        opts.offline = true;
        let req = FetchRequest {
            urls: Vec::new(),
            sha256: p.sha256.clone(),
        };
        let hit = gpu_driver_installer::fetch::fetch(&opts, &req).unwrap();
        assert!(hit.cache_hit, "{}", p.name);
    }

    // A non-empty scratch root is refused, the existing tree untouched.
    let err = fetch_headers_from(
        &signed_source(&server.url(""), SUITE),
        &repo.release,
        &options(cache.path()),
        &root,
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::Internal, "{err}");
    assert!(tree.arch_dir.join("Makefile").is_file());
}

#[test]
fn unpacked_headers_build_a_kernel_module() {
    // Debian's headers build with the kernel's own compiler: bookworm's
    // .kernelvariables sets CC = gcc-12 (Debian 12's gcc).
    require_tool("gcc-12");
    require_tool("make");
    let (server, repo) = Repo::real().serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    // The tree is built in one place and used from another: nothing in it
    // may depend on where it was unpacked.
    let tree = fetch_headers_from(
        &signed_source(&server.url(""), SUITE),
        &repo.release,
        &options(cache.path()),
        &scratch.path().join("unpacked"),
    )
    .unwrap();
    let moved = scratch.path().join("moved");
    fs::rename(&tree.root, &moved).unwrap();
    let arch = moved.join(tree.arch_dir.strip_prefix(&tree.root).unwrap());
    let common = moved.join(tree.common_dir.strip_prefix(&tree.root).unwrap());

    // The usual external-module build: make -C <arch dir>.
    let m = build_hello(&["-C".into(), arch.display().to_string()]);
    assert!(
        m.join("hello.ko").is_file(),
        "no hello.ko in {}",
        m.display()
    );
    let modinfo = fs::read(m.join("hello.ko")).unwrap();
    let vermagic = format!("vermagic={} ", repo.release);
    assert!(
        modinfo
            .windows(vermagic.len())
            .any(|w| w == vermagic.as_bytes()),
        "hello.ko lacks {vermagic:?}"
    );
    fs::remove_dir_all(&m).unwrap();

    // NVIDIA's way: sources from the common dir, output from the arch dir
    // (SYSSRC/SYSOUT become make -C <src> O=<out>).
    let m = build_hello(&[
        "-C".into(),
        common.display().to_string(),
        format!("O={}", arch.display()),
    ]);
    assert!(
        m.join("hello.ko").is_file(),
        "no hello.ko in {}",
        m.display()
    );
    fs::remove_dir_all(&m).unwrap();
}

#[test]
fn a_tampered_deb_is_a_checksum_mismatch() {
    let mut repo = Repo::real();
    let path = repo.deb("linux-kbuild-");
    let mut bytes = repo.read(&path);
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    repo.overrides.insert(path.clone(), bytes);
    let Refused {
        err,
        cache,
        scratch,
        root,
    } = refused_headers(repo);
    assert_eq!(err.reason, Reason::ChecksumMismatch, "{err}");
    assert!(err.to_string().contains("linux-kbuild-6.1"), "{err}");
    // Nothing half-done: no scratch root, and the bad bytes are not cached.
    assert!(!root.exists());
    assert_eq!(fs::read_dir(scratch.path()).unwrap().count(), 0);
    for e in fs::read_dir(cache.path()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".partial"), "{name}");
    }
}

#[test]
fn a_missing_package_is_kernel_headers_not_found() {
    let (server, _repo) = Repo::real().serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let url = server.url("");
    let err = fetch_headers_from(
        &signed_source(&url, SUITE),
        "6.1.0-999-cloud-amd64",
        &options(cache.path()),
        &scratch.path().join("root"),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::KernelHeadersNotFound, "{err}");
    for needle in [
        "linux-headers-6.1.0-999-cloud-amd64",
        url.as_str(),
        "suite bookworm",
        "install linux-headers",
    ] {
        assert!(err.to_string().contains(needle), "{needle:?} not in: {err}");
    }
    // Only the index was read.
    assert!(
        !requested(&server).iter().any(|p| p.ends_with(".deb")),
        "{:?}",
        requested(&server)
    );

    // A suite the repository does not have.
    let err = fetch_headers_from(
        &signed_source(&url, "1592.4"),
        "6.1.0-50-cloud-amd64",
        &options(cache.path()),
        &scratch.path().join("root"),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::KernelHeadersNotFound, "{err}");
    assert!(err.to_string().contains("no suite 1592.4"), "{err}");
}

#[test]
fn release_without_inrelease_and_index_fallback_to_gz() {
    let mut repo = Repo::real();
    let packages = repo.packages_text();
    repo.reindex(&packages, &["Packages.gz"]);
    let release = repo.release.clone();
    let (server, _repo) = repo.serve();
    let cache = tempfile::tempdir().unwrap();
    // A trailing slash on the repository URL is fine.
    let source = signed_source(&server.url("/"), SUITE);
    let index = apt::read_index(&source, &options(cache.path()), &mut |_: &str| true).unwrap();
    assert_eq!(index.release_url, server.url("/dists/bookworm/Release"));
    assert_eq!(
        index.index_urls,
        [server.url(&format!("/{INDEX_DIR}/Packages.gz"))]
    );
    assert_eq!(index.packages.len(), 3);
    let headers = index
        .best(&format!("linux-headers-{release}"), None)
        .unwrap();
    assert_eq!(headers.depends.len(), 3);
    let log = requested(&server);
    assert_eq!(
        log,
        [
            "/dists/bookworm/InRelease".to_string(),
            "/dists/bookworm/Release".to_string(),
            "/dists/bookworm/Release.gpg".to_string(),
            format!("/{INDEX_DIR}/Packages.gz"),
        ]
    );
}

#[test]
fn index_prefers_xz_and_falls_back_when_it_cannot_be_fetched() {
    let mut repo = Repo::real();
    let packages = repo.packages_text();
    repo.reindex(&packages, &["Packages.xz", "Packages.gz", "Packages"]);
    // Listed in the Release but not served (a mirror mid-sync).
    repo.overrides.remove(&format!("{INDEX_DIR}/Packages.xz"));
    repo.missing.push(format!("{INDEX_DIR}/Packages.xz"));
    let (server, _repo) = repo.serve();
    let cache = tempfile::tempdir().unwrap();
    let source = signed_source(&server.url(""), SUITE);
    let index = apt::read_index(&source, &options(cache.path()), &mut |_: &str| true).unwrap();
    assert_eq!(
        index.index_urls,
        [server.url(&format!("/{INDEX_DIR}/Packages.gz"))]
    );
    assert_eq!(index.packages.len(), 3);

    // An index whose bytes differ from the Release's sha256 is not used.
    let mut repo = Repo::real();
    repo.reindex(&packages, &["Packages"]);
    repo.overrides.insert(
        format!("{INDEX_DIR}/Packages"),
        packages
            .replace("linux-kbuild-6.1", "linux-kbuild-6.2")
            .into_bytes(),
    );
    let (server, _repo) = repo.serve();
    let source = signed_source(&server.url(""), SUITE);
    let err = apt::read_index(&source, &options(cache.path()), &mut |_: &str| true).unwrap_err();
    assert_eq!(err.reason, Reason::ChecksumMismatch, "{err}");
}

#[test]
fn a_malformed_deb_is_archive_invalid() {
    // The repository is consistent (the index has the broken file's
    // sha256), but the .deb itself is cut short: not a download problem.
    let mut repo = Repo::real();
    let path = repo.deb("linux-kbuild-");
    let good = repo.read(&path);
    let cut = good[..good.len() / 2].to_vec();
    let packages = repo.packages_text().replace(
        &format!("SHA256: {}", sha256_hex(&good)),
        &format!("SHA256: {}", sha256_hex(&cut)),
    );
    let packages = packages.replace(
        &format!("Size: {}\n", good.len()),
        &format!("Size: {}\n", cut.len()),
    );
    repo.reindex(&packages, &["Packages.xz"]);
    repo.overrides.insert(path, cut);
    let Refused {
        err,
        cache: _,
        scratch,
        root,
    } = refused_headers(repo);
    assert_eq!(err.reason, Reason::ArchiveInvalid, "{err}");
    assert!(err.to_string().contains("linux-kbuild-6.1"), "{err}");
    assert!(!root.exists());
    assert_eq!(fs::read_dir(scratch.path()).unwrap().count(), 0);
}

#[test]
fn deb_reader_refuses_malformed_ar_archives() {
    let repo = Repo::real();
    let good = repo.read(&repo.deb("linux-headers-"));
    assert!(good.starts_with(b"!<arch>\ndebian-binary"));
    let work = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not ar", b"PK\x03\x04 not an ar archive at all".to_vec()),
        ("magic only", b"!<arch>\n".to_vec()),
        ("cut in a header", good[..8 + 30].to_vec()),
        ("cut in the data member", good[..good.len() - 1000].to_vec()),
        ("bad header terminator", {
            let mut b = good.clone();
            b[8 + 58] = b'X';
            b
        }),
        ("wrong first member", {
            let mut b = good.clone();
            b[8..8 + 13].copy_from_slice(b"control-xxxxx");
            b
        }),
        ("bad size", {
            let mut b = good.clone();
            b[8 + 48..8 + 50].copy_from_slice(b"zz");
            b
        }),
        ("format 3.0", {
            let mut b = good.clone();
            b[8 + 60] = b'3';
            b
        }),
    ];
    for (what, bytes) in cases {
        let deb = work.path().join("x.deb");
        fs::write(&deb, &bytes).unwrap();
        let root = work.path().join(what.replace(' ', "-"));
        fs::create_dir(&root).unwrap();
        let err = gpu_driver_installer::deb::unpack_data(&deb, &root).unwrap_err();
        assert_eq!(err.reason, Reason::ArchiveInvalid, "{what}: {err}");
        assert!(err.to_string().contains("x.deb"), "{what}: {err}");
    }

    // The real one unpacks, and its absolute symlinks stay inside.
    let deb = work.path().join("good.deb");
    fs::write(&deb, &good).unwrap();
    let root = work.path().join("good");
    fs::create_dir(&root).unwrap();
    let report = gpu_driver_installer::deb::unpack_data(&deb, &root).unwrap();
    assert_eq!(report.data_member, "data.tar.xz");
    let build = root.join(format!("lib/modules/{}/build", repo.release));
    assert_eq!(
        fs::read_link(&build).unwrap(),
        Path::new(&format!("../../../usr/src/linux-headers-{}", repo.release))
    );
}

// ------------------------------------------------------------- signatures

/// Reads the index of `repo` with `source`'s keyring; the error.
fn index_error(
    repo: Repo,
    source: impl Fn(&str) -> AptSource,
) -> (gpu_driver_installer::Error, Server) {
    let (server, _repo) = repo.serve();
    let cache = tempfile::tempdir().unwrap();
    let err = apt::read_index(
        &source(&server.url("")),
        &options(cache.path()),
        &mut |_: &str| true,
    )
    .unwrap_err();
    (err, server)
}

fn assert_nothing_but_the_release_read(server: &Server) {
    let log = requested(server);
    assert!(
        log.iter()
            .all(|p| p.starts_with("/dists/bookworm/") && !p.contains("Packages")),
        "{log:?}"
    );
}

/// A repository that drips its InRelease one byte every 50 ms (each read
/// well inside the read timeout) meets the download deadline
/// (`--download-timeout`, 2 s here) instead of holding the fetch for as
/// long as the file takes.
#[test]
fn a_dripping_release_meets_the_download_deadline() {
    let mut repo = Repo::real();
    repo.drip.push("dists/bookworm/InRelease".into());
    let release = repo.release.clone();
    let (server, _repo) = repo.serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path());
    opts.timeouts.total = Duration::from_secs(2);
    let err = fetch_headers_from(
        &signed_source(&server.url(""), SUITE),
        &release,
        &opts,
        &scratch.path().join("root"),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::DownloadFailed, "{err}");
    assert!(
        err.to_string()
            .contains("the download deadline of 2 s passed"),
        "{err}"
    );
}

#[test]
fn a_tampered_inrelease_is_signature_invalid() {
    // One byte of the Release text changed, the test key's signature kept.
    let mut repo = Repo::real();
    let signed = String::from_utf8(repo.overrides["dists/bookworm/InRelease"].clone()).unwrap();
    let sum = signed
        .lines()
        .find(|l| l.ends_with("main/binary-amd64/Packages.xz"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let mut evil = sum.clone().into_bytes();
    evil[0] = if evil[0] == b'0' { b'1' } else { b'0' };
    let tampered = signed.replacen(&sum, std::str::from_utf8(&evil).unwrap(), 1);
    assert_ne!(tampered, signed);
    repo.overrides
        .insert("dists/bookworm/InRelease".into(), tampered.into_bytes());
    let (err, server) = index_error(repo, |u| signed_source(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    for needle in [
        server.url("/dists/bookworm/InRelease").as_str(),
        "suite bookworm",
        TEST_FP,
        "does not verify",
        "changed after signing",
    ] {
        assert!(err.to_string().contains(needle), "{needle:?} not in: {err}");
    }
    assert_nothing_but_the_release_read(&server);
}

#[test]
fn an_inrelease_by_an_unknown_key_is_signature_invalid() {
    let mut repo = Repo::real();
    let text = String::from_utf8(repo.read("dists/bookworm/Release")).unwrap();
    repo.overrides.insert(
        "dists/bookworm/InRelease".into(),
        aptsign::clearsign_unknown(&text),
    );
    let (err, server) = index_error(repo, |u| signed_source(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    for needle in [
        server.url("").as_str(),
        "suite bookworm",
        UNKNOWN_FP,
        "--apt-keyring",
        TEST_FP,
    ] {
        assert!(err.to_string().contains(needle), "{needle:?} not in: {err}");
    }
    assert_nothing_but_the_release_read(&server);
}

#[test]
fn the_shipped_keyring_does_not_trust_the_test_repository() {
    // Without a keyring of its own, a repository outside Garden Linux is
    // checked against Debian's archive keys: the test key is not one.
    let (err, _server) = index_error(Repo::real(), |u| AptSource::new(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    assert!(
        err.to_string().contains("Debian's archive keyring"),
        "{err}"
    );
    assert!(err.to_string().contains(TEST_FP), "{err}");
    // fetch_headers (no keyring given) goes the same way.
    let (server, repo) = Repo::real().serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let err = fetch_headers(
        &server.url(""),
        SUITE,
        &repo.release,
        &options(cache.path()),
        &scratch.path().join("root"),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
}

#[test]
fn a_release_without_release_gpg_is_refused() {
    let mut repo = Repo::real();
    let packages = repo.packages_text();
    repo.reindex(&packages, &["Packages.xz"]);
    repo.overrides.remove("dists/bookworm/Release.gpg");
    repo.missing.push("dists/bookworm/Release.gpg".into());
    let (err, server) = index_error(repo, |u| signed_source(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    assert!(err.to_string().contains("not signed"), "{err}");
    assert!(err.to_string().contains("Release.gpg"), "{err}");
    assert_nothing_but_the_release_read(&server);

    // A Release.gpg for other bytes (the Release changed after signing).
    let mut repo = Repo::real();
    repo.reindex(&packages, &["Packages.xz"]);
    let release = repo.overrides["dists/bookworm/Release"].clone();
    let other = String::from_utf8(release)
        .unwrap()
        .replacen("Origin: test", "Origin: tesT", 1);
    repo.overrides
        .insert("dists/bookworm/Release".into(), other.into_bytes());
    let (err, _server) = index_error(repo, |u| signed_source(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    assert!(err.to_string().contains("Release.gpg"), "{err}");
}

#[test]
fn a_real_debian_inrelease_verifies_with_the_shipped_keyring() {
    // Captured from deb.debian.org (bookworm, signed by the bookworm and
    // trixie archive keys and the bookworm release key), served on
    // loopback; the shipped keyring is the default.
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/apt/debian-bookworm-InRelease");
    let inrelease = fs::read(&fixture).unwrap();
    let server = Server::start(move |req| {
        if req.path() == "/debian/dists/bookworm/InRelease" {
            Reply::Full(200, vec![], inrelease.clone())
        } else {
            Reply::Full(404, vec![], b"not found".to_vec())
        }
    });
    let cache = tempfile::tempdir().unwrap();
    let source = AptSource::new(&server.url("/debian"), "bookworm");
    let (url, release) = apt::fetch_release(&source, &options(cache.path())).unwrap();
    assert_eq!(url, server.url("/debian/dists/bookworm/InRelease"));
    assert_eq!(release.codename.as_deref(), Some("bookworm"));
    assert!(release.file("main/binary-amd64/Packages.xz").is_some());

    // The same file with a keyring that lacks Debian's keys is refused,
    // naming the keys that did sign it.
    let err = apt::fetch_release(
        &source.clone().with_keyring(Some(aptsign::test_keyring())),
        &options(cache.path()),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    for fp in [
        "4CB50190207B4758A3F73A796ED0E7B82643E131",
        "B8E5F13176D2A7A75220028078DBA3BC47EF2265",
        "4D64FEC119C2029067D6E791F8D2585B8783D481",
    ] {
        assert!(err.to_string().contains(fp), "{fp} not in: {err}");
    }
}
