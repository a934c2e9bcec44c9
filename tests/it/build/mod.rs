//! `gpu-driver-installer build`, end to end.
//!
//! Fast tests run the built binary into preflight failures (no compiler
//! needed). The compile tests build NVIDIA's modules for real: the static
//! binary runs inside a chroot of a Debian builder root (headers, gcc, make
//! and Debian's `nvidia-*-kernel-source` tarballs installed) with `/proc`
//! mounted in a private mount namespace. They take minutes and need:
//!
//! - the tools file's `builderRoots`: a directory holding `bookworm/`,
//!   `trixie/` and `bookworm-arm64/` roots (`scripts/builder-root`; see
//!   `docs/build.md`);
//! - its `staticBin`: the static binary (`cargo xtask static-build`);
//! - root (chroot, mount namespaces) and `unshare` (util-linux).
//!
//! The test runner writes both. Without the roots the compile tests fail,
//! saying how to create them, unless the file's `skip` holds "compile". They only write under `<root>/build-dev/`.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::support::host as host_support;
use crate::support::tools;
use gpu_driver_installer::node::CpuArch;
use serde_json::Value;
use sha2::{Digest, Sha256};

mod signing;

fn bin() -> Command {
    let mut c = Command::new(crate::support::bin::installer());
    c.args(["--termination-log", "/nonexistent/termination-log"]);
    c.env_remove("RUST_LOG");
    c
}

use crate::support::run as run_support;
use run_support::{Run, finish};

mod preflight;

fn reason(r: &Run) -> &str {
    r.doc["status"]["reason"].as_str().unwrap_or("")
}

fn message(r: &Run) -> &str {
    r.doc["status"]["message"].as_str().unwrap_or("")
}

/// Debian-style split headers for `uts` in `<base>/usr/src`.
fn headers(base: &Path, dir_release: &str, uts: &str) -> PathBuf {
    crate::support::kernel_headers::debian_split(base, dir_release, uts)
}

const REL: &str = "6.1.0-50-cloud-amd64";

/// `build` (see [`build_args`]) with no global flags.
fn run_build(source: &str, out: &str, extra: &[&str]) -> Run {
    finish(bin().args(build_args(source, out, extra)).output().unwrap())
}

fn build_args<'a>(source: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "build", "--source", source, "--kernel", REL, "--flavor", "open", "--out", out,
    ];
    a.extend_from_slice(extra);
    a
}

/// One compile at a time: they share the builder roots and two CPUs.
static COMPILE: Mutex<()> = Mutex::new(());

const HOW_TO_CREATE_ROOTS: &str = "\
compile tests need the tools file's `builderRoots`: a directory with Debian builder roots `bookworm/`, \
`trixie/` and `bookworm-arm64/`. Create each as root with
  scripts/builder-root --link DIR SUITE
(SUITE = bookworm, trixie, bookworm-arm64; see docs/build.md for what each holds). `cargo xtask test` \
(or `scripts/test`) makes them and names them in GPU_DRIVER_TOOLS. To skip these tests on purpose, \
put \"compile\" in the tools file's `skip`.";

/// The builder roots, or `None` when skipping was asked for explicitly.
fn builder_root(suite: &str) -> Option<PathBuf> {
    let tools = tools::tools();
    let roots = match tools.builder_roots() {
        Some(r) => r,
        None => {
            // Honoured in CI too, as it always was for the compile tests.
            if tools.skip_asked(tools::Group::Compile) {
                eprintln!("skipped: the tools file's skip holds \"compile\"");
                return None;
            }
            panic!("{HOW_TO_CREATE_ROOTS}");
        }
    };
    let root = roots.join(suite);
    assert!(
        root.join("usr/bin/make").exists(),
        "{} is not a builder root (no usr/bin/make). {HOW_TO_CREATE_ROOTS}",
        root.display()
    );
    Some(root)
}

fn static_bin() -> PathBuf {
    match tools::tools().static_bin() {
        Some(p) if p.is_file() => p,
        _ => tools::missing(
            "staticBin",
            "the static installer for the chroot, from `cargo xtask static-build`",
        ),
    }
}

