//! NVIDIA's user space (nvidia-smi, libnvidia-ml, libcuda, …): chosen from a
//! `.run`'s `.manifest` at build time, carried in the artifact under a
//! root-filesystem layout (`usr/bin`, `usr/lib/<triplet>`), and registered
//! on the host at install time (`ld.so.conf.d`, ldconfig,
//! `/run/nvidia/driver`, written through [`crate::confined_fs`]).
//!
//! Only what a headless compute node needs is taken: utilities, the NVML,
//! CUDA, OpenCL and video-codec libraries and their SONAME links. OpenGL,
//! X, Vulkan, 32-bit compat and documentation entries are left out.

use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::confined_fs::{HostFs, Kind};
use crate::error::{Error, Failure, Result};
use crate::host_root::HostRoot;
use crate::node::CpuArch;

/// Utilities, inside the artifact and the driver root.
pub(crate) const BIN_DIR: &str = "usr/bin";
/// The ld.so.conf.d entry install writes on the host.
pub(crate) const LD_SO_CONF: &str = "/etc/ld.so.conf.d/gpu-driver.conf";
/// Where the NVIDIA GPU Operator's container toolkit and device plugin look
/// for a containerized driver's root filesystem.
pub(crate) const RUN_NVIDIA_DRIVER: &str = "/run/nvidia/driver";

pub(crate) use gpu_driver_contract::layout::lib_dir;

/// [`lib_dir`] of another architecture (a cross build's target).
pub(crate) fn lib_dir_for(arch: CpuArch) -> String {
    format!("usr/lib/{}", arch.gnu_triplet())
}

/// One entry of NVIDIA's `.manifest`: `name perms TYPE [fields…]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DotManifestEntry {
    pub name: String,
    pub mode: u32,
    pub kind: String,
    /// The fields after the type, without the trailing `MODULE:…`.
    pub fields: Vec<String>,
}

/// Parses a `.manifest`: the header lines (description, version, …) are
/// skipped by shape; an entry has an octal mode and an upper-case type.
pub(crate) fn parse_dot_manifest(text: &str) -> Vec<DotManifestEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(name), Some(mode), Some(kind)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let Ok(mode) = u32::from_str_radix(mode, 8) else {
            continue;
        };
        if mode > 0o7777
            || !kind
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            continue;
        }
        let fields = words
            .filter(|w| !w.starts_with("MODULE:"))
            .map(str::to_string)
            .collect();
        out.push(DotManifestEntry {
            name: name.to_string(),
            mode,
            kind: kind.to_string(),
            fields,
        });
    }
    out
}

/// What goes into the artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    /// A file of the package (`src`, relative to the `.manifest`'s
    /// directory) at `dest` in the artifact.
    File {
        src: String,
        dest: String,
        mode: u32,
    },
    /// A symbolic link at `dest` to `target` (a name in the same directory).
    Link { dest: String, target: String },
}

/// nvidia-smi (UTILITY_BINARY) and nvidia-modprobe (NVIDIA_MODPROBE,
/// set-uid in the package; placed without the bit, as everything here):
/// tools that create device nodes on demand (MIG, NVSwitch) run it.
const BINARIES: &[&str] = &["UTILITY_BINARY", "NVIDIA_MODPROBE"];
const LIBRARIES: &[&str] = &[
    "UTILITY_LIB",
    "CUDA_LIB",
    "OPENCL_LIB",
    "NVCUVID_LIB",
    "ENCODEAPI_LIB",
];
const LIB_LINKS: &[&str] = &[
    "UTILITY_LIB_SYMLINK",
    "CUDA_SYMLINK",
    "OPENCL_LIB_SYMLINK",
    "NVCUVID_LIB_SYMLINK",
    "ENCODEAPI_LIB_SYMLINK",
];
const BIN_LINKS: &[&str] = &["UTILITY_BIN_SYMLINK"];

