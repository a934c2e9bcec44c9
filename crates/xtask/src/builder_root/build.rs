//! Making a root: debootstrap, the packages (and for arm64 the foreign
//! ones, unpacked), the record of what the archive resolved to, and the
//! rename into place.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use gpu_driver_contract::text::rfc3339_utc;

use super::mounts::{Proc, unmount_below};
use super::{COMPONENTS, META, Spec, parse, sibling};
use crate::cmd::{cmd, read, run};
use crate::pyjson::J;

/// `chroot ROOT env DEBIAN_FRONTEND=noninteractive LC_ALL=C ARGS…`.
fn in_root(root: &Path, args: &[&str]) -> Command {
    let mut c = cmd("chroot");
    c.arg(root)
        .args(["env", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"])
        .args(args);
    c
}

/// Builds `root` in `<root>.tmp` and renames it into place.
pub(super) fn build(spec: &Spec, root: &Path) -> Result<()> {
    let tmp = sibling(root, ".tmp");
    match build_tmp(spec, root, &tmp) {
        Ok(()) => {}
        Err(e) => {
            unmount_below(&tmp)?;
            return Err(e.context(format!(
                "builder root {} not made; partial root left in {}",
                spec.suite,
                tmp.display()
            )));
        }
    }
    eprintln!("==> publish {} root", spec.suite);
    let mut old = None;
    if root.exists() {
        let o = sibling(root, &format!(".old.{}", std::process::id()));
        unmount_below(root)?;
        std::fs::rename(root, &o).with_context(|| format!("moving {} aside", root.display()))?;
        old = Some(o);
    }
    std::fs::rename(&tmp, root)
        .with_context(|| format!("renaming {} to {}", tmp.display(), root.display()))?;
    if let Some(o) = old {
        crate::cache::remove(&o)?;
    }
    Ok(())
}

fn build_tmp(spec: &Spec, root: &Path, tmp: &Path) -> Result<()> {
    eprintln!("==> debootstrap {}", spec.suite);
    if tmp.exists() {
        unmount_below(tmp)?;
        crate::cache::remove(tmp)?;
    }
    debootstrap(spec, root, tmp)?;
    eprintln!("==> apt packages ({})", spec.suite);
    // Some postinst scripts want /proc.
    let proc = Proc::mount(tmp)?;
    // debootstrap writes only the first component to sources.list.
    let sources = format!(
        "deb {} {} {}\n",
        spec.mirror,
        spec.debian_suite,
        COMPONENTS.replace(',', " ")
    );
    std::fs::write(tmp.join("etc/apt/sources.list"), sources)?;
    let mut packages = spec.packages.clone();
    let mut foreign = Vec::new();
    if spec.arch != "amd64" {
        run(&mut in_root(
            tmp,
            &["dpkg", "--add-architecture", spec.arch],
        ))?;
    }
    run(&mut in_root(tmp, &["apt-get", "update", "-qq"]))?;
    if spec.arch != "amd64" {
        let (more, f) = cross_packages(tmp, spec.arch)?;
        packages.extend(more);
        foreign = f;
    }
    let mut install = in_root(
        tmp,
        &["apt-get", "install", "-y", "-qq", "--no-install-recommends"],
    );
    // Its progress on stdout is noise; errors go to stderr.
    let st = install
        .args(&packages)
        .stdout(std::process::Stdio::null())
        .status()
        .context("starting chroot apt-get install")?;
    if !st.success() {
        bail!("apt-get install in {} failed ({st})", tmp.display());
    }
    let unpacked = if foreign.is_empty() {
        Vec::new()
    } else {
        eprintln!("==> unpack {} packages ({})", spec.arch, spec.suite);
        unpack_foreign(tmp, &foreign)?
    };
    run(&mut in_root(tmp, &["apt-get", "clean"]))?;
    crate::cache::remove(&tmp.join("var/lib/apt/lists"))?;
    std::fs::create_dir_all(tmp.join("var/lib/apt/lists"))?;
    eprintln!("==> record versions ({})", spec.suite);
    let requested: Vec<String> = packages
        .iter()
        .chain(&spec.foreign)
        .map(|p| p.split('=').next().unwrap_or(p).to_string())
        .collect();
    let meta = record(spec, root, tmp, &requested, &unpacked)?;
    std::fs::write(tmp.join(META), meta.dump())?;
    proc.unmount();
    Ok(())
}

fn debootstrap(spec: &Spec, root: &Path, tmp: &Path) -> Result<()> {
    let log = sibling(root, ".debootstrap.log");
    let st = cmd("debootstrap")
        .args(["--variant=minbase", &format!("--components={COMPONENTS}")])
        .arg(spec.debian_suite)
        .arg(tmp)
        .arg(&spec.mirror)
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::options().append(true).open(&log)?)
        .status()
        .context("starting debootstrap")?;
    if !st.success() {
        let text = tail(&log, 20);
        bail!("debootstrap {} failed ({st}):\n{text}", spec.suite);
    }
    Ok(())
}

/// The last `lines` lines of a log, read from its last 64 KiB at most.
fn tail(path: &Path, lines: usize) -> String {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut buf = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let _ = f.take(64 * 1024).read_to_end(&mut buf);
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The arm64 headers of the newest cloud ABI and what they need on amd64:
/// the -common headers (arch all) and linux-kbuild at the same version,
/// and the cross compiler of the gcc major their Depends name. Returns the
/// packages to install and the foreign ones to unpack (name:arch=version).
fn cross_packages(tmp: &Path, arch: &str) -> Result<(Vec<String>, Vec<String>)> {
    let meta = format!("linux-headers-cloud-{arch}:{arch}");
    let deps = read(&mut in_root(tmp, &["apt-cache", "depends", &meta]))?;
    let abi = parse::abi_headers(&deps)
        .with_context(|| format!("{meta} depends on no linux-headers-* package"))?;
    let show = read(&mut in_root(
        tmp,
        &[
            "apt-cache",
            "show",
            "--no-all-versions",
            &format!("{abi}:{arch}"),
        ],
    ))?;
    let version = parse::field(&show, "Version").context("no Version")?;
    let depends = parse::field(&show, "Depends").unwrap_or_default();
    let (common, kbuild, gcc) = parse::cross_needs(&depends).with_context(|| {
        format!("cannot read common headers, kbuild and gcc from {abi}'s Depends: {depends}")
    })?;
    Ok((
        vec![
            format!("{common}={version}"),
            format!("{kbuild}={version}"),
            format!("gcc-{gcc}-aarch64-linux-gnu"),
        ],
        vec![
            format!("{abi}:{arch}={version}"),
            format!("nvidia-open-kernel-source:{arch}"),
        ],
    ))
}

/// apt-get download + dpkg-deb -x of `foreign` into the root; returns each
/// one's name, version and architecture.
fn unpack_foreign(tmp: &Path, foreign: &[String]) -> Result<Vec<(String, String, String)>> {
    let dir = tmp.join("var/cache/gpu-driver-foreign");
    let stage = dir.join("x");
    std::fs::create_dir_all(&dir)?;
    let mut dl = in_root(
        tmp,
        &[
            "env",
            "-C",
            "/var/cache/gpu-driver-foreign",
            "apt-get",
            "download",
            "-qq",
        ],
    );
    run(dl.args(foreign))?;
    let mut debs: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    debs.sort();
    let mut out = Vec::new();
    for deb in debs {
        // Through a staging directory: the packages' ./lib must land in the
        // merged-/usr root's usr/lib, not replace its /lib symlink.
        crate::cache::remove(&stage)?;
        std::fs::create_dir_all(&stage)?;
        run(cmd("dpkg-deb").arg("-x").arg(&deb).arg(&stage))?;
        copy_tree(&stage, tmp)?;
        let fields =
            read(
                cmd("dpkg-deb")
                    .arg("-f")
                    .arg(&deb)
                    .args(["Package", "Version", "Architecture"]),
            )?;
        out.push(
            parse::deb_fields(&fields).with_context(|| format!("fields of {}", deb.display()))?,
        );
    }
    crate::cache::remove(&dir)?;
    Ok(out)
}

/// `tar -cf - . | tar -xf - --keep-directory-symlink`, as two processes.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let mut pack = cmd("tar")
        .arg("-C")
        .arg(from)
        .args(["-cf", "-", "."])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting tar")?;
    let st = cmd("tar")
        .arg("-C")
        .arg(to)
        .args(["-xf", "-", "--keep-directory-symlink"])
        .stdin(pack.stdout.take().context("tar's stdout")?)
        .status()?;
    if !st.success() || !pack.wait()?.success() {
        bail!("copying {} into {} failed", from.display(), to.display());
    }
    Ok(())
}

/// The root's module sources (each checked to be there) and its gcc: the
/// cross gcc of the kernel's major for arm64, as the installer will choose
/// it.
fn sources_and_gcc(
    spec: &Spec,
    tmp: &Path,
    src: &Path,
    krel: &str,
) -> Result<(Vec<(String, J)>, String)> {
    let headers = src.join(format!("linux-headers-{krel}"));
    let (sources, gcc) = if spec.arch == "amd64" {
        let v = read(&mut in_root(tmp, &["gcc", "--version"]))?;
        (vec!["open", "proprietary"], v)
    } else {
        // The cross gcc of the kernel's major, as the installer will choose it.
        let config = std::fs::read_to_string(headers.join(".config"))?;
        let major = parse::cc_major(&config).context("no gcc in the headers' .config")?;
        let v = read(&mut in_root(
            tmp,
            &[&format!("aarch64-linux-gnu-gcc-{major}"), "--version"],
        ))?;
        // The headers' scripts/ and tools/ must reach the amd64 kbuild.
        if !headers.join("scripts/Makefile.build").is_file() {
            bail!("linux-headers-{krel}/scripts does not lead to an installed linux-kbuild");
        }
        (vec!["open"], v)
    };
    let mut src_obj = Vec::new();
    for s in &sources {
        let file = if *s == "open" {
            "nvidia-open-kernel.tar.xz"
        } else {
            "nvidia-kernel.tar.xz"
        };
        if !src.join(file).is_file() {
            bail!("{} missing", src.join(file).display());
        }
        src_obj.push((s.to_string(), J::str(format!("/usr/src/{file}"))));
    }
    Ok((src_obj, gcc))
}

/// The root's record: what was asked for and what it resolved to.
fn record(
    spec: &Spec,
    root: &Path,
    tmp: &Path,
    requested: &[String],
    unpacked: &[(String, String, String)],
) -> Result<J> {
    let src = tmp.join("usr/src");
    let names: Vec<String> = std::fs::read_dir(&src)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    let krel =
        parse::newest_release(names.iter().map(String::as_str), spec.arch).with_context(|| {
            format!(
                "no linux-headers-*-cloud-{} in {}",
                spec.arch,
                src.display()
            )
        })?;
    let (src_obj, gcc) = sources_and_gcc(spec, tmp, &src, &krel)?;
    let query = read(&mut in_root(
        tmp,
        &[
            "dpkg-query",
            "-W",
            "-f",
            "${db:Status-Abbrev}\t${Package}\t${Version}\n",
        ],
    ))?;
    let installed = parse::installed(&query);
    let key = root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let key = key.rsplit('-').next().unwrap_or_default().to_string();
    let strs = |v: &[String]| J::Arr(v.iter().map(J::str).collect());
    Ok(J::Obj(vec![
        ("suite".into(), J::str(&spec.suite)),
        ("key".into(), J::str(key)),
        (
            "created".into(),
            J::str(rfc3339_utc(std::time::SystemTime::now())),
        ),
        ("mirror".into(), J::str(&spec.mirror)),
        (
            "components".into(),
            J::Arr(COMPONENTS.split(',').map(J::str).collect()),
        ),
        ("requested".into(), strs(requested)),
        ("arch".into(), J::str(spec.arch)),
        ("kernelRelease".into(), J::str(&krel)),
        ("gcc".into(), J::str(gcc.lines().next().unwrap_or_default())),
        ("sources".into(), J::Obj(src_obj)),
        (
            "packages".into(),
            parse::recorded_packages(requested, &krel, &installed, unpacked),
        ),
    ]))
}
