//! What `build` is asked to do, and where its work and artifact go.

use std::path::PathBuf;

use super::result::BuildSpec;
use crate::artifact;
use crate::host_root::HostRoot;
use crate::node::{CpuArch, ModuleFlavor};

/// What `build` is asked to do.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub source: PathBuf,
    pub kernel_release: String,
    /// `--headers`: the release's headers directory in our own filesystem.
    pub headers: Option<PathBuf>,
    /// Where installed headers are looked up when `headers` is not given.
    pub root: HostRoot,
    pub flavor: ModuleFlavor,
    pub out_dir: PathBuf,
    /// Default: `<out>/work-<flavor>-<release>`.
    pub work_dir: Option<PathBuf>,
    /// Keep the extracted and compiled tree (for debugging); the log is
    /// always kept.
    pub keep_work: bool,
    pub jobs: usize,
    pub driver_version: Option<String>,
    /// `--arch`: the architecture to build for; `None` takes the headers'.
    pub arch: Option<CpuArch>,
    /// The artifact cache (`--cache-url`), already checked.
    pub cache: Option<crate::cache::CacheConfig>,
    /// `run --no-compile`: only the cache may supply the artifact; a build
    /// it does not supply fails (`ArtifactNotCached`) instead of compiling.
    pub no_compile: bool,
    /// [`look_up_first`]: the source is not fetched yet; stop after the
    /// cache lookup.
    pub lookup_only: bool,
    /// `--signing-key/--signing-cert`: sign every module.
    pub signing: Option<crate::signing::SigningFiles>,
}

impl BuildOptions {
    pub(crate) fn work_dir(&self) -> PathBuf {
        self.work_dir.clone().unwrap_or_else(|| {
            self.out_dir
                .join(format!("work-{}-{}", self.flavor, self.kernel_release))
        })
    }

    pub fn spec(&self) -> BuildSpec {
        BuildSpec {
            source: self.source.display().to_string(),
            kernel_release: self.kernel_release.clone(),
            headers: self.headers.as_ref().map(|p| p.display().to_string()),
            flavor: self.flavor,
            out_dir: self.out_dir.display().to_string(),
            work_dir: self.work_dir().display().to_string(),
            jobs: self.jobs,
            driver_version: self.driver_version.clone(),
            arch: self.arch,
            host_root: self.root.path().display().to_string(),
        }
    }

    /// Where a build of `driver_version` puts its artifact (and a cache hit
    /// restores it).
    pub(super) fn artifact_path(&self, driver_version: &str) -> PathBuf {
        self.out_dir.join(artifact::file_name(
            driver_version,
            self.flavor,
            &self.kernel_release,
        ))
    }
}