/// A relative path of plain components only.
fn safe_relative(p: &str) -> bool {
    !p.is_empty()
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

fn base_name(p: &str) -> Option<&str> {
    Path::new(p).file_name().and_then(|n| n.to_str())
}

/// The compute user space of a `.manifest`, in its order. Entries with an
/// unsafe path or link target are dropped (with a warning): the manifest
/// comes from a downloaded package and must not place files outside the
/// driver root. Libraries go to `lib` ([`lib_dir_for`] the package's
/// architecture).
pub(crate) fn select(entries: &[DotManifestEntry], lib: &str) -> Vec<Placement> {
    let mut out = Vec::new();
    for e in entries {
        let kind = e.kind.as_str();
        // Library entries name their architecture first; 32-bit compat
        // libraries serve no compute container.
        let arch_ok = e.fields.first().is_none_or(|a| a != "COMPAT32");
        let Some(name) = base_name(&e.name).filter(|_| safe_relative(&e.name)) else {
            tracing::warn!("ignoring .manifest entry {:?}: not a safe path", e.name);
            continue;
        };
        if BINARIES.contains(&kind) {
            out.push(Placement::File {
                src: e.name.clone(),
                dest: format!("{BIN_DIR}/{name}"),
                mode: 0o755,
            });
        } else if LIBRARIES.contains(&kind) && arch_ok {
            out.push(Placement::File {
                src: e.name.clone(),
                dest: format!("{lib}/{name}"),
                mode: 0o755,
            });
        } else if (LIB_LINKS.contains(&kind) && arch_ok) || BIN_LINKS.contains(&kind) {
            // The link's target is the last field (after the arch and an
            // optional subdirectory); it must name a file beside the link.
            let Some(target) = e
                .fields
                .last()
                .filter(|t| safe_relative(t) && !t.contains('/') && t.as_str() != "NATIVE")
            else {
                tracing::warn!("ignoring .manifest link {:?}: no safe target", e.name);
                continue;
            };
            let dir = if BIN_LINKS.contains(&kind) {
                BIN_DIR
            } else {
                lib
            };
            out.push(Placement::Link {
                dest: format!("{dir}/{name}"),
                target: target.clone(),
            });
        }
    }
    out
}

/// Finds the `.manifest` of an extracted `.run` (at the top, or one
/// directory down); `None` for sources without one (Debian's tarballs).
pub(crate) fn find_dot_manifest(extracted: &Path) -> Option<PathBuf> {
    let top = extracted.join(".manifest");
    if top.is_file() {
        return Some(top);
    }
    let mut dirs: Vec<PathBuf> = fs::read_dir(extracted)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path().join(".manifest"))
        .filter(|p| p.is_file())
        .collect();
    dirs.sort();
    dirs.into_iter().next()
}

/// Reads and selects the user space of an extracted package: the
/// placements and the directory their `src` paths are relative to. Every
/// selected file must exist (`ArchiveInvalid` otherwise).
pub(crate) fn collect(
    extracted: &Path,
    arch: CpuArch,
) -> Result<Option<(PathBuf, Vec<Placement>)>> {
    let Some(manifest) = find_dot_manifest(extracted) else {
        return Ok(None);
    };
    let text = crate::named_file::Named {
        what: "the package's .manifest",
        max: 16 << 20,
        reason: Failure::ArchiveInvalid,
        hint: "the package is damaged; download it again",
    }
    .read_text(&manifest)?;
    let base = manifest
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| extracted.to_path_buf());
    let placements = select(&parse_dot_manifest(&text), &lib_dir_for(arch));
    for p in &placements {
        if let Placement::File { src, .. } = p {
            let path = base.join(src);
            let meta = fs::symlink_metadata(&path).map_err(|e| {
                Error::io(Failure::ArchiveInvalid, "reading", &path, e).with_hint(
                    "the package's .manifest lists a file the package does not hold; download it again",
                )
            })?;
            if !meta.is_file() {
                return Err(Error::new(
                    Failure::ArchiveInvalid,
                    format!(
                        "{} is listed in {} but is not a regular file",
                        path.display(),
                        manifest.display()
                    ),
                ));
            }
        }
    }
    Ok(Some((base, placements)))
}

