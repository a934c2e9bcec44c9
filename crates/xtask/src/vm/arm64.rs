//! `scripts/vm-test-arm64`: an emulated arm64 machine
//! (`qemu-system-aarch64 -M virt -cpu cortex-a57`, TCG) boots Debian's
//! arm64 cloud kernel with a busybox-static:arm64 initramfs, and the static
//! aarch64 installer installs an arm64 NVIDIA artifact cross-built on
//! x86_64. No mocks.
//!
//! ARTIFACT is the build's .tar.zst for a Debian *-cloud-arm64 kernel (the
//! test pipeline passes the cross compile test's); its manifest's
//! kernelRelease picks the kernel that is booted.
//!
//! Checked (`tests/it/vm.rs` `vm_arm64_results`, from the serial console):
//! the VM runs that kernel on aarch64; `install` fails with
//! ModuleLoadFailed, errno ENODEV, quoting the kernel's "NVRM: No NVIDIA
//! GPU found." (so the arm64 loader accepted the modules and nvidia.ko's
//! init ran); nothing stays loaded; `run` is Skipped with NoGpu.
//!
//! The console log and tools.json (the test's inputs) go to
//! target/vm-test-arm64. Debian's arm64 linux-image and busybox-static are
//! cached under `<cache>/vm/arm64/<release>`; the archive is
//! GPU_DRIVER_DEBIAN_MIRROR.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use super::Stage;
use super::apt::Apt;
use crate::apt::{self as packages, Need};
use crate::cache::{self, Cache};
use crate::cmd::cmd;
use crate::static_build::{self, Arch};

/// On top of `apt::VM_ARM64`: cpio for the initramfs, zstd and dpkg-deb
/// for the artifact and the packages, `file` checks busybox.
const TOOLS: &[Need] = &[
    ("cpio", "cpio"),
    ("zstd", "zstd"),
    ("dpkg-deb", "dpkg"),
    ("file", "file"),
];

