//! The statically linked release binaries: the installer (for builder roots,
//! scratch images, VMs and `nsenter`) and the operator (a scratch image).
//!
//! `--target` is explicit so that `+crt-static` applies to the binary only,
//! not to build scripts and proc macros (which cannot be static). Each
//! binary is built from its own package, so the installer links none of
//! the operator's or the exporter's dependencies.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::apt;
use crate::cmd::{cmd, read, run};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    #[value(alias = "amd64")]
    X86_64,
    #[value(alias = "arm64")]
    Aarch64,
}

impl Arch {
    fn target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Aarch64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// What `file` says of a binary of this architecture.
    fn file_word(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86-64",
            Arch::Aarch64 => "ARM aarch64",
        }
    }
}

/// Builds `bins` (one cargo call, so shared dependencies compile once) and
/// returns their paths in the same order, each checked to be static.
pub fn build(repo: &Path, bins: &[&str], arch: Arch) -> Result<Vec<PathBuf>> {
    let target = arch.target();
    let mut c = cmd("cargo");
    c.current_dir(repo)
        .args(["build", "--release", "--locked", "--target", target]);
    for b in bins {
        if !matches!(*b, "gpu-driver-installer" | "gpu-driver-operator") {
            bail!("unknown binary {b} (gpu-driver-installer or gpu-driver-operator)");
        }
        c.args(["-p", b, "--bin", b]);
    }
    if arch == Arch::Aarch64 {
        apt::ensure(&[apt::CROSS_ARM64])?;
        let installed = read(cmd("rustup").args(["target", "list", "--installed"]))?;
        if !installed.lines().any(|l| l == target) {
            run(cmd("rustup").args(["target", "add", target]))?;
        }
        c.env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            "aarch64-linux-gnu-gcc",
        )
        .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
        .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar");
    }
    let flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    c.env(
        "RUSTFLAGS",
        format!("{flags} -C target-feature=+crt-static").trim(),
    );
    run(&mut c)?;
    let dir = target_dir(repo)?.join(target).join("release");
    bins.iter()
        .map(|b| {
            let p = dir.join(b);
            let desc = read(cmd("file").arg("-b").arg(&p))?;
            if !is_static(&desc, arch.file_word()) {
                bail!(
                    "{} is not a statically linked {} binary: {desc}",
                    p.display(),
                    arch.file_word()
                );
            }
            Ok(p)
        })
        .collect()
}

fn is_static(file_says: &str, arch: &str) -> bool {
    file_says.contains(arch)
        && (file_says.contains("static-pie linked") || file_says.contains("statically linked"))
}

/// Cargo's target directory (CARGO_TARGET_DIR or `<repo>/target`).
pub fn target_dir(repo: &Path) -> Result<PathBuf> {
    Ok(
        match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => repo.join("target"),
        },
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn tells_static_binaries() {
        let s = "ELF 64-bit LSB pie executable, x86-64, version 1 (GNU/Linux), static-pie linked, stripped";
        assert!(super::is_static(s, "x86-64"));
        assert!(!super::is_static(s, "ARM aarch64"));
        let d = "ELF 64-bit LSB pie executable, x86-64, dynamically linked, interpreter /lib64/ld-linux-x86-64.so.2";
        assert!(!super::is_static(d, "x86-64"));
    }
}
