//! The base image, localhost/debian:bookworm-slim, made here so that no
//! registry is needed: a `debootstrap --variant=minbase bookworm` root with
//! the official image's apt sources, its "slim" dpkg excludes and its apt
//! clean-up, saved as a tar. This file's text is part of the base's key,
//! so any change here makes a new base.

use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};
use sha2::{Digest as _, Sha256};

use super::sys;
use crate::cmd::cmd;

pub const SECURITY_MIRROR: &str = "http://deb.debian.org/debian-security";

/// The base's key: 16 hex digits of a sha256 over this file and the
/// mirrors.
pub fn key(mirror: &str) -> String {
    let text = format!(
        "{}bookworm\nminbase\n{mirror}\n{SECURITY_MIRROR}\n",
        include_str!("base.rs")
    );
    hex::encode(Sha256::digest(text.as_bytes()))[..16].to_string()
}

/// Makes the base root in `dir` and saves it as `tar` (via `tar.new`).
pub fn make(dir: &Path, tar: &Path, mirror: &str) -> Result<()> {
    let log = Path::new(&format!("{}.log", tar.display())).to_path_buf();
    sys::run_logged(
        cmd("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(dir)
            .arg(mirror),
        &log,
        20,
        Duration::from_secs(3600),
    )?;
    configure(dir, mirror)?;
    slim(dir)?;
    // The sources must work: apt-get update inside the root (then dropped).
    let apt = Duration::from_secs(900);
    sys::run(
        cmd("chroot")
            .arg(dir)
            .args(["env", "LC_ALL=C", "apt-get", "update", "-qq"]),
        apt,
    )?;
    sys::run(cmd("chroot").arg(dir).args(["apt-get", "clean"]), apt)?;
    for sub in ["var/lib/apt/lists", "var/log"] {
        remove_children(&dir.join(sub), |_| true)?;
    }
    remove_children(&dir.join("var/cache/apt"), |n| n.ends_with(".bin"))?;
    // The runtime provides resolv.conf and hostname.
    for f in [
        "var/cache/ldconfig/aux-cache",
        "etc/resolv.conf",
        "etc/hostname",
    ] {
        crate::cache::remove(&dir.join(f))?;
    }
    let new = Path::new(&format!("{}.new", tar.display())).to_path_buf();
    sys::run(
        cmd("tar")
            .args(["--numeric-owner", "--xattrs", "-C"])
            .arg(dir)
            .args(["--exclude=./dev/*", "--exclude=./proc/*"])
            .args(["--exclude=./sys/*", "--exclude=./run/*", "-cf"])
            .arg(&new)
            .arg("."),
        Duration::from_secs(900),
    )?;
    fs::rename(&new, tar)
        .with_context(|| format!("renaming {} to {}", new.display(), tar.display()))
}

/// The official image's apt sources (the release, its updates and
/// security) and its apt clean-up: apt deletes the packages it downloaded
/// and keeps no package caches, so that they stay out of image layers.
fn configure(dir: &Path, mirror: &str) -> Result<()> {
    crate::cache::remove(&dir.join("etc/apt/sources.list"))?;
    let sources = format!(
        "Types: deb
URIs: {mirror}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {SECURITY_MIRROR}
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"
    );
    let clean = r#"DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
"#;
    // "slim": what later packages put in these paths is not installed either.
    let slim = "path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
";
    for (file, text) in [
        ("etc/apt/sources.list.d/debian.sources", sources.as_str()),
        ("etc/apt/apt.conf.d/docker-clean", clean),
        ("etc/dpkg/dpkg.cfg.d/slim", slim),
    ] {
        let p = dir.join(file);
        fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// What the slim excludes would have kept out: docs but their copyright
/// files, man pages, info, locales, lintian overrides.
fn slim(dir: &Path) -> Result<()> {
    let doc = dir.join("usr/share/doc");
    let find = Duration::from_secs(300);
    sys::run(
        cmd("find")
            .arg(&doc)
            .args(["-mindepth", "1", "-not", "-name", "copyright"])
            .args(["-not", "-type", "d", "-delete"]),
        find,
    )?;
    sys::run(
        cmd("find")
            .arg(&doc)
            .args(["-mindepth", "1", "-type", "d", "-empty", "-delete"]),
        find,
    )?;
    for sub in ["man", "info", "locale", "lintian"] {
        remove_children(&dir.join("usr/share").join(sub), |_| true)?;
    }
    Ok(())
}

/// Deletes the entries of `dir` (not hidden ones, as a shell glob) whose
/// name `pick` selects; a missing `dir` has none.
fn remove_children(dir: &Path, pick: impl Fn(&str) -> bool) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && pick(&name) {
            crate::cache::remove(&e.path())?;
        }
    }
    Ok(())
}
