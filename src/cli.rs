//! Command line: parses arguments, runs one command, prints its result
//! document and turns its reason into the exit code.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use std::time::Duration;

use crate::build::{self, BuildOptions, BuildResult};
use crate::catalog::Catalog;
use crate::detect::{self, DetectOptions, DetectSpec, HostReport};
use crate::error::{Error, Result};
use crate::fetch::{
    self, ChecksumSource, FetchOptions, FetchResult, PackageRequest, RetryPolicy, Timeouts,
};
use crate::host::{HostRoot, HostRootSource, ModuleFlavor};
use crate::load::{self, InstallOptions, UninstallOptions};
use crate::report::{self, Kind, Outcome, Reason, ResultDocument};
use crate::resolve::{self, FlavorChoice, InstallPlan, ResolveOptions, ResolveSpec};
use crate::run::{Installed, RunResult, RunSpec, Steps};
use crate::verify::{self, VerifyOptions};

#[derive(Debug, Parser)]
#[command(
    name = "gpu-driver-installer",
    version,
    about = "Detects a node, resolves the NVIDIA driver it needs, and reports in JSON",
    long_about = None
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// The host's root filesystem. Default: /host if it holds an os-release,
    /// else /proc/1/root in a hostPID pod, else /.
    #[arg(long, global = true, value_name = "PATH", env = "GPU_DRIVER_HOST_ROOT")]
    pub host_root: Option<PathBuf>,
    /// Catalog file to use instead of the embedded one.
    #[arg(long, global = true, value_name = "PATH", env = "GPU_DRIVER_CATALOG")]
    pub catalog: Option<PathBuf>,
    /// Kernel release to target instead of the running one.
    #[arg(long, global = true, value_name = "RELEASE")]
    pub kernel_release: Option<String>,
    /// Write the result document here (atomically) instead of stdout.
    #[arg(long, global = true, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Where Kubernetes reads the termination message; written only if it
    /// exists and is writable.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        default_value = "/dev/termination-log"
    )]
    pub termination_log: PathBuf,
    /// Diagnostics on stderr: error, warn, info, debug, trace (or RUST_LOG).
    #[arg(long, global = true, value_name = "LEVEL", default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Report the OS, kernel, NVIDIA GPUs, loaded driver and Secure Boot state.
    Detect,
    /// Decide driver version, module flavor, kernel headers and package.
    Resolve(PlanArgs),
    /// Download the plan's package (or --url) into the cache, verified.
    Fetch(FetchArgs),
    /// Compile the kernel modules of a driver package for a kernel and
    /// package them (modules, firmware, manifest) into one file.
    Build(BuildArgs),
    /// Load a build artifact's modules (vermagic checked first), place the
    /// driver root, create device nodes.
    Install(InstallArgs),
    /// Unload NVIDIA's modules (or --module NAME ...), holders first.
    Uninstall(UninstallArgs),
    /// Run the installed nvidia-smi and compare with detect.
    Verify(VerifyArgs),
    /// The Job: detect, resolve, fetch, build, install, verify.
    Run(RunArgs),
    /// Print the JSON Schema of every result document.
    Schema,
    /// Copy this binary to PATH (mode 0755) and print PATH: the init
    /// container of an operator Job uses it to hand the installer from the
    /// scratch installer image to the builder image (no `cp` in scratch).
    CopySelf {
        #[arg(value_name = "PATH")]
        dest: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The build artifact: a .tar.zst (or other tar) or a directory holding
    /// manifest.json, modules/*.ko and optional firmware/.
    #[arg(long, value_name = "PATH")]
    pub artifact: PathBuf,
    #[command(flatten)]
    pub load: LoadArgs,
}

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Module parameters: `module key=value ...` lines.
    #[arg(long, value_name = "PATH")]
    pub module_params: Option<PathBuf>,
    /// Do not load nvidia-drm even if the artifact has it.
    #[arg(long)]
    pub no_drm: bool,
    /// Load nvidia-peermem too (needs the InfiniBand stack, ib_core).
    #[arg(long)]
    pub peermem: bool,
    /// Try to unload another loaded driver version even when it looks in
    /// use (the kernel still refuses a module with users).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// Module to unload (repeatable). Default: NVIDIA's stack.
    #[arg(long = "module", value_name = "NAME")]
    pub modules: Vec<String>,
    /// Try the unload even when the module looks in use.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// nvidia-smi to run. Default: <host-root>/var/lib/gpu-driver/drivers/current/usr/bin/nvidia-smi.
    #[arg(long, value_name = "PATH")]
    pub nvidia_smi: Option<PathBuf>,
    /// Expected driver version. Default: the current driver root's manifest.
    #[arg(long, value_name = "VERSION")]
    pub driver_version: Option<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Install this prebuilt artifact instead of resolving, fetching and
    /// building.
    #[arg(long, value_name = "PATH")]
    pub artifact: Option<PathBuf>,
    /// nvidia-smi for the verify step (see verify --nvidia-smi).
    #[arg(long, value_name = "PATH")]
    pub nvidia_smi: Option<PathBuf>,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub fetch: FetchArgs,
}

