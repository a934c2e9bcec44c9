//! Packaging: the built modules stripped and checked, GSP firmware and user
//! space, with their manifest, into one artifact.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use super::options::BuildOptions;
use super::preflight::Preflight;
use super::result::{BuildStatus, BuiltModule, seconds};
use super::source::Source;
use super::work::LOCAL_IO;
use crate::artifact::{
    self, MANIFEST_VERSION, Manifest, ManifestFile, ManifestLink, ManifestModule, ManifestUserFile,
    PackFile,
};
use crate::error::{Error, Failure, Result};
use crate::modinfo;
use crate::node::CpuArch;

/// The modules NVIDIA's Makefile builds (`NV_KERNEL_MODULES`); `nvidia` is
/// the one without which nothing works.
const KNOWN_MODULES: &[&str] = &[
    "nvidia",
    "nvidia-uvm",
    "nvidia-modeset",
    "nvidia-drm",
    "nvidia-peermem",
    "nvidia-vgpu-vfio",
];

/// The stripped modules, GSP firmware and user space with their manifest,
/// into one artifact (see [`crate::artifact`]).
pub(super) fn package(
    opts: &BuildOptions,
    pre: &Preflight,
    src: &Source,
    status: &mut BuildStatus,
) -> Result<(PathBuf, String, Manifest)> {
    let release = opts.kernel_release.as_str();
    let t = Instant::now();
    let built = collect_modules(&src.tree)?;
    let module_dir = src.staging.join("modules");
    fs::create_dir_all(&module_dir).map_err(|e| Error::io(LOCAL_IO, "creating", &module_dir, e))?;
    let mut modules = Vec::new();
    for ko in &built {
        let staged = stage_module(ko, &module_dir, release, pre)?;
        modules.push(staged);
    }
    let mut manifest = Manifest {
        schema_version: MANIFEST_VERSION,
        generator: format!("gpu-driver-installer {}", env!("CARGO_PKG_VERSION")),
        driver_version: src.driver_version.clone(),
        flavor: opts.flavor,
        kernel_release: release.to_string(),
        compiler: pre.compiler.version.clone(),
        kernel_compiler: pre.compiler.kernel_version_text.clone(),
        arch: Some(pre.target.arch),
        built_at: crate::text::rfc3339_utc(SystemTime::now()),
        modules: modules.iter().map(|s| s.manifest.clone()).collect(),
        firmware: Vec::new(),
        firmware_note: None,
        user_space: Vec::new(),
        links: Vec::new(),
        signer: pre.signing.as_ref().map(|s| s.signer.clone()),
    };
    let mut files: Vec<PackFile> = modules
        .iter()
        .map(|m| PackFile {
            name: m.module.file.clone(),
            path: m.path.clone(),
            mode: 0o644,
        })
        .collect();
    files.extend(add_firmware(&mut manifest, &src.firmware)?);
    files.extend(add_user_space(&mut manifest, src.user_space.as_ref())?);
    let artifact = opts.artifact_path(&src.driver_version);
    let sha256 = artifact::pack(&artifact, &manifest, &files)?;
    status.timings.package_seconds = Some(seconds(t.elapsed()));
    status.firmware = manifest.firmware.iter().map(|f| f.file.clone()).collect();
    status.user_space = manifest
        .user_space
        .iter()
        .map(|f| f.file.clone())
        .chain(manifest.links.iter().map(|l| l.file.clone()))
        .collect();
    status.modules = modules.into_iter().map(|s| s.module).collect();
    status.artifact = Some(artifact.display().to_string());
    status.artifact_sha256 = Some(sha256.clone());
    Ok((artifact, sha256, manifest))
}

/// Lists the GSP firmware in the manifest (or why there is none).
fn add_firmware(manifest: &mut Manifest, firmware: &[PathBuf]) -> Result<Vec<PackFile>> {
    let mut files = Vec::new();
    for fw in firmware {
        let (sha256, size_bytes) = crate::digest::sha256_file(fw, LOCAL_IO)?;
        let name = fw
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let file = format!("firmware/{name}");
        manifest.firmware.push(ManifestFile {
            file: file.clone(),
            size_bytes,
            sha256,
        });
        files.push(PackFile {
            name: file,
            path: fw.clone(),
            mode: 0o644,
        });
    }
    if firmware.is_empty() {
        manifest.firmware_note = Some(
            "the source carries no GSP firmware (Debian's module-source packages ship it in firmware-nvidia-gsp); install it separately"
                .into(),
        );
    }
    Ok(files)
}

/// Lists NVIDIA's user space (files and links) in the manifest.
fn add_user_space(
    manifest: &mut Manifest,
    user_space: Option<&(PathBuf, Vec<crate::userspace::Placement>)>,
) -> Result<Vec<PackFile>> {
    let mut files = Vec::new();
    let Some((base, placements)) = user_space else {
        return Ok(files);
    };
    for p in placements {
        match p {
            crate::userspace::Placement::File { src, dest, mode } => {
                let path = base.join(src);
                let (sha256, size_bytes) = crate::digest::sha256_file(&path, LOCAL_IO)?;
                manifest.user_space.push(ManifestUserFile {
                    file: dest.clone(),
                    size_bytes,
                    sha256,
                    mode: *mode,
                });
                files.push(PackFile {
                    name: dest.clone(),
                    path,
                    mode: *mode,
                });
            }
            crate::userspace::Placement::Link { dest, target } => {
                manifest.links.push(ManifestLink {
                    file: dest.clone(),
                    target: target.clone(),
                })
            }
        }
    }
    Ok(files)
}

