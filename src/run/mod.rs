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
//! [`Config`] is a plain struct: the command line fills it (src/cli),
//! and nothing here knows about argument parsing.

use std::path::PathBuf;

use crate::catalog::Catalog;
use crate::detect::HostReport;
use crate::error::{Error, Failure, Result};
use crate::fetch::FetchResult;
use crate::install;
use crate::report::Kind;
use crate::resolve::InstallPlan;

mod config;
mod prebuild;
mod steps;
mod summary;

pub use config::{Config, Download, LoadSettings};
pub use prebuild::prebuild;
use steps::{
    build_step, detect_with, fetch_fabric_manager, fetch_step, install_planned, resolve_with,
};
pub use steps::{detect, fetch, install, resolve, verify};
pub(crate) use steps::{install_with_daemons, look_up_first};
pub use summary::{
    BuiltArtifact, Installed, PrebuildTarget, RunResult, RunSpec, RunStatus, Step, Steps,
};

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