#[derive(Debug, Args)]
pub struct FetchArgs {
    /// Fetch this URL instead of the resolved plan's package.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Expected sha256 (64 hex digits). Without it: the catalog, then a
    /// `<url>.sha256sum` companion, then NVIDIA's redistrib manifest.
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// NVIDIA redistrib_<version>.json to take the checksum from.
    #[arg(long, value_name = "URL")]
    pub manifest: Option<String>,
    /// Mirror to try after the primary URL, in order (repeatable): a prefix
    /// the file name is appended to, or a template with {file}/{version}.
    #[arg(long = "mirror", value_name = "URL")]
    pub mirrors: Vec<String>,
    /// Package cache. Default: <host-root>/var/cache/gpu-driver/packages.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Never touch the network: succeed only from the cache.
    #[arg(long)]
    pub offline: bool,
    /// Allow plain http:// URLs (trusted networks only).
    #[arg(long)]
    pub allow_http: bool,
    /// Retries per URL after the first attempt (exponential backoff).
    #[arg(long, value_name = "N", default_value_t = RetryPolicy::default().retries)]
    pub retries: u32,
    /// Wait before the first retry, in milliseconds; doubles each retry.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub backoff_ms: u64,
    /// Connect timeout in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub connect_timeout: u64,
    /// Timeout for the response head and for each read, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub read_timeout: u64,
    /// Extra CA certificates (PEM) for private mirrors.
    #[arg(long, value_name = "PATH")]
    pub ca_bundle: Option<PathBuf>,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub plan: PlanArgs,
}

/// The artifact cache in the cluster owner's object storage (docs/cache.md).
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// Artifact cache: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX,
    /// az://CONTAINER/PREFIX or file:///DIR. Endpoint and credentials come
    /// from the provider's environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
    /// ...). Also a private mirror of driver packages (<url>/packages/).
    #[arg(long, value_name = "URL", env = "GPU_DRIVER_CACHE_URL")]
    pub cache_url: Option<String>,
    /// How long to wait for another builder compiling the same key before
    /// compiling here, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = crate::cache::DEFAULT_WAIT_SECS)]
    pub cache_wait: u64,
    /// Age after which a builder's lease counts as abandoned, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = crate::cache::DEFAULT_LEASE_TTL_SECS)]
    pub cache_lease_ttl: u64,
    /// How often a waiting builder looks for the artifact, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = crate::cache::DEFAULT_POLL_MS)]
    pub cache_poll_ms: u64,
}

