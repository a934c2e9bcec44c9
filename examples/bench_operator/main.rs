//! One run of `scripts/bench-operator` against a cluster that script
//! started: N simulated Garden Linux GPU nodes from nothing to all ready,
//! with the operator (watch-based) or the naive polling baseline
//! ([`naive`], which only this benchmark builds), in this process. Prints one JSON line: convergence seconds and the write
//! requests the apiserver counted (apiserver_request_total, after minus
//! before) on what only the operator writes: Job creates, node patches (not
//! nodes/status: KWOK's heartbeats), events.k8s.io Events and GpuDriver
//! status. Leases are left out: the controller-manager and scheduler renew
//! theirs, and the operator runs here without leader election.
//!
//! Usage: bench_operator --kubeconfig FILE --nodes N [--naive] [--timeout S]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gpu_driver::operator::controller::{self, Options};
use gpu_driver::operator::crd::GpuDriver;
use gpu_driver::operator::keys;
use gpu_driver::operator::metrics::Metrics;
use gpu_driver::report::{Kind, Outcome, Reason};
use gpu_driver::run::{Installed, RunSpec, Steps};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, CustomResourceExt};
use serde_json::json;

mod naive;

const NS: &str = "gpu-driver";

struct Args {
    kubeconfig: String,
    nodes: usize,
    naive: bool,
    timeout: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        kubeconfig: String::new(),
        nodes: 100,
        naive: false,
        timeout: 600,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--kubeconfig" => a.kubeconfig = it.next().ok_or("--kubeconfig FILE")?,
            "--nodes" => a.nodes = it.next().and_then(|n| n.parse().ok()).ok_or("--nodes N")?,
            "--timeout" => {
                a.timeout = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--timeout S")?
            }
            "--naive" => a.naive = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.kubeconfig.is_empty() {
        return Err("--kubeconfig FILE is required".into());
    }
    Ok(a)
}

fn success_message() -> String {
    let mut steps = Steps::new();
    steps.set_installed(Installed {
        driver_version: Some("580.95.05".into()),
        flavor: Some(gpu_driver::host::ModuleFlavor::Open),
        kernel_release: Some("6.6.63-cloud-amd64".into()),
    });
    let doc = steps.finish(
        RunSpec {
            host_root: "/proc/1/root".into(),
            artifact: None,
            driver_version: None,
        },
        Some(Outcome::new(Reason::Verified, "driver 580.95.05 verified")),
    );
    gpu_driver::report::termination_message(Kind::RunResult, &doc).unwrap_or_default()
}

/// apiserver_request_total summed by (verb, group, resource, subresource).
async fn request_totals(client: &Client) -> Result<BTreeMap<String, f64>, String> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client
        .request_text(req)
        .await
        .map_err(|e| format!("GET /metrics: {e}"))?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let get = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let key = format!(
            "{} {}/{}/{}",
            get("verb"),
            get("group"),
            get("resource"),
            get("subresource")
        );
        *out.entry(key).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

/// The writes only the operator (or the baseline) makes.
fn operator_writes(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> (f64, BTreeMap<String, f64>) {
    let counted = [
        "POST batch/jobs/",
        "PATCH /nodes/",
        "PUT /nodes/",
        "POST events.k8s.io/events/",
        "PATCH events.k8s.io/events/",
        "PATCH gpu-driver.gardenlinux.io/gpudrivers/status",
        "PUT gpu-driver.gardenlinux.io/gpudrivers/status",
    ];
    let mut by = BTreeMap::new();
    let mut total = 0.0;
    for k in counted {
        let d = after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
        if d > 0.0 {
            by.insert(k.to_string(), d);
            total += d;
        }
    }
    (total, by)
}

/// Reads of nodes, Jobs and pods (GET and LIST; watches are not counted).
/// The controllers watch rather than poll, so these are nearly all the
/// operator's (or the baseline's), plus this program's one LIST a second.
fn reads(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> f64 {
    after
        .iter()
        .filter(|(k, _)| {
            (k.starts_with("GET ") || k.starts_with("LIST "))
                && ["/nodes/", "batch/jobs/", "/pods/"]
                    .iter()
                    .any(|r| k.ends_with(r))
        })
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0.0))
        .sum()
}

