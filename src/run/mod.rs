//! The Job's pipeline and the commands built from its steps. `run`:
//! detect → resolve → fetch → build → install → verify, stopping at the
//! first step that does not succeed; its outcome is the run's. The host is
//! detected once and the plan resolved once; the plan's package goes to
//! fetch and the plan itself to build. A node without a GPU is Skipped
//! (NoGpu) right after detect; `--artifact` (a prebuilt artifact) skips
//! resolve, fetch and build. `prebuild`: resolve → fetch → build for a
//! target given on the command line (a build Job's: no host, no GPU), and
//! the artifact stored in the cache.
//!
//! [`Config`] is a plain struct: the command line fills it (src/cli.rs),
//! and nothing here knows about argument parsing.

use std::path::{Path, PathBuf};

use crate::build::{self, BuildOptions, BuildResult};
use crate::cache::CacheConfig;
use crate::catalog::Catalog;
use crate::detect::{self, DetectOptions, HostReport};
use crate::error::{Error, Failure, Result};
use crate::fetch::{
    self, ChecksumSource, FetchPolicy, FetchResult, PackageRequest, RetryPolicy, Timeouts,
};
use crate::host::{CpuArch, HostRoot, ModuleFlavor};
use crate::hostfs::HostRootFs;
use crate::install::{self, InstallOptions};
use crate::report::{Document, Kind, Outcome, Phase, Reason, ResultDocument};
use crate::resolve::{self, FlavorChoice, InstallPlan, ResolveOptions, ResolveSpec};
use crate::step::Done;
use crate::verify::{self, VerifyOptions};

mod prebuild;

pub use prebuild::prebuild;

