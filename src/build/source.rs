//! The package extracted into the work directory: its module tree, the
//! driver version it declares, GSP firmware and user space.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::options::BuildOptions;
use super::result::{BuildStatus, seconds};
use super::work::{Cleanup, LOCAL_IO, remove_dir_if_present};
use crate::error::{Error, Failure, Result};
use crate::node::CpuArch;

/// The unpacked package: its module tree, version, firmware and user space.
pub(super) struct Source {
    pub(super) tree: PathBuf,
    pub(super) driver_version: String,
    pub(super) firmware: Vec<PathBuf>,
    pub(super) user_space: Option<(PathBuf, Vec<crate::userspace::Placement>)>,
    pub(super) staging: PathBuf,
    pub(super) cleanup: Cleanup,
}

/// Extracts the package and finds what the build needs in it.
pub(super) fn extract_source(
    opts: &BuildOptions,
    work: &Path,
    arch: CpuArch,
    status: &mut BuildStatus,
) -> Result<Source> {
    let t = Instant::now();
    let extracted = work.join("source");
    let staging = work.join("staging");
    remove_dir_if_present(&extracted)?;
    remove_dir_if_present(&staging)?;
    let cleanup = Cleanup {
        dirs: if opts.keep_work {
            Vec::new()
        } else {
            vec![extracted.clone(), staging.clone()]
        },
    };
    crate::extract::extract_package(&opts.source, &extracted)?;
    let tree = crate::extract::module_source_dir(&extracted, opts.flavor)?;
    let driver_version = driver_version_of(&tree, opts.driver_version.as_deref())?;
    status.driver_version = Some(driver_version.clone());
    let firmware = find_firmware(&extracted)?;
    let user_space = crate::userspace::collect(&extracted, arch)?;
    status.timings.extract_seconds = Some(seconds(t.elapsed()));
    Ok(Source {
        tree,
        driver_version,
        firmware,
        user_space,
        staging,
        cleanup,
    })
}

/// The driver version the tree declares: `NV_VERSION_STRING` in its Kbuild
/// (both the `.run`'s and Debian's trees), else `NVIDIA_VERSION` in a
/// `version.mk` beside or above it. `--driver-version` must agree with it;
/// without a declared version, the flag is required.
pub fn driver_version_of(tree: &Path, flag: Option<&str>) -> Result<String> {
    let mut declared = None;
    for f in ["Kbuild", "Makefile"] {
        if let Some(text) = crate::node::read_optional(&tree.join(f)).ok().flatten() {
            declared = parse_nv_version_string(&text);
            if declared.is_some() {
                break;
            }
        }
    }
    if declared.is_none() {
        for dir in tree.ancestors().take(3) {
            if let Some(text) = crate::node::read_optional(&dir.join("version.mk"))
                .ok()
                .flatten()
            {
                declared = parse_version_mk(&text);
                if declared.is_some() {
                    break;
                }
            }
        }
    }
    match (declared, flag) {
        (Some(d), Some(f)) if d != f => Err(Error::new(
            Failure::InvalidArgument,
            format!(
                "--driver-version {f} but the source {} is driver {d}",
                tree.display()
            ),
        )),
        (Some(d), _) => Ok(d),
        (None, Some(f)) => Ok(f.to_string()),
        (None, None) => Err(Error::new(
            Failure::InvalidArgument,
            format!(
                "the source {} declares no driver version (no NV_VERSION_STRING in its Kbuild, no version.mk)",
                tree.display()
            ),
        )
        .with_hint("pass --driver-version")),
    }
}

/// `ccflags-y += -DNV_VERSION_STRING=\"535.261.03\"` → `535.261.03`.
pub fn parse_nv_version_string(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (_, rest) = l.split_once("NV_VERSION_STRING=")?;
        let v: String = rest
            .trim_start_matches(['\\', '"'])
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        crate::node::is_driver_version(&v).then_some(v)
    })
}

/// `NVIDIA_VERSION = 535.261.03` → `535.261.03`.
pub fn parse_version_mk(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("NVIDIA_VERSION")?;
        let v = rest.trim_start().strip_prefix(['=', ':'])?;
        let v = v.trim_start_matches('=').trim();
        crate::node::is_driver_version(v).then(|| v.to_string())
    })
}

/// GSP firmware of a `.run` (`firmware/gsp_*.bin`, at the top or one
/// directory down); Debian's module-source tarballs have none.
pub fn find_firmware(extracted: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs = vec![extracted.join("firmware")];
    if let Ok(entries) = fs::read_dir(extracted) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path().join("firmware"));
            }
        }
    }
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let e = e.map_err(|e| Error::io(LOCAL_IO, "reading", &dir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("gsp_")
                && name.ends_with(".bin")
                && e.file_type().is_ok_and(|t| t.is_file())
            {
                out.push(e.path());
            }
        }
        if !out.is_empty() {
            break;
        }
    }
    out.sort();
    Ok(out)
}
