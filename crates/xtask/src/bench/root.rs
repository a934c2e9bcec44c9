//! The builder root that bench-build and bench-cache work in: made or
//! found by scripts/builder-root, held with a shared lock while they work
//! (a rebuild of it waits), /proc mounted, the static installer copied in.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use super::{Cleanup, Stage};
use crate::apt::{self, Need};
use crate::cmd::{cmd, read, read_last_line, run};
use crate::static_build::{self, Arch};

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Flavor {
    Open,
    Proprietary,
}

impl Flavor {
    pub(super) fn name(self) -> &'static str {
        match self {
            Flavor::Open => "open",
            Flavor::Proprietary => "proprietary",
        }
    }

    /// The source tarball in the root.
    pub(super) fn source(self) -> &'static str {
        match self {
            Flavor::Open => "/usr/src/nvidia-open-kernel.tar.xz",
            Flavor::Proprietary => "/usr/src/nvidia-kernel.tar.xz",
        }
    }

    /// The Debian package that installed the source.
    fn package(self) -> &'static str {
        match self {
            Flavor::Open => "nvidia-open-kernel-source",
            Flavor::Proprietary => "nvidia-kernel-source",
        }
    }
}

/// The flags bench-build and bench-cache share.
#[derive(clap::Args)]
pub(super) struct RootArgs {
    /// The builder root's Debian suite.
    #[arg(long, default_value = "bookworm")]
    pub suite: String,
    #[arg(long, value_enum, default_value = "open")]
    pub flavor: Flavor,
    /// Compile jobs (default: nproc).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: Option<u32>,
    /// Repeats; the table shows medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// The installer binary (default: cargo xtask static-build's).
    #[arg(long)]
    pub binary: Option<PathBuf>,
}

/// What `.gpu-driver-root.json` says of its root.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RootMeta {
    kernel_release: String,
    #[serde(default)]
    packages: std::collections::BTreeMap<String, String>,
}

/// A root ready for the benchmark.
pub(super) struct Root {
    pub path: PathBuf,
    pub krel: String,
    meta: RootMeta,
    pub jobs: u32,
}

impl Root {
    /// The driver version: the flavor's source package's, without its
    /// Debian revision.
    pub(super) fn driver(&self, flavor: Flavor) -> Result<String> {
        let v = self
            .meta
            .packages
            .get(flavor.package())
            .with_context(|| format!("the builder root has no {}", flavor.package()))?;
        Ok(upstream_version(v).to_string())
    }
}

/// `sub("-[^-]*$"; "")`: the version without its last `-` part.
fn upstream_version(v: &str) -> &str {
    v.rsplit_once('-').map_or(v, |(up, _)| up)
}

/// The checks before anything starts: root, the packages.
pub(super) fn preflight() -> Result<()> {
    if !apt::is_root() {
        eprintln!("error: needs root (chroot, mount)");
        std::process::exit(2);
    }
    const JQ: &[Need] = &[("jq", "jq")];
    apt::ensure(&[apt::ROOTS, JQ])
}

/// The static installer: `binary`, else a fresh static build.
pub(super) fn installer(repo: &Path, stage: &mut Stage, binary: Option<&Path>) -> Result<PathBuf> {
    if let Some(b) = binary {
        return Ok(b.to_path_buf());
    }
    stage.start("static installer");
    let bins = static_build::build(
        repo,
        &["gpu-driver-installer", "gpu-driver-operator"],
        Arch::X86_64,
    )?;
    Ok(bins[0].clone())
}

/// The root of `a.suite`, locked, /proc mounted, `binary` copied in as
/// /gpu-driver-installer and the directory `work` made; both go at the end.
pub(super) fn prepare(
    repo: &Path,
    cleanup: &Cleanup,
    stage: &mut Stage,
    a: &RootArgs,
    binary: &Path,
    work: &str,
) -> Result<Root> {
    stage.start(&format!("builder root {}", a.suite));
    let path = PathBuf::from(read_last_line(
        cmd(repo.join("scripts/builder-root")).arg(&a.suite),
    )?);
    // Held until what this run put in the root is gone.
    cleanup.hold(lock_shared(&PathBuf::from(format!(
        "{}.lock",
        path.display()
    )))?);
    let meta_file = path.join(".gpu-driver-root.json");
    let meta: RootMeta = serde_json::from_slice(
        &std::fs::read(&meta_file).with_context(|| format!("reading {}", meta_file.display()))?,
    )
    .with_context(|| format!("parsing {}", meta_file.display()))?;
    if meta.kernel_release.is_empty() {
        bail!("{} names no kernelRelease", meta_file.display());
    }
    let proc = path.join("proc");
    if !cmd("mountpoint").arg("-q").arg(&proc).status()?.success() {
        run(cmd("mount").args(["-t", "proc", "proc"]).arg(&proc))?;
        cleanup.umount(&proc);
    }
    let installer = path.join("gpu-driver-installer");
    cleanup.remove(&installer);
    cleanup.remove(&path.join(work));
    std::fs::copy(binary, &installer).with_context(|| format!("copying {}", binary.display()))?;
    std::fs::create_dir_all(path.join(work))?;
    let jobs = match a.jobs {
        Some(j) => j,
        None => read(&mut cmd("nproc"))?.parse().context("nproc's answer")?,
    };
    Ok(Root {
        krel: meta.kernel_release.clone(),
        path,
        meta,
        jobs,
    })
}

/// A shared lock on the root's lock file (scripts/builder-root rebuilds
/// a root only under an exclusive one), waited for up to an hour.
fn lock_shared(path: &Path) -> Result<File> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        match f.try_lock_shared() {
            Ok(()) => return Ok(f),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                bail!("timed out waiting for {}", path.display())
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_roots_metadata() -> Result<()> {
        let m: RootMeta = serde_json::from_str(
            r#"{"suite":"bookworm","kernelRelease":"6.1.0-50-cloud-amd64",
               "packages":{"nvidia-open-kernel-source":"535.261.03-1~deb12u1",
               "linux-headers-6.1.0-50-cloud-amd64":"6.1.170-1"}}"#,
        )?;
        assert_eq!(m.kernel_release, "6.1.0-50-cloud-amd64");
        let v = &m.packages["nvidia-open-kernel-source"];
        assert_eq!(upstream_version(v), "535.261.03");
        assert_eq!(upstream_version("550.1"), "550.1");
        Ok(())
    }
}
