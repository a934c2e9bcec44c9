//! The watch-based reconciler. Nodes are the primary objects; Jobs and pods
//! in the operator's namespace (and a GpuDriver's spec or deletion, not its
//! status) trigger their node's reconcile. Everything is read from reflector caches; the only API calls
//! are writes, and per node from nothing to ready they are three: create the
//! Job, one node patch (annotations, label and taint together), one Event.
//!
//! Build targets belong to a GpuDriver, not to a node: a second reconcile,
//! over GpuDrivers ([`targets`]), creates their build Jobs (a node's install
//! gate may too). The status loop ([`status_loop`]) only computes and
//! writes `status`. What was written and the caches may not show yet is in
//! one expectations store ([`expect`]).

mod context;
mod expect;
mod finish;
mod lookup;
mod patch;
mod reconcile;
mod slim;
mod status_loop;
mod targets;
mod upgrade;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::crd::GpuDriver;
use crate::decide;
use crate::keys;
use crate::metrics::Metrics;
use context::{Caches, Context, Error, Waiters};

pub use context::Options;
pub use lookup::{driver_for, facts};
pub use patch::{
    Change, NodeAnnotations, NodeLabels, NodeMetaPatch, NodePatch, NodeSpecPatch, ready_patch,
};

fn error_policy(node: Arc<Node>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.inc("gpu_driver_reconcile_errors_total", &[]);
    tracing::warn!("node {}: {err}", node.name_any());
    Action::requeue(Duration::from_secs(5))
}

fn targets_error_policy(gd: Arc<GpuDriver>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.inc("gpu_driver_reconcile_errors_total", &[]);
    tracing::warn!("GpuDriver {}: {err}", gd.name_any());
    Action::requeue(Duration::from_secs(5))
}

/// Which nodes a Job or pod concerns: its node (our annotation), or for a
/// build Job the nodes waiting for its target.
fn nodes_of<K: Resource>(obj: &K, waiters: &Waiters) -> Vec<ObjectRef<Node>> {
    let Some(a) = obj.meta().annotations.as_ref() else {
        return Vec::new();
    };
    if let Some(n) = a.get(keys::NODE) {
        return vec![ObjectRef::new(n)];
    }
    let Some(t) = a.get(keys::TARGET) else {
        return Vec::new();
    };
    waiters
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(t)
        .map(|ns| ns.iter().map(|n| ObjectRef::new(n)).collect())
        .unwrap_or_default()
}

/// Only what the decisions read: labels, annotations, taints and the node
/// info. Heartbeats and condition updates do not trigger a reconcile.
fn node_relevant(node: &Node) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let f = facts(node);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        f.kernel,
        f.os_image,
        f.boot_id,
        f.labels,
        f.annotations,
        f.taints,
    )
        .hash(&mut h);
    Some(h.finish())
}

fn store_and_stream<K>(
    api: Api<K>,
    cfg: watcher::Config,
    slim: fn(&mut K),
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, cfg)
        .default_backoff()
        .modify(slim)
        .reflect(writer)
        .touched_objects();
    (reader, stream)
}

/// The GpuDriver cache, and the changes that concern the nodes a GpuDriver
/// selects: a new spec (`metadata.generation`), its deletion begun, its
/// removal. Not its status: this process writes that every status interval
/// while the nodes change, and each write reconciled every selected node
/// (5000 nodes coming up: 126 status writes, 630,000 reconciles).
fn driver_store_and_changes(
    api: Api<GpuDriver>,
) -> (
    Store<GpuDriver>,
    impl futures::Stream<Item = Result<GpuDriver, watcher::Error>> + Send + 'static,
) {
    let (reader, writer) = reflector::store();
    let mut seen = DriverSeen::new();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(slim::metadata)
        .reflect(writer)
        .filter_map(move |ev| futures::future::ready(driver_change(&mut seen, ev)));
    (reader, stream)
}

/// Each GpuDriver's generation and whether its deletion has begun, as
/// last passed on.
type DriverSeen = HashMap<String, (Option<i64>, bool)>;

/// The watch event as a change for [`driver_store_and_changes`]: `None`
/// where the GpuDriver's spec and deletion are as last passed on.
fn driver_change(
    seen: &mut DriverSeen,
    ev: Result<watcher::Event<GpuDriver>, watcher::Error>,
) -> Option<Result<GpuDriver, watcher::Error>> {
    match ev {
        Ok(watcher::Event::Apply(gd) | watcher::Event::InitApply(gd)) => {
            let now = (
                gd.metadata.generation,
                gd.metadata.deletion_timestamp.is_some(),
            );
            let new = seen.insert(gd.name_any(), now) != Some(now);
            new.then_some(Ok(gd))
        }
        Ok(watcher::Event::Delete(gd)) => {
            seen.remove(&gd.name_any());
            Some(Ok(gd))
        }
        Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
        Err(e) => Some(Err(e)),
    }
}

/// Runs the controller until `shutdown` resolves. Returns the metrics so a
/// caller (test, bench) can read them.
pub async fn run(
    client: Client,
    opts: Options,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = opts.namespace.clone();
    let selector = format!("{}={}", keys::MANAGED_BY_LABEL, keys::MANAGED_BY);
    let (jobs, job_stream) = store_and_stream(
        Api::<Job>::namespaced(client.clone(), &ns),
        watcher::Config::default().labels(&selector),
        slim::job,
    );
    let (pods, pod_stream) = store_and_stream(
        Api::<Pod>::namespaced(client.clone(), &ns),
        watcher::Config::default().labels(&selector),
        slim::pod,
    );
    let (drivers, driver_stream) = driver_store_and_changes(Api::<GpuDriver>::all(client.clone()));
    let (nodes_reader, nodes_writer) = reflector::store();
    let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(slim::node)
        .reflect(nodes_writer)
        .applied_objects()
        .predicate_filter(node_relevant, Default::default());

    let (wake, wake_rx) = tokio::sync::mpsc::unbounded_channel();
    let caches = Caches {
        nodes: nodes_reader.clone(),
        jobs,
        pods,
        drivers,
    };
    let ctx = Arc::new(Context::new(client.clone(), opts, metrics, caches, wake));
    let job_waiters = ctx.waiters.clone();
    let pod_waiters = ctx.waiters.clone();

    let all_nodes = nodes_reader.clone();
    let controller = Controller::for_stream(node_stream, nodes_reader)
        .with_config(ControllerConfig::default().concurrency(64))
        .watches_stream(job_stream, move |j| nodes_of(&j, &job_waiters))
        .watches_stream(pod_stream, move |p| nodes_of(&p, &pod_waiters))
        .watches_stream(driver_stream, move |gd: GpuDriver| {
            // A changed GpuDriver concerns every node it selects.
            all_nodes
                .state()
                .iter()
                .filter(|n| decide::selects(&gd.spec.node_selector, n.labels()))
                .map(|n| ObjectRef::from_obj(n.as_ref()))
                .collect::<Vec<_>>()
        })
        .reconcile_on(tokio_stream_from(wake_rx))
        .graceful_shutdown_on(shutdown);

    let status_task = tokio::spawn(status_loop::status_loop(ctx.clone()));
    // Build targets are a GpuDriver's, not a node's: their own reconcile.
    let targets = Controller::new(Api::<GpuDriver>::all(client), watcher::Config::default())
        .run(
            targets::reconcile_targets,
            targets_error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));
    let targets_task = tokio::spawn(targets);
    controller
        .run(reconcile::reconcile, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()))
        .await;
    status_task.abort();
    targets_task.abort();
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
#[cfg(test)]
mod mock_tests;
