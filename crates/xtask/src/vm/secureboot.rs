//! `scripts/vm-test-secureboot`: Debian's Secure Boot chain under QEMU
//! (TCG), from Debian's archive only (OVMF with Secure Boot and
//! Microsoft's keys enrolled, shim-signed, grub-efi-amd64-signed, Debian's
//! signed cloud kernel), with the test key pre-enrolled as a Machine Owner
//! Key (virt-fw-vars from PyPI's virt-firmware, in a venv: no MokManager
//! step), and the static installer installing what its own `build` signed.
//!
//! NVIDIA_ARTIFACT is a build artifact of NVIDIA's modules for the VM's
//! kernel, signed with MOK_KEY/MOK_CERT (PEM) by `build --signing-key
//! --signing-cert`. kmod-hello is built here by the installer three times,
//! in the bookworm builder root: signed with the MOK, signed with another
//! key, unsigned.
//!
//! Checked (`tests/it/vm.rs` `vm_secure_boot_results`): Secure Boot on,
//! read by the installer's detect from a real efivarfs, with the lockdown;
//! the kernel locked down (integrity); the MOK loaded (the .machine
//! keyring); the signed nvidia.ko past the signature check
//! (ModuleLoadFailed, ENODEV, "No NVIDIA GPU found"); the MOK-signed hello
//! installs; the one signed with another key is ModuleKeyRejected (the
//! kernel's EKEYREJECTED) naming its certificate's fingerprint and
//! mokutil; the unsigned one is ModuleSignatureRequired before anything is
//! loaded.
//!
//! Needs the kernel `scripts/vm-test` downloaded (`<cache>/vm/<release>/`)
//! and the bookworm builder root. The firmware packages and the
//! virt-firmware venv are cached under `<cache>/secureboot`; the console
//! log, signers and tools.json (the test's inputs) go to
//! target/vm-test-secureboot.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use super::{Stage, proc};
use crate::apt::{self as packages, Need};
use crate::cache::{self, Cache};
use crate::cmd::{cmd, on_path};

/// The firmware and boot chain, from Debian's archive.
const DEBS: [&str; 4] = [
    "ovmf",
    "shim-signed",
    "grub-efi-amd64-signed",
    "shim-helpers-amd64-signed",
];

const TOOLS: &[Need] = &[("zstd", "zstd"), ("openssl", "openssl"), ("cpio", "cpio")];

/// shim's vendor GUID for the MOK list (`MokListRT`).
const SHIM_GUID: &str = "605dab50-e046-4300-abb6-3dd810dd8b23";

const GRUB_CFG: &str = "set timeout=0\nmenuentry vm {\n  linux /vmlinuz console=ttyS0 panic=-1 quiet\n  initrd /initrd.gz\n}\n";