#[derive(clap::Args)]
pub struct Args {
    /// The arm64 NVIDIA artifact (.tar.zst) built for a Debian
    /// cloud-arm64 kernel.
    artifact: PathBuf,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolsFile {
    vm_arm64_log: PathBuf,
    vm_release: String,
}

pub fn run(repo: &Path, args: Args) -> Result<()> {
    let artifact = super::absolute(&args.artifact)?;
    if !artifact.is_file() {
        bail!(
            "vm-test-arm64: pass the arm64 NVIDIA artifact (.tar.zst) built for a Debian \
             cloud-arm64 kernel ({} is not a file)",
            artifact.display()
        );
    }
    let mut stage = Stage::new(Path::new("."));
    stage.start("vm-test-arm64 tools");
    packages::ensure(&[packages::VM_ARM64, TOOLS])?;
    let release = super::manifest_release(&super::artifact_manifest(&artifact)?, false)?;
    if !release.ends_with("-cloud-arm64") {
        bail!(
            "vm-test-arm64: {} is for {release}, not a Debian cloud-arm64 kernel",
            artifact.display()
        );
    }
    eprintln!("vm-test-arm64: kernel {release} (from the artifact's manifest)");

    stage.start(&format!("arm64 kernel {release} and busybox-static"));
    let cache = Cache::resolve()?.dir("vm/arm64")?;
    let dir = kernel_and_busybox(&cache, &release)?;
    let kernel = dir.join(format!("root/boot/vmlinuz-{release}"));
    let busybox = dir.join("root/bin/busybox");
    let desc = crate::cmd::read(cmd("file").arg("-b").arg(&busybox))?;
    if !is_static_aarch64(&desc) {
        bail!(
            "vm-test-arm64: {} is not a static aarch64 busybox: {desc}",
            busybox.display()
        );
    }

    stage.start("static aarch64 installer");
    let bin = static_build::build(repo, &["gpu-driver-installer"], Arch::Aarch64)?;
    let bin = fs::canonicalize(&bin[0])?;

    stage.start("initramfs");
    let out = repo.join("target/vm-test-arm64");
    cache::remove(&out)?;
    fs::create_dir_all(&out)?;
    let out = fs::canonicalize(&out)?;
    initrd(repo, &out, &busybox, &bin, &artifact)?;

    stage.start(&format!(
        "boot {release} under qemu-system-aarch64 (virt, cortex-a57, tcg)"
    ));
    let console = boot(&kernel, &out)?;

    stage.start("assertions");
    let tools = out.join("tools.json");
    super::write_tools(
        &tools,
        &ToolsFile {
            vm_arm64_log: console,
            vm_release: release,
        },
    )?;
    super::assertions(repo, &tools, "vm::vm_arm64_results")?;
    stage.end();
    Ok(())
}

/// The initramfs: the shared /init, told by the kernel command line to run
/// only the NVIDIA steps (no hello.ko for this kernel).
fn initrd(repo: &Path, out: &Path, busybox: &Path, bin: &Path, artifact: &Path) -> Result<()> {
    let r = out.join("initrd");
    fs::create_dir_all(r.join("artifacts"))?;
    // This machine's os-release, as the arm64 kernel's root has none.
    super::initrd_base(repo, &r, busybox, bin, Path::new("/usr/lib/os-release"))?;
    super::copy(artifact, &r.join("artifacts/nvidia.tar.zst"))?;
    super::copy(&repo.join("tests/vm-init.sh"), &r.join("init"))?;
    super::chmod(&r.join("init"), 0o755)?;
    super::initramfs(&r, &out.join("initrd.gz"))
}

/// Boots `kernel` on the emulated arm64 machine; returns the console
/// log's path.
fn boot(kernel: &Path, out: &Path) -> Result<PathBuf> {
    let console = out.join("console.log");
    let start = std::time::Instant::now();
    let st = super::boot(
        cmd("qemu-system-aarch64")
            .args(["-M", "virt", "-cpu", "cortex-a57", "-accel", "tcg"])
            .args(["-m", "1024", "-smp", "1", "-nographic", "-no-reboot"])
            .arg("-kernel")
            .arg(kernel)
            .arg("-initrd")
            .arg(out.join("initrd.gz"))
            .args([
                "-append",
                "console=ttyAMA0 panic=-1 quiet gpu_driver_vm=nvidia",
            ]),
        &console,
    )?;
    let Some(st) = st else {
        return Err(super::hung("vm-test-arm64", &console, 40, ""));
    };
    eprintln!(
        "vm-test-arm64: qemu exit {st} after {} s; console in {}",
        start.elapsed().as_secs(),
        console.display()
    );
    Ok(console)
}

/// Debian's arm64 linux-image of `rel` and busybox-static, unpacked in
/// `<cache>/<rel>/root`; cached whole (`done`).
fn kernel_and_busybox(cache: &Path, rel: &str) -> Result<PathBuf> {
    let dir = cache.join(rel);
    if dir.join("done").is_file() {
        return Ok(dir);
    }
    let mut apt = Apt::new(cache, true)?;
    apt.update()?;
    let work = tempfile::Builder::new()
        .prefix(".work.")
        .tempdir_in(cache)
        .with_context(|| format!("creating a directory in {}", cache.display()))?;
    apt.download(
        work.path(),
        &[format!("linux-image-{rel}"), "busybox-static".to_string()],
    )?;
    super::unpack_debs(work.path())?;
    fs::write(work.path().join("done"), b"")?;
    cache::remove(&dir)?;
    let work = work.keep();
    fs::rename(&work, &dir)
        .with_context(|| format!("renaming {} to {}", work.display(), dir.display()))?;
    Ok(dir)
}

/// Whether `file -b` says a static aarch64 executable.
fn is_static_aarch64(desc: &str) -> bool {
    desc.find("aarch64")
        .is_some_and(|i| desc[i..].contains("static"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn tells_a_static_aarch64_busybox() {
        // `file -b` of bookworm busybox-static:arm64's /bin/busybox.
        let bb = "ELF 64-bit LSB executable, ARM aarch64, version 1 (GNU/Linux), statically \
                  linked, BuildID[sha1]=2d0361f90c8817f80eb486e1ccf7f5177cdd2883, for \
                  GNU/Linux 3.7.0, stripped";
        assert!(super::is_static_aarch64(bb));
        let x86 = "ELF 64-bit LSB executable, x86-64, version 1 (GNU/Linux), statically linked";
        assert!(!super::is_static_aarch64(x86));
        let dynamic = "ELF 64-bit LSB pie executable, ARM aarch64, dynamically linked";
        assert!(!super::is_static_aarch64(dynamic));
    }
}
