//! `cargo xtask builder-root` (behind `scripts/builder-root`): a Debian
//! builder root — a debootstrap minbase root with a compiler, the cloud
//! kernel's headers and Debian's NVIDIA module sources. It stands in for
//! Garden Linux's kmodbuild images in the build matrix, the benchmarks and
//! the compile tests.
//!
//! `bookworm-arm64` is an amd64 root that cross-compiles for arm64: the
//! aarch64-linux-gnu toolchain of the arm64 kernel's gcc major, amd64's
//! linux-kbuild, and the arm64 headers and NVIDIA sources unpacked with
//! `dpkg-deb -x` (their dependencies' binaries cannot run here).
//!
//! Cache: `<cache>/roots/<suite>-<key>`, key = the root's format version,
//! the suite, the components and the packages. The root records what the
//! archive resolved to in `<root>/.gpu-driver-root.json`. A root older than
//! `--max-age-days` is rebuilt (the archive moves). Built into `<root>.tmp`
//! and renamed when complete, under an exclusive lock on `<root>.lock`;
//! users of a root (the matrix, the benchmarks) hold a shared lock on it
//! while they work in it.

mod build;
mod mounts;
mod parse;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};

use crate::apt;
use crate::cache::{Cache, KeyInputs};
use crate::pyjson::J;

/// Bumped when what a root holds changes in a way its inputs do not show,
/// so that such a change rebuilds the roots (and a refactoring does not).
const FORMAT: &str = "builder-root format 1";
const COMPONENTS: &str = "main,contrib,non-free";
const META: &str = ".gpu-driver-root.json";

#[derive(clap::Args)]
pub struct Args {
    /// bookworm, trixie or bookworm-arm64.
    #[arg(value_parser = ["bookworm", "trixie", "bookworm-arm64"])]
    suite: String,
    /// A root older than this is rebuilt (0: never stale).
    #[arg(long, env = "GPU_DRIVER_ROOT_MAX_AGE_DAYS", default_value_t = 7)]
    max_age_days: u64,
    /// Rebuild even if a fresh root exists.
    #[arg(long)]
    rebuild: bool,
    /// Keep the roots of the same suite with other keys (by default those
    /// nobody holds a lock on are deleted).
    #[arg(long)]
    no_prune: bool,
    /// Also make DIR/<suite> a symlink to the root.
    #[arg(long, value_name = "DIR")]
    link: Option<PathBuf>,
}

/// What a suite's root is made of.
pub(crate) struct Spec {
    suite: String,
    debian_suite: &'static str,
    arch: &'static str,
    mirror: String,
    packages: Vec<String>,
    /// Unpacked with dpkg-deb -x, not installed.
    foreign: Vec<String>,
}

impl Spec {
    fn new(suite: &str) -> Spec {
        let (debian_suite, arch) = match suite {
            "trixie" => ("trixie", "amd64"),
            "bookworm-arm64" => ("bookworm", "arm64"),
            _ => ("bookworm", "amd64"),
        };
        let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let (packages, foreign) = if arch == "amd64" {
            let p = "gcc make libc6-dev xz-utils kmod binutils linux-headers-cloud-amd64 \
                     nvidia-open-kernel-source nvidia-kernel-source";
            (words(p), Vec::new())
        } else {
            // The headers' own -common, kbuild and cross gcc-<N> are added
            // once the arm64 headers' ABI is resolved (build::cross_packages).
            let p = "make xz-utils kmod binutils gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu";
            (
                words(p),
                words("linux-headers-cloud-arm64 nvidia-open-kernel-source"),
            )
        };
        Spec {
            suite: suite.to_string(),
            debian_suite,
            arch,
            mirror: apt::debian_mirror(),
            packages,
            foreign,
        }
    }

    fn key(&self) -> String {
        let mut k = KeyInputs::default()
            .line(FORMAT)
            .line(&self.suite)
            .line(COMPONENTS);
        for p in self.packages.iter().chain(&self.foreign) {
            k = k.line(p);
        }
        k.key().to_string()
    }
}

