//! `cargo xtask test-runfile BUILDER_ROOT` (scripts/test-runfile):
//! assembles an NVIDIA-style .run (a real makeself archive) from real
//! parts, since NVIDIA's own .run cannot be downloaded here, and prints its
//! path:
//!
//! - `kernel-open/`: Debian's nvidia-open-kernel-source tree from the
//!   builder root (`/usr/src/nvidia-open-kernel.tar.xz`,
//!   `modules/nvidia-open-kernel`), the kernel-module part of NVIDIA's .run;
//! - NVIDIA's user space of the same version from Debian non-free:
//!   nvidia-smi, libnvidia-ml.so.<v> (libnvidia-ml1), libcuda.so.<v>
//!   (libcuda1);
//! - a `.manifest` in NVIDIA's format listing them.
//!
//! Cached under `<cache>/test-data/runfile/<version>-<key>/`, keyed by the
//! version and this module's source.

use std::fmt::Write as _;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

use super::apt::{Apt, mirror};
use super::{find_all, glob, scratch, unpack};
use crate::cache::Cache;
use crate::cmd::cmd;
use crate::deadline;

/// The key's inputs besides the version: how the .run is assembled.
const SOURCES: [&str; 2] = [include_str!("runfile.rs"), include_str!("apt.rs")];
const LIMIT: Duration = Duration::from_secs(600);
/// A header that must never run: the installer unpacks .run payloads itself.
const INSTALLER: &str = "#!/bin/sh
echo \"this installer must not be executed by gpu-driver\" >&2
exit 99
";

fn log(msg: &str) {
    eprintln!("test-runfile: {msg}");
}

