//! `prebuild`: resolve → fetch → build for a target given on the command
//! line instead of a detected host, and the artifact stored in the cache.

use super::config::Config;
use super::steps::{build_step, fetch_step, look_up_first, resolve_with};
use super::summary::{BuiltArtifact, PrebuildTarget, RunResult, RunSpec, Steps};
use crate::build::BuildResult;
use crate::catalog::Catalog;
use crate::detect::{self, HostReport};
use crate::error::{Error, Failure, Result, Success};
use crate::node::CpuArch;
use crate::report::{Kind, Reason};
use crate::resolve::{FlavorChoice, InstallPlan};
use crate::step::Done;

/// `prebuild`: resolve → fetch → build for a target given on the command
/// line (the OS as its os-release names it, `--kernel-release`, `--arch`)
/// instead of a detected host: a build Job, without host access and
/// without GPUs, stores the artifact in the cache for the install Jobs of
/// the target's nodes. `Built` only when the artifact is in the store
/// afterwards (a hit, or stored by this build), with `status.built`;
/// otherwise `CacheWriteFailed`.
pub fn prebuild(cfg: &Config, os_id: &str, os_version: &str) -> RunResult {
    let spec = RunSpec {
        host_root: cfg.root.path().display().to_string(),
        artifact: None,
        driver_version: cfg.driver_version.clone(),
        target: Some(PrebuildTarget {
            os_id: os_id.to_string(),
            os_version: os_version.to_string(),
            kernel_release: cfg.kernel_release.clone(),
            arch: cfg.arch,
        }),
    };
    let mut steps = Steps::new();
    let (kernel, arch) = match check_prebuild_flags(cfg, os_id, os_version) {
        Ok(t) => t,
        Err(e) => return steps.stop(spec, &e),
    };
    let catalog = match cfg.load_catalog() {
        Ok(c) => c,
        Err(e) => return steps.stop(spec, &e),
    };
    let detect_spec = detect::spec(&cfg.root, Some(kernel.clone()), Some(arch));
    let report = detect::target_report(detect_spec, &catalog, os_id, os_version, &kernel, arch);
    if let Err(e) = crate::step::succeeded(&report.status.outcome) {
        return steps.stop(spec, &e);
    }
    let plan = prebuild_plan(cfg, &catalog, &report);
    if !steps.push(Kind::InstallPlan, &plan) {
        return steps.finish(spec);
    }
    // The target already in the store: a hit without downloading the
    // package (a second build Job of the key, or an entry put there first).
    let built = match look_up_first(cfg, &plan) {
        Some(hit) => hit,
        None => {
            let fetched = fetch_step(cfg, Some(&plan));
            if !steps.push(Kind::FetchResult, &fetched) {
                return steps.finish(spec);
            }
            build_step(cfg, &plan, &fetched)
        }
    };
    if !steps.push(Kind::BuildResult, &built) {
        return steps.finish(spec);
    }
    match stored_artifact(&built) {
        Ok((b, message)) => {
            steps.set_built(b);
            steps.succeed(spec, Done::new(Success::Built, message))
        }
        Err(e) => steps.stop(spec, &e),
    }
}

/// The target's kernel and architecture, required; a cache that may be
/// written, required and checked before anything is downloaded.
fn check_prebuild_flags(cfg: &Config, os_id: &str, os_version: &str) -> Result<(String, CpuArch)> {
    let missing = |what: &str| {
        Error::new(
            Failure::InvalidArgument,
            format!("prebuild needs {what}: it builds for a target, not for the host it runs on"),
        )
        .with_hint("e.g. prebuild --os-id gardenlinux --os-version 1877.3 --kernel-release 6.12.44-cloud-amd64 --arch amd64 --cache-url s3://BUCKET/PREFIX")
    };
    if os_id.is_empty() || os_version.is_empty() {
        return Err(missing(
            "--os-id and --os-version (os-release's ID and version: gardenlinux 1877.3, debian 12)",
        ));
    }
    let kernel = match cfg.kernel_release.as_deref() {
        Some(k) if !k.is_empty() => k.to_string(),
        _ => return Err(missing("--kernel-release (the target's kernel release)")),
    };
    let arch = cfg
        .arch
        .ok_or_else(|| missing("--arch (the target's CPU architecture: amd64 or arm64)"))?;
    let cache = cfg.cache.as_ref().ok_or_else(|| {
        missing("--cache-url (the store that install Jobs read the artifact from)")
    })?;
    if cache.read_only {
        return Err(Error::new(
            Failure::InvalidArgument,
            "prebuild with --cache-read-only: prebuild exists to store the artifact, so its cache must be writable",
        ));
    }
    cache.check()?;
    Ok((kernel, arch))
}