impl CacheArgs {
    /// The checked configuration; `None` without `--cache-url`.
    pub fn config(&self, allow_http: bool) -> Result<Option<crate::cache::CacheConfig>> {
        let Some(url) = &self.cache_url else {
            return Ok(None);
        };
        let cfg = crate::cache::CacheConfig {
            wait: Duration::from_secs(self.cache_wait),
            lease_ttl: Duration::from_secs(self.cache_lease_ttl),
            poll: Duration::from_millis(self.cache_poll_ms.max(10)),
            ..crate::cache::CacheConfig::new(url, allow_http)
        };
        cfg.check()?;
        Ok(Some(cfg))
    }
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The driver package: NVIDIA's .run, a module-source tarball (Debian's
    /// /usr/src/nvidia-open-kernel.tar.xz) or an unpacked directory.
    #[arg(long, value_name = "PATH")]
    pub source: PathBuf,
    /// Kernel release to build for. Default: --kernel-release, else the
    /// running kernel.
    #[arg(long, value_name = "RELEASE")]
    pub kernel: Option<String>,
    /// The release's kernel headers. Default: /usr/src/linux-headers-<rel>
    /// or /lib/modules/<rel>/build under the host root.
    #[arg(long, value_name = "DIR")]
    pub headers: Option<PathBuf>,
    /// Kernel module flavor to build.
    #[arg(long, value_enum)]
    pub flavor: BuildFlavor,
    /// Where the packaged artifact is written.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Work directory (extraction, compile, build.log). Default:
    /// <out>/work-<flavor>-<release>.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Keep the extracted and compiled tree (the log is always kept).
    #[arg(long)]
    pub keep_work: bool,
    /// Parallel compile jobs. Default: the number of CPUs available.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub jobs: Option<u16>,
    /// The driver version, where the source does not declare it; must agree
    /// with the source when it does. With --cache-url it lets a cache hit
    /// skip extracting the source.
    #[arg(long, value_name = "VERSION")]
    pub driver_version: Option<String>,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Allow a plain http:// cache endpoint (trusted networks only).
    #[arg(long)]
    pub allow_http: bool,
}

/// `build` needs a concrete flavor: "auto" is `resolve`'s decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BuildFlavor {
    Open,
    Proprietary,
}

impl From<BuildFlavor> for ModuleFlavor {
    fn from(f: BuildFlavor) -> Self {
        match f {
            BuildFlavor::Open => ModuleFlavor::Open,
            BuildFlavor::Proprietary => ModuleFlavor::Proprietary,
        }
    }
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Install exactly this driver version (e.g. 580.95.05).
    #[arg(long, value_name = "VERSION")]
    pub driver_version: Option<String>,
    /// Kernel module flavor.
    #[arg(long, value_enum, default_value_t = FlavorChoice::Auto)]
    pub flavor: FlavorChoice,
}

/// Where packages are cached on the host, so that a later Job finds them.
pub const DEFAULT_PACKAGE_CACHE: &str = "/var/cache/gpu-driver/packages";

/// Entry point: returns the process exit code.
pub fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; usage errors
            // print to stderr and exit 2.
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    init_tracing(&cli.global.log_level);
    match execute(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(e.reason.exit_code())
        }
    }
}

