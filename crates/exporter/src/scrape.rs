//! One scrape: NVML (on a blocking thread, with the processes' cgroups)
//! and the kubelet's PodResources API at the same time, into a
//! [`Snapshot`], rendered.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::metrics::{self, GpuReading, Health, ProcessOwner, Snapshot};
use crate::nvml::{self, Collected, NvmlConfig};
use crate::{cgroup, containers, podresources};
use gpu_driver_contract::host_root::HostRoot;

/// How long a scrape waits for the kubelet; Prometheus' default scrape
/// timeout is 10 s.
pub const PODRESOURCES_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a scrape waits for NVML. A collection that takes longer (an
/// init or a call stuck in the driver) goes on alone; the scrape reports
/// NVML down, and the scrapes after it share that collection rather than
/// start more.
pub const NVML_TIMEOUT: Duration = Duration::from_secs(5);

/// The NVML side of one scrape, shared by the scrapes that wait for it.
type NvmlSide = Arc<(Collected, Owners)>;

/// What the exporter reads, from the command line.
#[derive(Debug, Clone)]
pub struct Config {
    pub host_root: HostRoot,
    pub nvml: Option<PathBuf>,
    pub kubelet_socket: PathBuf,
    /// The `Hostname` label.
    pub hostname: String,
}

/// Process owners by PID, and the PIDs in no pod.
type Owners = (BTreeMap<u32, ProcessOwner>, BTreeSet<u32>);

pub struct Scraper {
    nvml: Arc<Mutex<nvml::Source>>,
    /// The collection under way, if any: a scrape that comes while it runs
    /// waits for its result instead of queueing another blocking call.
    in_flight: Arc<Mutex<Option<tokio::sync::broadcast::Sender<NvmlSide>>>>,
    host_root: HostRoot,
    socket: PathBuf,
    hostname: String,
    /// The last PodResources error logged, so a lasting one is logged once.
    last_pr_error: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which processes on the GPUs run in which pod container (names only
/// when the kubelet's log links are readable), and which in no pod.
pub fn process_owners(
    root: &HostRoot,
    gpus: &[GpuReading],
) -> (BTreeMap<u32, ProcessOwner>, BTreeSet<u32>) {
    let mut owners = BTreeMap::new();
    let mut host = BTreeSet::new();
    let mut names = None;
    for p in gpus.iter().flat_map(|g| &g.processes) {
        let pc = match cgroup::read(root, p.pid) {
            Ok(Some(pc)) => pc,
            Ok(None) => {
                host.insert(p.pid);
                continue;
            }
            Err(e) => {
                tracing::debug!(pid = p.pid, "no cgroup for a GPU process: {e}");
                continue;
            }
        };
        let names =
            names.get_or_insert_with(|| containers::read_names(&containers::links_dir(root)));
        let container_names = pc
            .container_id
            .as_ref()
            .and_then(|id| names.get(id))
            .cloned();
        owners.insert(
            p.pid,
            ProcessOwner {
                pod_uid: pc.pod_uid,
                container_id: pc.container_id,
                names: container_names,
            },
        );
    }
    (owners, host)
}

/// NVML down with `error`, logged.
fn down(error: String) -> (Collected, Owners) {
    tracing::error!("{error}");
    let health = Health {
        up: false,
        error: Some(error),
    };
    (
        Collected {
            health,
            ..Default::default()
        },
        Owners::default(),
    )
}

impl Scraper {
    pub fn new(cfg: Config) -> Self {
        Scraper {
            nvml: Arc::new(Mutex::new(nvml::Source::new(NvmlConfig {
                explicit: cfg.nvml,
                host_root: cfg.host_root.clone(),
            }))),
            in_flight: Arc::default(),
            host_root: cfg.host_root,
            socket: cfg.kubelet_socket,
            hostname: cfg.hostname,
            last_pr_error: Mutex::new(None),
        }
    }

    /// NVML's readings and the process owners, off the async thread (NVML
    /// calls block, some for milliseconds), within [`NVML_TIMEOUT`]; one
    /// collection at a time, shared by the scrapes that wait for it.
    async fn nvml_side(&self) -> (Collected, Owners) {
        let mut result = {
            let mut flight = lock(&self.in_flight);
            match &*flight {
                Some(running) => running.subscribe(),
                None => {
                    let (tx, rx) = tokio::sync::broadcast::channel(1);
                    *flight = Some(tx.clone());
                    let (source, root) = (self.nvml.clone(), self.host_root.clone());
                    let in_flight = self.in_flight.clone();
                    tokio::task::spawn_blocking(move || {
                        let collected = lock(&source).collect(Instant::now());
                        let owners = process_owners(&root, &collected.gpus);
                        *lock(&in_flight) = None;
                        let _ = tx.send(Arc::new((collected, owners)));
                    });
                    rx
                }
            }
        };
        match tokio::time::timeout(NVML_TIMEOUT, result.recv()).await {
            Ok(Ok(side)) => (side.0.clone(), side.1.clone()),
            Ok(Err(e)) => down(format!("reading NVML failed unexpectedly: {e}")),
            Err(_) => down(format!(
                "NVML did not answer within {} s (a call stuck in the driver); \
                 the next scrapes wait for the same collection",
                NVML_TIMEOUT.as_secs()
            )),
        }
    }

    fn note_podresources(&self, error: Option<&str>) {
        let mut last = lock(&self.last_pr_error);
        if last.as_deref() != error {
            match error {
                Some(e) => tracing::warn!("PodResources down: {e}"),
                None => tracing::info!(socket = %self.socket.display(), "PodResources up"),
            }
            *last = error.map(str::to_string);
        }
    }

    /// Everything one scrape knows.
    pub async fn snapshot(&self) -> Snapshot {
        let start = Instant::now();
        let (nvml_side, pods) = tokio::join!(
            self.nvml_side(),
            podresources::list(&self.socket, PODRESOURCES_TIMEOUT)
        );
        let ((collected, (process_owners, host_processes)), (allocations, podresources)) = (
            nvml_side,
            match pods {
                Ok(a) => (
                    a,
                    Health {
                        up: true,
                        error: None,
                    },
                ),
                Err(e) => (
                    Vec::new(),
                    Health {
                        up: false,
                        error: Some(e.to_string()),
                    },
                ),
            },
        );
        self.note_podresources(podresources.error.as_deref());
        Snapshot {
            hostname: self.hostname.clone(),
            driver: collected.driver,
            gpus: collected.gpus,
            allocations,
            process_owners,
            host_processes,
            nvml: collected.health,
            podresources,
            scrape_seconds: start.elapsed().as_secs_f64(),
        }
    }

    /// The `/metrics` body.
    pub async fn scrape(&self) -> String {
        metrics::render(&self.snapshot().await)
    }
}
