//! `cargo xtask e2e` (behind `scripts/e2e`): the main job on its embedded
//! default, end to end, no GPU needed:
//!   1. a Debian bookworm builder root (`scripts/builder-root`, cached);
//!   2. `build` of Debian's NVIDIA open module sources for its cloud kernel,
//!      by the static installer inside that root (chroot, /proc mounted);
//!   3. a QEMU boot of that same kernel (`scripts/vm-test --no-assert`);
//!   4. `install` of the built modules in the VM: the kernel refuses
//!      nvidia.ko with ENODEV ("NVRM: No NVIDIA GPU found."), which the
//!      result quotes; hello.ko loads and unloads; `run` skips with NoGpu.
//!
//! Prints each result document and checks the VM's facts itself (the
//! checks of tests/it/vm.rs, shared through `xtask::vmlog`), so no test
//! binary is compiled. Needs root (debootstrap, chroot, mounts).

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;
use xtask::vmlog::{self, Checks, Console};

use crate::apt::{self, Need};
use crate::cache::{self, Cache};
use crate::cmd::{cmd, read_last_line, run};
use crate::pipeline::unpack_modules;
use crate::stages::Stages;
use crate::static_build::{self, Arch};

/// On top of the builder roots' and the VM's packages: zstd unpacks the
/// artifact, jq writes scripts/vm-test's tools file.
const E2E: &[Need] = &[("zstd", "zstd"), ("tar", "tar"), ("jq", "jq")];

/// Runs the whole job; the stage table is printed whatever happens.
/// `out` (default `target/e2e`) receives the artifact, its unpacked
/// modules and the VM's console.
pub fn run_all(repo: &Path, out: Option<PathBuf>) -> Result<()> {
    let target = static_build::target_dir(repo)?;
    let out = out.unwrap_or_else(|| target.join("e2e"));
    let mut stages = Stages::new(&target.join("xtask/e2e-stages.json"))?;
    let res = steps(repo, &out, &mut stages);
    eprint!("{}", stages.table());
    res?;
    eprintln!(
        "e2e: build, VM boot and install done; artifact and logs in {}",
        out.display()
    );
    Ok(())
}

fn steps(repo: &Path, out: &Path, stages: &mut Stages) -> Result<()> {
    apt::ensure(&[apt::ROOTS, apt::VM, E2E])?;
    let cache = Cache::resolve()?;
    cache::remove(out)?;
    fs::create_dir_all(out)?;
    let out = fs::canonicalize(out)?;

    let root = stages.run("builder root (bookworm)", || {
        read_last_line(
            cmd(repo.join("scripts/builder-root"))
                .arg("bookworm")
                .env("GPU_DRIVER_CACHE", cache.root()),
        )
        .map(PathBuf::from)
    })?;
    let krel = kernel_release(&root)?;

    let bin = stages.run("static installer", || {
        // The operator too, as every caller builds both: one cargo call
        // compiles their shared dependencies once.
        let bins = static_build::build(
            repo,
            &["gpu-driver-installer", "gpu-driver-operator"],
            Arch::X86_64,
        )?;
        bins.into_iter().next().context("no installer path")
    })?;

    stages.run(
        &format!("build (open modules for {krel}, inside the builder root)"),
        || build_in_root(&root, &bin, &krel, &out),
    )?;

    let vm = out.join("vm");
    stages.run(&format!("VM boot of {krel} and install"), || {
        // --no-assert: the console is judged below, without compiling the
        // test binary.
        run(cmd(repo.join("scripts/vm-test"))
            .arg("--no-assert")
            .arg("--out")
            .arg(&vm)
            .arg(out.join("nvidia"))
            .env("GPU_DRIVER_CACHE", cache.root()))
    })?;

    stages.run("results from inside the VM", || {
        judge(&vm.join("tools.json"), &krel)
    })
}

