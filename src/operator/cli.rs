//! `gpu-driver-operator` commands: `run` (the operator), `crd` (print the
//! CRD), `naive` (the benchmark's polling baseline).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

use super::controller::{self, Options};
use super::leader::{self, LeaseConfig};
use super::metrics::{self, Metrics};

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
    /// The benchmark's baseline: poll every node instead of watching.
    Naive {
        #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-driver")]
        namespace: String,
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
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

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log_level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
    match execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn execute(command: Command) -> Result<(), String> {
    match command {
        Command::Crd => {
            let yaml = super::crd::crd_yaml().map_err(|e| format!("rendering the CRD: {e}"))?;
            print!("{yaml}");
            Ok(())
        }
        Command::Run(args) => runtime()?.block_on(run(args)),
        Command::Naive {
            namespace,
            interval_ms,
        } => runtime()?.block_on(async move {
            let client = kube::Client::try_default()
                .await
                .map_err(|e| format!("connecting to the API server: {e}"))?;
            let m = Arc::new(Metrics::default());
            super::naive::run(
                client,
                namespace,
                Duration::from_millis(interval_ms),
                m,
                shutdown_signal(),
            )
            .await;
            Ok(())
        }),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

async fn run(args: RunArgs) -> Result<(), String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("connecting to the API server: {e}"))?;
    let metrics = Arc::new(Metrics::default());
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|e| format!("binding {}: {e}", args.metrics_addr))?;
    tracing::info!("metrics on http://{}/metrics", args.metrics_addr);
    tokio::spawn(metrics::serve(listener, metrics.clone()));

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
        controller::run(client, opts, metrics, shutdown_signal()).await;
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
            return Err("lost the leader lease".to_string());
        }
        () = shutdown_signal() => {}
    }
    let _ = tx.send(());
    let _ = ctl.await;
    Ok(())
}
