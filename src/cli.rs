//! Command line: parses arguments, runs one command, prints its result
//! document and turns its reason into the exit code.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::build::{self, BuildOptions};
use crate::error::{Error, Failure, Result};
use crate::fetch::{RetryPolicy, Timeouts};
use crate::host::{HostRoot, HostRootSource, ModuleFlavor};
use crate::hostfs::HostRootFs;
use crate::install::{self, UninstallOptions};
use crate::report::{self, Kind, ResultDocument};
use crate::resolve::FlavorChoice;
use crate::run::{self, Config, Download, LoadSettings};

#[derive(Debug, Parser)]
#[command(
    name = "gpu-driver-installer",
    version,
    about = "Builds, loads and verifies the NVIDIA driver for a node's exact kernel: detect, resolve, fetch, build, install, verify; every command prints one JSON result",
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
    /// CPU architecture to target instead of the running one.
    #[arg(long, global = true, value_name = "ARCH",
        value_parser = ["x86_64", "amd64", "aarch64", "arm64"])]
    pub arch: Option<String>,
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
    /// The most one extraction (a driver package, kernel headers, an
    /// artifact) may write, in MiB; past it the archive is UnsafeArchive.
    #[arg(long, global = true, value_name = "MIB",
        default_value_t = crate::extract::DEFAULT_LIMITS.max_bytes >> 20,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub max_unpacked_size: u64,
    /// The most files, directories and links one extraction may create.
    #[arg(long, global = true, value_name = "N",
        default_value_t = crate::extract::DEFAULT_LIMITS.max_entries,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub max_unpacked_entries: u64,
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
    /// Run the installed nvidia-smi and compare with detect; run CUDA
    /// (libcuda: context, allocation, copy) on every device.
    Verify(VerifyArgs),
    /// The Job: detect, resolve, fetch, build, install, verify.
    Run(RunArgs),
    /// A build Job: resolve, fetch and build for a target OS, kernel
    /// (--kernel-release) and architecture (--arch), without detecting a
    /// host, and store the artifact in the cache (--cache-url, required);
    /// status.built names the entry and the artifact's sha256.
    Prebuild(PrebuildArgs),
    /// Print the JSON Schema of every result document.
    Schema,
    /// Check the catalog (embedded, or --catalog): every OS release and
    /// kernel series resolves to a digest-pinned default that no exclusion
    /// forbids; every exclusion cites its evidence.
    CatalogCheck,
    /// Print the catalog [[exclusions]] that a build matrix suggests (TOML
    /// on stdout): one per KernelApiMismatch pair the catalog (embedded, or
    /// --catalog) does not exclude yet; covered pairs as comments.
    MatrixExclusions {
        /// The build matrix written by scripts/matrix.
        #[arg(long, value_name = "PATH", default_value = "docs/matrix.json")]
        matrix: PathBuf,
    },
    /// The module-signing certificate a host enrolls: prints its subject
    /// and SHA-256 fingerprint (JSON) and, with --out, writes it as DER,
    /// the form `mokutil --import` takes.
    SigningCert {
        /// The certificate, PEM or DER (a tls Secret's tls.crt).
        #[arg(long, value_name = "PATH")]
        signing_cert: PathBuf,
        /// Write the certificate here as DER.
        #[arg(long, value_name = "PATH")]
        out: Option<PathBuf>,
    },
    /// Make the current driver root visible at /run/nvidia/driver (a link,
    /// or a read-only bind mount onto a directory there), in the mount
    /// namespace at --mount-ns if given. Install runs it; so can a test.
    #[command(hide = true)]
    ExposeDriverRoot {
        #[arg(long, value_name = "PATH")]
        mount_ns: Option<PathBuf>,
    },
    /// Run systemctl or journalctl (with the arguments after `--`) in the
    /// mount namespace at --mount-ns: install starts the Fabric Manager and
    /// nvidia-persistenced units in the host's (PID 1's, from a hostPID
    /// pod) this way.
    #[command(hide = true)]
    HostTool {
        #[arg(long, value_name = "PATH")]
        mount_ns: PathBuf,
        #[arg(value_enum)]
        tool: HostToolArg,
        #[arg(last = true)]
        args: Vec<String>,
    },
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
    /// Fabric Manager's redistributable archive
    /// (fabricmanager-linux-<platform>-<version>-archive.tar.xz, the
    /// driver's version; `run` fetches it, verified, on NVSwitch hosts):
    /// placed into the driver root and run as a systemd service.
    #[arg(long, value_name = "PATH")]
    pub fabric_manager: Option<PathBuf>,
    /// Run the driver root's nvidia-persistenced as a systemd service
    /// (`run` does on hosts with data-center GPUs).
    #[arg(long)]
    pub persistenced: bool,
}

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Module parameters: `module key=value ...` lines.
    #[arg(long, value_name = "PATH")]
    pub module_params: Option<PathBuf>,
    /// Load nvidia-drm too (display/KMS; GPU nodes are headless, so it is
    /// off by default, as in every peer).
    #[arg(long)]
    pub drm: bool,
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
    /// libcuda.so.1 for the CUDA check. Default:
    /// <host-root>/var/lib/gpu-driver/drivers/current/usr/lib/<arch>-linux-gnu/libcuda.so.1.
    #[arg(long, value_name = "PATH")]
    pub libcuda: Option<PathBuf>,
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
    /// Never compile on the node: the artifact comes from the cache
    /// (--cache-url), stored there by a build Job (`prebuild`), or the run
    /// fails with ArtifactNotCached.
    #[arg(long)]
    pub no_compile: bool,
    /// The expected sha256 of the cached artifact (a build Job's
    /// status.built.artifactSha256): a cache entry with another is not
    /// used (with --no-compile: ChecksumMismatch).
    #[arg(long, value_name = "HEX")]
    pub artifact_sha256: Option<String>,
    /// The cache entry the build Job stored it in (its
    /// status.built.cacheKey): read directly, so the node needs neither
    /// kernel headers nor a compiler on a hit. Needs --artifact-sha256.
    #[arg(long, value_name = "PATH")]
    pub cache_entry: Option<String>,
    #[command(flatten)]
    pub fetch: FetchArgs,
    #[command(flatten)]
    pub signing: SigningArgs,
}