/// The .run of `root`'s driver version, built unless cached.
pub fn build(cache: &Cache, root: &Path) -> Result<PathBuf> {
    let suite = root_suite(root)?;
    let deb_version = dpkg_version(root, "nvidia-open-kernel-source")?;
    let version = upstream(&deb_version);
    let dir = cache.dir("test-data/runfile")?;
    let out = dir
        .join(format!("{version}-{}", key()))
        .join(format!("NVIDIA-Linux-x86_64-{version}.run"));
    if out.is_file() {
        log(&format!("cached: {}", out.display()));
        return Ok(out);
    }
    let work = scratch(&dir)?;
    let work = work.path();
    // User space of exactly this version, with a private apt configuration.
    let apt = Apt::new(&dir.join(format!("apt-{suite}")), &mirror(), &suite, false)?;
    apt.update(None)?;
    log(&format!(
        "downloading nvidia-smi, libnvidia-ml1, libcuda1 {deb_version}"
    ));
    let specs = ["nvidia-smi", "libnvidia-ml1", "libcuda1"].map(|p| format!("{p}={deb_version}"));
    apt.download(work, &specs)?;
    let debs = work.join("debs");
    for deb in find_all(work, &|p, _| glob(p, "*.deb"))? {
        unpack(&deb, &debs)?;
    }
    let top = work.join(format!("NVIDIA-Linux-x86_64-{version}"));
    fs::create_dir(&top)?;
    deadline::run(
        cmd("tar")
            .arg("-xJf")
            .arg(root.join("usr/src/nvidia-open-kernel.tar.xz"))
            .arg("-C")
            .arg(work),
        LIMIT,
    )?;
    fs::rename(
        work.join("modules/nvidia-open-kernel"),
        top.join("kernel-open"),
    )
    .context("moving modules/nvidia-open-kernel of the tarball")?;
    let lib = debs.join("usr/lib/x86_64-linux-gnu/nvidia/current");
    for (from, name) in [
        (
            debs.join("usr/lib/nvidia/current/nvidia-smi"),
            "nvidia-smi".to_string(),
        ),
        (
            lib.join(format!("libnvidia-ml.so.{version}")),
            format!("libnvidia-ml.so.{version}"),
        ),
        (
            lib.join(format!("libcuda.so.{version}")),
            format!("libcuda.so.{version}"),
        ),
    ] {
        fs::copy(&from, top.join(&name)).with_context(|| format!("copying {}", from.display()))?;
    }
    let kernel = top.join("kernel-open");
    let sources: Vec<String> = find_all(&kernel, &|_, m| m.is_file())?
        .iter()
        .filter_map(|p| p.strip_prefix(&kernel).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    fs::write(top.join(".manifest"), manifest(version, &sources))?;
    write_executable(&top.join("nvidia-installer"), INSTALLER)?;
    makeself(&top, &out, version)?;
    let mib = fs::metadata(&out)?.len() >> 20;
    log(&format!("wrote {} ({mib} MiB)", out.display()));
    Ok(out)
}

/// `makeself` into `out` (through `out.partial`).
fn makeself(top: &Path, out: &Path, version: &str) -> Result<()> {
    let dir = out.parent().context("the .run's directory")?;
    fs::create_dir_all(dir)?;
    let partial = out.with_extension("run.partial");
    deadline::run(
        cmd("makeself")
            .args(["--gzip", "--nox11", "--quiet"])
            .arg(top)
            .arg(&partial)
            .arg(format!(
                "NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}"
            ))
            .arg("./nvidia-installer"),
        LIMIT,
    )?;
    fs::rename(&partial, out).with_context(|| format!("renaming {}", partial.display()))
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// 12 hex digits of the sha256 of how the .run is made.
fn key() -> String {
    let mut h = Sha256::new();
    for s in SOURCES {
        h.update(s.as_bytes());
    }
    hex::encode(h.finalize())[..12].to_string()
}

/// The suite the builder root was made from (its `.gpu-driver-root.json`).
fn root_suite(root: &Path) -> Result<String> {
    let p = root.join(".gpu-driver-root.json");
    let mut text = String::new();
    fs::File::open(&p)
        .with_context(|| format!("opening {}", p.display()))?
        .take(1 << 20)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", p.display()))?;
    parse_suite(&text).with_context(|| format!("no suite in {}", p.display()))
}

fn parse_suite(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.get("suite")?.as_str().map(str::to_string)
}

/// The installed version of `pkg` in `root`'s dpkg database.
fn dpkg_version(root: &Path, pkg: &str) -> Result<String> {
    let mut admindir = std::ffi::OsString::from("--admindir=");
    admindir.push(root.join("var/lib/dpkg"));
    let out = deadline::read(
        cmd("dpkg-query")
            .arg(admindir)
            .args(["-W", "-f", "${Version}", pkg]),
        Duration::from_secs(60),
    )?;
    let v = out.trim();
    if v.is_empty() {
        bail!("{pkg} is not installed in {}", root.display());
    }
    Ok(v.to_string())
}

/// The upstream part of a Debian version: `535.261.03-1` → `535.261.03`.
fn upstream(deb_version: &str) -> &str {
    deb_version.split('-').next().unwrap_or(deb_version)
}

/// The `.manifest` in NVIDIA's format: the header, the user space and one
/// line per file of `kernel-open/` (`sources`, relative to it).
fn manifest(version: &str, sources: &[String]) -> String {
    let mut m = format!(
        "NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}
{version}
KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 MODULE:nvidia
x86_64
nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem
kernel-open
gpu-driver scripts/test-runfile (assembled from Debian packages)
EXTRA
nvidia-smi 0755 UTILITY_BINARY MODULE:nvidia
libnvidia-ml.so.{version} 0755 UTILITY_LIB NATIVE MODULE:nvidia
libnvidia-ml.so.1 0000 UTILITY_LIB_SYMLINK NATIVE libnvidia-ml.so.{version} MODULE:nvidia
libcuda.so.{version} 0755 CUDA_LIB NATIVE MODULE:nvidia
libcuda.so.1 0000 CUDA_SYMLINK NATIVE libcuda.so.{version} MODULE:nvidia
libcuda.so 0000 CUDA_SYMLINK NATIVE libcuda.so.1 MODULE:nvidia
"
    );
    for s in sources {
        let _ = writeln!(
            m,
            "kernel-open/{s} 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 MODULE:nvidia"
        );
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_suite() {
        assert_eq!(upstream("535.261.03-1"), "535.261.03");
        assert_eq!(upstream("550.54.14-1~deb12u1"), "550.54.14");
        assert_eq!(upstream("535.261.03"), "535.261.03");
        let json = r#"{"suite": "bookworm", "key": "a2a9f655e922ffe6", "arch": "amd64"}"#;
        assert_eq!(parse_suite(json).as_deref(), Some("bookworm"));
        assert_eq!(parse_suite(r#"{"key": "x"}"#), None);
        assert_eq!(parse_suite("not json"), None);
    }

    #[test]
    fn manifest_lists_the_user_space_and_each_source() {
        let m = manifest("535.1", &["Kbuild".into(), "nvidia/nv.c".into()]);
        let lines: Vec<&str> = m.lines().collect();
        assert_eq!(lines.len(), 16);
        assert_eq!(lines[1], "535.1");
        assert_eq!(
            lines[10],
            "libnvidia-ml.so.1 0000 UTILITY_LIB_SYMLINK NATIVE libnvidia-ml.so.535.1 MODULE:nvidia"
        );
        assert_eq!(
            lines[15],
            "kernel-open/nvidia/nv.c 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 MODULE:nvidia"
        );
    }
}
