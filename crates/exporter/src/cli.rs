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
use gpu_driver_contract::host::{HostRoot, HostRootSource};

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
    #[error("cannot listen on {addr}: {source}; pass a free address with --listen")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
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

/// Binds, then serves until a signal.
pub fn serve(cli: &Cli) -> Result<(), Error> {
    // One thread serves everything; NVML's blocking calls get one more.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(2)
        .build()
        .map_err(Error::Runtime)?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(cli.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: cli.listen,
                source,
            })?;
        let addr = listener.local_addr().unwrap_or(cli.listen);
        let cfg = config(cli);
        tracing::info!(
            host_root = %cfg.host_root.path().display(),
            kubelet_socket = %cfg.kubelet_socket.display(),
            "listening on {addr}"
        );
        let scraper = Arc::new(Scraper::new(cfg));
        // Load NVML now, so that its state is logged before the first
        // scrape; in the background: /healthz answers from the start, even
        // while an NVML init hangs.
        let first = scraper.clone();
        tokio::spawn(async move { drop(first.snapshot().await) });
        tokio::select! {
            () = server::serve(listener, scraper) => {}
            () = gpu_driver_serve::shutdown_signal() => tracing::info!("stopping"),
        }
        Ok(())
    })
}

/// The binary's whole body: exit 0 after a signal, 1 when it cannot
/// start, 2 on bad arguments.
pub fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    gpu_driver_contract::logging::init_tracing(
        "info",
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
    );
    match serve(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
