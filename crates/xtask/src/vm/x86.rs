//! `scripts/vm-test`: the static installer loads real modules into a real
//! Debian cloud kernel booted under QEMU (TCG). No mocks.
//!
//! NVIDIA_KO_DIR holds nvidia*.ko built for a Debian cloud kernel (the
//! build's output, unpacked); nvidia.ko's vermagic picks the kernel that is
//! booted. It is required: the nvidia checks are never faked with another
//! module.
//!
//! The VM (`tests/vm-init.sh` as /init) prints each step's result on the
//! serial console; `tests/it/vm.rs` (`vm_results`, with `xtask::vmlog`'s
//! checks) judges it:
//!  1. hello.ko (`tests/fixtures/kmod-hello`, built and packaged by the
//!     installer's own `build` against the kernel's headers) installs,
//!     shows in /proc/modules, a second install is AlreadyInstalled, and
//!     `uninstall --module hello` removes it;
//!  2. the NVIDIA artifact fails with ModuleLoadFailed, errno ENODEV,
//!     quoting the kernel's "NVRM: No NVIDIA GPU found.", and nothing stays
//!     loaded;
//!  3. `run` is Skipped with NoGpu (the VM has no NVIDIA PCI device);
//!  4. hello.ko built for another release (bookworm-backports' cloud
//!     kernel) is refused with VermagicMismatch, /proc/modules unchanged;
//!  5. `nsenter -t 1 ... run` and `--host-root /proc/1/root` from another
//!     root both see the host.
//!
//! DIR (default target/vm-test) receives the console log and tools.json
//! (vmLog, vmRelease, vmForeign: the test's inputs). `--no-assert` stops
//! there, for a caller that judges the console itself (`cargo xtask e2e`).
//!
//! Debian's linux-image, linux-headers and linux-kbuild .debs are cached
//! under `<cache>/vm/<release>`; the archive is GPU_DRIVER_DEBIAN_MIRROR.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

use super::apt::{Apt, kernel_deps, newest_cloud_release};
use super::{Stage, proc};
use crate::apt::{self as packages, Need};
use crate::cache::{self, Cache};
use crate::cmd::cmd;

/// On top of `apt::VM`: gcc and make build the test module; dpkg-deb and
/// zstd unpack packages and pack artifacts; `file` checks busybox.
const TOOLS: &[Need] = &[
    ("gcc", "gcc"),
    ("make", "make"),
    ("zstd", "zstd"),
    ("dpkg-deb", "dpkg"),
    ("file", "file"),
];

/// NVIDIA's modules that go into the artifact, when present.
const NVIDIA: [&str; 5] = [
    "nvidia",
    "nvidia-uvm",
    "nvidia-modeset",
    "nvidia-drm",
    "nvidia-peermem",
];

