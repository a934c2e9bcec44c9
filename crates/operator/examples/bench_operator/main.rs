//! One run of `scripts/bench-operator` against a cluster that script
//! started: N simulated Garden Linux GPU nodes from nothing to all ready,
//! with the operator (watch-based) or the naive polling baseline
//! ([`naive`], which only this benchmark builds), in this process. Prints
//! one JSON line: convergence seconds and the write requests the apiserver
//! counted (apiserver_request_total, after minus before) on what only the
//! operator writes: Job creates, node patches (not nodes/status: KWOK's
//! heartbeats), events.k8s.io Events and GpuDriver status. Leases are left
//! out: the controller-manager and scheduler renew theirs, and the operator
//! runs here without leader election.
//!
//! Then, with the operator only and unless `--no-upgrade`, a rolling
//! upgrade of the same nodes: the GpuDriver's pinned driver version goes
//! from [`FROM_VERSION`] to [`TO_VERSION`] with `upgradePolicy.maxUnavailable`
//! [`MAX_UNAVAILABLE`], timed until every node is installed for its new key
//! again (state Installed, no upgrade annotation, schedulable, ready label
//! on), with the writes counted over that phase alone, and the most nodes
//! seen upgrading at once (upgrade annotation or cordoned), from a watch on
//! the nodes, so that no intermediate state is missed.
//!
//! Memory: `peakRssMiB` is this process's peak resident set (VmHWM) over
//! the install phase, and in `upgrade` over the upgrade phase alone (the
//! peak is started over at each phase's start, through
//! /proc/self/clear_refs; `peakRssSinceStart` true where that failed and
//! the figure counts from the process's start). It is the operator's (or
//! the baseline's) memory together with this program's: its client, its
//! LIST of ready nodes each second and, in the upgrade, its own watch of
//! every node. `rssBeforeMiB` is the RSS just before the operator starts
//! (after the nodes were created).
//!
//! Usage: bench_operator --kubeconfig FILE --nodes N [--naive] [--no-upgrade] [--timeout S]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gpu_driver_contract::report::{Kind, Reason};
use gpu_driver_operator::controller::{self, Options};
use gpu_driver_operator::crd::GpuDriver;
use gpu_driver_operator::decide;
use gpu_driver_operator::keys;
use gpu_driver_operator::metrics::Metrics;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::json;

mod naive;

const NS: &str = "gpu-driver";
/// The driver version the nodes are installed with first.
const FROM_VERSION: &str = "550.163.01";
/// The driver version the upgrade rolls out.
const TO_VERSION: &str = "580.95.05";
/// `upgradePolicy.maxUnavailable` for the upgrade.
const MAX_UNAVAILABLE: &str = "10%";
/// The pod annotation KWOK's pod-complete stage turns into the Job pod's
/// termination message (tools/k8s/stages/pod-complete.yaml).
const SIM_MESSAGE: &str = "sim.gpu-driver.gardenlinux.io/termination-message";

struct Args {
    kubeconfig: String,
    nodes: usize,
    naive: bool,
    upgrade: bool,
    timeout: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        kubeconfig: String::new(),
        nodes: 100,
        naive: false,
        upgrade: true,
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
            "--no-upgrade" => a.upgrade = false,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.kubeconfig.is_empty() {
        return Err("--kubeconfig FILE is required".into());
    }
    Ok(a)
}

/// The installer's RunResult for a verified install of driver `version`.
fn success_message(version: &str) -> String {
    let doc = gpu_driver_operator::outcome::sample_run_result(
        Reason::Verified,
        format!("driver {version} verified"),
        Some(version),
    );
    gpu_driver_contract::report::termination_message(Kind::RunResult, &doc).unwrap_or_default()
}

/// This process's resident memory from /proc/self/status: `field` is
/// `VmHWM` (the peak since it started or since [`reset_peak_rss`]) or
/// `VmRSS` (now); MiB, one decimal. `None` where there is no such file.
fn rss_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((kib / 1024.0 * 10.0).round() / 10.0)
}