/// The `.ko` files the build produced, in `KNOWN_MODULES` order; `nvidia.ko`
/// must be among them.
pub fn collect_modules(tree: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = KNOWN_MODULES
        .iter()
        .map(|m| tree.join(format!("{m}.ko")))
        .filter(|p| p.is_file())
        .collect();
    // NVIDIA's trees keep nvidia.ko's sources in nvidia/: there it is
    // required. Other trees with NVIDIA's make interface (the VM test's
    // module) give whatever .ko files they built.
    let nvidia_tree = tree.join("nvidia").is_dir();
    if found.is_empty() && !nvidia_tree {
        let mut other: Vec<PathBuf> = fs::read_dir(tree)
            .map_err(|e| Error::io(LOCAL_IO, "reading", tree, e))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "ko"))
            .collect();
        other.sort();
        found = other;
    }
    if found.is_empty() || (nvidia_tree && !found.iter().any(|p| p.ends_with("nvidia.ko"))) {
        return Err(Error::new(
            Failure::BuildFailed,
            format!("make succeeded but {} holds no nvidia.ko", tree.display()),
        ));
    }
    Ok(found)
}

/// A module stripped into the staging area.
struct Staged {
    module: BuiltModule,
    manifest: ManifestModule,
    path: PathBuf,
}

/// Strips debug info into `dest_dir` (an unstripped `nvidia.ko` is 184 MB,
/// stripped 11 MB), signs it when the build signs (after the strip, which
/// would drop an appended signature), reads its modinfo and checks the
/// vermagic's release.
fn stage_module(ko: &Path, dest_dir: &Path, release: &str, pre: &Preflight) -> Result<Staged> {
    let target = &pre.target;
    let file_name = ko
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dest = dest_dir.join(&file_name);
    run_strip(&target.tool("strip"), ko, &dest)?;
    if let Some(signing) = &pre.signing {
        signing.sign(&dest)?;
    }
    let info = modinfo::read_modinfo(&dest)
        .map_err(|e| Error::new(Failure::BuildFailed, format!("reading modinfo: {e}")))?;
    check_vermagic(&file_name, &info.vermagic, release)?;
    check_machine(&file_name, info.machine, target.arch)?;
    let (sha256, size_bytes) = crate::digest::sha256_file(&dest, LOCAL_IO)?;
    let module = BuiltModule {
        name: info.name.clone(),
        file: format!("modules/{file_name}"),
        vermagic: info.vermagic.trim_end().to_string(),
        size_bytes,
        sha256,
    };
    let manifest = ManifestModule {
        name: module.name.clone(),
        file: module.file.clone(),
        vermagic: module.vermagic.clone(),
        depends: info.depends,
        version: info.version,
        size_bytes,
        sha256: module.sha256.clone(),
    };
    Ok(Staged {
        module,
        manifest,
        path: dest,
    })
}

/// `strip --strip-debug -o dest src`: the source tree stays as built.
/// `strip` is the target's (`aarch64-linux-gnu-strip` for arm64 modules on
/// an x86_64 builder: the native one does not know their format).
fn run_strip(strip: &str, src: &Path, dest: &Path) -> Result<()> {
    let mut cmd = crate::process::command(strip);
    cmd.arg("--strip-debug").arg("-o").arg(dest).arg(src);
    // Not starting is a missing tool; failing is a bad module file.
    let out = crate::process::output(&mut cmd, Failure::CompilerMissing)?;
    if !out.status.success() {
        return Err(crate::process::exit_error(&cmd, &out, Failure::BuildFailed));
    }
    Ok(())
}

/// A module is for the CPU the build targeted: a cross build that quietly
/// produced host objects (a make variable lost on the way) stops here.
pub fn check_machine(module: &str, machine: u16, arch: CpuArch) -> Result<()> {
    if machine == arch.elf_machine() {
        return Ok(());
    }
    let found = CpuArch::from_elf_machine(machine)
        .map_or_else(|| format!("ELF machine {machine}"), |a| a.to_string());
    Err(Error::new(
        Failure::BuildFailed,
        format!("{module} was built for {found}, not for {arch}"),
    ))
}

/// A module loads only into the kernel its vermagic names.
pub fn check_vermagic(module: &str, vermagic: &str, release: &str) -> Result<()> {
    if vermagic.split_whitespace().next() == Some(release) {
        Ok(())
    } else {
        Err(Error::new(
            Failure::BuildFailed,
            format!(
                "{module} was built with vermagic {:?}, which is not for kernel {release}; the headers do not match the release",
                vermagic.trim_end()
            ),
        ))
    }
}
