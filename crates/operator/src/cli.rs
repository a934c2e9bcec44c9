//! `gpu-driver-operator` commands: `run` (the operator), `crd` (print the
//! CRD), `job-template` (print the install Job for a GpuDriver).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::controller::{self, Options};
use crate::job::{NoJob, TemplateKind};
use crate::leader::{self, LeaseConfig};
use crate::metrics::{self, Metrics};

/// Why a command failed. Each one is logged as one line and ends the
/// process with exit code 1; the variants keep the kind (and the source
/// error) for callers that need to tell them apart.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rendering the CRD: {0}")]
    RenderCrd(#[source] serde_yaml::Error),
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error(transparent)]
    NoJob(#[from] NoJob),
    #[error("rendering: {0}")]
    RenderJob(#[source] serde_yaml::Error),
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("connecting to the API server: {0}")]
    Connect(#[source] kube::Error),
    #[error("binding {0}")]
    Bind(#[source] gpu_driver_serve::BindError),
    /// Another instance may already be acting.
    #[error("lost the leader lease")]
    LostLease,
}

#[derive(Debug, Parser)]
#[command(
    name = "gpu-driver-operator",
    version,
    about = "Installs NVIDIA drivers on GPU nodes with short-lived Jobs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Diagnostics on stderr (or RUST_LOG).
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator (kubeconfig from KUBECONFIG, ~/.kube/config or the
    /// in-cluster ServiceAccount).
    Run(RunArgs),
    /// Print the GpuDriver CustomResourceDefinition as YAML.
    Crd,
    /// Print the install Job (or the build Job) the operator would create
    /// for a GpuDriver (YAML file) and a node with this OS image and kernel.
    JobTemplate {
        #[arg(long, value_name = "FILE")]
        gpudriver: PathBuf,
        /// `install`: the privileged Job pinned to the node; `build`: the
        /// unprivileged Job that compiles for the node's target.
        #[arg(long, value_enum, default_value = "install")]
        kind: KindArg,
        /// With `--kind install`: the Job of a node whose target's build
        /// Job stored the artifact (the installer image alone,
        /// `--no-compile`), instead of one that compiles on the node.
        #[arg(long)]
        cached: bool,
        #[arg(long, default_value = "gpu-node-1")]
        node: String,
        #[arg(long, default_value = "Garden Linux 1877.3")]
        os_image: String,
        #[arg(long, default_value = "6.12.44-cloud-amd64")]
        kernel: String,
        #[arg(long, default_value = "gpu-driver")]
        namespace: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Namespace of the Jobs and the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-driver")]
    pub namespace: String,
    /// Where /metrics and /healthz are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Run without a leader Lease (one replica only).
    #[arg(long)]
    pub no_leader_elect: bool,
    /// This instance's name in the Lease and in Events.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How often the GpuDriver status is recomputed, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub status_interval_ms: u64,
}

/// The binary's whole body: exit 0 after a signal (or a printed
/// document), 1 on failure, 2 on bad arguments.
pub fn run() -> ExitCode {
    gpu_driver_serve::cli::run_command_line(
        |cli: &Cli, ansi| gpu_driver_contract::logging::init_tracing(&cli.log_level, ansi),
        |cli: Cli| execute(cli.command),
    )
}

fn execute(command: Command) -> Result<(), Error> {
    match command {
        Command::Crd => {
            let yaml = crate::crd::crd_yaml().map_err(Error::RenderCrd)?;
            print!("{yaml}");
            Ok(())
        }
        Command::Run(args) => runtime()?.block_on(operate(args)),
        Command::JobTemplate {
            gpudriver,
            kind,
            cached,
            node,
            os_image,
            kernel,
            namespace,
        } => {
            let kind = match (kind, cached) {
                (KindArg::Install, true) => TemplateKind::CachedInstall,
                (k, _) => k.into(),
            };
            let yaml = job_template(&gpudriver, kind, &node, &os_image, &kernel, &namespace)?;
            print!("# Generated by `gpu-driver-operator job-template`; do not edit.\n{yaml}");
            Ok(())
        }
    }
}

/// `--kind`'s values; the library's [`TemplateKind`] carries no clap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KindArg {
    Install,
    Build,
}

impl From<KindArg> for TemplateKind {
    fn from(k: KindArg) -> Self {
        match k {
            KindArg::Install => TemplateKind::Install,
            KindArg::Build => TemplateKind::Build,
        }
    }
}

fn job_template(
    gpudriver: &Path,
    kind: TemplateKind,
    node: &str,
    os_image: &str,
    kernel: &str,
    namespace: &str,
) -> Result<String, Error> {
    let text = std::fs::read_to_string(gpudriver).map_err(|source| Error::Read {
        path: gpudriver.to_path_buf(),
        source,
    })?;
    let gd: crate::crd::GpuDriver = serde_yaml::from_str(&text).map_err(|source| Error::Parse {
        path: gpudriver.to_path_buf(),
        source,
    })?;
    let job = crate::job::example(&gd, node, os_image, kernel, namespace, kind)?;
    serde_yaml::to_string(&job).map_err(Error::RenderJob)
}

fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)
}

/// `run`: the metrics server, then the controller (behind the leader
/// Lease unless `--no-leader-elect`) until a signal or a lost lease.
async fn operate(args: RunArgs) -> Result<(), Error> {
    let client = crate::connect().await.map_err(Error::Connect)?;
    let metrics = Arc::new(Metrics::default());
    gpu_driver_serve::start_server(args.metrics_addr, metrics::router(metrics.clone()))
        .await
        .map_err(Error::Bind)?;
    tracing::info!("metrics on http://{}/metrics", args.metrics_addr);

    let identity = args.identity.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| format!("gpu-driver-operator-{}", std::process::id()))
    });
    let opts = Options {
        namespace: args.namespace.clone(),
        instance: identity.clone(),
        status_interval: Duration::from_millis(args.status_interval_ms),
    };
    if args.no_leader_elect {
        controller::run(client, opts, metrics, gpu_driver_serve::shutdown_signal()).await;
        return Ok(());
    }
    let mut leading = leader::lead(
        client.clone(),
        LeaseConfig::new(&args.namespace, &identity),
        metrics.clone(),
    )
    .await;
    let lost = async move {
        while leading.changed().await.is_ok() {
            if !*leading.borrow() {
                return true;
            }
        }
        true
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = rx.await;
    };
    let ctl = tokio::spawn(controller::run(client, opts, metrics, stop));
    tokio::select! {
        _ = lost => {
            // Another instance may already be acting: stop at once rather
            // than finish in-flight work.
            return Err(Error::LostLease);
        }
        () = gpu_driver_serve::shutdown_signal() => {}
    }
    let _ = tx.send(());
    let _ = ctl.await;
    Ok(())
}