/// Starts the peak (`VmHWM`) over from the current RSS (writing 5 to
/// /proc/self/clear_refs, Linux 4.0 and later), so that a phase's peak
/// leaves out what came before it; false where that is not possible.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
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

/// Reads of nodes, Jobs and pods (GET and LIST; watches are not counted),
/// in all and by (verb, group, resource, subresource).
/// The controllers watch rather than poll, so these are nearly all the
/// operator's (or the baseline's), plus this program's one LIST a second.
fn reads(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> (f64, BTreeMap<String, f64>) {
    let by: BTreeMap<String, f64> = after
        .iter()
        .filter(|(k, _)| {
            (k.starts_with("GET ") || k.starts_with("LIST "))
                && ["/nodes/", "batch/jobs/", "/pods/"]
                    .iter()
                    .any(|r| k.ends_with(r))
        })
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    (by.values().sum(), by)
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
            "driver": {"version": FROM_VERSION},
            "podAnnotations": {SIM_MESSAGE: success_message(FROM_VERSION)},
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

/// Nodes with the ready label, counted a page of 500 at a time: this runs
/// in the measured process, and one list of 5000 nodes' metadata (with
/// their managedFields) every second was a large part of its peak RSS.
async fn ready_count(client: &Client) -> usize {
    let api: Api<Node> = Api::all(client.clone());
    let mut params = ListParams::default()
        .labels(&format!("{}=true", keys::READY_LABEL))
        .limit(500);
    let mut count = 0;
    loop {
        let Ok(page) = api.list_metadata(&params).await else {
            return count;
        };
        count += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return count,
        }
    }
}

/// What the upgrade phase saw.
struct UpgradeRun {
    /// `upgradePolicy.maxUnavailable` as the operator counts it.
    max_unavailable: u32,
    /// Until every node was installed for its new key; `None`: timed out.
    seconds: Option<f64>,
    /// Nodes installed for their new key at the end.
    upgraded: usize,
    /// The most nodes seen at once with the upgrade annotation or cordoned.
    max_concurrent: usize,
    /// The most nodes seen at once without the ready label.
    max_unready: usize,
}

/// One node as the upgrade phase sees it.
struct Seen {
    /// Upgrade annotation set, or cordoned.
    busy: bool,
    /// Ready label not `true`.
    unready: bool,
    /// Installed for the new key: state Installed, no upgrade annotation,
    /// schedulable, ready label on.
    done: bool,
    /// Its state in a few words, for the tally when it does not converge.
    what: String,
}

/// Each node's states, in the order the watch showed them (a state is
/// recorded when it differs from the last).
type History = HashMap<String, Vec<(f64, String)>>;

/// Records `what` for node `name` if it is new; true if it was.
fn record(history: &mut History, name: &str, at: f64, what: &str) -> bool {
    let h = history.entry(name.to_string()).or_default();
    let new = h.last().is_none_or(|(_, w)| w != what);
    if new {
        h.push((at, what.to_string()));
    }
    new
}

/// No node changed for this long: the roll is stuck (waiting nodes are
/// looked at again every 30 s at the latest), stop waiting for it.
const STALL: Duration = Duration::from_secs(120);

fn seen(node: &Node, spec: &gpu_driver_operator::crd::GpuDriverSpec) -> Seen {
    let f = controller::facts(node);
    let ann = |k: &str| f.annotations.get(k).map(String::as_str);
    let upgrade = ann(keys::UPGRADE);
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let ready = f.labels.get(keys::READY_LABEL).map(String::as_str) == Some("true");
    let new_key = ann(keys::KEY) == Some(decide::desired_key(spec, &f).as_str());
    let state = ann(keys::STATE);
    let cordoned_by_us = ann(keys::UPGRADE_CORDONED);
    Seen {
        busy: upgrade.is_some() || cordoned,
        unready: !ready,
        done: decide::NodeState::of(&f) == Some(decide::NodeState::Installed)
            && new_key
            && upgrade.is_none()
            && !cordoned
            && ready,
        what: format!(
            "state={} upgrade={} upgradeCordoned={} newKey={new_key} cordoned={cordoned} \
             ready={ready}",
            state.unwrap_or("-"),
            upgrade.unwrap_or("-"),
            cordoned_by_us.unwrap_or("-"),
        ),
    }
}

/// The rolling upgrade: the GpuDriver's driver version goes to
/// [`TO_VERSION`] with maxUnavailable [`MAX_UNAVAILABLE`] (and the
/// simulated installer reports the new version), timed until all `nodes`
/// are installed for their new key. A node watch, started before the
/// change, sees every state each node passes through.
/// Why an upgrade did not converge: the nodes by state, and the history
/// of the first few that did not finish.
fn report_stuck(view: &HashMap<String, Seen>, history: &History) {
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    for s in view.values() {
        *tally.entry(s.what.as_str()).or_default() += 1;
    }
    eprintln!("upgrade did not converge; nodes by state:");
    for (what, n) in tally {
        eprintln!("  {n:>6}  {what}");
    }
    let mut stuck: Vec<&String> = view
        .iter()
        .filter(|(_, s)| !s.done)
        .map(|(n, _)| n)
        .collect();
    stuck.sort();
    for name in stuck.iter().take(5) {
        eprintln!("node {name} (seconds since the change; 0: before it):");
        for (at, what) in history.get(*name).into_iter().flatten() {
            eprintln!("  {at:>7.2}s  {what}");
        }
    }
}

/// Counts the roll's progress into `run`; prints a line when it changed,
/// and a warning (once) when more nodes are out than maxUnavailable.
fn progress(
    view: &HashMap<String, Seen>,
    run: &mut UpgradeRun,
    (last, warned): (&mut (usize, usize, usize), &mut bool),
    nodes: usize,
    started: Instant,
) {
    let max_unavailable = run.max_unavailable;
    let busy = view.values().filter(|s| s.busy).count();
    let unready = view.values().filter(|s| s.unready).count();
    run.upgraded = view.values().filter(|s| s.done).count();
    run.max_concurrent = run.max_concurrent.max(busy);
    run.max_unready = run.max_unready.max(unready);
    if busy > max_unavailable as usize && !*warned {
        *warned = true;
        eprintln!(
            "WARNING: {busy} nodes upgrading or cordoned at once, \
             more than maxUnavailable {max_unavailable}"
        );
    }
    if (run.upgraded, busy, unready) != *last {
        eprintln!(
            "{:>7.1}s  {}/{nodes} nodes upgraded, {busy} upgrading or cordoned, \
             {unready} without the ready label",
            started.elapsed().as_secs_f64(),
            run.upgraded,
        );
        *last = (run.upgraded, busy, unready);
    }
}

/// The nodes as the watch's initial list shows them, judged against the
/// new `spec`.
async fn initial_view(
    events: &mut futures::stream::BoxStream<'static, Result<watcher::Event<Node>, watcher::Error>>,
    spec: &gpu_driver_operator::crd::GpuDriverSpec,
    view: &mut HashMap<String, Seen>,
    history: &mut History,
) -> Result<(), String> {
    loop {
        match events.next().await {
            Some(Ok(watcher::Event::InitApply(n) | watcher::Event::Apply(n))) => {
                let s = seen(&n, spec);
                record(history, &n.name_any(), 0.0, &s.what);
                view.insert(n.name_any(), s);
            }
            Some(Ok(watcher::Event::InitDone)) => return Ok(()),
            Some(Ok(_)) => {}
            Some(Err(e)) => eprintln!("watching nodes: {e}"),
            None => return Err("the node watch ended".into()),
        }
    }
}

/// The change the roll answers: the next driver version, with the
/// simulated kubelet's answer for it.
async fn new_driver_version(gds: &Api<GpuDriver>) -> Result<GpuDriver, String> {
    let patch = json!({"spec": {
        "driver": {"version": TO_VERSION},
        "upgradePolicy": {"maxUnavailable": MAX_UNAVAILABLE},
        "podAnnotations": {SIM_MESSAGE: success_message(TO_VERSION)},
    }});
    gds.patch("bench", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| format!("patching the GpuDriver: {e}"))
}

async fn upgrade(client: &Client, nodes: usize, timeout: Duration) -> Result<UpgradeRun, String> {
    let gds: Api<GpuDriver> = Api::all(client.clone());
    let api: Api<Node> = Api::all(client.clone());
    let mut spec = gds
        .get("bench")
        .await
        .map_err(|e| format!("reading the GpuDriver: {e}"))?
        .spec;
    spec.driver.version = Some(TO_VERSION.into());
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut view: HashMap<String, Seen> = HashMap::new();
    let mut history = History::new();
    initial_view(&mut events, &spec, &mut view, &mut history).await?;
    let gd = new_driver_version(&gds).await?;
    let started = Instant::now();
    spec = gd.spec;
    let max_unavailable =
        decide::max_unavailable(&spec.upgrade_policy.max_unavailable, nodes as u32);
    eprintln!(
        "upgrade: driver {FROM_VERSION} -> {TO_VERSION}, maxUnavailable {MAX_UNAVAILABLE} \
         ({max_unavailable} of {nodes} nodes)"
    );
    // Nodes seen before the change are re-judged against the new key.
    let mut run = UpgradeRun {
        max_unavailable,
        seconds: None,
        upgraded: 0,
        max_concurrent: 0,
        max_unready: 0,
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut changed = Instant::now();
    let mut last = (usize::MAX, 0, 0);
    let mut warned = false;
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(watcher::Event::InitApply(n) | watcher::Event::Apply(n))) => {
                    let s = seen(&n, &spec);
                    let at = started.elapsed().as_secs_f64();
                    if record(&mut history, &n.name_any(), at, &s.what) {
                        changed = Instant::now();
                    }
                    view.insert(n.name_any(), s);
                }
                Some(Ok(watcher::Event::Delete(n))) => {
                    view.remove(&n.name_any());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => eprintln!("watching nodes: {e}"),
                None => return Err("the node watch ended".into()),
            },
            _ = tick.tick() => {
                if started.elapsed() >= timeout {
                    eprintln!("upgrade: timed out after {}s", timeout.as_secs());
                    break;
                }
                if changed.elapsed() >= STALL {
                    eprintln!("upgrade: stalled, no node changed for {}s", STALL.as_secs());
                    break;
                }
            }
        }
        progress(&view, &mut run, (&mut last, &mut warned), nodes, started);
        if run.upgraded >= nodes {
            run.seconds = Some(started.elapsed().as_secs_f64());
            break;
        }
    }
    if run.seconds.is_none() {
        report_stuck(&view, &history);
    }
    Ok(run)
}