/// The kernel release the builder root's headers are for.
fn kernel_release(root: &Path) -> Result<String> {
    let meta = root.join(".gpu-driver-root.json");
    let v: serde_json::Value = serde_json::from_slice(
        &fs::read(&meta).with_context(|| format!("reading {}", meta.display()))?,
    )
    .with_context(|| format!("parsing {}", meta.display()))?;
    match v["kernelRelease"].as_str() {
        Some(k) if !k.is_empty() => Ok(k.to_string()),
        _ => bail!("{} names no kernelRelease", meta.display()),
    }
}

/// The installer's `build` inside the root; prints its result document,
/// keeps the artifact in `out` and its modules unpacked in `out/nvidia`.
fn build_in_root(root: &Path, bin: &Path, krel: &str, out: &Path) -> Result<()> {
    let installer = root.join("e2e-installer");
    let work = root.join("e2e-out");
    cache::remove(&work)?;
    fs::create_dir_all(&work)?;
    fs::copy(bin, &installer).with_context(|| format!("copying {}", bin.display()))?;
    let res = build_and_keep(root, krel, &work, out);
    // Nothing of this run stays in the shared root, passed or failed.
    cache::remove(&work)?;
    cache::remove(&installer)?;
    res
}

fn build_and_keep(root: &Path, krel: &str, work: &Path, out: &Path) -> Result<()> {
    // A private mount namespace with /proc mounted in the root: nothing
    // stays mounted afterwards, whatever happens.
    let mut mount_proc = OsString::from("--mount-proc=");
    mount_proc.push(root.join("proc"));
    let built = run(cmd("unshare")
        .arg(mount_proc)
        .args(["--", "chroot"])
        .arg(root)
        .args([
            "/e2e-installer",
            "--host-root",
            "/",
            "--log-level",
            "info",
            "--output",
            "/e2e-out/build.json",
            "build",
            "--source",
            "/usr/src/nvidia-open-kernel.tar.xz",
            "--kernel",
            krel,
            "--flavor",
            "open",
            "--out",
            "/e2e-out",
        ]));
    if let Ok(doc) = fs::read_to_string(work.join("build.json")) {
        println!("{}", doc.trim_end());
    }
    built.context("the build failed")?;
    let artifact = fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".tar.zst"))
        .with_context(|| format!("the build left no artifact in {}", work.display()))?;
    let modules = out.join("nvidia");
    fs::create_dir_all(&modules)?;
    unpack_modules(&artifact, &modules)?;
    let name = artifact.file_name().context("artifact name")?;
    fs::copy(&artifact, out.join(name))?;
    Ok(())
}

/// What scripts/vm-test's tools file says of its VM.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VmRun {
    vm_log: PathBuf,
    vm_foreign: String,
}

/// Prints each step's result document and one line per fact; fails if a
/// fact is not what it must be.
fn judge(tools: &Path, krel: &str) -> Result<()> {
    let t: VmRun = serde_json::from_slice(
        &fs::read(tools).with_context(|| format!("reading {}", tools.display()))?,
    )
    .with_context(|| format!("parsing {}", tools.display()))?;
    if t.vm_foreign.is_empty() {
        bail!("{} names no foreign release", tools.display());
    }
    let raw = fs::read(&t.vm_log).with_context(|| format!("reading {}", t.vm_log.display()))?;
    let con = Console::parse(&String::from_utf8_lossy(&raw));
    for b in con.blocks() {
        if let Some(rc) = b.rc {
            println!("--- {} (exit {rc})", b.name);
            println!("{}", b.text.trim());
        }
    }
    let mut c = Checks::default();
    vmlog::x86_vm(&mut c, &con, krel, &t.vm_foreign);
    println!("{} passed, {} failed", c.passed, c.failed);
    if c.failed > 0 {
        bail!(
            "{} VM check(s) failed; console: {}",
            c.failed,
            t.vm_log.display()
        );
    }
    Ok(())
}