/// Prints the root's path on stdout (the summary goes to stderr).
pub fn run(a: Args) -> Result<()> {
    if !apt::is_root() {
        bail!("needs root (debootstrap, chroot, mount)");
    }
    apt::ensure(&[apt::ROOTS])?;
    let spec = Spec::new(&a.suite);
    let roots = Cache::resolve()?.dir("roots")?;
    let root = roots.join(format!("{}-{}", a.suite, spec.key()));
    let lock = lock_file(&root)?;
    wait_lock(&lock, &root, true)?;
    if fresh(&root, &a)? {
        return publish(&root, &a);
    }
    lock.unlock()?;
    wait_lock(&lock, &root, false)?;
    // Someone else may have built it while we waited.
    if fresh(&root, &a)? {
        return publish(&root, &a);
    }
    build::build(&spec, &root)?;
    if !a.no_prune {
        eprintln!("==> prune other {} roots", a.suite);
        prune(&roots, &a.suite, &root)?;
    }
    publish(&root, &a)
}

fn sibling(root: &Path, suffix: &str) -> PathBuf {
    let mut p = root.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

fn lock_file(root: &Path) -> Result<File> {
    let p = sibling(root, ".lock");
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .with_context(|| format!("opening {}", p.display()))
}

/// A shared (reuse) or exclusive (build) lock, waited for an hour at most.
fn wait_lock(f: &File, root: &Path, shared: bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let got = if shared {
            f.try_lock_shared()
        } else {
            f.try_lock()
        };
        match got {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                bail!("timed out waiting for {}", sibling(root, ".lock").display())
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).context(format!("locking {}", sibling(root, ".lock").display()));
            }
        }
    }
}

/// True when the root is complete and young enough; says why not otherwise.
fn fresh(root: &Path, a: &Args) -> Result<bool> {
    let meta = root.join(META);
    if a.rebuild || !meta.is_file() {
        return Ok(false);
    }
    let age = SystemTime::now()
        .duration_since(meta.metadata()?.modified()?)
        .unwrap_or_default()
        .as_secs();
    if a.max_age_days == 0 || age < a.max_age_days * 86400 {
        eprintln!("reusing {} ({} h old)", root.display(), age / 3600);
        return Ok(true);
    }
    eprintln!(
        "{} is {} days old (max {}): rebuilding",
        root.display(),
        age / 86400,
        a.max_age_days
    );
    Ok(false)
}

fn publish(root: &Path, a: &Args) -> Result<()> {
    let meta = J::read(&root.join(META))?;
    eprint!("{}", parse::summary(&meta));
    if let Some(dir) = &a.link {
        std::fs::create_dir_all(dir)?;
        let link = dir.join(&a.suite);
        let tmp = dir.join(format!(".{}.link", a.suite));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(root, &tmp)?;
        std::fs::rename(&tmp, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    println!("{}", root.display());
    Ok(())
}

/// Roots of this suite with other keys are never reused: deletes those
/// nobody holds a lock on.
fn prune(roots: &Path, suite: &str, keep: &Path) -> Result<()> {
    for e in std::fs::read_dir(roots)? {
        let name = e?.file_name().to_string_lossy().into_owned();
        let Some(key) = name
            .strip_suffix(".lock")
            .and_then(|n| n.strip_prefix(suite))
            .and_then(|n| n.strip_prefix('-'))
        else {
            continue;
        };
        // Only this suite's keys: bookworm-<key>, not bookworm-arm64-<key>.
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let other = roots.join(format!("{suite}-{key}"));
        if other == keep {
            continue;
        }
        let f = lock_file(&other)?;
        if f.try_lock().is_err() {
            eprintln!("kept {} (in use)", other.display());
            continue;
        }
        for p in [other.clone(), sibling(&other, ".tmp")] {
            mounts::unmount_below(&p)?;
            crate::cache::remove(&p)?;
        }
        let _ = std::fs::remove_file(sibling(&other, ".debootstrap.log"));
        let _ = std::fs::remove_file(sibling(&other, ".lock"));
        eprintln!("deleted {}", other.display());
    }
    Ok(())
}