/// The release of the root's installed cloud-kernel headers, from their
/// `UTS_RELEASE` (the roots follow Debian's current kernel ABI).
fn root_kernel_release(root: &Path) -> String {
    let mut found = Vec::new();
    for e in fs::read_dir(root.join("usr/src")).unwrap() {
        let p = e.unwrap().path();
        let uts = p.join("include/generated/utsrelease.h");
        if let Ok(t) = fs::read_to_string(&uts) {
            if let Some(r) = gpu_driver_installer::headers::parse_uts_release(&t) {
                found.push(r);
            }
        }
    }
    assert_eq!(
        found.len(),
        1,
        "expected one headers tree in {}: {found:?}",
        root.display()
    );
    found.remove(0)
}

/// A job directory under `<root>/build-dev/`, the only place the tests
/// write in a root.
struct Job {
    root: PathBuf,
    rel: String,
}

impl Job {
    fn new(root: &Path, name: &str) -> Job {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let rel = format!("build-dev/test-{name}-{}-{nanos}", std::process::id());
        fs::create_dir_all(root.join(&rel)).unwrap();
        Job {
            root: root.to_path_buf(),
            rel,
        }
    }

    /// Path inside the chroot.
    fn inner(&self, p: &str) -> String {
        format!("/{}/{p}", self.rel)
    }

    /// The same path seen from outside.
    fn outer(&self, inner: &str) -> PathBuf {
        self.root.join(inner.trim_start_matches('/'))
    }

    /// Runs the static installer in the chroot, `/proc` mounted in a
    /// private mount namespace that disappears with it (so concurrent users
    /// of the root are never affected, and nothing is left mounted).
    fn run(&self, args: &[&str]) -> Run {
        assert!(
            // /proc/self belongs to the process's effective user.
            fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0),
            "compile tests need root (chroot, mount namespaces); run `cargo xtask test` \
             (or scripts/test) as root, or put \"compile\" in the tools file's skip"
        );
        let bin = self.root.join(&self.rel).join("gpu-driver-installer");
        fs::copy(static_bin(), &bin).unwrap();
        let proc_dir = self.root.join("proc");
        let out = Command::new("unshare")
            .arg(format!("--mount-proc={}", proc_dir.display()))
            .arg("--")
            .arg("chroot")
            .arg(&self.root)
            .arg(self.inner("gpu-driver-installer"))
            .args(["--termination-log", "/nonexistent", "--host-root", "/"])
            .args(args)
            .env_remove("RUST_LOG")
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .output()
            .unwrap_or_else(|e| panic!("running unshare (util-linux): {e}"));
        finish(out)
    }

    /// A program of the root (`argv`), run as [`Job::run`] runs the
    /// installer.
    fn run_tool(&self, argv: &[&str]) -> std::process::Output {
        Command::new("unshare")
            .arg(format!("--mount-proc={}", self.root.join("proc").display()))
            .arg("--")
            .arg("chroot")
            .arg(&self.root)
            .args(argv)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .output()
            .unwrap_or_else(|e| panic!("running unshare (util-linux): {e}"))
    }

    /// `build` of `source` for `release` into the job's `out`, after the
    /// global flags `global`.
    fn build(&self, global: &[&str], source: &str, release: &str, flavor: &str) -> Run {
        let out = self.inner("out");
        let mut args = global.to_vec();
        args.extend([
            "build", "--source", source, "--kernel", release, "--flavor", flavor, "--out", &out,
        ]);
        self.run(&args)
    }

    fn remove(self) {
        drop(self);
    }
}

/// A build tree is a gigabyte or more: one left behind by a failed test in a
/// root that CI keeps between runs would add up until the disk is full. So
/// a job's directory goes even when its test panics, unless
/// the tools file's `keepFailedJobs` asks to keep it for a look.
impl Drop for Job {
    fn drop(&mut self) {
        let dir = self.root.join(&self.rel);
        if std::thread::panicking() && tools::tools().keep_failed_jobs() {
            eprintln!("kept {} (keepFailedJobs)", dir.display());
            return;
        }
        let _ = fs::remove_dir_all(dir);
    }
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Reads every file of a `.tar.zst`.
fn unpack(artifact: &Path) -> BTreeMap<String, Vec<u8>> {
    let f = fs::File::open(artifact).unwrap();
    let dec = zstd::stream::read::Decoder::new(f).unwrap();
    let mut tar = tar::Archive::new(dec);
    let mut files = BTreeMap::new();
    for e in tar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().display().to_string();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        assert!(files.insert(name.clone(), data).is_none(), "{name} twice");
    }
    files
}