async fn setup(client: &Client, nodes: usize) -> Result<(), String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let _ = crds.create(&PostParams::default(), &GpuDriver::crd()).await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NS}})).map_err(|e| e.to_string())?;
    let _ = nss.create(&PostParams::default(), &ns).await;
    // The CRD must be served before a GpuDriver can be created.
    let gds: Api<GpuDriver> = Api::all(client.clone());
    let gd: GpuDriver = serde_json::from_value(json!({
        "apiVersion": "gpu-driver.gardenlinux.io/v1alpha1",
        "kind": "GpuDriver",
        "metadata": {"name": "bench"},
        "spec": {
            "nodeSelector": {"pool": "gpu"},
            "builderImages": [{"gardenLinuxVersion": "1592", "image": "kmodbuild:{gardenLinuxVersion}"}],
            "installerImage": "gpu-driver-installer:bench",
            "maxParallel": 0,
            "podAnnotations": {"sim.gpu-driver.gardenlinux.io/termination-message": success_message()},
        }
    }))
    .map_err(|e| e.to_string())?;
    let mut tries = 0;
    loop {
        match gds.create(&PostParams::default(), &gd).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 => break,
            Err(e) if tries < 100 => {
                tries += 1;
                tracing_sleep(&e).await;
            }
            Err(e) => return Err(format!("creating the GpuDriver: {e}")),
        }
    }
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..nodes)
        .for_each_concurrent(32, |i| {
            let api = api.clone();
            async move {
                let n: Node = serde_json::from_value(json!({
                    "metadata": {"name": format!("gpu-{i:05}"), "labels": {
                        "pool": "gpu",
                        keys::NFD_NVIDIA_LABEL: "true",
                        "node.kubernetes.io/instance-type": "p4d.24xlarge",
                    }},
                    "status": {"nodeInfo": {
                        "kernelVersion": "6.6.63-cloud-amd64",
                        "osImage": "Garden Linux 1592.4",
                        "bootID": format!("boot-{i}"),
                        "architecture": "amd64",
                    }}
                }))
                .unwrap_or_default();
                if let Err(e) = api.create(&PostParams::default(), &n).await {
                    eprintln!("creating node {i}: {e}");
                }
            }
        })
        .await;
    Ok(())
}

async fn tracing_sleep(e: &kube::Error) {
    eprintln!("waiting for the CRD: {e}");
    tokio::time::sleep(Duration::from_millis(200)).await;
}

async fn ready_count(client: &Client) -> usize {
    let api: Api<Node> = Api::all(client.clone());
    api.list_metadata(&ListParams::default().labels(&format!("{}=true", keys::READY_LABEL)))
        .await
        .map_or(0, |l| l.items.len())
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let a = args()?;
    let kc = kube::config::Kubeconfig::read_from(&a.kubeconfig).map_err(|e| e.to_string())?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    gpu_driver::tls::init();
    let client = Client::try_from(cfg).map_err(|e| e.to_string())?;

    setup(&client, a.nodes).await?;
    let before = request_totals(&client).await?;
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = rx.await;
    };
    let started = Instant::now();
    let task = if a.naive {
        tokio::spawn(naive::run(
            client.clone(),
            NS.into(),
            Duration::from_secs(1),
            metrics.clone(),
            stop,
        ))
    } else {
        tokio::spawn(controller::run(
            client.clone(),
            Options {
                namespace: NS.into(),
                instance: "bench".into(),
                status_interval: Duration::from_secs(2),
            },
            metrics.clone(),
            stop,
        ))
    };
    let mut converged = None;
    let mut last = 0;
    while started.elapsed() < Duration::from_secs(a.timeout) {
        // Each poll lists up to N nodes' metadata: once a second keeps the
        // observer's own load on the apiserver small.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let n = ready_count(&client).await;
        if n != last {
            eprintln!(
                "{:>7.1}s  {n}/{} nodes ready",
                started.elapsed().as_secs_f64(),
                a.nodes
            );
            last = n;
        }
        if n >= a.nodes {
            converged = Some(started.elapsed().as_secs_f64());
            break;
        }
    }
    // Let in-flight writes (status, late Events) land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    let after = request_totals(&client).await?;
    let (writes, by) = operator_writes(&before, &after);
    let own = metrics.total("gpu_driver_api_writes_total");
    let read = reads(&before, &after);
    let round = |x: f64| (x * 100.0).round() / 100.0;
    println!(
        "{}",
        json!({
            "mode": if a.naive { "naive" } else { "operator" },
            "nodes": a.nodes,
            "readyNodes": last,
            "convergeSeconds": converged.map(round),
            "writesPerNode": round(writes / a.nodes as f64),
            "readsPerNode": round(read / a.nodes as f64),
            "apiserverWrites": by,
            "clientWrites": own,
        })
    );
    Ok(())
}