// ------------------------------------------------------------ on the host

/// The host's ldconfig and its arguments: Debian's `/sbin/ldconfig` may be
/// a shell wrapper around `ldconfig.real`, which is static, so the real one
/// is preferred; `-r ROOT` makes it read and write the host's
/// configuration and cache when the host root is not `/`.
pub(crate) fn ldconfig_command(root: &HostRoot) -> Option<(PathBuf, Vec<OsString>)> {
    let found = [
        "/sbin/ldconfig.real",
        "/usr/sbin/ldconfig.real",
        "/sbin/ldconfig",
        "/usr/sbin/ldconfig",
    ]
    .iter()
    .find_map(|p| root.resolve(p).filter(|r| r.is_file()))?;
    let mut args = Vec::new();
    if root.path() != Path::new("/") {
        args.push(OsString::from("-r"));
        args.push(root.path().as_os_str().to_os_string());
    }
    Some((found, args))
}

/// Runs ldconfig for the host and returns its command line; the error
/// carries the command line and its stderr tail.
pub(crate) fn run_ldconfig(root: &HostRoot) -> Result<String> {
    let Some((program, args)) = ldconfig_command(root) else {
        return Err(Error::new(
            Failure::Internal,
            format!(
                "no ldconfig under {} (looked for /sbin/ldconfig(.real), /usr/sbin/ldconfig(.real))",
                root.path().display()
            ),
        ));
    };
    let mut cmd = crate::process::command(program);
    cmd.args(&args);
    crate::process::run(&mut cmd, Failure::Internal)?;
    Ok(crate::process::command_line(&cmd))
}

/// The `ld.so.conf.d` line: the current driver root's library directory,
/// as the host sees it, so that switching `current` needs no rewrite.
pub(crate) fn ld_so_conf_text(current: &Path) -> String {
    format!(
        "# Written by gpu-driver-installer: NVIDIA's libraries of the current driver root.\n{}\n",
        current.join(lib_dir()).display()
    )
}

/// Writes the `ld.so.conf.d` entry naming `current`'s library directory,
/// confined to the host root; one that says so already is left alone.
pub(crate) fn write_ld_so_conf(fs: &HostFs, current: &Path) -> Result<()> {
    let text = ld_so_conf_text(current);
    if fs.read(LD_SO_CONF)?.is_some_and(|t| t == text.as_bytes()) {
        return Ok(());
    }
    fs.write_atomic(LD_SO_CONF, text.as_bytes(), 0o644)
}

/// How `/run/nvidia/driver` shows the current driver root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exposure {
    /// Nothing (or our link) was there: a link to `current`, which pods
    /// started later resolve when they mount the path.
    Linked,
    /// A directory was there (NVIDIA's toolkit creates it with
    /// `DirectoryOrCreate` after a reboot, and pods may hold it mounted):
    /// the driver root is bind-mounted onto it, read-only, in the host's
    /// mount namespace, so the mount propagates into those pods.
    Mounted,
}

/// Makes the current driver root visible at `/run/nvidia/driver`
/// ([`Exposure`]). With the host root at `/proc/1/root` the mount must
/// happen in PID 1's mount namespace: a single-threaded child of this
/// binary enters it (`setns` refuses multi-threaded callers) and mounts
/// there; otherwise it happens here, on paths resolved inside the root.
pub(crate) fn expose_driver_root(fs: &HostFs, current: &Path) -> Result<Exposure> {
    match fs.kind(RUN_NVIDIA_DRIVER)? {
        Some(Kind::Symlink) if fs.read_link(RUN_NVIDIA_DRIVER).is_ok_and(|t| t == current) => {
            return Ok(Exposure::Linked);
        }
        Some(Kind::Symlink) | None => {
            fs.replace_symlink(RUN_NVIDIA_DRIVER, current)?;
            return Ok(Exposure::Linked);
        }
        Some(Kind::Dir) => check_run_dir_is_free(fs)?,
        Some(_) => {
            return Err(Error::new(
                Failure::Internal,
                format!(
                    "{} is neither a directory nor a link; not touched",
                    fs.host().join(RUN_NVIDIA_DRIVER).display()
                ),
            ));
        }
    }
    // PID 1's root, found by itself or given (the operator's Jobs pass
    // --host-root /proc/1/root): mount where PID 1 lives.
    let host = fs.host();
    if host.source() == crate::host_root::HostRootSource::Pid1Root
        || host.path() == Path::new("/proc/1/root")
    {
        let mut cmd = crate::process::command("/proc/self/exe");
        cmd.args([
            "--host-root",
            "/",
            "expose-driver-root",
            "--mount-ns",
            PID1_MOUNT_NS,
        ]);
        crate::process::run(&mut cmd, Failure::Internal)?;
        return Ok(Exposure::Mounted);
    }
    bind_read_only(&fs.real_dir(current)?, &fs.real_dir(RUN_NVIDIA_DRIVER)?)?;
    Ok(Exposure::Mounted)
}