/// The source a compile test builds: a path inside the root (Debian's
/// tarball), or a `.run` on the host that is copied into the job first.
enum Source<'a> {
    InRoot(&'a str),
    Runfile(PathBuf),
}

/// Builds in the root and checks the result, the artifact and every
/// module; `arch` is what the modules must be for (the root's kernel's).
fn compile_succeeds(suite: &str, flavor: &str, source: Source, branch: &str, arch: CpuArch) {
    let Some(root) = builder_root(suite) else {
        return;
    };
    let _one = COMPILE.lock().unwrap_or_else(|e| e.into_inner());
    let release = root_kernel_release(&root);
    let job = Job::new(&root, &format!("{suite}-{flavor}"));
    let (source, from_run) = match &source {
        Source::InRoot(p) => (p.to_string(), false),
        Source::Runfile(run) => {
            let inner = job.inner("NVIDIA-Linux.run");
            fs::copy(run, job.outer(&inner)).unwrap();
            (inner, true)
        }
    };
    let r = job.build(&[], &source, &release, flavor);
    let s = &r.doc["status"];
    assert_eq!(
        (r.code, reason(&r)),
        (0, "Built"),
        "{}\nstderr:\n{}",
        r.doc,
        r.stderr
    );
    assert_eq!(s["phase"], "Succeeded");
    assert_arch_and_compiler(s, arch);
    let driver = s["driverVersion"].as_str().unwrap();
    assert!(driver.starts_with(branch), "{driver}");
    eprintln!(
        "{suite} {flavor} {driver} for {release}: timings {}\n{:#}",
        s["timings"], r.doc
    );
    assert!(s["timings"]["compileSeconds"].as_f64().unwrap() > 1.0);
    assert!(s["timings"]["extractSeconds"].is_number());
    assert!(s["timings"]["packageSeconds"].is_number());

    let modules = assert_five_modules(s, &release, arch);

    // The artifact: its sha256, the manifest, and every file's sha256.
    let artifact = job.outer(s["artifact"].as_str().unwrap());
    assert_eq!(
        artifact.file_name().unwrap().to_string_lossy(),
        format!("nvidia-{driver}-{flavor}-{release}.tar.zst")
    );
    let bytes = fs::read(&artifact).unwrap();
    assert_eq!(s["artifactSha256"].as_str().unwrap(), sha256(&bytes));
    let files = unpack(&artifact);
    let manifest: Value = serde_json::from_slice(&files["manifest.json"]).unwrap();
    assert_eq!(manifest["kernelRelease"], release.as_str());
    assert_eq!(manifest["driverVersion"], driver);
    assert_eq!(manifest["flavor"], flavor);
    assert_eq!(manifest["arch"], arch.nvidia_name());
    assert!(manifest["compiler"].as_str().unwrap().contains("gcc"));
    assert!(manifest["builtAt"].as_str().unwrap().ends_with('Z'));
    // Neither Debian's module-source tarballs nor the assembled .run carry
    // GSP firmware; the manifest says so.
    assert_eq!(manifest["firmware"].as_array().unwrap().len(), 0);
    assert!(manifest["firmwareNote"].is_string());
    let listed = manifest["modules"].as_array().unwrap();
    assert_eq!(listed.len(), 5);
    for (m, st) in listed.iter().zip(modules) {
        assert_module_file(m, st, &files, &release, driver, arch);
    }
    let user = manifest["userSpace"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for f in &user {
        let file = f["file"].as_str().unwrap();
        assert_eq!(
            f["sha256"].as_str().unwrap(),
            sha256(&files[file]),
            "{file}"
        );
        assert_eq!(f["mode"], 0o755, "{file}");
    }
    assert_eq!(
        files.len(),
        1 + listed.len() + user.len(),
        "{:?}",
        files.keys()
    );
    if from_run {
        assert_run_user_space(&manifest, s, &user, driver);
        install_and_verify_real_user_space(&artifact, &release, driver, &files);
    } else {
        assert!(manifest.get("userSpace").is_none(), "{manifest:#}");
    }
    // modinfo's depends made it into the manifest (nvidia-uvm needs nvidia).
    let uvm = listed.iter().find(|m| m["name"] == "nvidia_uvm").unwrap();
    assert!(
        uvm["depends"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d == "nvidia"),
        "{uvm}"
    );

    // The log is kept; the extracted tree is not.
    let log = job.outer(s["log"].as_str().unwrap());
    assert!(fs::metadata(&log).unwrap().len() > 0);
    assert!(!log.parent().unwrap().join("source").exists());
    keep_artifact(&artifact, &format!("{suite}-{flavor}"));
    job.remove();
}

/// Five modules, each for this kernel.
fn assert_five_modules<'a>(s: &'a Value, release: &str, arch: CpuArch) -> &'a Vec<Value> {
    // Five modules, each for this kernel.
    let modules = s["modules"].as_array().unwrap();
    let names: Vec<&str> = modules
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "nvidia",
            "nvidia_uvm",
            "nvidia_modeset",
            "nvidia_drm",
            "nvidia_peermem"
        ]
    );
    for m in modules {
        let vermagic = m["vermagic"].as_str().unwrap();
        assert!(vermagic.starts_with(&format!("{release} ")), "{m}");
        // arm64's MODULE_ARCH_VERMAGIC.
        if arch == CpuArch::Aarch64 {
            assert!(vermagic.ends_with(" aarch64"), "{m}");
        }
    }
    modules
}

