//! The VM tests' host side (`scripts/vm-test`, `scripts/vm-test-arm64`,
//! `scripts/vm-test-secureboot`): each boots a real Debian cloud kernel
//! under QEMU (TCG) with the static installer in an initramfs whose /init
//! is shell (`tests/vm-init.sh`, `tests/vm-init-secureboot.sh`, with
//! `tests/vm-step.sh`). No mocks. The VM prints each step's result on the
//! serial console; `tests/it/vm.rs` (with `xtask::vmlog`'s checks) judges
//! it from a tools file naming the console log and the releases.
//!
//! Shared here: Debian's kernel .debs fetched with a private apt
//! configuration (`apt.rs`) and unpacked under `<cache>/vm/<release>/root`
//! (arm64's under `<cache>/vm/arm64/<release>`; the archive is
//! `GPU_DRIVER_DEBIAN_MIRROR`), the initramfs, the QEMU run with its
//! deadline (600 s: a VM that hangs instead of powering off is stopped),
//! the tools file and the assertions' test run. One file per test:
//! `x86.rs`, `arm64.rs`, `secureboot.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use crate::cmd::{cmd, show};
pub(crate) use crate::stages::Stage;

mod apt;
mod arm64;
mod proc;
mod secureboot;
mod x86;

pub use arm64::{Args as Arm64Args, run as arm64};
pub use secureboot::{Args as SecureBootArgs, run as secure_boot};
pub use x86::{Args as X86Args, run as x86};

/// Stops a VM that hangs instead of powering off.
const VM_LIMIT: Duration = Duration::from_secs(600);

/// The largest module or manifest read into memory.
const MAX_READ: u64 = 1 << 30;

/// Writes `bytes` to a temporary file beside `path`, then renames it.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().context("a file path without a directory")?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The tools file the assertions read, as pretty JSON.
fn write_tools(path: &Path, doc: &impl Serialize) -> Result<()> {
    let mut s = serde_json::to_vec_pretty(doc)?;
    s.push(b'\n');
    write_atomic(path, &s)
}

/// Reads a file of at most `MAX_READ` bytes.
fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    let len = fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if len > MAX_READ {
        bail!("{} is {len} bytes, more than {MAX_READ}", path.display());
    }
    fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// The value of the first string `KEY=…` in a module file, as `strings -a`
/// finds it (a run of at least 4 printable bytes): .modinfo's entries.
fn modinfo_value(bytes: &[u8], key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    bytes
        .split(|b| !(b.is_ascii_graphic() || *b == b' ' || *b == b'\t'))
        .filter(|run| run.len() >= 4)
        .find_map(|run| run.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The kernel release a module is for: the first word of its vermagic.
fn vermagic_release(bytes: &[u8]) -> Option<String> {
    let v = modinfo_value(bytes, "vermagic")?;
    let first = v.split(' ').next().unwrap_or_default();
    (!first.is_empty()).then(|| first.to_string())
}

/// An artifact's manifest.json, as text.
fn artifact_manifest(artifact: &Path) -> Result<String> {
    proc::read(
        cmd("tar")
            .arg("--zstd")
            .arg("-xOf")
            .arg(artifact)
            .arg("manifest.json"),
        proc::SHORT,
        16 << 20,
    )
}

/// The manifest's `kernelRelease` (empty when absent). With `signed`, a
/// manifest without a signer is an error.
fn manifest_release(manifest: &str, signed: bool) -> Result<String> {
    let v: serde_json::Value = serde_json::from_str(manifest).context("parsing manifest.json")?;
    if signed && v.get("signer").is_none_or(|s| s.is_null()) {
        bail!("the artifact is not signed");
    }
    Ok(v["kernelRelease"].as_str().unwrap_or_default().to_string())
}

/// Unpacks every .deb in `dir` into `dir/root` and deletes the .debs.
fn unpack_debs(dir: &Path) -> Result<()> {
    let root = dir.join("root");
    fs::create_dir_all(&root)?;
    let mut debs: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    debs.sort();
    for d in &debs {
        proc::run(cmd("dpkg-deb").arg("-x").arg(d).arg(&root), proc::SHORT)?;
        fs::remove_file(d)?;
    }
    Ok(())
}

/// The initramfs: `root`'s tree as a gzip'd newc cpio at `out`.
fn initramfs(root: &Path, out: &Path) -> Result<()> {
    let tmp = out.with_extension("gz.tmp");
    let mut find = cmd("find")
        .arg(".")
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting find")?;
    let mut cpio = cmd("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(root)
        .stdin(find.stdout.take().context("find's stdout")?)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cpio")?;
    // Spawned, not run_limited: that gives its child a null stdin.
    let mut gzip = cmd("gzip")
        .arg("-1")
        .stdin(cpio.stdout.take().context("cpio's stdout")?)
        .stdout(fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?)
        .spawn()
        .context("starting gzip")?;
    for (name, child) in [
        ("find", &mut find),
        ("cpio", &mut cpio),
        ("gzip", &mut gzip),
    ] {
        match proc::wait(child, proc::SHORT)? {
            Some(st) if st.success() => {}
            st => bail!("{name} of {} failed ({st:?})", root.display()),
        }
    }
    fs::rename(&tmp, out).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("{} ({} bytes)", out.display(), fs::metadata(out)?.len());
    Ok(())
}

/// Boots `qemu` with its console (stdout and stderr) in `console`; the
/// VM gets `VM_LIMIT`. `None`: it did not power off in time.
fn boot(qemu: &mut Command, console: &Path) -> Result<Option<ExitStatus>> {
    let log =
        fs::File::create(console).with_context(|| format!("creating {}", console.display()))?;
    qemu.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut child = qemu
        .spawn()
        .with_context(|| format!("starting {}", show(qemu)))?;
    proc::wait(&mut child, VM_LIMIT)
}

/// The error of a VM that did not power off (in time, or, with `exit`,
/// that QEMU left so), with the console's tail.
fn hung(prefix: &str, console: &Path, lines: usize, exit: &str) -> anyhow::Error {
    let text = read_bounded(console)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let tail = all[all.len().saturating_sub(lines)..].join("\n");
    let why = if exit.is_empty() {
        format!("within {}s", VM_LIMIT.as_secs())
    } else {
        format!("(qemu: {exit})")
    };
    anyhow::anyhow!(
        "{prefix}: the VM did not power off {why} (console: {}); its last lines:\n{tail}",
        console.display()
    )
}

/// Copies `from` to `to` (both files).
fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .map(|_| ())
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))
}