#[derive(clap::Args)]
pub struct Args {
    /// NVIDIA's modules for the VM's kernel, signed by `build
    /// --signing-key MOK_KEY --signing-cert MOK_CERT`.
    nvidia_artifact: PathBuf,
    /// The Machine Owner Key (PEM) that is enrolled.
    mok_key: PathBuf,
    /// Its certificate (PEM).
    mok_cert: PathBuf,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolsFile {
    sb_log: PathBuf,
    sb_mok: PathBuf,
    sb_other: PathBuf,
    vm_release: String,
}

pub fn run(repo: &Path, args: Args) -> Result<()> {
    let [artifact, mok_key, mok_cert] = inputs(&args)?;
    packages::ensure(&[&[("zstd", "zstd")]])?;
    // The kernel the artifact was built for is the one booted.
    let release = super::manifest_release(&super::artifact_manifest(&artifact)?, true)
        .with_context(|| format!("vm-test-secureboot: {}", artifact.display()))?;
    let cache = Cache::resolve()?;
    let kroot = cache.root().join("vm").join(&release).join("root");
    let kernel = kroot.join(format!("boot/vmlinuz-{release}"));
    let efivarfs = kroot.join(format!(
        "lib/modules/{release}/kernel/fs/efivarfs/efivarfs.ko"
    ));
    if !kernel.is_file() || !efivarfs.is_file() {
        bail!(
            "vm-test-secureboot: no {release} kernel in {}: run scripts/vm-test first",
            cache.root().join("vm").display()
        );
    }
    let mut stage = Stage::new(Path::new("."));
    stage.start("packages (apt-get download: ovmf, shim-signed, grub-efi-amd64-signed, shim-helpers-amd64-signed)");
    packages::ensure(&[packages::VM, TOOLS])?;
    let sb = cache.dir("secureboot")?;
    let x = firmware(&sb)?;
    let venv = virt_firmware(&sb)?;

    stage.start(
        "kmod-hello: the installer's build, signed with the MOK, with another key, unsigned",
    );
    let bin = super::static_installer(repo)?;
    let out = repo.join("target/vm-test-secureboot");
    cache::remove(&out)?;
    for d in [
        "esp/EFI/BOOT",
        "esp/EFI/debian",
        "initrd/bin",
        "initrd/artifacts",
    ] {
        fs::create_dir_all(out.join(d))?;
    }
    let out = fs::canonicalize(&out)?;
    other_key(&out)?;
    hello_builds(repo, &bin, &release, &out, &mok_key, &mok_cert)?;
    super::copy(&artifact, &out.join("initrd/artifacts/nvidia.tar.zst"))?;
    signers(&bin, &mok_cert, &out)?;
    super::list(&out.join("initrd/artifacts"))?;

    stage.start("ESP, initramfs, firmware variables");
    esp(&out, &x, &kernel)?;
    initrd(
        repo,
        &out,
        &bin,
        &efivarfs,
        &kroot.join("usr/lib/os-release"),
    )?;
    vars(&venv, &x, &out)?;

    stage.start("boot under OVMF with Secure Boot (tcg)");
    boot(&out, &x)?;

    stage.start("assertions");
    let tools = out.join("tools.json");
    super::write_tools(
        &tools,
        &ToolsFile {
            sb_log: out.join("console.log"),
            sb_mok: out.join("mok.json"),
            sb_other: out.join("other.json"),
            vm_release: release,
        },
    )?;
    super::assertions(repo, &tools, "vm::vm_secure_boot_results")?;
    stage.end();
    Ok(())
}

/// The three inputs, absolute, each an existing file.
fn inputs(args: &Args) -> Result<[PathBuf; 3]> {
    let mut inputs = Vec::new();
    for p in [&args.nvidia_artifact, &args.mok_key, &args.mok_cert] {
        let p = super::absolute(p)?;
        if !p.is_file() {
            bail!("vm-test-secureboot: {} does not exist", p.display());
        }
        inputs.push(fs::canonicalize(&p)?);
    }
    Ok(<[PathBuf; 3]>::try_from(inputs).expect("three inputs"))
}

/// The firmware's variable store with Secure Boot on and the MOK (its DER
/// in `out/mok.der`) in shim's MOK list.
fn vars(venv: &Path, x: &Path, out: &Path) -> Result<()> {
    proc::run(
        cmd(venv.join("bin/virt-fw-vars"))
            .arg("--input")
            .arg(x.join("usr/share/OVMF/OVMF_VARS_4M.ms.fd"))
            .arg("--output")
            .arg(out.join("vars.fd"))
            .args(["--add-mok", SHIM_GUID])
            .arg(out.join("mok.der"))
            .arg("--secure-boot"),
        proc::SHORT,
    )
}

/// The firmware and boot chain's packages (the system's apt sources),
/// unpacked in `<sb>/x`; cached (`x/.done`).
fn firmware(sb: &Path) -> Result<PathBuf> {
    let (debs, x) = (sb.join("debs"), sb.join("x"));
    fs::create_dir_all(&debs)?;
    fs::create_dir_all(&x)?;
    if !x.join(".done").is_file() {
        proc::run(
            cmd("apt-get").current_dir(&debs).arg("download").args(DEBS),
            proc::NETWORK,
        )?;
        for e in fs::read_dir(&debs)? {
            let d = e?.path();
            if d.extension().is_some_and(|x| x == "deb") {
                proc::run(cmd("dpkg-deb").arg("-x").arg(&d).arg(&x), proc::SHORT)?;
            }
        }
        fs::write(x.join(".done"), b"")?;
    }
    Ok(x)
}

/// A venv with PyPI's virt-firmware (virt-fw-vars), in `<sb>/venv`.
fn virt_firmware(sb: &Path) -> Result<PathBuf> {
    let venv = sb.join("venv");
    if crate::cmd::is_executable(&venv.join("bin/virt-fw-vars")) {
        return Ok(venv);
    }
    cache::remove(&venv)?;
    let python = if on_path("python3") {
        "python3"
    } else {
        "/usr/bin/python3"
    };
    let made = proc::run(cmd(python).args(["-m", "venv"]).arg(&venv), proc::SHORT);
    if made.is_err() {
        // Debian's python3 needs python3-venv for a venv (ensurepip).
        cache::remove(&venv)?;
        packages::ensure(&[&[("/usr/share/doc/python3-venv", "python3-venv")]])?;
        proc::run(
            cmd("/usr/bin/python3").args(["-m", "venv"]).arg(&venv),
            proc::SHORT,
        )?;
    }
    proc::run(
        cmd(venv.join("bin/pip")).args(["install", "-q", "virt-firmware"]),
        proc::NETWORK,
    )?;
    Ok(venv)
}

/// The key the kernel does not trust, with its certificate.
fn other_key(out: &Path) -> Result<()> {
    proc::run(
        cmd("openssl")
            .args(["req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes"])
            .args(["-days", "2", "-subj", "/CN=gpu-driver vm-test other key/"])
            .arg("-keyout")
            .arg(out.join("other.key"))
            .arg("-out")
            .arg(out.join("other.crt")),
        proc::SHORT,
    )
}

/// A job directory in the builder root, removed when dropped.
struct Job(PathBuf);

impl Drop for Job {
    fn drop(&mut self) {
        let _ = cache::remove(&self.0);
    }
}

/// kmod-hello by the installer's build in the bookworm builder root:
/// signed with the MOK, with the other key, unsigned.
fn hello_builds(
    repo: &Path,
    bin: &Path,
    release: &str,
    out: &Path,
    mok_key: &Path,
    mok_cert: &Path,
) -> Result<()> {
    let broot = crate::cmd::read_last_line(cmd(repo.join("scripts/builder-root")).arg("bookworm"))?;
    let broot = PathBuf::from(broot);
    let name = format!("build-dev/vm-test-secureboot-{}", std::process::id());
    let job = Job(broot.join(&name));
    cache::remove(&job.0)?;
    fs::create_dir_all(job.0.join("src/kernel-open"))?;
    for f in ["hello.c", "Kbuild", "Makefile"] {
        super::copy(
            &repo.join("tests/fixtures/kmod-hello").join(f),
            &job.0.join("src/kernel-open").join(f),
        )?;
    }
    for (key, to) in [(mok_key, "mok.key"), (&out.join("other.key"), "other.key")] {
        super::copy(key, &job.0.join(to))?;
        super::chmod(&job.0.join(to), 0o400)?;
    }
    super::copy(mok_cert, &job.0.join("mok.crt"))?;
    super::copy(&out.join("other.crt"), &job.0.join("other.crt"))?;
    super::copy(bin, &job.0.join("gpu-driver-installer"))?;
    let inner = format!("/{name}");
    let signed = |k: &str| {
        vec![
            "--signing-key".to_string(),
            format!("{inner}/{k}.key"),
            "--signing-cert".to_string(),
            format!("{inner}/{k}.crt"),
        ]
    };
    for (art, signing) in [
        ("hello-mok", signed("mok")),
        ("hello-other", signed("other")),
        ("hello-unsigned", Vec::new()),
    ] {
        build_hello(&broot, &inner, release, out, art, &signing)?;
        let built = super::tar_zst_in(&job.0.join(format!("out-{art}")))?;
        super::move_file(&built, &out.join(format!("initrd/artifacts/{art}.tar.zst")))?;
    }
    Ok(())
}

/// One `build` in the root (its /proc mounted in a private namespace,
/// the root's lock shared), its result document in `out/build-NAME.json`.
fn build_hello(
    broot: &Path,
    inner: &str,
    release: &str,
    out: &Path,
    name: &str,
    signing: &[String],
) -> Result<()> {
    let mut lock = broot.as_os_str().to_owned();
    lock.push(".lock");
    let mut mount_proc = OsString::from("--mount-proc=");
    mount_proc.push(broot.join("proc"));
    let doc = out.join(format!("build-{name}.json"));
    let built = proc::run_limited(
        cmd("flock")
            .arg("-s")
            .arg(lock)
            .arg("unshare")
            .arg(mount_proc)
            .args(["--", "chroot"])
            .arg(broot)
            .arg(format!("{inner}/gpu-driver-installer"))
            .args(["--host-root", "/", "--termination-log", "/dev/null"])
            .args(["--log-level", "warn", "build", "--source"])
            .arg(format!("{inner}/src"))
            .args([
                "--kernel",
                release,
                "--flavor",
                "open",
                "--driver-version",
                "1.0",
            ])
            .arg("--out")
            .arg(format!("{inner}/out-{name}"))
            .args(signing)
            .stdout(fs::File::create(&doc)?),
        proc::LONG,
    );
    if let Err(e) = built {
        let d = super::read_bounded(&doc).unwrap_or_default();
        bail!(
            "vm-test-secureboot: build of {name} failed: {e:#}\n{}",
            String::from_utf8_lossy(&d)
        );
    }
    Ok(())
}

/// The DER a host enrolls and both signers' documents, by the installer's
/// own signing-cert command.
fn signers(bin: &Path, mok_cert: &Path, out: &Path) -> Result<()> {
    proc::run_limited(
        cmd(bin)
            .args(["signing-cert", "--signing-cert"])
            .arg(mok_cert)
            .arg("--out")
            .arg(out.join("mok.der"))
            .stdout(fs::File::create(out.join("mok.json"))?),
        proc::SHORT,
    )?;
    proc::run_limited(
        cmd(bin)
            .args(["signing-cert", "--signing-cert"])
            .arg(out.join("other.crt"))
            .stdout(fs::File::create(out.join("other.json"))?),
        proc::SHORT,
    )
}

/// The EFI system partition: shim as the fallback loader, MokManager,
/// grub with its config (where grub looks for it either way), the kernel.
fn esp(out: &Path, x: &Path, kernel: &Path) -> Result<()> {
    let boot = out.join("esp/EFI/BOOT");
    super::copy(
        &x.join("usr/lib/shim/shimx64.efi.signed"),
        &boot.join("BOOTX64.EFI"),
    )?;
    super::copy(
        &x.join("usr/lib/shim/mmx64.efi.signed"),
        &boot.join("mmx64.efi"),
    )?;
    super::copy(
        &x.join("usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"),
        &boot.join("grubx64.efi"),
    )?;
    fs::write(boot.join("grub.cfg"), GRUB_CFG)?;
    fs::write(out.join("esp/EFI/debian/grub.cfg"), GRUB_CFG)?;
    super::copy(kernel, &out.join("esp/vmlinuz"))
}

/// The initramfs on the ESP: /init is `tests/vm-init-secureboot.sh`, with
/// efivarfs.ko to mount the firmware's variables.
fn initrd(repo: &Path, out: &Path, bin: &Path, efivarfs: &Path, os_release: &Path) -> Result<()> {
    let r = out.join("initrd");
    super::initrd_base(repo, &r, Path::new("/bin/busybox"), bin, os_release)?;
    super::copy(efivarfs, &r.join("efivarfs.ko"))?;
    super::copy(&repo.join("tests/vm-init-secureboot.sh"), &r.join("init"))?;
    super::chmod(&r.join("init"), 0o755)?;
    super::initramfs(&r, &out.join("esp/initrd.gz"))
}

/// Boots OVMF with Secure Boot (SMM, the secure flash) from the ESP; a
/// VM that fails or does not power off in time is an error.
fn boot(out: &Path, x: &Path) -> Result<()> {
    let console = out.join("console.log");
    let mut code = OsString::from("if=pflash,format=raw,unit=0,file=");
    code.push(x.join("usr/share/OVMF/OVMF_CODE_4M.secboot.fd"));
    code.push(",readonly=on");
    let mut vars = OsString::from("if=pflash,format=raw,unit=1,file=");
    vars.push(out.join("vars.fd"));
    let mut esp = OsString::from("file=fat:rw:");
    esp.push(out.join("esp"));
    esp.push(",format=raw");
    let st = super::boot(
        cmd("qemu-system-x86_64")
            .args(["-machine", "q35,smm=on", "-accel", "tcg", "-m", "2048"])
            .args(["-smp", "1", "-nographic", "-no-reboot"])
            .args(["-global", "driver=cfi.pflash01,property=secure,value=on"])
            .arg("-drive")
            .arg(code)
            .arg("-drive")
            .arg(vars)
            .arg("-drive")
            .arg(esp),
        &console,
    )?;
    match st {
        Some(st) if st.success() => Ok(()),
        Some(st) => Err(super::hung(
            "vm-test-secureboot",
            &console,
            30,
            &st.to_string(),
        )),
        None => Err(super::hung("vm-test-secureboot", &console, 30, "")),
    }
}