/// The architecture comes from the headers' .config; a cross build says
/// which prefix it used.
fn assert_arch_and_compiler(s: &Value, arch: CpuArch) {
    // The architecture comes from the headers' .config; a cross build says
    // which prefix it used.
    assert_eq!(s["arch"], arch.nvidia_name(), "{s}");
    let cross = arch != gpu_driver_installer::node::running_arch().unwrap();
    if cross {
        let prefix = format!("{}-", arch.gnu_triplet());
        assert_eq!(s["compiler"]["crossCompile"], prefix.as_str(), "{s}");
        assert!(
            s["compiler"]["command"]
                .as_str()
                .unwrap()
                .starts_with(&prefix),
            "{s}"
        );
    } else {
        assert!(s["compiler"].get("crossCompile").is_none(), "{s}");
    }
}

/// One module of the artifact: the manifest's entry matches the result's
/// and the file (stripped, for this kernel and architecture).
fn assert_module_file(
    m: &Value,
    st: &Value,
    files: &BTreeMap<String, Vec<u8>>,
    release: &str,
    driver: &str,
    arch: CpuArch,
) {
    let file = m["file"].as_str().unwrap();
    let data = &files[file];
    assert_eq!(m["sha256"].as_str().unwrap(), sha256(data), "{file}");
    assert_eq!(m["sha256"], st["sha256"]);
    assert_eq!(m["sizeBytes"].as_u64().unwrap(), data.len() as u64);
    assert_eq!(m["vermagic"], st["vermagic"]);
    // Stripped: the 184 MB nvidia.ko is ~11 MB without debug info.
    assert!(data.len() < 64 << 20, "{file}: {} bytes", data.len());
    let info = gpu_driver_installer::modinfo::parse_modinfo(data).unwrap();
    assert_eq!(info.vermagic_release(), release);
    // The ELF header's e_machine (62 x86_64, 183 aarch64), read by the
    // test itself.
    assert_eq!(
        u16::from_le_bytes([data[18], data[19]]),
        arch.elf_machine(),
        "{file}"
    );
    assert_eq!(info.machine, arch.elf_machine(), "{file}");
    assert_eq!(info.version.as_deref(), Some(driver));
}

/// A build from a .run: NVIDIA's user space from its .manifest, in the
/// root layout, with its links.
fn assert_run_user_space(manifest: &Value, s: &Value, user: &[Value], driver: &str) {
    // NVIDIA's user space from the .run's .manifest, in the root layout.
    let lib = format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    let names: Vec<&str> = user.iter().map(|f| f["file"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "usr/bin/nvidia-smi".to_string(),
            format!("{lib}/libnvidia-ml.so.{driver}"),
            format!("{lib}/libcuda.so.{driver}"),
        ],
        "{manifest:#}"
    );
    let links: Vec<(&str, &str)> = manifest["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["file"].as_str().unwrap(), l["target"].as_str().unwrap()))
        .collect();
    assert!(
        links.contains(&(
            &format!("{lib}/libnvidia-ml.so.1"),
            &format!("libnvidia-ml.so.{driver}")
        )),
        "{links:?}"
    );
    assert_eq!(manifest["schemaVersion"], 2);
    assert!(s["userSpace"].as_array().unwrap().len() >= 6, "{s}");
}

/// With the tools file's `keepArtifacts` = DIR, the artifact is copied to
/// `DIR/<suite>-<flavor>.tar.zst` before the job is removed: scripts/test
/// hands the arm64 one to the arm64 VM test (`scripts/vm-test-arm64`)
/// instead of compiling it twice.
fn keep_artifact(artifact: &Path, name: &str) {
    let Some(dir) = tools::tools().keep_artifacts() else {
        return;
    };
    fs::create_dir_all(&dir).unwrap();
    let dest = dir.join(format!("{name}.tar.zst"));
    fs::copy(artifact, &dest).unwrap();
    eprintln!("kept {} as {}", artifact.display(), dest.display());
}

/// The `.run` of `scripts/test-runfile` (NVIDIA's open module sources and
/// user space, from Debian, in a real makeself archive); required in CI.
fn test_runfile() -> Option<PathBuf> {
    match tools::tools().test_runfile() {
        Some(p) => Some(p),
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "the tools file's testRunfile must name scripts/test-runfile's .run in CI: {}",
                tools::HOW
            );
            eprintln!(
                "the tools file has no testRunfile: building Debian's tarball instead of a .run \
                 (scripts/test-runfile ROOT makes one)"
            );
            None
        }
    }
}

