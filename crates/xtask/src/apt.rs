//! The Debian packages the tooling needs, installed when their command (or
//! file) is missing, so that the README's commands work on a fresh machine.

use anyhow::{Result, bail};

use crate::cmd::{cmd, on_path, run};

/// `command-or-absolute-file`, `package`.
pub type Need = (&'static str, &'static str);

/// What the tests need: `file` checks the static binary; makeself and the
/// compressors build the tests' .run files; dpkg tools unpack and index
/// Debian packages; gcc/make compile test modules and the CUDA check
/// helper (build.rs); kbuild's prebuilt tools link libelf and libcrypto;
/// the local cluster makes certificates with openssl and polls with curl.
pub const TEST: &[Need] = &[
    ("file", "file"),
    ("chroot", "coreutils"),
    ("makeself", "makeself"),
    ("xz", "xz-utils"),
    ("bzip2", "bzip2"),
    ("zstd", "zstd"),
    ("dpkg-deb", "dpkg"),
    ("dpkg-scanpackages", "dpkg-dev"),
    ("gzip", "gzip"),
    ("gcc", "gcc"),
    ("cc", "gcc"),
    ("make", "make"),
    ("/usr/include/stdio.h", "libc6-dev"),
    ("/usr/lib/x86_64-linux-gnu/libelf.so.1", "libelf1"),
    ("/usr/lib/x86_64-linux-gnu/libcrypto.so.3", "libssl3"),
    ("openssl", "openssl"),
    ("curl", "curl"),
    ("flock", "util-linux"),
    ("jq", "jq"),
];

/// Builder roots, the matrix and the e2e run.
pub const ROOTS: &[Need] = &[
    ("debootstrap", "debootstrap"),
    ("flock", "util-linux"),
    ("mountpoint", "util-linux"),
    ("unshare", "util-linux"),
    ("timeout", "coreutils"),
];

/// The x86_64 VM tests: QEMU, a static busybox and cpio for the initramfs.
pub const VM: &[Need] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("busybox", "busybox-static"),
    ("cpio", "cpio"),
    ("strip", "binutils"),
];

/// The static aarch64 installer: the cross linker and arm64's static glibc.
pub const CROSS_ARM64: &[Need] = &[
    ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
    ("/usr/aarch64-linux-gnu/lib/libc.a", "libc6-dev-arm64-cross"),
];

/// The arm64 VM test.
pub const VM_ARM64: &[Need] = &[("qemu-system-aarch64", "qemu-system-arm")];

/// `images build`: buildah without a daemon, debootstrap for the base,
/// unshare for buildah's mount namespace, file and static glibc for the
/// pause binary, tar to read the OCI archives.
pub const IMAGES: &[Need] = &[
    ("buildah", "buildah"),
    ("debootstrap", "debootstrap"),
    ("unshare", "util-linux"),
    ("file", "file"),
    ("gcc", "gcc"),
    ("/usr/lib/x86_64-linux-gnu/libc.a", "libc6-dev"),
    ("tar", "tar"),
];

/// `images check`: a throwaway containerd, its runtime, and util-linux to
/// give it a mount namespace and ctr a way into it.
pub const CONTAINERD: &[Need] = &[
    ("containerd", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("unshare", "util-linux"),
    ("nsenter", "util-linux"),
];

/// Installs the packages of `needs` whose command or file is missing.
pub fn ensure(needs: &[&[Need]]) -> Result<()> {
    let mut missing: Vec<&str> = Vec::new();
    for (what, pkg) in needs.iter().flat_map(|n| n.iter()) {
        let present = if what.starts_with('/') {
            std::path::Path::new(what).exists()
        } else {
            on_path(what)
        };
        if !present && !missing.contains(pkg) {
            missing.push(pkg);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing packages {}: install them (apt-get install {}) or run as root",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("installing {}", missing.join(" "));
    run(cmd("apt-get")
        .args(["update", "-qq"])
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(cmd("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// The Debian archive: `GPU_DRIVER_DEBIAN_MIRROR`, else deb.debian.org.
pub fn debian_mirror() -> String {
    std::env::var("GPU_DRIVER_DEBIAN_MIRROR")
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "http://deb.debian.org/debian".to_string())
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}