#[derive(Debug, Args)]
pub struct PrebuildArgs {
    /// The target's OS as its os-release names it: `gardenlinux`, `debian`.
    #[arg(long, value_name = "ID")]
    pub os_id: String,
    /// The target's OS version as detect reports it: Garden Linux's
    /// GARDENLINUX_VERSION (`1877.3`), Debian's VERSION_ID (`12`).
    #[arg(long, value_name = "VERSION")]
    pub os_version: String,
    #[command(flatten)]
    pub fetch: FetchArgs,
    #[command(flatten)]
    pub signing: SigningArgs,
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
    /// Deadline for the whole download (every source, retry and wait), in
    /// seconds.
    #[arg(long, value_name = "SECS",
        default_value_t = crate::fetch::DEFAULT_DOWNLOAD_TIMEOUT_SECS,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub download_timeout: u64,
    /// The largest download accepted, in MiB; larger is UnsafeArchive.
    #[arg(long, value_name = "MIB",
        default_value_t = crate::fetch::DEFAULT_MAX_DOWNLOAD_MIB,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub max_download_size: u64,
    /// Extra CA certificates (PEM) for private mirrors.
    #[arg(long, value_name = "PATH")]
    pub ca_bundle: Option<PathBuf>,
    /// OpenPGP keyring (binary or armored) the kernel headers' apt
    /// repository must be signed with, for a repository other than
    /// Debian's or Garden Linux's (whose keys are shipped and used by
    /// default).
    #[arg(long, value_name = "PATH")]
    pub apt_keyring: Option<PathBuf>,
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
    /// Only read the cache: take no lease, store nothing (no artifact, no
    /// package), for credentials that may only read. A miss compiles here
    /// (unless --no-compile) without storing.
    #[arg(long)]
    pub cache_read_only: bool,
}

impl CacheArgs {
    /// The configuration, `None` without `--cache-url`; the step that uses
    /// it checks it (a bad value fails that step).
    pub fn config(&self, allow_http: bool) -> Option<crate::cache::CacheConfig> {
        let url = self.cache_url.as_ref()?;
        Some(crate::cache::CacheConfig {
            wait: Duration::from_secs(self.cache_wait),
            lease_ttl: Duration::from_secs(self.cache_lease_ttl),
            poll: Duration::from_millis(self.cache_poll_ms.max(10)),
            read_only: self.cache_read_only,
            ..crate::cache::CacheConfig::new(url, allow_http)
        })
    }
}

/// Module signing (Secure Boot): both or neither.
#[derive(Debug, Args)]
pub struct SigningArgs {
    /// Sign every module with this PEM private key (a kubernetes.io/tls
    /// Secret's tls.key), with the kernel headers' scripts/sign-file. The
    /// key is only handed to sign-file: never read, logged or packaged.
    #[arg(long, value_name = "PATH", requires = "signing_cert")]
    pub signing_key: Option<PathBuf>,
    /// The key's X.509 certificate, PEM or DER (tls.crt): recorded in the
    /// artifact's manifest (subject, SHA-256) and the cache key; the
    /// certificate the hosts enroll (`signing-cert`, `mokutil --import`).
    #[arg(long, value_name = "PATH", requires = "signing_key")]
    pub signing_cert: Option<PathBuf>,
}