fn init_tracing(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Runs the command; `Err` only when the result itself cannot be delivered.
pub fn execute(cli: &Cli) -> Result<u8> {
    let g = &cli.global;
    match &cli.command {
        Command::Schema => {
            emit_raw(g, &crate::schema::results_schema_json()?)?;
            Ok(0)
        }
        Command::CopySelf { dest } => {
            copy_self(dest)?;
            emit_raw(g, &format!("{}\n", dest.display()))?;
            Ok(0)
        }
        Command::Detect => {
            let root = host_root(g);
            let doc = match load_catalog(g) {
                Ok((catalog, _)) => detect::detect(&DetectOptions {
                    root: &root,
                    catalog: &catalog,
                    kernel_release: g.kernel_release.clone(),
                }),
                Err(e) => failed_host_report(&root, g, &e),
            };
            deliver(g, Kind::HostReport, &doc)
        }
        Command::Fetch(args) => {
            let doc = run_fetch(g, args);
            deliver(g, Kind::FetchResult, &doc)
        }
        Command::Build(args) => {
            let doc = run_build(g, args);
            deliver(g, Kind::BuildResult, &doc)
        }
        Command::Install(args) => {
            let root = host_root(g);
            let doc = load::install(&install_options(
                g,
                &root,
                args.artifact.clone(),
                &args.load,
            ));
            deliver(g, Kind::InstallResult, &doc)
        }
        Command::Uninstall(args) => {
            let root = host_root(g);
            let doc = load::uninstall(&UninstallOptions {
                root: &root,
                modules: args.modules.clone(),
                force: args.force,
            });
            deliver(g, Kind::InstallResult, &doc)
        }
        Command::Verify(args) => {
            let root = host_root(g);
            let doc = verify::verify(&VerifyOptions {
                root: &root,
                nvidia_smi: args.nvidia_smi.clone(),
                driver_version: args.driver_version.clone(),
            });
            deliver(g, Kind::VerifyResult, &doc)
        }
        Command::Run(args) => {
            let doc = run_job(g, args);
            deliver(g, Kind::RunResult, &doc)
        }
        Command::Resolve(args) => {
            let root = host_root(g);
            let doc = match load_catalog(g) {
                Ok((catalog, label)) => resolve::resolve(&ResolveOptions {
                    root: &root,
                    catalog: &catalog,
                    catalog_label: label,
                    kernel_release: g.kernel_release.clone(),
                    driver_version: args.driver_version.clone(),
                    flavor: args.flavor,
                }),
                Err(e) => failed_plan(&root, g, args, &e),
            };
            deliver(g, Kind::InstallPlan, &doc)
        }
    }
}

fn run_build(g: &GlobalArgs, args: &BuildArgs) -> BuildResult {
    let root = host_root(g);
    let jobs = args.jobs.map(usize::from).unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let mut opts = BuildOptions {
        source: args.source.clone(),
        kernel_release: String::new(),
        headers: args.headers.clone(),
        root,
        flavor: args.flavor.into(),
        out_dir: args.out.clone(),
        work_dir: args.work_dir.clone(),
        keep_work: args.keep_work,
        jobs,
        driver_version: args.driver_version.clone(),
        cache: None,
    };
    match args.cache.config(args.allow_http) {
        Ok(c) => opts.cache = c,
        Err(e) => return build::build_failed(opts.spec(), Outcome::from_error(&e)),
    }
    let release = match args.kernel.clone().or_else(|| g.kernel_release.clone()) {
        Some(r) => Ok(r),
        None => crate::host::read_kernel_release(&opts.root),
    };
    match release {
        Ok(r) => {
            opts.kernel_release = r;
            build::build(&opts)
        }
        Err(e) => build::build_failed(opts.spec(), Outcome::from_error(&e)),
    }
}

/// Where `run` keeps what it builds and the headers it downloads, on the
/// host, so that a rerun after a crash finds them.
const BUILD_CACHE: &str = "/var/cache/gpu-driver/builds";
const HEADERS_CACHE: &str = "/var/cache/gpu-driver/headers";

/// `run`'s build step: the fetched package, compiled for the plan's kernel
/// with the plan's flavor, against installed headers or the headers package
/// from the OS's repository.
fn run_build_step(
    root: &HostRoot,
    plan: &InstallPlan,
    fetched: &FetchResult,
    fetch_args: &FetchArgs,
) -> BuildResult {
    let st = &plan.status;
    let release = st.kernel_release.clone().unwrap_or_default();
    let mut opts = BuildOptions {
        source: PathBuf::from(fetched.status.path.clone().unwrap_or_default()),
        kernel_release: release.clone(),
        headers: None,
        root: root.clone(),
        flavor: st.module_flavor.unwrap_or(ModuleFlavor::Proprietary),
        out_dir: root.join(BUILD_CACHE),
        work_dir: None,
        keep_work: false,
        jobs: std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        driver_version: st.driver_version.clone(),
        cache: None,
    };
    match fetch_args.cache.config(fetch_args.allow_http) {
        Ok(c) => opts.cache = c,
        Err(e) => return build::build_failed(opts.spec(), Outcome::from_error(&e)),
    }
    if let Some(h) = &st.headers {
        match h.source {
            resolve::HeadersSource::Installed => {
                opts.headers = h.path.as_ref().map(|p| root.join(p));
            }
            resolve::HeadersSource::Package => {
                let fetch_opts = fetch_options(root, fetch_args);
                let scratch = root.join(HEADERS_CACHE).join(&release);
                let tree = if scratch.join("usr/src").is_dir() {
                    // Downloaded by an earlier run: the tree is renamed into
                    // place only when complete.
                    Ok(scratch
                        .join("usr/src")
                        .join(format!("linux-headers-{release}")))
                } else {
                    crate::headers::fetch_headers(
                        h.repository.as_deref().unwrap_or_default(),
                        h.suite.as_deref().unwrap_or_default(),
                        &release,
                        &fetch_opts,
                        &scratch,
                    )
                    .map(|t| t.arch_dir)
                };
                match tree {
                    Ok(dir) => opts.headers = Some(dir),
                    Err(e) => return build::build_failed(opts.spec(), Outcome::from_error(&e)),
                }
            }
        }
    }
    build::build(&opts)
}

fn install_options<'a>(
    g: &GlobalArgs,
    root: &'a HostRoot,
    artifact: PathBuf,
    load: &LoadArgs,
) -> InstallOptions<'a> {
    InstallOptions {
        root,
        artifact,
        kernel_release: g.kernel_release.clone(),
        module_params: load.module_params.clone(),
        drm: !load.no_drm,
        peermem: load.peermem,
        force: load.force,
    }
}