#[test]
fn compile_bookworm_open_535() {
    let source = match test_runfile() {
        Some(run) => Source::Runfile(run),
        None => Source::InRoot("/usr/src/nvidia-open-kernel.tar.xz"),
    };
    compile_succeeds("bookworm", "open", source, "535.", CpuArch::X86_64);
}

#[test]
fn compile_bookworm_proprietary_535() {
    compile_succeeds(
        "bookworm",
        "proprietary",
        Source::InRoot("/usr/src/nvidia-kernel.tar.xz"),
        "535.",
        CpuArch::X86_64,
    );
}

/// The arm64 build on this x86_64 machine: Debian's arm64 open 535 sources
/// (their core objects are prebuilt per architecture) against Debian's
/// arm64 cloud kernel headers, with the cross gcc of the kernel's major,
/// in the `bookworm-arm64` root (`scripts/builder-root bookworm-arm64`).
/// Nothing says "arm64" but the headers: the build takes it from their
/// `.config`.
#[test]
fn compile_bookworm_arm64_open_535_cross() {
    compile_succeeds(
        "bookworm-arm64",
        "open",
        Source::InRoot("/usr/src/nvidia-open-kernel.tar.xz"),
        "535.",
        CpuArch::Aarch64,
    );
    // `--arch` must agree with the headers (preflight, milliseconds).
    let Some(root) = builder_root("bookworm-arm64") else {
        return;
    };
    let release = root_kernel_release(&root);
    assert!(release.ends_with("-arm64"), "{release}");
    let job = Job::new(&root, "arm64-arch-flag");
    let r = job.build(
        &["--arch", "x86_64"],
        "/usr/src/nvidia-open-kernel.tar.xz",
        &release,
        "open",
    );
    assert_eq!(
        (r.code, reason(&r)),
        (13, "KernelHeadersMismatch"),
        "{}",
        r.doc
    );
    assert!(
        message(&r).contains("--arch x86_64 but the kernel headers"),
        "{}",
        message(&r)
    );
    assert_eq!(r.doc["spec"]["arch"], "x86_64");
    job.remove();
}

#[test]
fn compile_trixie_open_fails_with_kernel_api_mismatch() {
    let Some(root) = builder_root("trixie") else {
        return;
    };
    let _one = COMPILE.lock().unwrap_or_else(|e| e.into_inner());
    let release = root_kernel_release(&root);
    let job = Job::new(&root, "trixie-open");
    let r = job.build(&[], "/usr/src/nvidia-open-kernel.tar.xz", &release, "open");
    let s = &r.doc["status"];
    assert_eq!(
        (r.code, reason(&r)),
        (13, "KernelApiMismatch"),
        "{}\nstderr:\n{}",
        r.doc,
        r.stderr
    );
    eprintln!(
        "trixie open for {release}: timings {}\n{:#}",
        s["timings"], r.doc
    );
    assert_eq!(s["phase"], "Failed");
    let msg = message(&r);
    assert!(
        msg.contains("too few arguments to function 'pci_resize_resource'"),
        "{msg}"
    );
    assert!(msg.contains("nvidia/nv-pci.c"), "{msg}");
    let excerpt = s["logExcerpt"].as_str().unwrap();
    assert!(excerpt.contains("pci_resize_resource"), "{excerpt}");
    assert!(excerpt.lines().count() <= gpu_driver_installer::build::EXCERPT_LINES);
    let log = job.outer(s["log"].as_str().unwrap());
    assert!(
        fs::read_to_string(&log)
            .unwrap()
            .contains("error: too few arguments to function 'pci_resize_resource'")
    );
    assert!(s["artifact"].is_null());
    assert!(s["timings"]["compileSeconds"].is_number());
    job.remove();
}