impl SigningArgs {
    pub fn files(&self) -> Option<crate::signing::SigningFiles> {
        match (&self.signing_key, &self.signing_cert) {
            (Some(key), Some(cert)) => Some(crate::signing::SigningFiles {
                key: key.clone(),
                cert: cert.clone(),
            }),
            _ => None,
        }
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
    /// Parallel compile jobs. Default: the number of CPUs available, fewer
    /// where the cgroup's memory limit would not hold them (320 MiB plus
    /// 128 MiB per compiler).
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
    #[command(flatten)]
    pub signing: SigningArgs,
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

/// `--flavor` of install and resolve: the library's [`FlavorChoice`],
/// spelled for clap here so the library type carries no CLI derive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlavorArg {
    Auto,
    Open,
    Proprietary,
}

impl From<FlavorArg> for FlavorChoice {
    fn from(f: FlavorArg) -> Self {
        match f {
            FlavorArg::Auto => FlavorChoice::Auto,
            FlavorArg::Open => FlavorChoice::Open,
            FlavorArg::Proprietary => FlavorChoice::Proprietary,
        }
    }
}

/// `host-tool`'s TOOL: [`crate::install::HostTool`] spelled for clap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HostToolArg {
    Systemctl,
    Journalctl,
}

impl From<HostToolArg> for crate::install::HostTool {
    fn from(t: HostToolArg) -> Self {
        match t {
            HostToolArg::Systemctl => crate::install::HostTool::Systemctl,
            HostToolArg::Journalctl => crate::install::HostTool::Journalctl,
        }
    }
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Install exactly this driver version (e.g. 580.95.05).
    #[arg(long, value_name = "VERSION")]
    pub driver_version: Option<String>,
    /// Kernel module flavor.
    #[arg(long, value_enum, default_value_t = FlavorArg::Auto)]
    pub flavor: FlavorArg,
}

/// Where packages are cached on the host, so that a later Job finds them.
pub const DEFAULT_PACKAGE_CACHE: &str = crate::run::PACKAGE_CACHE;

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

/// Diagnostics on stderr at `level` (or RUST_LOG), secrets masked; shared by
/// every binary of the package.
pub fn init_tracing(level: &str) {
    gpu_driver_contract::logging::init_tracing(
        level,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
    );
}

/// Runs the command; `Err` only when the result itself cannot be delivered.
pub fn execute(cli: &Cli) -> Result<u8> {
    let g = &cli.global;
    crate::extract::set_limits(crate::extract::Limits {
        max_bytes: g.max_unpacked_size.saturating_mul(1 << 20),
        max_entries: g.max_unpacked_entries,
    });
    match execute_tool(g, &cli.command)? {
        Some(code) => Ok(code),
        None => execute_step(g, &cli.command),
    }
}

/// The commands that print something other than a step's result
/// document, or hand over to another program; `None` for the others.
fn execute_tool(g: &GlobalArgs, command: &Command) -> Result<Option<u8>> {
    match command {
        Command::Schema => {
            emit_raw(g, &crate::schema::results_schema_json()?)?;
            Ok(Some(0))
        }
        Command::CatalogCheck => {
            let cfg = config(g);
            let doc =
                crate::catalog::check_document(cfg.catalog_label(), cfg.load_catalog_unchecked());
            deliver(g, Kind::CatalogCheck, &doc).map(Some)
        }
        Command::MatrixExclusions { matrix } => {
            let catalog = config(g).load_catalog_unchecked()?;
            emit_raw(g, &crate::catalog::matrix_exclusions(&catalog, matrix)?)?;
            Ok(Some(0))
        }
        Command::ExposeDriverRoot { mount_ns } => {
            // First: setns refuses a process that has started threads.
            if let Some(ns) = mount_ns {
                crate::userspace::enter_mount_namespace(ns)?;
            }
            let root = host_root(g);
            let current = Path::new(crate::install::DRIVERS_DIR).join("current");
            crate::userspace::expose_driver_root(&root.fs()?, &current)?;
            Ok(Some(0))
        }
        Command::HostTool {
            mount_ns,
            tool,
            args,
        } => {
            // First: setns refuses a process that has started threads.
            crate::userspace::enter_mount_namespace(mount_ns)?;
            Err(crate::install::exec_host_tool((*tool).into(), args))
        }
        Command::SigningCert { signing_cert, out } => {
            let (der, signer) = crate::signing::read_certificate(signing_cert)?;
            if let Some(out) = out {
                crate::signing::write_der(&der, out)?;
            }
            let doc = serde_json::json!({
                "subject": signer.subject,
                "sha256": signer.sha256,
                "der": out.as_ref().map(|p| p.display().to_string()),
            });
            emit_raw(g, &format!("{doc}\n"))?;
            Ok(Some(0))
        }
        Command::CopySelf { dest } => {
            crate::files::copy_self(dest)?;
            emit_raw(g, &format!("{}\n", dest.display()))?;
            Ok(Some(0))
        }
        _ => Ok(None),
    }
}

