//! scripts/bench-build: wall time of the installer's `build` against a
//! bare `make -j<jobs> KERNEL_UNAME=<rel> modules` of the same source tree,
//! in the same builder root, same flavor, a clean tree each time; plus the
//! artifact's and nvidia.ko's sizes (unstripped from make, --strip-debug,
//! and in the artifact). Not a test: prints a Markdown table on stdout.
//! Target: build ≤ 1.10× make. Needs root (chroot, mount).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context as _, Result};

use super::root::{self, Root, RootArgs};
use super::{Cleanup, Stage, failed, median_of, median_s, met, ms_since, steps, walk};
use crate::cmd::{cmd, read, run};
use crate::pyjson::J;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    root: RootArgs,
    /// Run `build` before make (default: make first; the first compile
    /// also warms the page cache).
    #[arg(long)]
    build_first: bool,
}

/// Wall times (ms) of each run's steps.
#[derive(Default)]
struct Times {
    extract: Vec<u64>,
    make: Vec<u64>,
    build: Vec<u64>,
}

struct Bench<'a> {
    a: &'a RootArgs,
    root: Root,
    /// The root's /bench, where everything of this run goes.
    dir: PathBuf,
}

pub(super) fn bench(repo: &Path, cleanup: &Cleanup, stage: &mut Stage, a: &Args) -> Result<()> {
    root::preflight()?;
    let binary = root::installer(repo, stage, a.root.binary.as_deref())?;
    let root = root::prepare(repo, cleanup, stage, &a.root, &binary, "bench")?;
    let b = Bench {
        a: &a.root,
        dir: root.path.join("bench"),
        root,
    };
    let mut t = Times::default();
    let mut make_ko = PathBuf::new();
    for _ in 0..a.root.runs {
        if a.build_first {
            b.installer_build(stage, &mut t)?;
        }
        make_ko = b.bare_make(stage, &mut t)?;
        if !a.build_first {
            b.installer_build(stage, &mut t)?;
        }
    }
    stage.end();
    // Sizes: nvidia.ko as make leaves it, --strip-debug of it, and in the
    // artifact (a directory, or a tarball listed without unpacking).
    let size = |p: &Path| -> Result<u64> {
        Ok(std::fs::metadata(p)
            .with_context(|| format!("reading {}", p.display()))?
            .len())
    };
    let stripped = b.dir.join("nvidia.stripped.ko");
    run(cmd("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&stripped)
        .arg(&make_ko))?;
    let (unstripped, stripped) = (size(&make_ko)?, size(&stripped)?);
    build_summary(&b, &t, unstripped, stripped)
}

impl Bench<'_> {
    fn chroot(&self) -> std::process::Command {
        let mut c = cmd("chroot");
        c.arg(&self.root.path);
        c
    }

    /// Extracts the source into /bench/make and runs make there; the
    /// nvidia.ko it made.
    fn bare_make(&self, stage: &mut Stage, t: &mut Times) -> Result<PathBuf> {
        let (a, jobs) = (self.a, self.root.jobs);
        stage.start(&format!(
            "bare make ({}/{}, -j{jobs})",
            a.suite,
            a.flavor.name()
        ));
        let tree = self.dir.join("make");
        crate::cache::remove(&tree)?;
        std::fs::create_dir_all(&tree)?;
        let t0 = Instant::now();
        run(self
            .chroot()
            .args(["tar", "-xJf", a.flavor.source(), "-C", "/bench/make"]))?;
        let extract = ms_since(t0);
        let sub = kbuild_dir(&tree)
            .with_context(|| format!("no modules/*/Kbuild in {}", a.flavor.source()))?;
        let log = self.dir.join("log.make");
        let t1 = Instant::now();
        let mut c = self.chroot();
        c.arg("make")
            .arg("-C")
            .arg(Path::new("/bench/make").join(&sub))
            .arg(format!("-j{jobs}"))
            .arg(format!("KERNEL_UNAME={}", self.root.krel))
            .arg("modules");
        let out = std::fs::File::create(&log)?;
        let st = c.stdout(out.try_clone()?).stderr(out).status()?;
        if !st.success() {
            return Err(failed(&c, st, &log).context("bare make failed"));
        }
        t.extract.push(extract);
        t.make.push(ms_since(t1));
        Ok(tree.join(sub).join("nvidia.ko"))
    }

    /// The installer's `build` of the same source into /bench/out.
    fn installer_build(&self, stage: &mut Stage, t: &mut Times) -> Result<()> {
        let (a, jobs) = (self.a, self.root.jobs.to_string());
        stage.start(&format!(
            "installer build ({}/{}, --jobs {jobs})",
            a.suite,
            a.flavor.name()
        ));
        crate::cache::remove(&self.dir.join("out"))?;
        crate::cache::remove(&self.dir.join("result.json"))?;
        let log = self.dir.join("log.build");
        let mut c = self.chroot();
        c.args(["/gpu-driver-installer", "--log-level", "info"])
            .args(["--output", "/bench/result.json", "build"])
            .args(["--source", a.flavor.source(), "--kernel", &self.root.krel])
            .args(["--flavor", a.flavor.name(), "--out", "/bench/out"])
            .args(["--jobs", &jobs])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        let t0 = Instant::now();
        let st = c.status()?;
        let ms = ms_since(t0);
        if !st.success() {
            let result = super::tail(&self.dir.join("result.json"), 200);
            return Err(
                failed(&c, st, &log).context(format!("build failed; its result:\n{result}"))
            );
        }
        t.build.push(ms);
        Ok(())
    }
}

