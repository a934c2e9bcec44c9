//! The pipeline's configuration: a plain [`Config`] the command line
//! fills, what it derives (fetch policy, install options, the catalog) and
//! the host cache directories.

use std::path::PathBuf;

use crate::cache::CacheConfig;
use crate::catalog::Catalog;
use crate::confined_fs::HostRootFs;
use crate::error::{Error, Failure, Result};
use crate::fetch::{FetchPolicy, RetryPolicy, Timeouts};
use crate::host_root::HostRoot;
use crate::install::InstallOptions;
use crate::node::CpuArch;
use crate::resolve::FlavorChoice;

/// Where packages are cached on the host, so that a later Job finds them.
pub(crate) const PACKAGE_CACHE: &str = "/var/cache/gpu-driver/packages";
/// Where `run` keeps what it builds and the headers it downloads, on the
/// host, so that a rerun after a crash finds them.
pub(crate) const BUILD_CACHE: &str = "/var/cache/gpu-driver/builds";
pub(crate) const HEADERS_CACHE: &str = "/var/cache/gpu-driver/headers";

/// Everything a pipeline command needs, independent of how it was asked.
#[derive(Debug, Clone)]
pub struct Config {
    pub root: HostRoot,
    /// A catalog file; `None`: the embedded catalog.
    pub catalog: Option<PathBuf>,
    /// Target this kernel instead of the running one.
    pub kernel_release: Option<String>,
    /// Target this CPU architecture instead of the running one.
    pub arch: Option<CpuArch>,
    pub driver_version: Option<String>,
    pub flavor: FlavorChoice,
    pub download: Download,
    /// The artifact cache (`--cache-url`), checked by the step that uses it.
    pub cache: Option<CacheConfig>,
    /// Install this prebuilt artifact instead of resolving, fetching and
    /// building.
    pub artifact: Option<PathBuf>,
    /// `--no-compile`: the artifact comes from the cache or the run fails
    /// (`ArtifactNotCached`); never compiled on the node.
    pub no_compile: bool,
    /// `--artifact-sha256`: the only cached artifact the build step may use.
    pub artifact_sha256: Option<String>,
    /// `--cache-entry`: the entry a build Job stored it in.
    pub cache_entry: Option<String>,
    pub load: LoadSettings,
    /// nvidia-smi for the verify step.
    pub nvidia_smi: Option<PathBuf>,
    /// libcuda for the verify step's CUDA check (`verify --libcuda` only).
    pub libcuda: Option<PathBuf>,
    /// `--signing-key/--signing-cert`: builds sign their modules.
    pub signing: Option<crate::signing::SigningFiles>,
}

/// How packages are downloaded.
#[derive(Debug, Clone, Default)]
pub struct Download {
    /// A URL instead of the resolved plan's package.
    pub url: Option<String>,
    pub sha256: Option<String>,
    /// NVIDIA redistrib manifest URL to take the checksum from.
    pub manifest: Option<String>,
    pub mirrors: Vec<String>,
    /// Default: `<host-root>/var/cache/gpu-driver/packages`.
    pub cache_dir: Option<PathBuf>,
    pub offline: bool,
    pub allow_http: bool,
    pub retry: RetryPolicy,
    pub timeouts: Timeouts,
    pub ca_bundle: Option<PathBuf>,
    /// The keyring the headers' apt repository must be signed with;
    /// `None`: the one shipped for the repository.
    pub apt_keyring: Option<PathBuf>,
}

/// How modules are loaded.
#[derive(Debug, Clone, Default)]
pub struct LoadSettings {
    pub module_params: Option<PathBuf>,
    pub drm: bool,
    pub peermem: bool,
    pub force: bool,
}

impl Config {
    /// A configuration with every default, for `root`.
    pub fn new(root: HostRoot) -> Self {
        Config {
            root,
            catalog: None,
            kernel_release: None,
            arch: None,
            driver_version: None,
            flavor: FlavorChoice::Auto,
            download: Download::default(),
            cache: None,
            artifact: None,
            no_compile: false,
            artifact_sha256: None,
            cache_entry: None,
            load: LoadSettings {
                drm: false,
                ..LoadSettings::default()
            },
            nvidia_smi: None,
            libcuda: None,
            signing: None,
        }
    }

    pub(crate) fn catalog_label(&self) -> String {
        self.catalog
            .as_ref()
            .map_or("embedded".into(), |p| p.display().to_string())
    }

    /// The catalog a command installs by. One given with `--catalog` (a
    /// GpuDriver's ConfigMap, mounted into its Jobs) must pass every check
    /// of `catalog-check` first (every default resolves to a release with a
    /// digest): a catalog from outside the binary never relaxes what is
    /// verified, and an incomplete one fails here, before any download.
    pub(crate) fn load_catalog(&self) -> Result<Catalog> {
        let catalog = self.load_catalog_unchecked()?;
        if self.catalog.is_some() {
            let problems = catalog.check();
            if !problems.is_empty() {
                return Err(Error::new(
                    Failure::CatalogInvalid,
                    format!(
                        "{}: {} problem(s): {}",
                        catalog.origin,
                        problems.len(),
                        problems.join("; ")
                    ),
                )
                .with_hint(
                    "run `gpu-driver-installer --catalog FILE catalog-check` and fix what it lists",
                ));
            }
        }
        Ok(catalog)
    }

    /// The catalog as parsed, for `catalog-check` (which reports the
    /// problems) and `matrix-exclusions`.
    pub(crate) fn load_catalog_unchecked(&self) -> Result<Catalog> {
        match &self.catalog {
            Some(p) => Catalog::load(p),
            None => Catalog::embedded(),
        }
    }

    /// The network policy shared by every download of a command.
    pub(crate) fn fetch_options(&self) -> FetchPolicy {
        let d = &self.download;
        FetchPolicy {
            cache_dir: d
                .cache_dir
                .clone()
                .unwrap_or_else(|| self.root.join(PACKAGE_CACHE)),
            offline: d.offline,
            allow_http: d.allow_http,
            retry: d.retry,
            timeouts: d.timeouts,
            ca_bundle: d.ca_bundle.clone(),
            progress_bar: true,
        }
    }

    /// The fetch options with the package cache resolved: `--cache-dir` as
    /// given, else the host's package cache, created and resolved inside
    /// the host root (a link there never leads the download elsewhere).
    pub(super) fn confined_fetch_options(&self) -> Result<FetchPolicy> {
        let mut opts = self.fetch_options();
        if self.download.cache_dir.is_none() {
            opts.cache_dir = self.host_dir(PACKAGE_CACHE)?;
        }
        Ok(opts)
    }

    /// A directory of the host's, created and resolved inside the host root.
    pub(super) fn host_dir(&self, rel: &str) -> Result<PathBuf> {
        self.root.fs()?.real_dir(rel)
    }

    pub(super) fn install_options(&self, artifact: PathBuf) -> InstallOptions<'_> {
        InstallOptions {
            root: &self.root,
            artifact,
            kernel_release: self.kernel_release.clone(),
            module_params: self.load.module_params.clone(),
            planned_params: std::collections::BTreeMap::new(),
            iommu_passthrough: false,
            drm: self.load.drm,
            peermem: self.load.peermem,
            force: self.load.force,
            fabric_manager: None,
            persistenced: false,
        }
    }

    /// The cache configuration, checked; `None` without one.
    pub(super) fn checked_cache(&self) -> Result<Option<&CacheConfig>> {
        match &self.cache {
            Some(c) => c.check().map(|()| Some(c)),
            None => Ok(None),
        }
    }
}