/// A directory at `/run/nvidia/driver` is mounted over only when it is
/// empty (a pod's `DirectoryOrCreate` made it) or our own mount of one of
/// the driver roots (a reinstall replaces it). One with other files is
/// another driver's (NVIDIA's driver container mounts its root there):
/// mounting over it would hide that driver from its pods.
fn check_run_dir_is_free(fs: &HostFs) -> Result<()> {
    if fs.read_dir(RUN_NVIDIA_DRIVER)?.is_empty() {
        return Ok(());
    }
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let here = id(&fs.real_dir(RUN_NVIDIA_DRIVER)?);
    let drivers = gpu_driver_contract::layout::DRIVERS_DIR.trim_start_matches('/');
    let ours = here.is_some()
        && fs.read_dir(drivers)?.into_iter().any(|(name, kind)| {
            kind == Kind::Dir
                && fs
                    .real_dir(Path::new(drivers).join(&name))
                    .is_ok_and(|d| id(&d) == here)
        });
    if ours {
        return Ok(());
    }
    Err(Error::new(
        Failure::DriverRootOccupied,
        format!(
            "{} holds files that are not one of this installer's driver roots; not mounted over",
            fs.host().join(RUN_NVIDIA_DRIVER).display()
        ),
    )
    .with_hint(
        "another driver installer (NVIDIA's driver container, driver.enabled in the GPU Operator?) owns it: turn that one off, then retry",
    ))
}

/// PID 1's mount namespace: the host's, seen from a hostPID pod.
pub(crate) const PID1_MOUNT_NS: &str = "/proc/1/ns/mnt";

/// Enters the mount namespace at `ns`. Only a single-threaded process may
/// (the `expose-driver-root` child calls it first thing).
pub(crate) fn enter_mount_namespace(ns: &Path) -> Result<()> {
    let file = fs::File::open(ns).map_err(|e| Error::io(Failure::Internal, "opening", ns, e))?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNS).map_err(|e| {
        Error::new(
            Failure::Internal,
            format!("entering the mount namespace {}: {e}", ns.display()),
        )
        .with_hint("the installer needs CAP_SYS_ADMIN and hostPID to mount into the host")
    })
}

/// Bind-mounts `src` onto `dst` read-only, replacing an earlier mount
/// there (detached: pods still using files of the old root keep them).
pub(crate) fn bind_read_only(src: &Path, dst: &Path) -> Result<()> {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    let failed = |what: &str, e: nix::Error| {
        Error::new(
            Failure::Internal,
            format!("{what} {} on {}: {e}", src.display(), dst.display()),
        )
    };
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|e| {
        Error::io(
            Failure::Internal,
            "reading",
            Path::new("/proc/self/mountinfo"),
            e,
        )
    })?;
    if mount_points(&mountinfo).iter().any(|m| m == dst) {
        umount2(dst, MntFlags::MNT_DETACH).map_err(|e| failed("detaching the mount below", e))?;
    }
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| failed("bind-mounting", e))?;
    let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    mount(None::<&str>, dst, None::<&str>, ro, None::<&str>)
        .map_err(|e| failed("making read-only", e))?;
    Ok(())
}

