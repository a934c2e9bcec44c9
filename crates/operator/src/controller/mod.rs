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

mod expect;
mod finish;
mod patch;
mod reconcile;
mod slim;
mod status_loop;
mod targets;
mod upgrade;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::crd::{GpuDriver, TargetStatus};
use crate::decide::{self, JobRole, NodeFacts};
use crate::keys;
use crate::metrics::Metrics;
use expect::{Expectations, Kind};
use gpu_driver_contract::text::truncate;

pub use patch::{
    Change, NodeAnnotations, NodeLabels, NodeMetaPatch, NodePatch, NodeSpecPatch, ready_patch,
};

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("{0}: {1}")]
    Kube(String, #[source] kube::Error),
}

#[derive(Debug, Clone)]
pub struct Options {
    /// Where the Jobs run (the operator's own namespace).
    pub namespace: String,
    /// This instance, for Events.
    pub instance: String,
    /// How often the GpuDriver status is recomputed (written only when
    /// it changed).
    pub status_interval: Duration,
}

/// Nodes waiting for a target's build Job, by target key: a build Job's
/// change wakes them (it serves no node of its own).
type Waiters = Arc<Mutex<HashMap<String, HashSet<String>>>>;

/// An Event's object (kind/namespace/name), reason and action.
type EventKey = (String, String, String);

/// kube's Recorder folds an Event into an earlier one with the same
/// object, reason and action, keeping the first one's note: a second
/// upgrade's `UpgradeStarted` would show the first upgrade's versions. So
/// each (object, reason, action) keeps a recorder for as long as its note
/// stays the same; a new note gets a new recorder, and so a new Event.
/// Bounded by nodes x reasons.
struct Events {
    client: Client,
    reporter: Reporter,
    by_key: Mutex<HashMap<EventKey, (Option<String>, Recorder)>>,
}

impl Events {
    fn new(client: Client, reporter: Reporter) -> Events {
        Events {
            client,
            reporter,
            by_key: Mutex::new(HashMap::new()),
        }
    }

    /// The recorder whose folding is true for `ev`'s note.
    fn recorder_for(&self, regarding: &ObjectReference, ev: &Event) -> Recorder {
        let key = (
            format!(
                "{}/{}/{}",
                regarding.kind.as_deref().unwrap_or_default(),
                regarding.namespace.as_deref().unwrap_or_default(),
                regarding.name.as_deref().unwrap_or_default()
            ),
            ev.reason.clone(),
            ev.action.clone(),
        );
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&key) {
            Some((note, r)) if *note == ev.note => r.clone(),
            _ => {
                let r = Recorder::new(self.client.clone(), self.reporter.clone());
                map.insert(key, (ev.note.clone(), r.clone()));
                r
            }
        }
    }
}

pub(crate) struct Context {
    client: Client,
    opts: Options,
    nodes: Store<Node>,
    jobs: Store<Job>,
    pods: Store<Pod>,
    drivers: Store<GpuDriver>,
    events: Events,
    pub metrics: Arc<Metrics>,
    expect: Mutex<Expectations>,
    wake: tokio::sync::mpsc::UnboundedSender<ObjectRef<Node>>,
    /// Build targets by GpuDriver and target key; what `status.targets`
    /// shows and where it is seeded from after a restart.
    targets: Mutex<HashMap<(String, String), TargetStatus>>,
    waiters: Waiters,
}

pub fn facts(node: &Node) -> NodeFacts {
    let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
    NodeFacts {
        name: node.name_any(),
        kernel: info.map(|i| i.kernel_version.clone()).unwrap_or_default(),
        os_image: info.map(|i| i.os_image.clone()).unwrap_or_default(),
        boot_id: info.map(|i| i.boot_id.clone()).unwrap_or_default(),
        arch: info.map(|i| i.architecture.clone()).unwrap_or_default(),
        labels: node.labels().clone(),
        annotations: node.annotations().clone(),
        taints: node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
            .unwrap_or_default(),
    }
}

/// The first GpuDriver (by name) whose selector picks the node.
pub fn driver_for(drivers: &[Arc<GpuDriver>], node: &NodeFacts) -> Option<Arc<GpuDriver>> {
    driver_for_labels(drivers, &node.labels).cloned()
}

/// [`driver_for`] from a node's labels as they are: no copy of them, no
/// allocation (what a scan over every cached node calls).
fn driver_for_labels<'a>(
    drivers: &'a [Arc<GpuDriver>],
    labels: &BTreeMap<String, String>,
) -> Option<&'a Arc<GpuDriver>> {
    drivers
        .iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .filter(|d| decide::selects(&d.spec.node_selector, labels))
        .min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
}

fn job_is_terminal(job: &Job) -> bool {
    let st = job.status.as_ref();
    st.and_then(|s| s.succeeded).unwrap_or(0) > 0
        || st.and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
            cs.iter().any(|c| {
                c.status == "True"
                    && matches!(
                        c.type_.as_str(),
                        "Complete" | "Failed" | "SuccessCriteriaMet" | "FailureTarget"
                    )
            })
        })
}

