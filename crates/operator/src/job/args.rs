//! The installer's command line in each Job: its subcommand (`detect`,
//! `run`, `prebuild`) and the flags the GpuDriver and the request give it.

use super::layout::{CATALOG_DIR, CATALOG_KEY, SIGNING_CERT, SIGNING_DIR, SIGNING_KEY};
use super::request::JobRequest;
use crate::crd::GpuDriver;
use crate::decide::JobRole;

pub(super) fn installer_args(gd: &GpuDriver, req: &JobRequest<'_>) -> Vec<String> {
    let spec = &gd.spec;
    // A build Job's root is its own image's: it never sees a host.
    let host_root = if req.role == JobRole::Build {
        "/"
    } else {
        "/proc/1/root"
    };
    let mut args: Vec<String> = ["--host-root", host_root, "--log-level", "info"]
        .map(String::from)
        .to_vec();
    if spec.driver.catalog_config_map.is_some() {
        args.extend(["--catalog".into(), format!("{CATALOG_DIR}/{CATALOG_KEY}")]);
    }
    let driver = |args: &mut Vec<String>| {
        args.extend(["--flavor".into(), spec.driver.flavor.as_str().into()]);
        if let Some(v) = &spec.driver.version {
            args.extend(["--driver-version".into(), v.clone()]);
        }
    };
    let cache = |args: &mut Vec<String>| {
        if let Some(c) = &spec.cache {
            args.extend(["--cache-url".into(), c.url.clone()]);
            if c.allow_http {
                args.push("--allow-http".into());
            }
        }
    };
    match req.role {
        JobRole::Detect => args.push("detect".into()),
        JobRole::Install => {
            args.push("run".into());
            driver(&mut args);
            // The cache only with the build Job's digest: an install Job
            // never takes whatever entry the store holds for its key (a
            // failed build, or no build target, means compiling on the
            // node without the cache).
            if let Some(sha) = req.expect_sha256.filter(|_| spec.cache.is_some()) {
                cache(&mut args);
                args.push("--cache-read-only".into());
                args.extend(["--artifact-sha256".into(), sha.to_string()]);
                if let Some(entry) = req.cache_entry {
                    args.extend(["--cache-entry".into(), entry.to_string()]);
                }
                if !req.compile {
                    args.push("--no-compile".into());
                }
            }
            args.extend(spec.extra_args.iter().cloned());
        }
        JobRole::Build => {
            args.push("prebuild".into());
            if let Some(t) = req.target {
                let (id, version) = t.os_release();
                args.extend([
                    "--os-id".into(),
                    id.into(),
                    "--os-version".into(),
                    version,
                    "--kernel-release".into(),
                    t.kernel.clone(),
                    "--arch".into(),
                    t.arch.clone(),
                ]);
            }
            driver(&mut args);
            cache(&mut args);
            args.extend(signing_args(gd));
        }
    }
    args
}

/// `prebuild`'s `--signing-key` and `--signing-cert`, the files of the
/// signing Secret's volume, where the GpuDriver names one. Build Jobs
/// only: an install Job's `run` never gets the key.
fn signing_args(gd: &GpuDriver) -> Vec<String> {
    if gd.spec.build.signing_secret_name.is_none() {
        return Vec::new();
    }
    vec![
        "--signing-key".into(),
        format!("{SIGNING_DIR}/{SIGNING_KEY}"),
        "--signing-cert".into(),
        format!("{SIGNING_DIR}/{SIGNING_CERT}"),
    ]
}