/// The target's plan. No GPU is known: `--flavor auto` is what resolve
/// chooses without GPUs (by the driver branch and the kernel's rules); if
/// that is refused, the open modules, which drive Turing and newer (every
/// current data-center GPU).
fn prebuild_plan(cfg: &Config, catalog: &Catalog, report: &HostReport) -> InstallPlan {
    let mut plan = resolve_with(cfg, catalog, report);
    if cfg.flavor != FlavorChoice::Auto {
        return plan;
    }
    if plan.status.outcome.reason == Reason::FlavorNotSupported {
        let refused = plan.status.outcome.message.clone();
        let mut open = cfg.clone();
        open.flavor = FlavorChoice::Open;
        plan = resolve_with(&open, catalog, report);
        if plan.status.module_flavor.is_some() {
            plan.status.flavor_reason = Some(format!(
                "prebuild targets no GPU in particular and auto was refused ({refused}); built open: the open modules drive Turing and newer, every current data-center GPU"
            ));
        }
    } else if let Some(why) = plan.status.flavor_reason.take() {
        plan.status.flavor_reason = Some(format!("no GPU known (prebuild for a target): {why}"));
    }
    plan
}

/// What a prebuild's build step left in the store, or `CacheWriteFailed`
/// quoting the cache's warnings.
fn stored_artifact(built: &BuildResult) -> Result<(BuiltArtifact, String)> {
    let st = &built.status;
    let cache = st
        .cache
        .clone()
        .unwrap_or_else(crate::cache::CacheStatus::disabled);
    let url = cache.url.as_deref().unwrap_or("(no cache)");
    let in_store = cache.outcome == crate::cache::CacheOutcome::Hit || cache.stored;
    if !in_store {
        let why = if cache.warnings.is_empty() {
            "no warning given".to_string()
        } else {
            cache.warnings.join("; ")
        };
        return Err(Error::new(
            Failure::CacheWriteFailed,
            format!(
                "built {} but it is not in the cache {url} (cache {:?}: {why})",
                st.artifact.as_deref().unwrap_or("the artifact"),
                cache.outcome
            ),
        )
        .with_hint("a build Job needs credentials that may write the store (PUT under the prefix), and the store reachable"));
    }
    let incomplete = |what: &str| {
        Error::new(
            Failure::Internal,
            format!("the build succeeded without {what}"),
        )
    };
    let b = BuiltArtifact {
        driver_version: st
            .driver_version
            .clone()
            .ok_or_else(|| incomplete("a driver version"))?,
        flavor: built.spec.flavor,
        kernel_release: built.spec.kernel_release.clone(),
        arch: st.arch.ok_or_else(|| incomplete("an architecture"))?,
        cache_key: cache.key.clone().ok_or_else(|| incomplete("a cache key"))?,
        artifact_sha256: st
            .artifact_sha256
            .clone()
            .ok_or_else(|| incomplete("an artifact sha256"))?,
    };
    let how = if cache.stored {
        "stored by this build"
    } else {
        "already there, verified"
    };
    let message = format!(
        "driver {} ({}) for kernel {} ({}) is in the cache {url} as {} ({how}), artifact sha256 {}",
        b.driver_version, b.flavor, b.kernel_release, b.arch, b.cache_key, b.artifact_sha256
    );
    Ok((b, message))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::build::{self, BuildOptions};
    use crate::host_root::{HostRoot, HostRootSource};
    use crate::node::ModuleFlavor;
    use crate::resolve;

    /// The plan `prebuild` makes for a target, on an empty root (headers
    /// come from the OS's repository then; nothing is downloaded here).
    fn target_plan(os: (&str, &str), kernel: &str, flavor: FlavorChoice) -> InstallPlan {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::new(HostRoot::new(dir.path(), HostRootSource::Flag));
        cfg.kernel_release = Some(kernel.to_string());
        cfg.arch = Some(CpuArch::X86_64);
        cfg.flavor = flavor;
        let catalog = Catalog::embedded().unwrap();
        let spec = detect::spec(&cfg.root, cfg.kernel_release.clone(), cfg.arch);
        let report = detect::target_report(spec, &catalog, os.0, os.1, kernel, CpuArch::X86_64);
        assert_eq!(report.status.outcome.reason, Reason::Detected, "{report:?}");
        assert!(report.status.gpus.is_empty());
        prebuild_plan(&cfg, &catalog, &report)
    }

    #[test]
    fn a_target_resolves_without_a_host_and_says_no_gpu_is_known() {
        let plan = target_plan(
            ("gardenlinux", "1877.3"),
            "6.12.44-cloud-amd64",
            FlavorChoice::Auto,
        );
        let st = &plan.status;
        assert_eq!(st.outcome.reason, Reason::Resolved, "{:?}", st.outcome);
        let why = st.flavor_reason.as_deref().unwrap();
        assert!(
            why.starts_with("no GPU known (prebuild for a target): "),
            "{why}"
        );
        // No headers under the empty root: the OS's repository's package.
        let headers = st.headers.as_ref().unwrap();
        assert_eq!(headers.source, resolve::HeadersSource::Package);
        assert_eq!(
            headers.package.as_deref(),
            Some("linux-headers-6.12.44-cloud-amd64")
        );
        assert_eq!(st.arch, Some(CpuArch::X86_64));

        // A flavor asked for is taken as it is, without the note.
        let plan = target_plan(("debian", "12"), "6.1.0-50-cloud-amd64", FlavorChoice::Open);
        assert_eq!(plan.status.module_flavor, Some(ModuleFlavor::Open));
        assert_eq!(
            plan.status.flavor_reason.as_deref(),
            Some("requested with --flavor open")
        );
    }

    #[test]
    fn a_prebuild_is_built_only_when_the_artifact_is_in_the_store() {
        let mut built = crate::report::Document::new(
            Kind::BuildResult,
            BuildOptions {
                source: PathBuf::from("/src.run"),
                kernel_release: "6.1.0-50-cloud-amd64".into(),
                headers: None,
                root: HostRoot::new(Path::new("/"), HostRootSource::Flag),
                flavor: ModuleFlavor::Open,
                out_dir: PathBuf::from("/out"),
                work_dir: None,
                keep_work: false,
                jobs: 1,
                driver_version: None,
                arch: None,
                cache: None,
                no_compile: false,
                lookup_only: false,
                signing: None,
            }
            .spec(),
            <build::BuildStatus as crate::step::StepStatus>::unfinished(),
        );
        let st = &mut built.status;
        st.outcome = crate::report::Outcome::new(Reason::Built, "built");
        st.driver_version = Some("535.261.03".into());
        st.arch = Some(CpuArch::X86_64);
        st.artifact = Some("/out/a.tar.zst".into());
        st.artifact_sha256 = Some("ab".repeat(32));
        let mut cache = crate::cache::CacheStatus::disabled();
        cache.outcome = crate::cache::CacheOutcome::Miss;
        cache.url = Some("s3://b/p".into());
        cache.key = Some("artifacts/v1.2/x86_64/k/535.261.03/open/cc-0".into());
        cache.warnings = vec!["not stored: uploading the artifact: 403 Forbidden".into()];
        st.cache = Some(cache.clone());
        let e = stored_artifact(&built).unwrap_err();
        assert_eq!(e.reason, Reason::CacheWriteFailed);
        assert!(e.to_string().contains("403 Forbidden"), "{e}");
        assert_eq!(e.reason.exit_code(), 13);

        cache.stored = true;
        cache.warnings.clear();
        built.status.cache = Some(cache);
        let (b, message) = stored_artifact(&built).unwrap();
        assert_eq!(b.artifact_sha256, "ab".repeat(32));
        assert_eq!(b.cache_key, "artifacts/v1.2/x86_64/k/535.261.03/open/cc-0");
        assert!(message.contains("stored by this build"), "{message}");
        let json = serde_json::to_value(&b).unwrap();
        for field in [
            "driverVersion",
            "flavor",
            "kernelRelease",
            "arch",
            "cacheKey",
            "artifactSha256",
        ] {
            assert!(json.get(field).is_some(), "{json}");
        }
    }
}