/// `run`: each step's document goes to stderr; the RunResult summarizes.
fn run_job(g: &GlobalArgs, args: &RunArgs) -> RunResult {
    let root = host_root(g);
    let spec = RunSpec {
        host_root: root.path().display().to_string(),
        artifact: args.artifact.as_ref().map(|p| p.display().to_string()),
        driver_version: args.fetch.plan.driver_version.clone(),
    };
    let mut steps = Steps::new();
    let (catalog, label) = match load_catalog(g) {
        Ok(c) => c,
        Err(e) => return steps.finish(spec, Some(Outcome::from_error(&e))),
    };
    let report = detect::detect(&DetectOptions {
        root: &root,
        catalog: &catalog,
        kernel_release: g.kernel_release.clone(),
    });
    if !steps.push(Kind::HostReport, &report) {
        return steps.finish(spec, None);
    }
    let artifact = match &args.artifact {
        Some(a) => a.clone(),
        None => {
            let plan = resolve::resolve(&ResolveOptions {
                root: &root,
                catalog: &catalog,
                catalog_label: label,
                kernel_release: g.kernel_release.clone(),
                driver_version: args.fetch.plan.driver_version.clone(),
                flavor: args.fetch.plan.flavor,
            });
            if !steps.push(Kind::InstallPlan, &plan) {
                return steps.finish(spec, None);
            }
            let fetched = run_fetch(g, &args.fetch);
            if !steps.push(Kind::FetchResult, &fetched) {
                return steps.finish(spec, None);
            }
            let built = run_build_step(&root, &plan, &fetched, &args.fetch);
            if !steps.push(Kind::BuildResult, &built) {
                return steps.finish(spec, None);
            }
            match &built.status.artifact {
                Some(a) => PathBuf::from(a),
                None => {
                    return steps.finish(
                        spec,
                        Some(Outcome::new(
                            Reason::Internal,
                            "build succeeded without an artifact",
                        )),
                    );
                }
            }
        }
    };
    let installed = load::install(&install_options(g, &root, artifact, &args.load));
    if !steps.push(Kind::InstallResult, &installed) {
        return steps.finish(spec, None);
    }
    steps.set_installed(Installed {
        driver_version: installed.status.driver_version.clone(),
        flavor: installed.status.flavor,
        kernel_release: installed.status.kernel_release.clone(),
    });
    let verified = verify::verify(&VerifyOptions {
        root: &root,
        nvidia_smi: args.nvidia_smi.clone(),
        driver_version: installed.status.driver_version.clone(),
    });
    steps.push(Kind::VerifyResult, &verified);
    steps.finish(spec, None)
}