/// The directory of the first `Kbuild` in the extracted tree's modules/
/// (as `find . -maxdepth 3 -name Kbuild -path './modules/*'` finds it),
/// relative to the tree.
fn kbuild_dir(tree: &Path) -> Option<PathBuf> {
    for e in std::fs::read_dir(tree.join("modules")).ok()?.flatten() {
        let p = e.path();
        if e.file_name() == "Kbuild" {
            return Some(PathBuf::from("modules"));
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) && p.join("Kbuild").symlink_metadata().is_ok() {
            return Some(Path::new("modules").join(e.file_name()));
        }
    }
    None
}

/// Files under `dir` (symlinks left out), or the file's own size.
fn size_of(path: &Path) -> u64 {
    if !path.is_dir() {
        return path.metadata().map(|m| m.len()).unwrap_or(0);
    }
    let mut total = 0;
    walk(path, &mut |p| {
        if let Ok(m) = p.symlink_metadata()
            && m.is_file()
        {
            total += m.len();
        }
    });
    total
}

/// The size of the last `nvidia.ko` under `dir`.
fn ko_under(dir: &Path) -> Option<u64> {
    let mut found = None;
    walk(dir, &mut |p| {
        if p.file_name().is_some_and(|n| n == "nvidia.ko") {
            found = p.metadata().ok().map(|m| m.len());
        }
    });
    found
}

/// The size of `nvidia.ko` in a tarball, from `tar -tvf`.
fn ko_in_tar(path: &Path) -> Option<u64> {
    ko_in_listing(&read(cmd("tar").arg("-tvf").arg(path)).ok()?)
}

/// The size of the last `nvidia.ko` in a `tar -tv` listing.
fn ko_in_listing(list: &str) -> Option<u64> {
    list.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let name = f.last()?;
        (Path::new(name).file_name()? == "nvidia.ko")
            .then(|| f.get(2)?.parse().ok())
            .flatten()
    })
}

