//! The pipeline's steps as commands of their own (`detect`, `resolve`,
//! `fetch`, `install`, `verify`) and the pieces `run` and `prebuild` chain:
//! each takes the [`Config`] and returns its step's document.

use std::path::{Path, PathBuf};

use crate::build::{self, BuildOptions, BuildResult};
use crate::catalog::Catalog;
use crate::detect::{self, DetectOptions, HostReport};
use crate::error::{Error, Failure, Result};
use crate::fetch::{self, ChecksumSource, FetchResult, PackageRequest};
use crate::install;
use crate::node::{CpuArch, ModuleFlavor};
use crate::resolve::{self, InstallPlan, ResolveOptions, ResolveSpec};
use crate::verify::{self, VerifyOptions};

use super::config::{BUILD_CACHE, Config, HEADERS_CACHE};

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

pub(super) fn detect_with(cfg: &Config, catalog: &Catalog) -> HostReport {
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

pub(super) fn resolve_with(cfg: &Config, catalog: &Catalog, report: &HostReport) -> InstallPlan {
    resolve::resolve_report(
        &ResolveOptions {
            root: &cfg.root,
            catalog,
            catalog_label: cfg.catalog_label(),
            kernel_release: cfg.kernel_release.clone(),
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
pub(super) fn fetch_step(cfg: &Config, plan: Option<&InstallPlan>) -> FetchResult {
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
pub(super) fn fetch_fabric_manager(cfg: &Config, plan: &InstallPlan) -> Option<FetchResult> {
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
pub(super) fn build_step(cfg: &Config, plan: &InstallPlan, fetched: &FetchResult) -> BuildResult {
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
                None => crate::node::running_arch()?,
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
pub(crate) fn install_with_daemons(
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
pub(super) fn install_planned(
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