/// The network policy of `fetch`, shared by every download of a run.
fn fetch_options(root: &HostRoot, args: &FetchArgs) -> FetchOptions {
    FetchOptions {
        urls: Vec::new(),
        sha256: String::new(),
        cache_dir: args
            .cache_dir
            .clone()
            .unwrap_or_else(|| root.join(DEFAULT_PACKAGE_CACHE)),
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
        },
        ca_bundle: args.ca_bundle.clone(),
        progress_bar: true,
    }
}

fn run_fetch(g: &GlobalArgs, args: &FetchArgs) -> FetchResult {
    let root = host_root(g);
    let opts = fetch_options(&root, args);
    let flag_sum = args
        .sha256
        .as_ref()
        .map(|s| (s.clone(), ChecksumSource::Flag));
    let request = match &args.url {
        Some(url) => Ok(PackageRequest {
            url: url.clone(),
            sha256: flag_sum,
            mirrors: args.mirrors.clone(),
            version: None,
            manifest: args.manifest.clone(),
        }),
        None => plan_request(g, &root, args, flag_sum),
    };
    let cache = match args.cache.config(args.allow_http) {
        Ok(c) => c,
        Err(e) => {
            return fetch::fetch_package_failed(
                args.url.clone().unwrap_or_default(),
                &opts,
                Outcome::from_error(&e),
            );
        }
    };
    match request {
        Ok(req) => match &cache {
            Some(c) => fetch_via_store(c, &req, opts),
            None => fetch::fetch_package(&req, opts),
        },
        Err(e) => fetch::fetch_package_failed(
            args.url.clone().unwrap_or_default(),
            &opts,
            Outcome::from_error(&e),
        ),
    }
}