/// Where packages are cached on the host, so that a later Job finds them.
pub const PACKAGE_CACHE: &str = "/var/cache/gpu-driver/packages";
/// Where `run` keeps what it builds and the headers it downloads, on the
/// host, so that a rerun after a crash finds them.
pub const BUILD_CACHE: &str = "/var/cache/gpu-driver/builds";
pub const HEADERS_CACHE: &str = "/var/cache/gpu-driver/headers";

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

    pub fn catalog_label(&self) -> String {
        self.catalog
            .as_ref()
            .map_or("embedded".into(), |p| p.display().to_string())
    }

    /// The catalog a command installs by. One given with `--catalog` (a
    /// GpuDriver's ConfigMap, mounted into its Jobs) must pass every check
    /// of `catalog-check` first (every default resolves to a release with a
    /// digest): a catalog from outside the binary never relaxes what is
    /// verified, and an incomplete one fails here, before any download.
    pub fn load_catalog(&self) -> Result<Catalog> {
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
    pub fn load_catalog_unchecked(&self) -> Result<Catalog> {
        match &self.catalog {
            Some(p) => Catalog::load(p),
            None => Catalog::embedded(),
        }
    }

    /// The network policy shared by every download of a command.
    pub fn fetch_options(&self) -> FetchPolicy {
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
    fn confined_fetch_options(&self) -> Result<FetchPolicy> {
        let mut opts = self.fetch_options();
        if self.download.cache_dir.is_none() {
            opts.cache_dir = self.host_dir(PACKAGE_CACHE)?;
        }
        Ok(opts)
    }

    /// A directory of the host's, created and resolved inside the host root.
    fn host_dir(&self, rel: &str) -> Result<PathBuf> {
        self.root.fs()?.real_dir(rel)
    }

    fn install_options(&self, artifact: PathBuf) -> InstallOptions<'_> {
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
    fn checked_cache(&self) -> Result<Option<&CacheConfig>> {
        match &self.cache {
            Some(c) => c.check().map(|()| Some(c)),
            None => Ok(None),
        }
    }
}

/// `detect`: the host report.
pub fn detect(cfg: &Config) -> HostReport {
    match cfg.load_catalog() {
        Ok(catalog) => detect_with(cfg, &catalog),
        Err(e) => detect::detect_failed(
            detect::spec(&cfg.root, cfg.kernel_release.clone(), cfg.arch),
            e,
        ),
    }
}

fn detect_with(cfg: &Config, catalog: &Catalog) -> HostReport {
    detect::detect(&DetectOptions {
        root: &cfg.root,
        catalog,
        kernel_release: cfg.kernel_release.clone(),
        arch: cfg.arch,
    })
}

/// `resolve`: detect, then the install plan.
pub fn resolve(cfg: &Config) -> InstallPlan {
    match cfg.load_catalog() {
        Ok(catalog) => {
            let report = detect_with(cfg, &catalog);
            resolve_with(cfg, &catalog, &report)
        }
        Err(e) => resolve::plan_failed(resolve_spec(cfg), e),
    }
}

fn resolve_spec(cfg: &Config) -> ResolveSpec {
    ResolveSpec {
        host_root: cfg.root.path().display().to_string(),
        driver_version: cfg.driver_version.clone(),
        flavor: cfg.flavor,
        kernel_release_override: cfg.kernel_release.clone(),
        catalog: cfg.catalog_label(),
    }
}

fn resolve_with(cfg: &Config, catalog: &Catalog, report: &HostReport) -> InstallPlan {
    resolve::resolve_report(
        &ResolveOptions {
            root: &cfg.root,
            catalog,
            catalog_label: cfg.catalog_label(),
            kernel_release: cfg.kernel_release.clone(),
            arch: cfg.arch,
            driver_version: cfg.driver_version.clone(),
            flavor: cfg.flavor,
        },
        report,
    )
}

/// `fetch`: `--url`, else the package of the plan resolved here.
pub fn fetch(cfg: &Config) -> FetchResult {
    if cfg.download.url.is_some() {
        return fetch_step(cfg, None);
    }
    let plan = resolve(cfg);
    fetch_step(cfg, Some(&plan))
}

/// Downloads `--url` or the plan's package, verified, through the cache's
/// package mirror when there is a cache.
fn fetch_step(cfg: &Config, plan: Option<&InstallPlan>) -> FetchResult {
    let failed = |e: Error| {
        fetch::fetch_package_failed(
            cfg.download.url.clone().unwrap_or_default(),
            &cfg.fetch_options(),
            e,
        )
    };
    let request = match (&cfg.download.url, plan) {
        (Some(url), _) => PackageRequest {
            url: url.clone(),
            sha256: flag_checksum(cfg),
            mirrors: cfg.download.mirrors.clone(),
            version: None,
            manifest: cfg.download.manifest.clone(),
        },
        (None, Some(plan)) => match package_request(cfg, plan) {
            Ok(r) => r,
            Err(e) => return failed(e),
        },
        (None, None) => {
            return failed(Error::new(
                Failure::Internal,
                "fetch without a URL or a plan",
            ));
        }
    };
    fetch_request(cfg, &request)
}

/// Downloads one request, verified, through the cache's package mirror
/// when there is a cache.
fn fetch_request(cfg: &Config, request: &PackageRequest) -> FetchResult {
    let failed =
        |e: Error| fetch::fetch_package_failed(request.url.clone(), &cfg.fetch_options(), e);
    let cache = match cfg.checked_cache() {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let opts = match cfg.confined_fetch_options() {
        Ok(o) => o,
        Err(e) => return failed(e),
    };
    match cache {
        Some(c) => crate::cache::fetch_with_mirror(c, request, opts),
        None => fetch::fetch_package(request, opts),
    }
}

/// `run`'s second fetch on NVSwitch hosts: the plan's Fabric Manager
/// archive, whose sha256 comes from NVIDIA's redistrib manifest (never
/// from the archive's own server alone); `None` when not planned.
fn fetch_fabric_manager(cfg: &Config, plan: &InstallPlan) -> Option<FetchResult> {
    let fm = plan.status.fabric_manager.as_ref()?;
    let mut mirrors = cfg.download.mirrors.clone();
    mirrors.extend(fm.package.mirrors.iter().cloned());
    let request = PackageRequest {
        url: fm.package.url.clone(),
        sha256: fm
            .package
            .sha256
            .as_ref()
            .map(|s| (s.clone(), ChecksumSource::Catalog)),
        mirrors,
        version: Some(fm.version.clone()),
        manifest: None,
    };
    Some(fetch_request(cfg, &request))
}

fn flag_checksum(cfg: &Config) -> Option<(String, ChecksumSource)> {
    cfg.download
        .sha256
        .as_ref()
        .map(|s| (s.clone(), ChecksumSource::Flag))
}

/// The package of a resolved plan; fails with the plan's own reason.
fn package_request(cfg: &Config, plan: &InstallPlan) -> Result<PackageRequest> {
    crate::step::succeeded(&plan.status.outcome)?;
    // A plan without a package that still says Resolved is our bug.
    let package = plan
        .status
        .package
        .as_ref()
        .ok_or_else(|| Error::new(Failure::Internal, plan.status.outcome.message.clone()))?;
    let mut mirrors = cfg.download.mirrors.clone();
    mirrors.extend(package.mirrors.iter().cloned());
    Ok(PackageRequest {
        url: package.url.clone(),
        sha256: flag_checksum(cfg).or_else(|| {
            package
                .sha256
                .as_ref()
                .map(|s| (s.clone(), ChecksumSource::Catalog))
        }),
        mirrors,
        version: plan.status.driver_version.clone(),
        manifest: cfg.download.manifest.clone(),
    })
}

/// `run`'s build step: the fetched package, compiled for the plan's kernel
/// with the plan's flavor, against installed headers or the headers package
/// from the OS's repository.
fn build_step(cfg: &Config, plan: &InstallPlan, fetched: &FetchResult) -> BuildResult {
    let source = PathBuf::from(fetched.status.path.clone().unwrap_or_default());
    match build_options(cfg, plan, source, true) {
        Ok(opts) => build::build(&opts),
        Err(failed) => *failed,
    }
}

/// The cache looked up before the package is fetched
/// ([`build::look_up_first`]): `Some` when that decides the build step.
/// An entry a build Job named needs no headers, so none are looked for.
pub(crate) fn look_up_first(cfg: &Config, plan: &InstallPlan) -> Option<BuildResult> {
    let headers = cfg.cache_entry.is_none();
    match build_options(cfg, plan, PathBuf::new(), headers) {
        Ok(opts) => build::look_up_first(&opts),
        // The full path reports it, after the fetch.
        Err(_) => None,
    }
}

/// The build's options for the plan, or the failed step's document.
fn build_options(
    cfg: &Config,
    plan: &InstallPlan,
    source: PathBuf,
    with_headers: bool,
) -> std::result::Result<BuildOptions, Box<BuildResult>> {
    let st = &plan.status;
    let root = &cfg.root;
    let release = st.kernel_release.clone().unwrap_or_default();
    let mut opts = BuildOptions {
        source,
        kernel_release: release.clone(),
        headers: None,
        root: root.clone(),
        flavor: st.module_flavor.unwrap_or(ModuleFlavor::Proprietary),
        out_dir: root.join(BUILD_CACHE),
        work_dir: None,
        keep_work: false,
        jobs: crate::build::default_jobs(),
        driver_version: st.driver_version.clone(),
        arch: st.arch,
        cache: None,
        no_compile: cfg.no_compile,
        lookup_only: false,
        signing: cfg.signing.clone(),
    };
    let failed = |opts: &BuildOptions, e| Box::new(build::build_failed(opts.spec(), e));
    match cfg.checked_cache() {
        Ok(c) => {
            opts.cache = c.cloned().map(|mut c| {
                c.expected_sha256 = cfg.artifact_sha256.as_ref().map(|s| s.to_ascii_lowercase());
                c.entry = cfg.cache_entry.clone();
                c
            });
        }
        Err(e) => return Err(failed(&opts, e)),
    }
    match cfg.host_dir(BUILD_CACHE) {
        Ok(d) => opts.out_dir = d,
        Err(e) => return Err(failed(&opts, e)),
    }
    if let Some(h) = st.headers.as_ref().filter(|_| with_headers) {
        match headers_for(cfg, h, &release, st.arch) {
            Ok(dir) => opts.headers = dir,
            Err(e) => return Err(failed(&opts, e)),
        }
    }
    Ok(opts)
}

/// The plan's headers: installed ones under the host root, or the OS
/// repository's package, downloaded once into the host's header cache.
fn headers_for(
    cfg: &Config,
    h: &resolve::Headers,
    release: &str,
    arch: Option<CpuArch>,
) -> Result<Option<PathBuf>> {
    let root = &cfg.root;
    match h.source {
        resolve::HeadersSource::Installed => Ok(h.path.as_ref().map(|p| root.join(p))),
        resolve::HeadersSource::Package => {
            let scratch = cfg.host_dir(HEADERS_CACHE)?.join(release);
            if scratch.join("usr/src").is_dir() {
                // Downloaded by an earlier run: the tree is renamed into
                // place only when complete.
                return Ok(Some(
                    scratch
                        .join("usr/src")
                        .join(format!("linux-headers-{release}")),
                ));
            }
            let mut source = crate::apt::AptSource::new(
                h.repository.as_deref().unwrap_or_default(),
                h.suite.as_deref().unwrap_or_default(),
            )
            .with_keyring(cfg.download.apt_keyring.clone());
            // The node's architecture's index, not the builder's.
            source.architecture = match arch {
                Some(a) => a,
                None => crate::host::running_arch()?,
            }
            .debian_name()
            .to_string();
            crate::headers::fetch_headers_from(
                &source,
                release,
                &cfg.confined_fetch_options()?,
                &scratch,
            )
            .map(|t| Some(t.arch_dir))
        }
    }
}

/// `install`: load the given artifact.
pub fn install(cfg: &Config, artifact: &Path) -> install::InstallResult {
    install_planned(cfg, artifact, None, None)
}

/// `install --fabric-manager ARCHIVE --persistenced`: the daemons without
/// a plan.
pub fn install_with_daemons(
    cfg: &Config,
    artifact: &Path,
    fabric_manager: Option<&Path>,
    persistenced: bool,
) -> install::InstallResult {
    let mut opts = cfg.install_options(artifact.to_path_buf());
    opts.persistenced = persistenced;
    if let Some(p) = fabric_manager {
        match install::FabricManagerArchive::local(p) {
            Ok(a) => opts.fabric_manager = Some(a),
            Err(e) => return install::install_refused(&opts, e),
        }
    }
    install::install(&opts)
}

/// `install`, with the plan's module parameters, IOMMU setting and
/// daemons when `run` resolved one, and the Fabric Manager it fetched.
fn install_planned(
    cfg: &Config,
    artifact: &Path,
    plan: Option<&InstallPlan>,
    fabric_manager: Option<install::FabricManagerArchive>,
) -> install::InstallResult {
    let mut opts = cfg.install_options(artifact.to_path_buf());
    opts.fabric_manager = fabric_manager;
    if let Some(plan) = plan {
        opts.persistenced = plan.status.persistenced.is_some();
        for m in &plan.status.module_params {
            let joined = match opts.planned_params.remove(&m.module) {
                Some(p) => format!("{p} {}", m.params),
                None => m.params.clone(),
            };
            opts.planned_params.insert(m.module.clone(), joined);
        }
        opts.iommu_passthrough = plan.status.iommu_passthrough.is_some();
    }
    install::install(&opts)
}

/// `verify`: nvidia-smi against detect and the installed manifest, and the
/// CUDA check.
pub fn verify(cfg: &Config, driver_version: Option<String>) -> verify::VerifyResult {
    verify::verify(&VerifyOptions {
        root: &cfg.root,
        nvidia_smi: cfg.nvidia_smi.clone(),
        libcuda: cfg.libcuda.clone(),
        driver_version,
    })
}

/// `run`: each step's document goes to stderr; the RunResult summarizes.
pub fn run(cfg: &Config) -> RunResult {
    let spec = RunSpec {
        host_root: cfg.root.path().display().to_string(),
        artifact: cfg.artifact.as_ref().map(|p| p.display().to_string()),
        driver_version: cfg.driver_version.clone(),
        target: None,
    };
    let mut steps = Steps::new();
    if let Err(e) = check_install_flags(cfg) {
        return steps.stop(spec, &e);
    }
    let catalog = match cfg.load_catalog() {
        Ok(c) => c,
        Err(e) => return steps.stop(spec, &e),
    };
    let report = detect_with(cfg, &catalog);
    if !steps.push(Kind::HostReport, &report) {
        return steps.finish(spec);
    }
    let (artifact, plan, fm) = match &cfg.artifact {
        Some(a) => (a.clone(), None, None),
        None => match plan_fetch_build(cfg, &catalog, &report, &mut steps) {
            Ok(Built { artifact, plan, fm }) => (artifact, Some(plan), fm),
            Err(None) => return steps.finish(spec),
            Err(Some(e)) => return steps.stop(spec, &e),
        },
    };
    let installed = install_planned(cfg, &artifact, plan.as_deref(), fm);
    if !steps.push(Kind::InstallResult, &installed) {
        return steps.finish(spec);
    }
    steps.set_installed(Installed {
        driver_version: installed.status.driver_version.clone(),
        flavor: installed.status.flavor,
        kernel_release: installed.status.kernel_release.clone(),
    });
    let verified = verify(cfg, installed.status.driver_version.clone());
    steps.push(Kind::VerifyResult, &verified);
    steps.finish(spec)
}

/// `--no-compile`, `--artifact-sha256` and `--cache-entry` are about the
/// cache: without one they could never be honoured.
fn check_install_flags(cfg: &Config) -> Result<()> {
    if let Some(sha) = &cfg.artifact_sha256 {
        crate::cache::check_sha256_flag(sha)?;
        if cfg.cache.is_none() && cfg.artifact.is_none() {
            return Err(Error::new(
                Failure::InvalidArgument,
                "--artifact-sha256 is the expected sha256 of the cached artifact, and there is no --cache-url",
            ));
        }
    }
    if let Some(entry) = &cfg.cache_entry {
        crate::cache::check_entry_flag(entry, cfg.artifact_sha256.is_some())?;
        if cfg.cache.is_none() {
            return Err(Error::new(
                Failure::InvalidArgument,
                "--cache-entry names an entry of the artifact cache, and there is no --cache-url",
            ));
        }
    }
    if cfg.no_compile && cfg.cache.is_none() && cfg.artifact.is_none() {
        return Err(Error::new(
            Failure::InvalidArgument,
            "--no-compile without --cache-url (or --artifact): nothing could supply the artifact",
        )
        .with_hint("pass the artifact cache with --cache-url, or allow compiling on the node"));
    }
    Ok(())
}

/// What resolve → fetch → build hands to install.
struct Built {
    artifact: PathBuf,
    plan: Box<InstallPlan>,
    fm: Option<install::FabricManagerArchive>,
}

/// resolve → fetch (the driver, then Fabric Manager where planned) →
/// build; the artifact, or the error to end the run with (`None`: the
/// last step's outcome).
fn plan_fetch_build(
    cfg: &Config,
    catalog: &Catalog,
    report: &HostReport,
    steps: &mut Steps,
) -> std::result::Result<Built, Option<Error>> {
    let plan = resolve_with(cfg, catalog, report);
    if !steps.push(Kind::InstallPlan, &plan) {
        return Err(None);
    }
    // A cached artifact holds the modules, firmware and user space: on a
    // hit the driver package (hundreds of MB) is never downloaded.
    let early = look_up_first(cfg, &plan);
    let fetched = match early {
        Some(_) => None,
        None => {
            let fetched = fetch_step(cfg, Some(&plan));
            if !steps.push(Kind::FetchResult, &fetched) {
                return Err(None);
            }
            Some(fetched)
        }
    };
    let mut fm = None;
    if let Some(got) = fetch_fabric_manager(cfg, &plan) {
        if !steps.push(Kind::FetchResult, &got) {
            return Err(None);
        }
        fm = fabric_manager_archive(&plan, &got);
    }
    let built = match (early, &fetched) {
        (Some(built), _) => built,
        (None, Some(fetched)) => build_step(cfg, &plan, fetched),
        (None, None) => {
            return Err(Some(Error::new(
                Failure::Internal,
                "neither a cache hit nor a fetched package",
            )));
        }
    };
    if !steps.push(Kind::BuildResult, &built) {
        return Err(None);
    }
    match &built.status.artifact {
        Some(a) => Ok(Built {
            artifact: PathBuf::from(a),
            plan: Box::new(plan),
            fm,
        }),
        None => Err(Some(Error::new(
            Failure::Internal,
            "build succeeded without an artifact",
        ))),
    }
}

/// The verified Fabric Manager archive a fetch produced.
fn fabric_manager_archive(
    plan: &InstallPlan,
    got: &FetchResult,
) -> Option<install::FabricManagerArchive> {
    let fm = plan.status.fabric_manager.as_ref()?;
    Some(install::FabricManagerArchive {
        path: PathBuf::from(got.status.path.as_ref()?),
        sha256: got.status.sha256.clone()?,
        version: fm.version.clone(),
    })
}

pub use gpu_driver_contract::run::{
    BuiltArtifact, Installed, PrebuildTarget, RunResult, RunSpec, RunStatus, Step,
};

/// Collects steps; `push` says whether to go on.
pub struct Steps {
    steps: Vec<Step>,
    installed: Option<Installed>,
    built: Option<BuiltArtifact>,
}

impl Default for Steps {
    fn default() -> Self {
        Self::new()
    }
}

impl Steps {
    pub fn new() -> Self {
        Steps {
            steps: Vec::new(),
            installed: None,
            built: None,
        }
    }

    /// Records a step's document (also logged whole on stderr) and returns
    /// true when it succeeded.
    pub fn push<T: ResultDocument>(&mut self, kind: Kind, doc: &T) -> bool {
        if let Ok(json) = serde_json::to_string(doc) {
            tracing::info!("{kind:?}: {json}");
        }
        let o = doc.outcome();
        self.steps.push(Step {
            kind,
            phase: o.phase,
            reason: o.reason,
            message: o.message.clone(),
            bytes_downloaded: doc.bytes_downloaded(),
        });
        o.phase == Phase::Succeeded
    }

    /// Records what the install step loaded.
    pub fn set_installed(&mut self, installed: Installed) {
        self.installed = Some(installed);
    }

    /// Records what a prebuild left in the cache.
    pub fn set_built(&mut self, built: BuiltArtifact) {
        self.built = Some(built);
    }

    /// Ends the run with the last step's outcome.
    pub fn finish(self, spec: RunSpec) -> RunResult {
        let outcome = self.steps.last().map_or_else(
            || Outcome::new(Reason::Internal, "run had no steps"),
            |s| Outcome::new(s.reason, s.message.clone()),
        );
        self.end(spec, outcome)
    }

    /// Ends the run with the error that stopped it outside any step.
    pub fn stop(self, spec: RunSpec, error: &Error) -> RunResult {
        self.end(spec, Outcome::from(error))
    }

    /// Ends the run with a success of its own (`prebuild`'s `Built`).
    pub fn succeed(self, spec: RunSpec, done: Done) -> RunResult {
        self.end(spec, done.into())
    }

    fn end(self, spec: RunSpec, outcome: Outcome) -> RunResult {
        Document::new(
            Kind::RunResult,
            spec,
            RunStatus {
                outcome,
                installed: self.installed,
                built: self.built,
                bytes_downloaded: self.steps.iter().map(|s| s.bytes_downloaded).sum(),
                steps: self.steps,
            },
        )
    }
}