/// Installs the built artifact into a fixture host root (one T4 on its PCI
/// bus) whose `/proc/modules` says these very modules are loaded already
/// (matched by srcversion/version), so that nothing reaches the kernel of
/// the machine running the tests; then verify runs the placed, real
/// nvidia-smi, which finds no NVIDIA kernel driver here and says so, and
/// loads the placed, real libcuda, whose cuInit finds no device.
fn install_and_verify_real_user_space(
    artifact: &Path,
    release: &str,
    driver: &str,
    files: &BTreeMap<String, Vec<u8>>,
) {
    let tmp = tempfile::tempdir().unwrap();
    let host = host_support::installable_host(tmp.path());
    let infos: Vec<_> = ["nvidia", "nvidia-uvm", "nvidia-modeset"]
        .iter()
        .map(|m| {
            gpu_driver_installer::modinfo::parse_modinfo(&files[&format!("modules/{m}.ko")])
                .unwrap()
        })
        .collect();
    let loaded: Vec<host_support::Loaded> = infos
        .iter()
        .map(|i| host_support::Loaded {
            name: &i.name,
            version: i.version.as_deref(),
            srcversion: i
                .fields
                .iter()
                .find(|(k, _)| k == "srcversion")
                .map(|(_, v)| v.as_str()),
        })
        .collect();
    host_support::mark_loaded(&host, &loaded);
    let run = |args: &[&str]| {
        let out = Command::new(crate::support::bin::installer())
            .args([
                "--termination-log",
                "/nonexistent",
                "--host-root",
                host.to_str().unwrap(),
            ])
            .args(args)
            .output()
            .unwrap();
        finish(out)
    };
    let r = run(&[
        "--kernel-release",
        release,
        "install",
        "--artifact",
        artifact.to_str().unwrap(),
    ]);
    assert_eq!(
        (r.code, reason(&r)),
        (0, "AlreadyInstalled"),
        "{}\n{}",
        r.doc,
        r.stderr
    );
    let us = &r.doc["status"]["userSpace"];
    assert_eq!(us["present"], true, "{}", r.doc);
    assert!(
        us["ldconfig"].as_str().unwrap().contains("ldconfig -r"),
        "{}",
        r.doc
    );
    let current = host.join("var/lib/gpu-driver/drivers/current");
    let smi = current.join("usr/bin/nvidia-smi");
    assert!(smi.is_file());
    // The host's ld.so.cache (real ldconfig -r) now resolves NVIDIA's
    // libraries through the current driver root.
    let cache = host_support::ld_cache(&host);
    for soname in ["libnvidia-ml.so.1", "libcuda.so.1"] {
        assert!(
            cache.contains(&format!(
                "{soname} (libc6,x86-64) => /var/lib/gpu-driver/drivers/current/"
            )),
            "{soname}: {cache}"
        );
    }
    // NVIDIA's real nvidia-smi, with its real libnvidia-ml, finds no
    // driver on this machine: VerifyFailed, quoting it.
    let r = run(&["verify", "--driver-version", driver]);
    assert_eq!(
        (r.code, reason(&r)),
        (15, "VerifyFailed"),
        "{}\n{}",
        r.doc,
        r.stderr
    );
    let msg = message(&r);
    assert!(
        msg.contains("couldn't communicate with the NVIDIA driver"),
        "{msg}"
    );
    // And the CUDA check, on the placed real libcuda with the host root's
    // loader and glibc: libcuda's own error for a machine without a GPU.
    let cuda = &r.doc["status"]["cuda"];
    assert_eq!(cuda["error"]["call"], "cuInit", "{}", r.doc);
    assert_eq!(cuda["error"]["name"], "CUDA_ERROR_NO_DEVICE", "{}", r.doc);
    assert!(
        msg.contains("; CUDA: cuInit failed with 100 CUDA_ERROR_NO_DEVICE"),
        "{msg}"
    );
    eprintln!("verify with NVIDIA's nvidia-smi {driver} and no driver: {msg}");
}
