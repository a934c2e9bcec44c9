//! The library's options from the parsed arguments: the pipeline's
//! [`Config`] and `build`'s [`BuildOptions`].

use std::time::Duration;

use super::args::{BuildArgs, FetchArgs, GlobalArgs, LoadArgs, PlanArgs};
use crate::build::BuildOptions;
use crate::fetch::{RetryPolicy, Timeouts};
use crate::host_root::{HostRoot, HostRootSource};
use crate::run::{Config, Download, LoadSettings};

pub(super) fn host_root(g: &GlobalArgs) -> HostRoot {
    match &g.host_root {
        Some(p) => HostRoot::new(p, HostRootSource::Flag),
        None => HostRoot::auto(),
    }
}

/// The pipeline's configuration from the global flags.
pub(super) fn config(g: &GlobalArgs) -> Config {
    let mut cfg = Config::new(host_root(g));
    cfg.catalog = g.catalog.clone();
    cfg.kernel_release = g.kernel_release.clone();
    cfg.arch = g.arch.as_deref().and_then(crate::node::CpuArch::parse);
    cfg
}

pub(super) fn with_plan(mut cfg: Config, args: &PlanArgs) -> Config {
    cfg.driver_version = args.driver_version.clone();
    cfg.flavor = args.flavor.into();
    cfg
}

pub(super) fn with_fetch(cfg: Config, args: &FetchArgs) -> Config {
    let mut cfg = with_plan(cfg, &args.plan);
    cfg.download = Download {
        url: args.url.clone(),
        sha256: args.sha256.clone(),
        manifest: args.manifest.clone(),
        mirrors: args.mirrors.clone(),
        cache_dir: args.cache_dir.clone(),
        offline: args.offline,
        allow_http: args.allow_http,
        retry: RetryPolicy {
            retries: args.retries,
            initial_backoff: Duration::from_millis(args.backoff_ms),
            ..RetryPolicy::default()
        },
        timeouts: Timeouts {
            connect: Duration::from_secs(args.connect_timeout),
            read: Duration::from_secs(args.read_timeout),
            total: Duration::from_secs(args.download_timeout),
            max_bytes: args.max_download_size.saturating_mul(1 << 20),
        },
        ca_bundle: args.ca_bundle.clone(),
        apt_keyring: args.apt_keyring.clone(),
    };
    cfg.cache = args.cache.config(args.allow_http);
    cfg
}

pub(super) fn with_load(mut cfg: Config, args: &LoadArgs) -> Config {
    cfg.load = LoadSettings {
        module_params: args.module_params.clone(),
        drm: args.drm,
        peermem: args.peermem,
        force: args.force,
    };
    cfg
}

pub(super) fn build_options(g: &GlobalArgs, args: &BuildArgs) -> BuildOptions {
    let jobs = args
        .jobs
        .map_or_else(crate::build::default_jobs, usize::from);
    BuildOptions {
        source: args.source.clone(),
        // Empty: the running kernel (read by build).
        kernel_release: args
            .kernel
            .clone()
            .or_else(|| g.kernel_release.clone())
            .unwrap_or_default(),
        headers: args.headers.clone(),
        root: host_root(g),
        flavor: args.flavor.into(),
        out_dir: args.out.clone(),
        work_dir: args.work_dir.clone(),
        keep_work: args.keep_work,
        jobs,
        driver_version: args.driver_version.clone(),
        arch: g.arch.as_deref().and_then(crate::node::CpuArch::parse),
        cache: args.cache.config(args.allow_http),
        no_compile: false,
        lookup_only: false,
        signing: args.signing.files(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser;

    use super::*;
    use crate::cli::args::{Cli, Command};

    #[test]
    fn apt_keyring_reaches_the_pipeline_config() {
        let cli = Cli::try_parse_from([
            "gpu-driver-installer",
            "run",
            "--apt-keyring",
            "/etc/apt/keyrings/mirror.gpg",
        ])
        .unwrap();
        let Command::Run(args) = &cli.command else {
            panic!("not run: {:?}", cli.command);
        };
        let cfg = with_fetch(config(&cli.global), &args.fetch);
        assert_eq!(
            cfg.download.apt_keyring.as_deref(),
            Some(Path::new("/etc/apt/keyrings/mirror.gpg"))
        );
        let cli = Cli::try_parse_from(["gpu-driver-installer", "run"]).unwrap();
        let Command::Run(args) = &cli.command else {
            panic!("not run");
        };
        assert_eq!(
            with_fetch(config(&cli.global), &args.fetch)
                .download
                .apt_keyring,
            None
        );
    }
}