/// The artifact's size and that of the `nvidia.ko` in it: the result's
/// module list, else the artifact itself (a directory, or a tarball's
/// listing), else the last one under bench/out.
fn artifact_sizes(root: &Path, status: &J, art: &str) -> (Option<u64>, Option<u64>) {
    let host_art = (!art.is_empty()).then(|| root.join(art.trim_start_matches('/')));
    let mut ko_in_art: Option<u64> = match status.get("modules") {
        J::Arr(ms) => ms
            .iter()
            .find(|m| m.get("name").as_str() == Some("nvidia"))
            .and_then(|m| m.get("sizeBytes").as_f64().map(|v| v as u64)),
        _ => None,
    };
    let mut art_size = None;
    if let Some(h) = host_art.as_ref().filter(|h| h.exists()) {
        art_size = Some(size_of(h));
        if h.is_dir() {
            if let Some(k) = ko_under(h) {
                ko_in_art = Some(k);
            }
        } else if ko_in_art.is_none()
            && [".tar", ".tar.gz", ".tar.xz"]
                .iter()
                .any(|e| art.ends_with(e))
        {
            ko_in_art = ko_in_tar(h);
        }
    }
    if ko_in_art.is_none() {
        ko_in_art = ko_under(&root.join("bench/out"));
    }
    (art_size, ko_in_art)
}

fn build_summary(b: &Bench, t: &Times, unstripped: u64, stripped: u64) -> Result<()> {
    let (a, root) = (b.a, &b.root.path);
    let res = J::read(&b.dir.join("result.json"))?;
    let (status, spec) = (res.get("status"), res.get("spec"));
    let art = status.get("artifact").as_str().unwrap_or("").to_string();
    let (art_size, ko_in_art) = artifact_sizes(root, status, &art);
    let (e, m, bs) = (median_s(&t.extract), median_s(&t.make), median_s(&t.build));
    let mb = |n: Option<u64>| n.map_or("–".to_string(), |n| format!("{:.1} MB", n as f64 / 1e6));
    let driver = status
        .get("driverVersion")
        .or(spec.get("driverVersion"))
        .or(&J::str("?"))
        .py_str();
    let jobs = b.root.jobs;
    println!(
        "### bench-build: {}/{}, driver {driver}, kernel {}, -j{jobs}{}",
        a.suite,
        a.flavor.name(),
        b.root.krel,
        median_of(t.build.len())
    );
    println!();
    println!("| what | value |");
    println!("|---|---|");
    println!("| extract (`tar -xJf`) | {e:.1} s |");
    println!("| bare `make -j{jobs} modules` | {m:.1} s |");
    println!("| extract + make | {:.1} s |", e + m);
    println!("| `gpu-driver-installer build` | {bs:.1} s |");
    println!(
        "| build / make | **{:.3}×** (target ≤ 1.10×: {}) |",
        bs / m,
        met(bs / m <= 1.10)
    );
    println!("| build / (extract + make) | {:.3}× |", bs / (e + m));
    let timings = status.get("timings");
    if timings.truthy() {
        println!("| build's own steps | {} |", steps(timings));
    }
    println!("| artifact | `{art}` {} |", mb(art_size));
    println!(
        "| nvidia.ko from make (unstripped) | {} |",
        mb(Some(unstripped))
    );
    println!(
        "| nvidia.ko `strip --strip-debug` | {} |",
        mb(Some(stripped))
    );
    println!("| nvidia.ko in the artifact | {} |", mb(ko_in_art));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_kbuild_directory() -> Result<()> {
        let d = tempfile::tempdir()?;
        assert_eq!(kbuild_dir(d.path()), None);
        std::fs::create_dir_all(d.path().join("modules/nvidia-open/src"))?;
        assert_eq!(kbuild_dir(d.path()), None);
        std::fs::write(d.path().join("modules/nvidia-open/Kbuild"), "")?;
        assert_eq!(
            kbuild_dir(d.path()),
            Some(PathBuf::from("modules/nvidia-open"))
        );
        Ok(())
    }

    #[test]
    fn the_nvidia_ko_in_a_tar_listing() {
        let list = "drwxr-xr-x root/root         0 2026-12-02 10:00 modules/\n\
                    -rw-r--r-- root/root  11081234 2026-12-02 10:00 modules/nvidia.ko\n\
                    -rw-r--r-- root/root      1234 2026-12-02 10:00 manifest.json\n";
        assert_eq!(ko_in_listing(list), Some(11081234));
        assert_eq!(ko_in_listing("-rw-r--r-- root/root 5 x y a.ko\n"), None);
    }
}
