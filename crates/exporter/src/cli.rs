//! `gpu-driver-exporter --listen ADDR [--host-root PATH] [--nvml PATH]
//! [--kubelet-socket PATH]`: arguments, logging, the runtime, and serving
//! until SIGTERM or SIGINT. Logs go to stderr (`RUST_LOG` filters them);
//! stdout stays empty.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use crate::scrape::{Config, Scraper};
use crate::{podresources, server};
use gpu_driver_contract::host_root::{HostRoot, HostRootSource};

#[derive(Debug, Parser)]
#[command(
    name = "gpu-driver-exporter",
    version,
    about = "Per-GPU and per-pod GPU metrics for Prometheus, from NVML and the kubelet"
)]
pub struct Cli {
    /// Address to serve /metrics and /healthz on (the DCGM exporter's port).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9400")]
    pub listen: SocketAddr,
    /// The host's root file system (its /proc, the kubelet's socket, the
    /// installed driver root); `/host` in a pod that mounts it there.
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub host_root: PathBuf,
    /// libnvidia-ml.so.1 to load [default: the installed driver root's,
    /// <host-root>/var/lib/gpu-driver/drivers/current/usr/lib/<arch>-linux-gnu/,
    /// else the dynamic loader's libnvidia-ml.so.1].
    #[arg(long, value_name = "PATH")]
    pub nvml: Option<PathBuf>,
    /// The kubelet's PodResources socket [default:
    /// <host-root>/var/lib/kubelet/pod-resources/kubelet.sock].
    #[arg(long, value_name = "PATH")]
    pub kubelet_socket: Option<PathBuf>,
}

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot listen on {0}; pass a free address with --listen")]
    Bind(#[source] gpu_driver_serve::BindError),
}

/// The node's name for the `Hostname` label, as the DCGM exporter finds
/// it: `NODE_NAME` (the downward API), else the host name.
fn hostname() -> String {
    if let Ok(n) = std::env::var("NODE_NAME") {
        if !n.is_empty() {
            return n;
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn config(cli: &Cli) -> Config {
    let host_root = HostRoot::new(&cli.host_root, HostRootSource::Flag);
    Config {
        kubelet_socket: cli
            .kubelet_socket
            .clone()
            .unwrap_or_else(|| podresources::default_socket(&host_root)),
        nvml: cli.nvml.clone(),
        hostname: hostname(),
        host_root,
    }
}

/// The binary's whole body: exit 0 after a signal, 1 when it cannot
/// start, 2 on bad arguments.
pub fn run() -> ExitCode {
    gpu_driver_serve::cli::run_command_line(
        |_: &Cli, ansi| gpu_driver_contract::logging::init_tracing("info", ansi),
        |cli: Cli| execute(&cli),
    )
}

fn execute(cli: &Cli) -> Result<(), Error> {
    // One thread serves everything; NVML's blocking calls get one more.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(2)
        .build()
        .map_err(Error::Runtime)?;
    rt.block_on(export(cli))
}

/// Serves `/metrics` and `/healthz` until a signal.
async fn export(cli: &Cli) -> Result<(), Error> {
    let cfg = config(cli);
    let (host_root, kubelet_socket) = (cfg.host_root.clone(), cfg.kubelet_socket.clone());
    let scraper = Arc::new(Scraper::new(cfg));
    let addr = gpu_driver_serve::start_server(cli.listen, server::router(scraper.clone()))
        .await
        .map_err(Error::Bind)?;
    tracing::info!(
        host_root = %host_root.path().display(),
        kubelet_socket = %kubelet_socket.display(),
        "listening on {addr}"
    );
    // Load NVML now, so that its state is logged before the first scrape;
    // in the background: /healthz answers from the start, even while an
    // NVML init hangs.
    tokio::spawn(async move { drop(scraper.snapshot().await) });
    gpu_driver_serve::shutdown_signal().await;
    tracing::info!("stopping");
    Ok(())
}