/// Stops the operator (or the baseline) and waits a little for it to end.
async fn stop_operator(
    op: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
) {
    if let Some((tx, task)) = op {
        let _ = tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
}

/// The operator under test, or the naive baseline, until `stop`.
fn spawn_operator(
    a: &Args,
    client: &Client,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    if a.naive {
        tokio::spawn(naive::run(
            client.clone(),
            NS.into(),
            Duration::from_secs(1),
            metrics,
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
    }
}

/// The driver upgrade after the install converged, with its own counts;
/// stops the operator at its end.
async fn upgrade_phase(
    client: &Client,
    a: &Args,
    metrics: &Metrics,
    own: u64,
    after: &BTreeMap<String, f64>,
    operator: Operator,
) -> Result<serde_json::Value, String> {
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let per_node = |x: f64| round(x / a.nodes as f64);
    let peak_reset = reset_peak_rss();
    let run = upgrade(client, a.nodes, Duration::from_secs(a.timeout)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peak = rss_mib("VmHWM");
    stop_operator(operator).await;
    let end = request_totals(client).await?;
    let (w, by) = operator_writes(after, &end);
    let (read, read_by) = reads(after, &end);
    Ok(json!({
        "nodes": a.nodes,
        "fromVersion": FROM_VERSION,
        "toVersion": TO_VERSION,
        "maxUnavailable": run.max_unavailable,
        "maxUnavailableSpec": MAX_UNAVAILABLE,
        "seconds": run.seconds.map(round),
        "upgradedNodes": run.upgraded,
        "writesPerNode": per_node(w),
        "readsPerNode": per_node(read),
        "apiserverReads": read_by,
        "maxConcurrent": run.max_concurrent,
        "maxUnready": run.max_unready,
        "peakRssMiB": peak,
        "peakRssSinceStart": !peak_reset,
        "apiserverWrites": by,
        "clientWrites": metrics.total("gpu_driver_api_writes_total") - own,
    }))
}

/// Waits (up to `--timeout`) until every node has the ready label, with a
/// line on stderr whenever the count changes: the seconds it took (`None`:
/// timed out), and the last count.
async fn await_ready(client: &Client, a: &Args) -> (Option<f64>, usize) {
    let started = Instant::now();
    let mut last = 0;
    while started.elapsed() < Duration::from_secs(a.timeout) {
        // Each poll lists up to N nodes' metadata: once a second keeps the
        // observer's own load on the apiserver small.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let n = ready_count(client).await;
        if n != last {
            eprintln!(
                "{:>7.1}s  {n}/{} nodes ready",
                started.elapsed().as_secs_f64(),
                a.nodes
            );
            last = n;
        }
        if n >= a.nodes {
            return (Some(started.elapsed().as_secs_f64()), last);
        }
    }
    (None, last)
}

/// The running operator: how to stop it, and its task.
type Operator = Option<(
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
)>;

#[tokio::main]
async fn main() -> Result<(), String> {
    let a = args()?;
    // The operator's own log, on stderr, only when asked for (RUST_LOG).
    if std::env::var_os("RUST_LOG").is_some() {
        gpu_driver_contract::logging::init_tracing("info", false);
    }
    let kc = kube::config::Kubeconfig::read_from(&a.kubeconfig).map_err(|e| e.to_string())?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    gpu_driver_operator::init_tls();
    let client = Client::try_from(cfg).map_err(|e| e.to_string())?;

    setup(&client, a.nodes).await?;
    let before = request_totals(&client).await?;
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = rx.await;
    };
    // The peak from here on is the operator's (or the baseline's) and this
    // program's observer, not the node creation above.
    let rss_before = rss_mib("VmRSS");
    let peak_reset = reset_peak_rss();
    let task = spawn_operator(&a, &client, metrics.clone(), stop);
    let mut operator = Some((tx, task));
    let (converged, last) = await_ready(&client, &a).await;
    // Let in-flight writes (status, late Events) land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peak = rss_mib("VmHWM");
    let upgrading = !a.naive && a.upgrade && converged.is_some();
    if !upgrading {
        stop_operator(operator.take()).await;
    }
    let after = request_totals(&client).await?;
    let own = metrics.total("gpu_driver_api_writes_total");
    let (writes, by) = operator_writes(&before, &after);
    let (read, read_by) = reads(&before, &after);
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let per_node = |x: f64| round(x / a.nodes as f64);

    // The upgrade phase, counted from the install phase's end.
    let mut up = serde_json::Value::Null;
    if upgrading {
        up = upgrade_phase(&client, &a, &metrics, own, &after, operator.take()).await?;
    } else if !a.naive && a.upgrade {
        eprintln!("upgrade: skipped, the install did not converge");
    }
    println!(
        "{}",
        json!({
            "mode": if a.naive { "naive" } else { "operator" },
            "nodes": a.nodes,
            "readyNodes": last,
            "convergeSeconds": converged.map(round),
            "writesPerNode": per_node(writes),
            "readsPerNode": per_node(read),
            "apiserverWrites": by,
            "apiserverReads": read_by,
            "clientWrites": own,
            "rssBeforeMiB": rss_before,
            "peakRssMiB": peak,
            "peakRssSinceStart": !peak_reset,
            "upgrade": up,
        })
    );
    Ok(())
}