/// The reflector caches the reconciles read.
struct Caches {
    nodes: Store<Node>,
    jobs: Store<Job>,
    pods: Store<Pod>,
    drivers: Store<GpuDriver>,
}

impl Context {
    fn new(
        client: Client,
        opts: Options,
        metrics: Arc<Metrics>,
        caches: Caches,
        wake: tokio::sync::mpsc::UnboundedSender<ObjectRef<Node>>,
    ) -> Context {
        let events = Events::new(
            client.clone(),
            Reporter {
                controller: "gpu-driver-operator".into(),
                instance: Some(opts.instance.clone()),
            },
        );
        Context {
            client,
            opts,
            nodes: caches.nodes,
            jobs: caches.jobs,
            pods: caches.pods,
            drivers: caches.drivers,
            events,
            metrics,
            expect: Mutex::new(Expectations::default()),
            wake,
            targets: Mutex::new(HashMap::new()),
            waiters: Waiters::default(),
        }
    }

    fn job_ref(&self, name: &str) -> ObjectRef<Job> {
        ObjectRef::new(name).within(&self.opts.namespace)
    }

    fn pods_of(&self, job: &str) -> Vec<Arc<Pod>> {
        self.pods.state_filter(|p| {
            p.labels()
                .get("batch.kubernetes.io/job-name")
                .or_else(|| p.labels().get("job-name"))
                .is_some_and(|j| j == job)
        })
    }

    fn expect(&self) -> std::sync::MutexGuard<'_, Expectations> {
        self.expect.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The nodes whose GpuDriver is `gd`.
    fn selected_nodes(&self, gd: &GpuDriver) -> Vec<NodeFacts> {
        let drivers = self.drivers.state();
        let owner = gd.name_any();
        self.nodes
            .state()
            .iter()
            .map(|n| facts(n))
            .filter(|n| driver_for(&drivers, n).is_some_and(|d| d.name_any() == owner))
            .collect()
    }

    /// Install Jobs of this GpuDriver still running (from the cache, plus
    /// those just created).
    fn active_installs(&self, gd: &GpuDriver) -> usize {
        let owner = gd.name_any();
        let expect = self.expect();
        let mut names: HashSet<String> = self
            .jobs
            .state()
            .iter()
            .filter(|j| {
                j.labels().get(keys::OWNER_LABEL) == Some(&owner)
                    && j.labels().get(keys::ROLE_LABEL).map(String::as_str) == Some("install")
                    && !job_is_terminal(j)
                    && !expect.holds(Kind::JobHandled, &j.name_any())
            })
            .map(|j| j.name_any())
            .collect();
        names.extend(expect.recently_created().map(String::from));
        names.len()
    }

    /// Build Jobs still running in the operator's namespace, whichever
    /// GpuDriver started them (from the cache, plus those just created):
    /// `build.maxParallel` is a cap on the whole cluster's compiles.
    fn active_builds(&self) -> usize {
        let expect = self.expect();
        let build = JobRole::Build.as_str();
        let mut names: HashSet<String> = self
            .jobs
            .state()
            .iter()
            .filter(|j| {
                j.labels().get(keys::ROLE_LABEL).map(String::as_str) == Some(build)
                    && !job_is_terminal(j)
                    && !expect.holds(Kind::JobHandled, &j.name_any())
            })
            .map(|j| j.name_any())
            .collect();
        let prefix = format!("gpu-{build}-");
        names.extend(
            expect
                .recently_created()
                .filter(|n| n.starts_with(&prefix))
                .map(String::from),
        );
        names.len()
    }

    async fn patch_node(&self, node: &str, patch: &NodePatch) -> Result<(), Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        self.metrics.write("patch", "nodes");
        api.patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| Error::Kube(format!("patching node {node}"), e))?;
        Ok(())
    }

    async fn event(&self, node: &Node, type_: EventType, reason: &str, note: String) {
        self.publish(node, "InstallDriver", type_, reason, note)
            .await;
    }

    /// Records an Event about `obj`. An Event is information: failing to
    /// record one must not stop a reconcile.
    async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        action: &str,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.metrics.write("create", "events");
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(&note, 1000)),
            action: action.into(),
            secondary: None,
        };
        let reference = obj.object_ref(&());
        let recorder = self.events.recorder_for(&reference, &ev);
        if let Err(e) = recorder.publish(&ev, &reference).await {
            let name = obj.meta().name.clone().unwrap_or_default();
            tracing::warn!("event {reason} for {} {name}: {e}", K::kind(&()));
        }
    }

    fn wake_waiting(&self, n: usize) {
        let picked = self.expect().dequeue_installs(n);
        for name in picked {
            let _ = self.wake.send(ObjectRef::new(&name));
        }
    }

    /// Forget old expectations; the caches have long caught up with them.
    fn prune(&self) {
        self.expect().prune();
    }
}

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