/// The mount points of a `/proc/self/mountinfo` (field 5, with the
/// kernel's octal escapes for space, tab, newline and backslash undone).
pub(crate) fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| {
            PathBuf::from(
                p.replace("\\040", " ")
                    .replace("\\011", "\t")
                    .replace("\\012", "\n")
                    .replace("\\134", "\\"),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

    /// In the layout of NVIDIA's 535 `.run` `.manifest` (written from the
    /// format that distribution packagers parse, not copied from a package).
    const MANIFEST: &str = "\
NVIDIA Accelerated Graphics Driver for Linux-x86_64 535.261.03
535.261.03
KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 MODULE:nvidia
x86_64
nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem
kernel/nvidia.ko
kernel-open
EXTRA
kernel/nvidia/nv.c 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 MODULE:nvidia
nvidia-smi 0755 UTILITY_BINARY MODULE:nvidia
nvidia-smi.1.gz 0644 MANPAGE MODULE:nvidia
nvidia-debugdump 0755 UTILITY_BINARY MODULE:nvidia
nvidia-modprobe 4755 NVIDIA_MODPROBE MODULE:nvidia
libnvidia-ml.so.535.261.03 0755 UTILITY_LIB NATIVE MODULE:nvidia
libnvidia-ml.so.1 0000 UTILITY_LIB_SYMLINK NATIVE libnvidia-ml.so.535.261.03 MODULE:nvidia
libcuda.so.535.261.03 0755 CUDA_LIB NATIVE MODULE:nvidia
libcuda.so.1 0000 CUDA_SYMLINK NATIVE libcuda.so.535.261.03 MODULE:nvidia
libcuda.so 0000 CUDA_SYMLINK NATIVE libcuda.so.1 MODULE:nvidia
32/libcuda.so.535.261.03 0755 CUDA_LIB COMPAT32 MODULE:nvidia
32/libcuda.so.1 0000 CUDA_SYMLINK COMPAT32 libcuda.so.535.261.03 MODULE:nvidia
libGLX_nvidia.so.535.261.03 0755 GLX_CLIENT_LIB NATIVE GLVND MODULE:opengl
firmware/gsp_ga10x.bin 0644 FIRMWARE INHERIT_PATH_DEPTH:1 MODULE:nvidia
../../etc/evil 0755 UTILITY_BINARY MODULE:nvidia
libevil.so.1 0000 UTILITY_LIB_SYMLINK NATIVE ../../../lib/libc.so.6 MODULE:nvidia
";

    #[test]
    fn mount_points_come_from_mountinfo_with_escapes_undone() {
        let text = "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw\n\
                    40 36 0:5 / /run/nvidia/driver ro shared:7 - tmpfs tmpfs rw\n\
                    41 36 0:5 /x /a\\040b rw - tmpfs tmpfs rw\n";
        let m = mount_points(text);
        assert_eq!(
            m,
            vec![
                PathBuf::from("/mnt/parent"),
                PathBuf::from("/run/nvidia/driver"),
                PathBuf::from("/a b")
            ]
        );
    }

    #[test]
    fn parses_entries_and_skips_the_header() {
        let e = parse_dot_manifest(MANIFEST);
        assert_eq!(e[0].name, "kernel/nvidia/nv.c");
        assert_eq!(e[0].kind, "KERNEL_MODULE_SRC");
        assert_eq!(e[0].fields, ["INHERIT_PATH_DEPTH:1"]);
        let link = e.iter().find(|e| e.name == "libcuda.so.1").unwrap();
        assert_eq!(link.mode, 0);
        assert_eq!(link.fields, ["NATIVE", "libcuda.so.535.261.03"]);
        assert!(e.iter().all(|e| !e.name.starts_with("NVIDIA")));
    }

    #[test]
    fn selects_compute_user_space_only() {
        let lib = lib_dir();
        let p = select(&parse_dot_manifest(MANIFEST), &lib_dir());
        let f = |src: &str, dest: String| Placement::File {
            src: src.into(),
            dest,
            mode: 0o755,
        };
        let l = |dest: String, target: &str| Placement::Link {
            dest,
            target: target.into(),
        };
        assert_eq!(
            p,
            vec![
                f("nvidia-smi", "usr/bin/nvidia-smi".into()),
                f("nvidia-debugdump", "usr/bin/nvidia-debugdump".into()),
                f("nvidia-modprobe", "usr/bin/nvidia-modprobe".into()),
                f(
                    "libnvidia-ml.so.535.261.03",
                    format!("{lib}/libnvidia-ml.so.535.261.03")
                ),
                l(
                    format!("{lib}/libnvidia-ml.so.1"),
                    "libnvidia-ml.so.535.261.03"
                ),
                f(
                    "libcuda.so.535.261.03",
                    format!("{lib}/libcuda.so.535.261.03")
                ),
                l(format!("{lib}/libcuda.so.1"), "libcuda.so.535.261.03"),
                l(format!("{lib}/libcuda.so"), "libcuda.so.1"),
            ]
        );
    }

    #[test]
    fn a_listed_file_the_package_lacks_is_archive_invalid() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("NVIDIA-Linux-x86_64-535.261.03");
        fs::create_dir(&top).unwrap();
        fs::write(top.join(".manifest"), MANIFEST).unwrap();
        let e = collect(tmp.path(), CpuArch::X86_64).unwrap_err();
        assert_eq!(e.reason, Reason::ArchiveInvalid);
        assert!(e.to_string().contains("nvidia-smi"), "{}", e.to_string());
        // Every selected file present: the placements, relative to the
        // .manifest's directory.
        for p in select(&parse_dot_manifest(MANIFEST), &lib_dir()) {
            if let Placement::File { src, .. } = p {
                fs::write(top.join(src), b"x").unwrap();
            }
        }
        let (base, placements) = collect(tmp.path(), CpuArch::X86_64).unwrap().unwrap();
        assert_eq!(base, top);
        assert_eq!(placements.len(), 8);
        // A cross build places the target's libraries under its triplet.
        let (_, arm) = collect(tmp.path(), CpuArch::Aarch64).unwrap().unwrap();
        assert!(
            arm.iter().any(|p| matches!(p, Placement::File { dest, .. }
                if dest == "usr/lib/aarch64-linux-gnu/libcuda.so.535.261.03")),
            "{arm:?}"
        );
        // No .manifest (Debian's tarballs): no user space.
        let none = tempfile::tempdir().unwrap();
        assert!(collect(none.path(), CpuArch::X86_64).unwrap().is_none());
    }

    #[test]
    fn ld_so_conf_names_the_current_library_directory() {
        let text = ld_so_conf_text(Path::new("/var/lib/gpu-driver/drivers/current"));
        assert!(text.ends_with(&format!(
            "/var/lib/gpu-driver/drivers/current/{}\n",
            lib_dir()
        )));
    }

    #[test]
    fn ldconfig_gets_the_host_root() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("usr/sbin")).unwrap();
        std::os::unix::fs::symlink("usr/sbin", tmp.path().join("sbin")).unwrap();
        fs::write(tmp.path().join("usr/sbin/ldconfig"), "").unwrap();
        let root = HostRoot::new(
            tmp.path().to_path_buf(),
            crate::host_root::HostRootSource::Flag,
        );
        let (cmd, args) = ldconfig_command(&root).unwrap();
        assert_eq!(cmd, tmp.path().join("usr/sbin/ldconfig"));
        assert_eq!(args, [OsString::from("-r"), tmp.path().as_os_str().into()]);
        let empty = tempfile::tempdir().unwrap();
        let none = HostRoot::new(
            empty.path().to_path_buf(),
            crate::host_root::HostRootSource::Flag,
        );
        assert!(ldconfig_command(&none).is_none());
        assert!(
            run_ldconfig(&none)
                .unwrap_err()
                .message
                .contains("no ldconfig")
        );
    }
}