#[derive(clap::Args)]
pub struct Args {
    /// Only boot and write DIR's console log and tools.json: the caller
    /// judges the console itself.
    #[arg(long)]
    no_assert: bool,
    /// Where the console log and tools.json go (default target/vm-test).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// nvidia*.ko built for a Debian cloud-amd64 kernel.
    nvidia_ko_dir: PathBuf,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolsFile {
    vm_log: PathBuf,
    vm_release: String,
    vm_foreign: String,
}

pub fn run(repo: &Path, args: Args) -> Result<()> {
    let ko_dir = super::absolute(&args.nvidia_ko_dir)?;
    let nvidia_ko = ko_dir.join("nvidia.ko");
    if !nvidia_ko.is_file() {
        bail!("vm-test: {} does not exist", nvidia_ko.display());
    }
    let mut stage = Stage::new(Path::new("."));
    stage.start("vm-test tools");
    let (release, version) = tools_and_release(&nvidia_ko)?;
    let vm = Cache::resolve()?.dir("vm")?;
    let out = args.out.unwrap_or_else(|| repo.join("target/vm-test"));
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = fs::canonicalize(&out)?;
    let _ = fs::remove_file(out.join("tools.json"));
    let foreign = kernels(&mut stage, &vm, &release)?;

    stage.start("static installer");
    let bin = super::static_installer(repo)?;

    stage.start("modules and artifacts (the installer's build)");
    let r = out.join("initrd");
    cache::remove(&r)?;
    let arts = r.join("artifacts");
    fs::create_dir_all(&arts)?;
    build_hello(repo, &bin, &vm, &release, &arts.join("hello"))?;
    build_hello(repo, &bin, &vm, &foreign, &arts.join("foreign"))?;
    let kos: Vec<PathBuf> = NVIDIA
        .iter()
        .map(|m| ko_dir.join(format!("{m}.ko")))
        .filter(|p| p.is_file())
        .collect();
    make_artifact(&arts.join("nvidia"), &version, &release, &kos)?;
    super::list(&arts)?;

    stage.start("initramfs");
    let root = vm.join(&release).join("root");
    let os_release = root.join("usr/lib/os-release");
    super::initrd_base(repo, &r, Path::new("/bin/busybox"), &bin, &os_release)?;
    super::copy(&repo.join("tests/vm-init.sh"), &r.join("init"))?;
    super::chmod(&r.join("init"), 0o755)?;
    super::initramfs(&r, &out.join("initrd.gz"))?;

    stage.start(&format!("boot {release} under qemu (tcg)"));
    let console = boot(&root.join(format!("boot/vmlinuz-{release}")), &out)?;
    // The console and the releases it is judged against, as the test reads them.
    let tools = out.join("tools.json");
    super::write_tools(
        &tools,
        &ToolsFile {
            vm_log: console,
            vm_release: release,
            vm_foreign: foreign,
        },
    )?;
    if !args.no_assert {
        stage.start("assertions");
        super::assertions(repo, &tools, "vm::vm_results")?;
    }
    stage.end();
    Ok(())
}

/// The VM's packages, a static busybox, and the kernel release and
/// driver version of `nvidia_ko` (its vermagic's first word, its version).
fn tools_and_release(nvidia_ko: &Path) -> Result<(String, String)> {
    packages::ensure(&[packages::VM, TOOLS])?;
    let bb = crate::cmd::read(cmd("file").arg("-b").arg("/bin/busybox")).unwrap_or_default();
    if !crate::cmd::is_executable(Path::new("/bin/busybox")) || !bb.contains("static") {
        bail!("vm-test: /bin/busybox is not static (install busybox-static)");
    }
    let ko = super::read_bounded(nvidia_ko)?;
    let release = super::vermagic_release(&ko)
        .with_context(|| format!("vm-test: no vermagic in {}", nvidia_ko.display()))?;
    if !release.ends_with("-cloud-amd64") {
        bail!(
            "vm-test: {} is for {release}, not a Debian cloud kernel",
            nvidia_ko.display()
        );
    }
    eprintln!("vm-test: kernel {release} (from nvidia.ko's vermagic)");
    let version = super::modinfo_value(&ko, "version").unwrap_or_else(|| "0".to_string());
    Ok((release, version))
}

/// The kernel's image and headers, and the headers of the newest other
/// cloud release (bookworm-backports'), which it returns.
fn kernels(stage: &mut Stage, vm: &Path, release: &str) -> Result<String> {
    let mut apt = Apt::new(vm, false)?;
    stage.start(&format!("kernel {release}: image and headers"));
    unpack_kernel(&mut apt, vm, release, true)?;

    stage.start("foreign kernel headers (bookworm-backports)");
    apt.update()?;
    let foreign = newest_cloud_release(&apt.show("linux-headers-cloud-amd64", true)?)
        .filter(|f| *f != release)
        .with_context(|| {
            format!("vm-test: no cloud kernel release other than {release} in bookworm(-backports)")
        })?;
    eprintln!("vm-test: foreign release {foreign}");
    unpack_kernel(&mut apt, vm, &foreign, false)?;
    Ok(foreign)
}

/// Boots `kernel` with `out/initrd.gz`; returns the console log's path.
fn boot(kernel: &Path, out: &Path) -> Result<PathBuf> {
    let console = out.join("console.log");
    let st = super::boot(
        cmd("qemu-system-x86_64")
            .args(["-accel", "tcg", "-m", "1024", "-smp", "1"])
            .args(["-nographic", "-no-reboot", "-kernel"])
            .arg(kernel)
            .arg("-initrd")
            .arg(out.join("initrd.gz"))
            .args(["-append", "console=ttyS0 panic=-1 quiet"]),
        &console,
    )?;
    let Some(st) = st else {
        return Err(super::hung("vm-test", &console, 40, ""));
    };
    eprintln!("vm-test: qemu exit {st}; console in {}", console.display());
    Ok(console)
}

/// Downloads and unpacks linux-headers (and with `image`, linux-image) of
/// `rel` into `<vm>/<rel>/root`; cached whole (`done`).
fn unpack_kernel(apt: &mut Apt, vm: &Path, rel: &str, image: bool) -> Result<()> {
    let dir = vm.join(rel);
    let vmlinuz = dir.join(format!("root/boot/vmlinuz-{rel}"));
    if dir.join("done").is_file() && (!image || vmlinuz.is_file()) {
        return Ok(());
    }
    apt.update()?;
    let headers = format!("linux-headers-{rel}");
    let mut pkgs = vec![headers.clone()];
    pkgs.extend(kernel_deps(&apt.show(&headers, false)?));
    if image {
        pkgs.push(format!("linux-image-{rel}"));
    }
    eprintln!("vm-test: downloading {}", pkgs.join(" "));
    let work = tempfile::Builder::new()
        .prefix(".work.")
        .tempdir_in(vm)
        .with_context(|| format!("creating a directory in {}", vm.display()))?;
    apt.download(work.path(), &pkgs)?;
    super::unpack_debs(work.path())?;
    // Debian's arch headers include the common ones by absolute path;
    // they name the final path, right once the directory is moved there.
    let mk = work
        .path()
        .join(format!("root/usr/src/linux-headers-{rel}/Makefile"));
    let text = String::from_utf8(super::read_bounded(&mk)?)
        .with_context(|| format!("{} is not UTF-8", mk.display()))?;
    let prefix = format!("include {}/root/usr/src/", dir.display());
    super::write_atomic(&mk, rewrite_includes(&text, &prefix).as_bytes())?;
    fs::write(work.path().join("done"), b"")?;
    cache::remove(&dir)?;
    let work = work.keep();
    fs::rename(&work, &dir)
        .with_context(|| format!("renaming {} to {}", work.display(), dir.display()))?;
    Ok(())
}

/// `include /usr/src/…` lines of a headers Makefile with `prefix` instead.
fn rewrite_includes(makefile: &str, prefix: &str) -> String {
    makefile
        .split_inclusive('\n')
        .map(|l| match l.strip_prefix("include /usr/src/") {
            Some(rest) => format!("{prefix}{rest}"),
            None => l.to_string(),
        })
        .collect()
}

/// The installer's own `build` compiles `tests/fixtures/kmod-hello` (laid
/// out as a package's kernel-open/ tree, with NVIDIA's make interface)
/// against `rel`'s headers and packages it as `<out>.tar.zst`: the same
/// machinery as for NVIDIA's modules.
fn build_hello(repo: &Path, bin: &Path, vm: &Path, rel: &str, out: &Path) -> Result<()> {
    let with = |ext: &str| PathBuf::from(format!("{}{ext}", out.display()));
    let (src, build, art, doc) = (
        with(".src"),
        with(".build"),
        with(".tar.zst"),
        with(".build.json"),
    );
    for p in [&src, &build, &art] {
        cache::remove(p)?;
    }
    fs::create_dir_all(src.join("kernel-open"))?;
    fs::create_dir_all(&build)?;
    for f in ["hello.c", "Kbuild", "Makefile"] {
        super::copy(
            &repo.join("tests/fixtures/kmod-hello").join(f),
            &src.join("kernel-open").join(f),
        )?;
    }
    let headers = vm
        .join(rel)
        .join(format!("root/usr/src/linux-headers-{rel}"));
    let built = proc::run_limited(
        cmd(bin)
            .args(["--host-root", "/", "--termination-log", "/dev/null"])
            .args(["--log-level", "warn", "build", "--source"])
            .arg(&src)
            .args([
                "--kernel",
                rel,
                "--flavor",
                "open",
                "--driver-version",
                "1.0",
            ])
            .arg("--headers")
            .arg(&headers)
            .arg("--out")
            .arg(&build)
            .stdout(fs::File::create(&doc)?),
        proc::LONG,
    );
    if let Err(e) = built {
        let d = super::read_bounded(&doc).unwrap_or_default();
        bail!(
            "vm-test: build of hello.ko for {rel} failed: {e:#}\n{}",
            String::from_utf8_lossy(&d)
        );
    }
    super::move_file(&super::tar_zst_in(&build)?, &art)?;
    cache::remove(&src)?;
    cache::remove(&build)
}

/// The manifest of an artifact made here (the build command's layout).
fn manifest(version: &str, rel: &str, modules: &[(String, String)]) -> serde_json::Value {
    let entries: Vec<_> = modules
        .iter()
        .map(|(file, sum)| {
            serde_json::json!({
                "name": file.trim_end_matches(".ko"),
                "file": format!("modules/{file}"),
                "sha256": sum,
            })
        })
        .collect();
    serde_json::json!({
        "schemaVersion": 1,
        "generator": "scripts/vm-test",
        "driverVersion": version,
        "flavor": "open",
        "kernelRelease": rel,
        "modules": entries,
        "firmware": [],
    })
}

/// The build command's artifact layout (manifest.json + modules/*.ko,
/// debug info stripped) as `<dir>.tar.zst`.
fn make_artifact(dir: &Path, version: &str, rel: &str, kos: &[PathBuf]) -> Result<()> {
    let art = PathBuf::from(format!("{}.tar.zst", dir.display()));
    cache::remove(dir)?;
    cache::remove(&art)?;
    fs::create_dir_all(dir.join("modules"))?;
    let mut modules = Vec::new();
    for ko in kos {
        let name = ko
            .file_name()
            .context("a module without a name")?
            .to_string_lossy()
            .into_owned();
        let dest = dir.join("modules").join(&name);
        proc::run(
            cmd("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(&dest)
                .arg(ko),
            proc::SHORT,
        )?;
        let sum = hex::encode(Sha256::digest(super::read_bounded(&dest)?));
        modules.push((name, sum));
    }
    let doc = manifest(version, rel, &modules);
    fs::write(
        dir.join("manifest.json"),
        format!("{}\n", serde_json::to_string(&doc)?),
    )?;
    proc::run(
        cmd("tar")
            .args(["--zstd", "-C"])
            .arg(dir)
            .arg("-cf")
            .arg(&art)
            .args(["manifest.json", "modules"]),
        proc::SHORT,
    )?;
    cache::remove(dir)
}

#[cfg(test)]
mod tests {
    #[test]
    fn headers_makefile_includes_the_cached_tree() {
        // linux-headers-6.1.0-50-cloud-amd64's whole Makefile, and a line
        // that is not an include.
        let mk = "include /usr/src/linux-headers-6.1.0-50-common/Makefile\n\
                  # include /usr/src/not-this\n";
        assert_eq!(
            super::rewrite_includes(mk, "include /c/vm/r/root/usr/src/"),
            "include /c/vm/r/root/usr/src/linux-headers-6.1.0-50-common/Makefile\n\
             # include /usr/src/not-this\n"
        );
    }

    #[test]
    fn artifact_manifest_names_each_module() {
        let m = super::manifest(
            "535.261.03",
            "6.1.0-50-cloud-amd64",
            &[("nvidia-uvm.ko".into(), "ab".into())],
        );
        assert_eq!(m["modules"][0]["name"], "nvidia-uvm");
        assert_eq!(m["modules"][0]["file"], "modules/nvidia-uvm.ko");
        assert_eq!(m["generator"], "scripts/vm-test");
        assert_eq!(m["kernelRelease"], "6.1.0-50-cloud-amd64");
    }
}
