//! `cargo xtask matrix` (behind `scripts/matrix`): the build-matrix smoke
//! test. It compiles Debian's packaged NVIDIA module sources with the static
//! installer's `build` command inside each builder root
//! (`scripts/builder-root`), for each module flavor, and compares each
//! pair's outcome with `docs/matrix-expect.json`.
//!
//! Each pair is recorded (`report::record`) as it finishes; the report
//! (`report::report`) merges the records into `matrix.json` and
//! `matrix.md`, keeping the earlier rows of pairs not run this time (unless
//! `--fresh`). Exit 0 when every pair run matches its expectation (pairs not
//! listed are only reported), 1 when one does not or gave no result
//! document, 2 on usage or setup errors.

mod report;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::apt;
use crate::cmd::{cmd, read_last_line, run};
use crate::pyjson::J;
use crate::static_build::{self, Arch};

#[derive(clap::Args)]
pub struct Args {
    /// The suites to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "bookworm,trixie", value_parser = report::SUITES)]
    suites: Vec<String>,
    /// The module flavors to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "open,proprietary", value_parser = report::FLAVORS)]
    flavors: Vec<String>,
    /// The installer binary to copy into the roots (default: what
    /// `cargo xtask static-build` builds).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// The expectations.
    #[arg(long, default_value = "docs/matrix-expect.json")]
    expect: String,
    /// The limit of each pair, in seconds.
    #[arg(long, default_value_t = 2400)]
    timeout: u64,
    /// Keep /matrix-out/<pair> (the modules) in the roots.
    #[arg(long)]
    keep: bool,
    /// Do not merge with the previous matrix.json.
    #[arg(long)]
    fresh: bool,
    /// Where matrix.md and matrix.json go.
    #[arg(long, default_value = "docs")]
    out: PathBuf,
    /// Sign the modules with this key (build's option; copied into the root
    /// for the build and removed after it). Needs --signing-cert.
    #[arg(long, requires = "signing_cert")]
    signing_key: Option<PathBuf>,
    #[arg(long, requires = "signing_key")]
    signing_cert: Option<PathBuf>,
}

/// Runs the matrix and returns its exit code; relative paths are taken from the repository's root,
/// as they always were.
pub fn run_matrix(repo: &Path, a: Args) -> Result<u8> {
    if !apt::is_root() {
        eprintln!("error: needs root (chroot, mount)");
        return Ok(2);
    }
    apt::ensure(&[apt::ROOTS])?;
    let expect = repo.join(&a.expect);
    if !expect.is_file() {
        eprintln!("error: no expectations file {}", expect.display());
        return Ok(2);
    }
    let out = repo.join(&a.out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let binary = match &a.binary {
        Some(b) => repo.join(b),
        // Both binaries, as every caller builds them: the same features,
        // so nothing compiles twice.
        None => static_build::build(
            repo,
            &["gpu-driver-installer", "gpu-driver-operator"],
            Arch::X86_64,
        )?
        .remove(0),
    };
    if !crate::cmd::is_executable(&binary) {
        eprintln!("error: {} is not an executable", binary.display());
        return Ok(2);
    }
    let work = tempfile::tempdir().context("creating a scratch directory")?;
    let mut guard = Guard::default();
    // All roots first, then a shared lock on each for the whole run, so
    // that scripts/builder-root cannot replace a root while we compile in it.
    let mut roots = Vec::new();
    for s in &a.suites {
        eprintln!("==> builder root {s}");
        let root = read_last_line(cmd(repo.join("scripts/builder-root")).arg(s))?;
        roots.push((s.clone(), PathBuf::from(root)));
    }
    for (_, root) in &roots {
        guard.locks.push(shared_lock(&lock_path(root))?);
    }
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (suite, root) in &roots {
        run_suite(&a, suite, root, &binary, work.path(), jobs, &mut guard)?;
    }
    eprintln!("==> report");
    let res = report::report(
        &report::ReportArgs {
            work: work.path().to_path_buf(),
            out: out.clone(),
            expect: a.expect.clone(),
            expect_path: expect.clone(),
            jobs: jobs as i64,
            fresh: a.fresh,
        },
        &report::now(),
    );
    eprintln!(
        "wrote {} and {}",
        out.join("matrix.md").display(),
        out.join("matrix.json").display()
    );
    match res {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("error: {e:#}");
            Ok(1)
        }
    }
}