/// `fetch` with the cache's store as a private package mirror: a package the
/// store holds (`<cache-url>/packages/<file>`) is placed into the local
/// package cache if its sha256 is the trusted one, and a package downloaded
/// from elsewhere is stored there for the other nodes. The store never
/// supplies a checksum, and its failures are only warnings.
fn fetch_via_store(
    cache: &crate::cache::CacheConfig,
    req: &PackageRequest,
    opts: FetchOptions,
) -> FetchResult {
    let file = fetch::file_name_of(&req.url);
    let sha = match &req.sha256 {
        Some((s, _)) => Some(s.to_ascii_lowercase()),
        None if !opts.offline => fetch::find_checksum(req, &opts).ok().map(|(s, _)| s),
        None => None,
    };
    let mut restored = None;
    if let Some(sha) = sha.filter(|s| fetch::is_sha256_hex(s)) {
        let dest = opts.cache_dir.join(&sha);
        if !dest.exists() {
            match crate::cache::restore_package(cache, &file, &sha, &dest) {
                Ok(Some(n)) => {
                    tracing::info!("{file}: {n} bytes from the cache store {}", cache.url);
                    restored = Some(n);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("{file}: cache store not used as a mirror: {e}"),
            }
        }
    }
    let mut doc = fetch::fetch_package(req, opts);
    if doc.status.outcome.reason != Reason::Fetched {
        return doc;
    }
    if let Some(n) = restored {
        doc.status.outcome.message = format!(
            "{file} came from the cache store {}/{} ({n} bytes) and was verified against the trusted sha256 at {}",
            cache.url.trim_end_matches('/'),
            crate::cache::package_object(&file),
            doc.status.path.as_deref().unwrap_or("?")
        );
    } else if let Some(path) = &doc.status.path {
        match crate::cache::store_package(cache, &file, Path::new(path)) {
            Ok(true) => tracing::info!("{file}: stored in the cache store {}", cache.url),
            Ok(false) => {}
            Err(e) => tracing::warn!("{file}: not stored in the cache store: {e}"),
        }
    }
    doc
}

/// The package of the resolved plan; fails with the plan's own reason.
fn plan_request(
    g: &GlobalArgs,
    root: &HostRoot,
    args: &FetchArgs,
    flag_sum: Option<(String, ChecksumSource)>,
) -> Result<PackageRequest> {
    let (catalog, label) = load_catalog(g)?;
    let plan = resolve::resolve(&ResolveOptions {
        root,
        catalog: &catalog,
        catalog_label: label,
        kernel_release: g.kernel_release.clone(),
        driver_version: args.plan.driver_version.clone(),
        flavor: args.plan.flavor,
    });
    let outcome = &plan.status.outcome;
    let package = match (&plan.status.package, outcome.reason) {
        (Some(p), Reason::Resolved) => p,
        _ => return Err(Error::new(outcome.reason, outcome.message.clone())),
    };
    let mut mirrors = args.mirrors.clone();
    mirrors.extend(package.mirrors.iter().cloned());
    Ok(PackageRequest {
        url: package.url.clone(),
        sha256: flag_sum.or_else(|| {
            package
                .sha256
                .as_ref()
                .map(|s| (s.clone(), ChecksumSource::Catalog))
        }),
        mirrors,
        version: plan.status.driver_version.clone(),
        manifest: args.manifest.clone(),
    })
}

fn host_root(g: &GlobalArgs) -> HostRoot {
    match &g.host_root {
        Some(p) => HostRoot::new(p, HostRootSource::Flag),
        None => HostRoot::auto(),
    }
}

fn load_catalog(g: &GlobalArgs) -> Result<(Catalog, String)> {
    match &g.catalog {
        Some(p) => Ok((Catalog::load(p)?, p.display().to_string())),
        None => Ok((Catalog::embedded()?, "embedded".to_string())),
    }
}

fn failed_host_report(root: &HostRoot, g: &GlobalArgs, e: &Error) -> HostReport {
    detect::detect_failed(
        DetectSpec {
            host_root: root.path().display().to_string(),
            host_root_source: root.source(),
            kernel_release_override: g.kernel_release.clone(),
        },
        Outcome::from_error(e),
    )
}

fn failed_plan(root: &HostRoot, g: &GlobalArgs, args: &PlanArgs, e: &Error) -> InstallPlan {
    resolve::plan_failed(
        ResolveSpec {
            host_root: root.path().display().to_string(),
            driver_version: args.driver_version.clone(),
            flavor: args.flavor,
            kernel_release_override: g.kernel_release.clone(),
            catalog: g
                .catalog
                .as_ref()
                .map_or("embedded".into(), |p| p.display().to_string()),
        },
        Outcome::from_error(e),
    )
}

/// Prints (or writes) the document, copies it to the termination log, logs
/// the outcome on stderr and returns the exit code of its reason.
fn deliver<T: ResultDocument + Serialize>(g: &GlobalArgs, kind: Kind, doc: &T) -> Result<u8> {
    let outcome = doc.outcome();
    match outcome.reason.phase() {
        report::Phase::Failed => tracing::error!("{}: {}", outcome.reason, outcome.message),
        _ => tracing::info!("{}: {}", outcome.reason, outcome.message),
    }
    emit_raw(g, &report::to_json(doc)?)?;
    let message = report::termination_message(kind, doc)?;
    if let Err(e) = report::write_termination_log(&g.termination_log, &message) {
        tracing::warn!("termination log not written: {e}");
    }
    Ok(outcome.reason.exit_code())
}

fn emit_raw(g: &GlobalArgs, text: &str) -> Result<()> {
    match &g.output {
        Some(path) => write_atomic(path, text.as_bytes()),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| Error::io(Reason::Internal, "writing", Path::new("<stdout>"), e))
        }
    }
}

fn copy_self(dest: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe()
        .map_err(|e| Error::new(Reason::Internal, format!("finding this binary: {e}")))?;
    let bytes = std::fs::read(&exe).map_err(|e| Error::io(Reason::Internal, "reading", &exe, e))?;
    write_atomic(dest, &bytes)?;
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io(Reason::InvalidArgument, "chmod", dest, e))
}

/// Temp file in the same directory, fsync, rename: a reader never sees a
/// half-written result.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "result".into());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let io = |action: &str, p: &Path, e| Error::io(Reason::InvalidArgument, action, p, e);
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| io("writing", &tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("renaming into place", path, e)
    })
}