/// The pipeline's steps and `run`/`prebuild`: each delivers its result
/// document.
fn execute_step(g: &GlobalArgs, command: &Command) -> Result<u8> {
    match command {
        Command::Detect => deliver(g, Kind::HostReport, &run::detect(&config(g))),
        Command::Resolve(args) => {
            let cfg = with_plan(config(g), args);
            deliver(g, Kind::InstallPlan, &run::resolve(&cfg))
        }
        Command::Fetch(args) => {
            let cfg = with_fetch(config(g), args);
            deliver(g, Kind::FetchResult, &run::fetch(&cfg))
        }
        Command::Build(args) => {
            let doc = build::build(&build_options(g, args));
            deliver(g, Kind::BuildResult, &doc)
        }
        Command::Install(args) => {
            let cfg = with_load(config(g), &args.load);
            let doc = run::install_with_daemons(
                &cfg,
                &args.artifact,
                args.fabric_manager.as_deref(),
                args.persistenced,
            );
            deliver(g, Kind::InstallResult, &doc)
        }
        Command::Uninstall(args) => {
            let root = host_root(g);
            let doc = install::uninstall(&UninstallOptions {
                root: &root,
                modules: args.modules.clone(),
                force: args.force,
            });
            deliver(g, Kind::InstallResult, &doc)
        }
        Command::Verify(args) => {
            let mut cfg = config(g);
            cfg.nvidia_smi = args.nvidia_smi.clone();
            cfg.libcuda = args.libcuda.clone();
            let doc = run::verify(&cfg, args.driver_version.clone());
            deliver(g, Kind::VerifyResult, &doc)
        }
        Command::Run(args) => {
            let mut cfg = with_load(with_fetch(config(g), &args.fetch), &args.load);
            cfg.artifact = args.artifact.clone();
            cfg.nvidia_smi = args.nvidia_smi.clone();
            cfg.no_compile = args.no_compile;
            cfg.artifact_sha256 = args.artifact_sha256.clone();
            cfg.cache_entry = args.cache_entry.clone();
            cfg.signing = args.signing.files();
            deliver(g, Kind::RunResult, &run::run(&cfg))
        }
        Command::Prebuild(args) => {
            let mut cfg = with_fetch(config(g), &args.fetch);
            cfg.signing = args.signing.files();
            let doc = run::prebuild(&cfg, &args.os_id, &args.os_version);
            deliver(g, Kind::RunResult, &doc)
        }
        _ => Err(Error::new(
            Failure::Internal,
            "a tool command reached the steps' dispatch",
        )),
    }
}

fn host_root(g: &GlobalArgs) -> HostRoot {
    match &g.host_root {
        Some(p) => HostRoot::new(p, HostRootSource::Flag),
        None => HostRoot::auto(),
    }
}

/// The pipeline's configuration from the global flags.
fn config(g: &GlobalArgs) -> Config {
    let mut cfg = Config::new(host_root(g));
    cfg.catalog = g.catalog.clone();
    cfg.kernel_release = g.kernel_release.clone();
    cfg.arch = g.arch.as_deref().and_then(crate::host::CpuArch::parse);
    cfg
}

fn with_plan(mut cfg: Config, args: &PlanArgs) -> Config {
    cfg.driver_version = args.driver_version.clone();
    cfg.flavor = args.flavor.into();
    cfg
}

fn with_fetch(cfg: Config, args: &FetchArgs) -> Config {
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

fn with_load(mut cfg: Config, args: &LoadArgs) -> Config {
    cfg.load = LoadSettings {
        module_params: args.module_params.clone(),
        drm: args.drm,
        peermem: args.peermem,
        force: args.force,
    };
    cfg
}

fn build_options(g: &GlobalArgs, args: &BuildArgs) -> BuildOptions {
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
        arch: g.arch.as_deref().and_then(crate::host::CpuArch::parse),
        cache: args.cache.config(args.allow_http),
        no_compile: false,
        lookup_only: false,
        signing: args.signing.files(),
    }
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
        Some(path) => {
            crate::files::write_atomic(path, text.as_bytes(), 0o644, Failure::InvalidArgument)
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| Error::io(Failure::Internal, "writing", Path::new("<stdout>"), e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