fn chmod(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// The initramfs' common tree in `r`: the directories /init expects, a
/// static busybox, the installer, os-release (the VM kernel's Debian's if
/// its root has one, else this machine's), /init and its step runner.
fn initrd_base(repo: &Path, r: &Path, busybox: &Path, bin: &Path, os_release: &Path) -> Result<()> {
    for d in ["bin", "etc", "proc", "sys", "dev", "run", "tmp", "var"] {
        fs::create_dir_all(r.join(d))?;
    }
    copy(busybox, &r.join("bin/busybox"))?;
    copy(bin, &r.join("bin/gpu-driver-installer"))?;
    if copy(os_release, &r.join("etc/os-release")).is_err() {
        copy(Path::new("/usr/lib/os-release"), &r.join("etc/os-release"))?;
    }
    copy(&repo.join("tests/vm-step.sh"), &r.join("vm-step.sh"))?;
    chmod(&r.join("bin/busybox"), 0o755)
}

/// Lists `dir`'s files and sizes on stderr (what goes into the VM).
fn list(dir: &Path) -> Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?.filter_map(|e| e.ok()).collect();
    names.sort_by_key(|e| e.file_name());
    for e in names {
        eprintln!("{:>12} {}", e.metadata()?.len(), e.path().display());
    }
    Ok(())
}

/// Moves a file, across file systems too.
fn move_file(from: &Path, to: &Path) -> Result<()> {
    if fs::rename(from, to).is_err() {
        copy(from, to)?;
        fs::remove_file(from)?;
    }
    Ok(())
}

/// The one `*.tar.zst` in `dir`.
fn tar_zst_in(dir: &Path) -> Result<PathBuf> {
    fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".tar.zst"))
        .with_context(|| format!("no .tar.zst in {}", dir.display()))
}

/// The static installer (with the operator, in one cargo call as every
/// caller builds them, so their shared dependencies compile once).
fn static_installer(repo: &Path) -> Result<PathBuf> {
    let bins = crate::static_build::build(
        repo,
        &["gpu-driver-installer", "gpu-driver-operator"],
        crate::static_build::Arch::X86_64,
    )?;
    Ok(fs::canonicalize(&bins[0])?)
}

/// The assertions: `tests/it/vm.rs`'s `test` on the console named in
/// `tools`.
fn assertions(repo: &Path, tools: &Path, test: &str) -> Result<()> {
    proc::run(
        cmd("cargo")
            .current_dir(repo)
            .args(["test", "--locked", "--workspace", "--test", "it", test])
            .args([
                "--",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("GPU_DRIVER_TOOLS", tools),
        proc::LONG,
    )
}

/// A path the caller named, made absolute against the working directory.
fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(std::path::absolute(p)?)
}

#[cfg(test)]
mod tests {
    /// The end of nvidia.ko's .modinfo (535.261.03 for 6.1.0-50-cloud-amd64),
    /// behind other bytes of the file.
    const MODINFO: &[u8] = b"\x7fELF\x02\x01\x01\x00\x00\x00NVreg_\x00\x01\x02\
import_ns=DMA_BUF\x00alias=char-major-195-*\x00version=535.261.03\x00\
supported=external\x00license=Dual MIT/GPL\x00\
parm=NvSwitchBlacklist:NvSwitchBlacklist=uuid[,uuid...]\x00\
srcversion=B5C8059AF6B6CFDF45E832F\x00depends=\x00retpoline=Y\x00name=nvidia\x00\
vermagic=6.1.0-50-cloud-amd64 SMP preempt mod_unload modversions \x00";

    #[test]
    fn vermagic_and_version_of_a_module() {
        assert_eq!(
            super::vermagic_release(MODINFO).as_deref(),
            Some("6.1.0-50-cloud-amd64")
        );
        assert_eq!(
            super::modinfo_value(MODINFO, "version").as_deref(),
            Some("535.261.03")
        );
        assert_eq!(super::vermagic_release(b"\x00vermagic=\x00"), None);
        assert_eq!(super::modinfo_value(b"no modinfo", "version"), None);
    }

    #[test]
    fn release_from_a_manifest() {
        let signed = r#"{"schemaVersion":2,"kernelRelease":"6.1.0-50-cloud-amd64",
            "signer":{"subject":"CN=gpu-driver CI test MOK","sha256":"36d2"}}"#;
        let plain = r#"{"schemaVersion":2,"kernelRelease":"6.1.0-50-cloud-arm64"}"#;
        let release = |m, s| super::manifest_release(m, s).map_err(|e| e.to_string());
        assert_eq!(release(signed, true).unwrap(), "6.1.0-50-cloud-amd64");
        assert_eq!(release(plain, false).unwrap(), "6.1.0-50-cloud-arm64");
        assert_eq!(
            release(plain, true).unwrap_err(),
            "the artifact is not signed"
        );
        assert_eq!(release("{}", false).unwrap(), "");
    }
}