fn lock_path(root: &Path) -> PathBuf {
    let mut p = root.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

fn shared_lock(path: &Path) -> Result<File> {
    let f = File::open(path).with_context(|| format!("opening the lock {}", path.display()))?;
    f.lock_shared()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(f)
}

/// The root's kernel release, from the record scripts/builder-root keeps.
fn kernel_release(root: &Path) -> Result<String> {
    let rec = J::read(&root.join(".gpu-driver-root.json"))?;
    rec.get("kernelRelease")
        .as_str()
        .filter(|k| !k.is_empty())
        .map(String::from)
        .with_context(|| format!("{} names no kernelRelease", root.display()))
}

fn run_suite(
    a: &Args,
    suite: &str,
    root: &Path,
    binary: &Path,
    work: &Path,
    jobs: usize,
    guard: &mut Guard,
) -> Result<()> {
    let krel = kernel_release(root)?;
    let proc = root.join("proc");
    if !cmd("mountpoint").arg("-q").arg(&proc).status()?.success() {
        run(cmd("mount").args(["-t", "proc", "proc"]).arg(&proc))?;
        guard.mounted.push(proc);
    }
    let inst = root.join("gpu-driver-installer");
    std::fs::copy(binary, &inst)
        .with_context(|| format!("copying {} to {}", binary.display(), inst.display()))?;
    guard.in_roots.push(inst);
    guard.out_dirs.push(root.join("matrix-out"));
    let mut sign = Vec::new();
    if let (Some(key), Some(cert)) = (&a.signing_key, &a.signing_cert) {
        let keys = root.join("matrix-keys");
        std::fs::create_dir_all(&keys)?;
        guard.in_roots.push(keys.clone());
        run(cmd("install")
            .args(["-m", "0400"])
            .arg(key)
            .arg(keys.join("signing.key")))?;
        run(cmd("install")
            .args(["-m", "0444"])
            .arg(cert)
            .arg(keys.join("signing.crt")))?;
        sign = vec![
            "--signing-key",
            "/matrix-keys/signing.key",
            "--signing-cert",
            "/matrix-keys/signing.crt",
        ];
    }
    for flavor in &a.flavors {
        let pair = Pair {
            suite,
            flavor,
            root,
            krel: &krel,
        };
        pair.run(a, work, jobs, &sign, guard)?;
    }
    Ok(())
}

struct Pair<'a> {
    suite: &'a str,
    flavor: &'a str,
    root: &'a Path,
    krel: &'a str,
}

impl Pair<'_> {
    fn name(&self) -> String {
        format!("{}-{}", self.suite, self.flavor)
    }

    fn source(&self) -> &'static str {
        match self.flavor {
            "open" => "/usr/src/nvidia-open-kernel.tar.xz",
            _ => "/usr/src/nvidia-kernel.tar.xz",
        }
    }

    fn run(&self, a: &Args, work: &Path, jobs: usize, sign: &[&str], g: &mut Guard) -> Result<()> {
        let (pair, out) = (self.name(), self.root.join("matrix-out"));
        eprintln!(
            "==> build {}/{} (kernel {})",
            self.suite, self.flavor, self.krel
        );
        crate::cache::remove(&out.join(&pair))?;
        crate::cache::remove(&out.join(format!("{pair}.json")))?;
        std::fs::create_dir_all(&out)?;
        if !a.keep {
            g.in_roots.push(out.join(&pair));
        }
        let start = Instant::now();
        let stdout = work.join(format!("{pair}.stdout"));
        let child = cmd("timeout")
            .arg(a.timeout.to_string())
            .arg("chroot")
            .arg(self.root)
            .args(["/gpu-driver-installer", "--log-level", "info", "--output"])
            .arg(format!("/matrix-out/{pair}.json"))
            .args(["build", "--source", self.source(), "--kernel", self.krel])
            .args(["--flavor", self.flavor, "--out"])
            .arg(format!("/matrix-out/{pair}"))
            .args(["--jobs", &jobs.to_string()])
            .args(sign)
            .stdout(File::create(&stdout)?)
            .stderr(File::create(work.join(format!("{pair}.log")))?)
            .spawn()
            .context("starting timeout chroot … gpu-driver-installer build")?;
        g.child = Some(child);
        // `timeout` ends the build; a little more for it to be reaped.
        let rc = g.wait_child(Duration::from_secs(a.timeout + 60))?;
        let ms = start.elapsed().as_millis() as i64;
        let result = work.join(format!("{pair}.result.json"));
        let doc = out.join(format!("{pair}.json"));
        if doc.is_file() {
            std::fs::rename(&doc, &result).or_else(|_| std::fs::copy(&doc, &result).map(|_| ()))?;
        } else if std::fs::metadata(&stdout).is_ok_and(|m| m.len() > 0) {
            std::fs::copy(&stdout, &result)?;
        }
        report::record(
            &report::RecordArgs {
                work: work.to_path_buf(),
                pair,
                suite: self.suite.into(),
                flavor: self.flavor.into(),
                root: self.root.to_path_buf(),
                source: self.source().into(),
                kernel: self.krel.into(),
                exit_code: rc,
                wall_ms: ms,
                timeout: a.timeout as i64,
            },
            &report::now(),
        )
    }
}

/// What a run put into the roots, taken out again however it ends: the
/// running build, /proc mounts, the installer and keys, empty output
/// directories, the roots' shared locks.
#[derive(Default)]
struct Guard {
    child: Option<Child>,
    mounted: Vec<PathBuf>,
    in_roots: Vec<PathBuf>,
    out_dirs: Vec<PathBuf>,
    locks: Vec<File>,
}

impl Guard {
    /// The build's exit code (`timeout`'s 124 when it ran out of time).
    fn wait_child(&mut self, limit: Duration) -> Result<i64> {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut().context("no build running")?;
        loop {
            if let Some(st) = child.try_wait()? {
                self.child = None;
                return Ok(st.code().map_or(128 + 9, i64::from));
            }
            if Instant::now() > deadline {
                bail!("the build outlived its timeout by a minute");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            eprintln!("stopping the running build (pid {})", c.id());
            let _ = cmd("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
        }
        for m in &self.mounted {
            let ok = cmd("umount").arg(m).stderr(Stdio::null()).status();
            if !ok.is_ok_and(|s| s.success()) {
                let _ = cmd("umount")
                    .arg("-l")
                    .arg(m)
                    .stderr(Stdio::null())
                    .status();
            }
        }
        for p in &self.in_roots {
            let _ = crate::cache::remove(p);
        }
        for d in &self.out_dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}
