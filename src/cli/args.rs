//! The command line's arguments: the only clap in the library.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::fetch::RetryPolicy;
use crate::node::ModuleFlavor;
use crate::resolve::FlavorChoice;

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
