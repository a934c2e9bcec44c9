//! The watch-based reconciler. Nodes are the primary objects; Jobs and pods
//! in the operator's namespace (and GpuDrivers) trigger their node's
//! reconcile. Everything is read from reflector caches; the only API calls
//! are writes, and per node from nothing to ready they are three: create the
//! Job, one node patch (annotations, label and taint together), one Event.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use super::crd::GpuDriver;
use super::decide::{self, JobRole, Marks, NodeFacts, Plan};
use super::job::{self, JobRequest};
use super::keys;
use super::metrics::Metrics;
use super::outcome::{self, JobState, PodResult};
use super::status;
use crate::report::{Phase, Reason};
use crate::text::truncate;

#[derive(Debug, thiserror::Error)]
pub enum Error {
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

/// What this process has written and the caches may not show yet: a
/// reconcile triggered before the watch delivers our own write must not
/// write again.
#[derive(Default)]
struct Memo {
    /// Jobs created (name → when).
    created: HashMap<String, Instant>,
    /// Jobs whose result is already on the node.
    handled: HashMap<String, Instant>,
    /// Nodes whose stale ready label was already taken off, by key.
    unreadied: HashMap<String, String>,
    /// Ready-label/taint fixes sent, by node and key.
    fixed: HashMap<String, String>,
    /// Nodes waiting for a free parallel slot.
    waiting: HashSet<String>,
}

pub struct Context {
    client: Client,
    opts: Options,
    nodes: Store<Node>,
    jobs: Store<Job>,
    pods: Store<Pod>,
    drivers: Store<GpuDriver>,
    recorder: Recorder,
    pub metrics: Arc<Metrics>,
    memo: Mutex<Memo>,
    wake: tokio::sync::mpsc::UnboundedSender<ObjectRef<Node>>,
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
    let mut ds: Vec<&Arc<GpuDriver>> = drivers
        .iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .filter(|d| decide::selects(&d.spec.node_selector, &node.labels))
        .collect();
    ds.sort_by_key(|d| d.name_any());
    ds.first().map(|d| (*d).clone())
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

impl Context {
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

    fn memo(&self) -> std::sync::MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Install Jobs of this GpuDriver still running (from the cache, plus
    /// those just created).
    fn active_installs(&self, gd: &GpuDriver) -> usize {
        let owner = gd.name_any();
        let memo = self.memo();
        let mut names: HashSet<String> = self
            .jobs
            .state()
            .iter()
            .filter(|j| {
                j.labels().get(keys::OWNER_LABEL) == Some(&owner)
                    && j.labels().get(keys::ROLE_LABEL).map(String::as_str) == Some("install")
                    && !job_is_terminal(j)
                    && !memo.handled.contains_key(&j.name_any())
            })
            .map(|j| j.name_any())
            .collect();
        for (name, at) in &memo.created {
            if at.elapsed() < Duration::from_secs(60) && !memo.handled.contains_key(name) {
                names.insert(name.clone());
            }
        }
        names.len()
    }

    async fn patch_node(&self, node: &str, patch: &Value) -> Result<(), Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        self.metrics.write("patch", "nodes");
        api.patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| Error::Kube(format!("patching node {node}"), e))?;
        Ok(())
    }

    async fn event(&self, node: &Node, type_: EventType, reason: &str, note: String) {
        self.metrics.write("create", "events");
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(&note, 1000)),
            action: "InstallDriver".into(),
            secondary: None,
        };
        // An Event is information: failing to record one must not stop the
        // node's reconcile.
        if let Err(e) = self.recorder.publish(&ev, &node.object_ref(&())).await {
            tracing::warn!("event {reason} for node {}: {e}", node.name_any());
        }
    }

    fn wake_waiting(&self, n: usize) {
        let mut memo = self.memo();
        let picked: Vec<String> = memo.waiting.iter().take(n).cloned().collect();
        for name in picked {
            memo.waiting.remove(&name);
            let _ = self.wake.send(ObjectRef::new(&name));
        }
    }

    /// Forget old memo entries; the caches have long caught up with them.
    fn prune(&self) {
        let mut memo = self.memo();
        let old = Duration::from_secs(600);
        memo.created.retain(|_, t| t.elapsed() < old);
        memo.handled.retain(|_, t| t.elapsed() < old);
    }
}

/// The patch that marks a node installed: annotations, the ready label and
/// the startup taint's removal, in one write.
pub fn ready_patch(
    gd: &GpuDriver,
    node: &Node,
    key: &str,
    job: &str,
    result: &PodResult,
    now: Timestamp,
) -> Value {
    let f = facts(node);
    let installed = result.installed.as_ref();
    let driver = installed
        .and_then(|i| i.driver_version.clone())
        .or_else(|| gd.spec.driver.version.clone())
        .unwrap_or_else(|| "unknown".into());
    let flavor = installed
        .and_then(|i| i.flavor)
        .map(|f| f.to_string())
        .unwrap_or_else(|| gd.spec.driver.flavor.as_str().into());
    let mut patch = json!({
        "metadata": {
            "annotations": {
                keys::STATE: "Installed",
                keys::KEY: key,
                keys::DRIVER_VERSION: driver,
                keys::FLAVOR: flavor,
                keys::KERNEL: f.kernel,
                keys::BOOT_ID: f.boot_id,
                keys::OS_IMAGE: f.os_image,
                keys::INSTALLED_AT: now.to_string(),
                keys::JOB: job,
                keys::FAILURES: null,
                keys::FAILURE_KEY: null,
                keys::FAILED_AT: null,
                keys::FAILURE_REASON: null,
                keys::FAILURE_MESSAGE: null,
            }
        }
    });
    let marks = Marks {
        ready_label: Some(true),
        startup_taint: Some(false),
    };
    add_marks(gd, node, marks, &mut patch);
    patch
}

/// Adds the ready label's and the startup taint's changes to `patch`. The
/// label is one key of the labels map. Taints are a list, which a merge
/// patch replaces whole: the patch carries the node's resourceVersion, so
/// that a taint another controller changed meanwhile makes it fail (409)
/// rather than be overwritten, and the reconcile retries on the new node.
/// Only the configured startup taint's key is added or removed; every
/// other taint is written back as it was.
fn add_marks(gd: &GpuDriver, node: &Node, marks: Marks, patch: &mut Value) {
    if let Some(on) = marks.ready_label {
        patch["metadata"]["labels"][keys::READY_LABEL] =
            if on { json!("true") } else { Value::Null };
    }
    let (Some(startup), Some(want)) = (&gd.spec.startup_taint, marks.startup_taint) else {
        return;
    };
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if taints.iter().any(|t| &t.key == startup) == want {
        return;
    }
    let mut rest: Vec<Taint> = taints.into_iter().filter(|t| &t.key != startup).collect();
    if want {
        rest.push(Taint {
            key: startup.clone(),
            effect: decide::STARTUP_TAINT_EFFECT.into(),
            value: None,
            time_added: None,
        });
    }
    patch["spec"] = json!({ "taints": rest });
    patch["metadata"]["resourceVersion"] = json!(node.resource_version());
}

/// The patch after a failed install Job: the failure on the node (reason,
/// message, count for the backoff), never the ready label.
pub fn failure_patch(
    key: &str,
    failures: u32,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Value {
    json!({
        "metadata": {
            "labels": { keys::READY_LABEL: null },
            "annotations": {
                keys::STATE: "Failed",
                keys::FAILURE_KEY: key,
                keys::FAILURES: failures.to_string(),
                keys::FAILED_AT: now.to_string(),
                keys::FAILURE_REASON: reason,
                keys::FAILURE_MESSAGE: truncate(&crate::redact::text(message), 1024),
            }
        }
    })
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, Error> {
    let f = facts(&node);
    let Some(gd) = driver_for(&ctx.drivers.state(), &f) else {
        return Ok(Action::await_change());
    };
    let now = Timestamp::now();
    match decide::plan(&gd.spec, &f, now.as_second()) {
        Plan::NoGpu => Ok(Action::await_change()),
        Plan::Ready { marks } => {
            let key = decide::desired_key(&gd.spec, &f);
            if !marks.is_empty() && ctx.memo().fixed.get(&f.name) != Some(&key) {
                let mut patch = json!({"metadata": {}});
                add_marks(&gd, &node, marks, &mut patch);
                ctx.patch_node(&f.name, &patch).await?;
                ctx.memo().fixed.insert(f.name.clone(), key);
            }
            Ok(Action::await_change())
        }
        Plan::NoBuilderImage => {
            let first =
                f.annotations.get(keys::STATE).map(String::as_str) != Some("NoBuilderImage");
            if first {
                let msg = format!(
                    "no builder image in GpuDriver {} matches OS {:?}, kernel {}",
                    gd.name_any(),
                    f.os_image,
                    f.kernel
                );
                ctx.event(&node, EventType::Warning, "NoBuilderImage", msg)
                    .await;
            }
            unready(&ctx, &gd, &node, first.then_some("NoBuilderImage")).await?;
            Ok(Action::await_change())
        }
        Plan::Backoff { seconds } => {
            // Normally done before the attempt that failed; this catches a
            // taint someone took off meanwhile, once per key.
            unready(&ctx, &gd, &node, None).await?;
            Ok(Action::requeue(Duration::from_secs(seconds.max(1))))
        }
        Plan::Detect { job } => {
            let image = gd.spec.installer_image.clone();
            drive_job(&ctx, &gd, &node, JobRole::Detect, &job, &image, &f.boot_id).await
        }
        Plan::Install {
            job, image, key, ..
        } => {
            // A node without a verified driver for this boot (new, rebooted,
            // upgraded) gets label off and startup taint on before the Job,
            // so nothing new lands there until the install is verified.
            unready(&ctx, &gd, &node, Some("Pending")).await?;
            drive_job(&ctx, &gd, &node, JobRole::Install, &job, &image, &key).await
        }
    }
}

/// Takes a GPU node that is not installed for its current key out of
/// service: ready label off, and the startup taint on unless the driver of
/// its last verified install is still loaded (only the policy changed; see
/// [`decide::marks`]), in one patch together with the `state` annotation.
/// `Pending` is written only along with a mark: it is not worth a write of
/// its own (a fresh node that already carries the taint writes nothing
/// here). Nothing is written when the node already looks so, and the marks
/// at most once per node and key: a reconcile that runs before the watch
/// shows our own write must not write again (nor fight whoever takes the
/// taint off by hand).
async fn unready(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    state: Option<&str>,
) -> Result<(), Error> {
    let f = facts(node);
    let key = decide::desired_key(&gd.spec, &f);
    let marks = decide::marks(&gd.spec, &f, false);
    let marks_due = !marks.is_empty() && ctx.memo().unreadied.get(&f.name) != Some(&key);
    let current = f.annotations.get(keys::STATE).map(String::as_str);
    let state_alone = state.filter(|s| *s != "Pending" && current != Some(*s));
    if !marks_due && state_alone.is_none() {
        return Ok(());
    }
    let mut patch = json!({"metadata": {}});
    if marks_due {
        add_marks(gd, node, marks, &mut patch);
    }
    if let Some(s) = state {
        patch["metadata"]["annotations"] = json!({ keys::STATE: s });
    }
    ctx.patch_node(&f.name, &patch).await?;
    if marks_due {
        ctx.memo().unreadied.insert(f.name.clone(), key);
    }
    Ok(())
}

async fn drive_job(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    role: JobRole,
    name: &str,
    image: &str,
    key: &str,
) -> Result<Action, Error> {
    if ctx.memo().handled.contains_key(name) {
        // Our node patch for this Job is on its way through the watch.
        return Ok(Action::await_change());
    }
    let node_name = node.name_any();
    let Some(job) = ctx.jobs.get(&ctx.job_ref(name)) else {
        if ctx.memo().created.contains_key(name) {
            return Ok(Action::await_change());
        }
        let max = gd.spec.max_parallel as usize;
        if role == JobRole::Install && max > 0 && ctx.active_installs(gd) >= max {
            ctx.memo().waiting.insert(node_name);
            // Woken when a slot frees up; the requeue is a safety net.
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
        let obj = job::build(
            gd,
            &JobRequest {
                role,
                name,
                namespace: &ctx.opts.namespace,
                node: &node_name,
                image,
                key,
            },
        );
        let api: Api<Job> = Api::namespaced(ctx.client.clone(), &ctx.opts.namespace);
        ctx.metrics.write("create", "jobs");
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {
                ctx.metrics
                    .inc("gpu_driver_jobs_created_total", &[("role", role.as_str())]);
                tracing::info!("node {node_name}: created {} Job {name}", role.as_str());
            }
            // Made by an earlier incarnation of this operator: same name,
            // same desired state.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(Error::Kube(format!("creating Job {name}"), e)),
        }
        ctx.memo().created.insert(name.to_string(), Instant::now());
        return Ok(Action::await_change());
    };
    let pods = ctx.pods_of(name);
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let (result, failure) = match outcome::job_state(&job, &pod_refs, Timestamp::now().as_second())
    {
        // A finished Job whose pod the cache has not caught up with: the
        // pod's event comes; the requeue covers a pod that never does.
        JobState::Running if job_is_terminal(&job) => {
            return Ok(Action::requeue(Duration::from_secs(
                outcome::LOST_POD_GRACE_SECONDS as u64 + 5,
            )));
        }
        JobState::Running => return Ok(Action::await_change()),
        JobState::Succeeded(result) => (result, None),
        JobState::Failed {
            result,
            job_reason,
            job_message,
        } => (result, Some(format!("{job_reason}: {job_message}"))),
    };
    let action = handle_finished(ctx, gd, node, role, &job, key, result, failure).await;
    if role == JobRole::Install && action.is_ok() {
        // A parallel slot is free.
        ctx.wake_waiting(1);
    }
    action
}

#[allow(clippy::too_many_arguments)]
async fn handle_finished(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    role: JobRole,
    job: &Job,
    key: &str,
    result: Option<PodResult>,
    job_failure: Option<String>,
) -> Result<Action, Error> {
    let name = job.name_any();
    let node_name = node.name_any();
    let now = Timestamp::now();
    let f = facts(node);
    let m = &ctx.metrics;

    // No GPU after all (detect Job, or the install Job's own detect step).
    if let Some(r) = result.as_ref().filter(|r| r.reason == Reason::NoGpu) {
        let patch = json!({"metadata": {
            "labels": {keys::READY_LABEL: null},
            "annotations": {keys::GPU: "false", keys::STATE: "NoGpu", keys::JOB: name}}});
        ctx.patch_node(&node_name, &patch).await?;
        ctx.memo().handled.insert(name.clone(), Instant::now());
        if role == JobRole::Install {
            m.inc("gpu_driver_installs_total", &[("result", "skipped")]);
        }
        tracing::info!("node {node_name}: no NVIDIA GPU ({})", r.message);
        return Ok(Action::await_change());
    }

    let succeeded =
        job_failure.is_none() && result.as_ref().is_some_and(|r| r.phase == Phase::Succeeded);
    if role == JobRole::Detect && succeeded {
        let patch = json!({"metadata": {"annotations": {keys::GPU: "true", keys::JOB: name}}});
        ctx.patch_node(&node_name, &patch).await?;
        ctx.memo().handled.insert(name, Instant::now());
        return Ok(Action::await_change());
    }
    if succeeded && let Some(r) = &result {
        return mark_installed(ctx, gd, node, job, key, r, now).await;
    }

    // Failed: the Job failed, or a pod "succeeded" without a result that
    // says so. Never marked installed.
    let (reason, message) = match (&result, &job_failure) {
        (Some(r), _) if r.phase == Phase::Failed => (r.reason.to_string(), r.message.clone()),
        (_, Some(why)) => ("JobFailed".to_string(), why.clone()),
        _ => (
            "NoResult".to_string(),
            "the Job's pod ended without an installer result in its termination message"
                .to_string(),
        ),
    };
    // The message goes into an Event and a node annotation: an installer
    // of another version may not have masked its URLs.
    let message = crate::redact::text(&message).into_owned();
    let attempts = decide::failures(&f, key) + 1;
    let wait = decide::backoff_seconds(
        attempts,
        gd.spec.job.retry_base_seconds,
        gd.spec.job.retry_max_seconds,
    );
    ctx.event(
        node,
        EventType::Warning,
        if role == JobRole::Install {
            "InstallFailed"
        } else {
            "DetectFailed"
        },
        format!("Job {name}: {reason}: {message} (attempt {attempts}, next in {wait}s)"),
    )
    .await;
    ctx.patch_node(
        &node_name,
        &failure_patch(key, attempts, &reason, &message, now),
    )
    .await?;
    ctx.memo().handled.insert(name, Instant::now());
    m.inc("gpu_driver_installs_total", &[("result", "failed")]);
    m.inc("gpu_driver_install_failures_total", &[("reason", &reason)]);
    tracing::warn!("node {node_name}: {reason}: {message}; retry in {wait}s");
    Ok(Action::requeue(Duration::from_secs(wait.max(1))))
}

/// An install Job whose result says installed: the node gets its ready
/// patch, the metrics and a Normal Event.
async fn mark_installed(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    job: &Job,
    key: &str,
    r: &PodResult,
    now: Timestamp,
) -> Result<Action, Error> {
    let name = job.name_any();
    let node_name = node.name_any();
    let m = &ctx.metrics;
    ctx.patch_node(&node_name, &ready_patch(gd, node, key, &name, r, now))
        .await?;
    ctx.memo().handled.insert(name.clone(), Instant::now());
    m.inc("gpu_driver_installs_total", &[("result", "succeeded")]);
    m.inc(
        "gpu_driver_cache_total",
        &[("outcome", r.cache.as_deref().unwrap_or("Unknown"))],
    );
    if let Some(s) = outcome::job_seconds(job, now.as_second()) {
        m.observe_duration(s);
    }
    let version = r
        .installed
        .as_ref()
        .and_then(|i| i.driver_version.clone())
        .unwrap_or_else(|| "unknown".into());
    ctx.event(
        node,
        EventType::Normal,
        "DriverInstalled",
        format!(
            "NVIDIA driver {version} installed for kernel {} by Job {name}",
            facts(node).kernel
        ),
    )
    .await;
    tracing::info!("node {node_name}: driver {version} installed");
    Ok(Action::await_change())
}

fn error_policy(node: Arc<Node>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.inc("gpu_driver_reconcile_errors_total", &[]);
    tracing::warn!("node {}: {err}", node.name_any());
    Action::requeue(Duration::from_secs(5))
}

/// Which node a Job or pod belongs to (our annotation).
fn node_of<K: Resource>(obj: &K) -> Option<ObjectRef<Node>> {
    obj.meta()
        .annotations
        .as_ref()?
        .get(keys::NODE)
        .map(|n| ObjectRef::new(n))
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
        .reflect(writer)
        .touched_objects();
    (reader, stream)
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
    );
    let (pods, pod_stream) = store_and_stream(
        Api::<Pod>::namespaced(client.clone(), &ns),
        watcher::Config::default().labels(&selector),
    );
    let (drivers, driver_stream) = store_and_stream(
        Api::<GpuDriver>::all(client.clone()),
        watcher::Config::default(),
    );
    let (nodes_reader, nodes_writer) = reflector::store();
    let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(nodes_writer)
        .applied_objects()
        .predicate_filter(node_relevant, Default::default());

    let (wake, wake_rx) = tokio::sync::mpsc::unbounded_channel();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "gpu-driver-operator".into(),
            instance: Some(opts.instance.clone()),
        },
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        opts: opts.clone(),
        nodes: nodes_reader.clone(),
        jobs,
        pods,
        drivers: drivers.clone(),
        recorder,
        metrics,
        memo: Mutex::new(Memo::default()),
        wake,
    });

    let all_nodes = nodes_reader.clone();
    let controller = Controller::for_stream(node_stream, nodes_reader)
        .with_config(ControllerConfig::default().concurrency(64))
        .watches_stream(job_stream, |j| node_of(&j))
        .watches_stream(pod_stream, |p| node_of(&p))
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

    let status_task = tokio::spawn(status_loop(ctx.clone()));
    controller
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()))
        .await;
    status_task.abort();
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Recomputes every GpuDriver's status from the caches and writes the
/// ones that changed; updates the nodes gauge.
async fn status_loop(ctx: Arc<Context>) {
    let mut written: HashMap<String, super::crd::GpuDriverStatus> = HashMap::new();
    loop {
        tokio::time::sleep(ctx.opts.status_interval).await;
        ctx.prune();
        let drivers = ctx.drivers.state();
        let nodes: Vec<NodeFacts> = ctx.nodes.state().iter().map(|n| facts(n)).collect();
        let running: HashSet<String> = ctx
            .jobs
            .state()
            .iter()
            .filter(|j| !job_is_terminal(j))
            .map(|j| j.name_any())
            .collect();
        let mut phases: BTreeMap<String, u32> = BTreeMap::new();
        for gd in &drivers {
            let mine: Vec<NodeFacts> = nodes
                .iter()
                .filter(|n| driver_for(&drivers, n).is_some_and(|d| d.name_any() == gd.name_any()))
                .cloned()
                .collect();
            let previous = written.get(&gd.name_any()).or(gd.status.as_ref());
            let st = status::compute(
                &gd.spec,
                gd.metadata.generation,
                &mine,
                |j| running.contains(j),
                previous,
                Timestamp::now(),
            );
            status::merge_phases(&mut phases, &st.phases);
            if gd.status.as_ref() == Some(&st) || written.get(&gd.name_any()) == Some(&st) {
                continue;
            }
            let api: Api<GpuDriver> = Api::all(ctx.client.clone());
            ctx.metrics.write("patch", "gpudrivers/status");
            match api
                .patch_status(
                    &gd.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": st })),
                )
                .await
            {
                Ok(_) => {
                    written.insert(gd.name_any(), st);
                }
                Err(e) => tracing::warn!("status of GpuDriver {}: {e}", gd.name_any()),
            }
        }
        ctx.metrics.set_all("gpu_driver_nodes", "phase", &phases);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gd_with_taint() -> GpuDriver {
        GpuDriver::new(
            "gd",
            serde_json::from_value(json!({
                "builderImages": [{"image": "b:1"}],
                "installerImage": "i:1",
                "startupTaint": "gpu-driver.gardenlinux.io/not-ready",
            }))
            .unwrap(),
        )
    }

    fn node_with_taints(taints: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "resourceVersion": "42",
                "labels": {keys::READY_LABEL: "true"}},
            "spec": {"taints": taints},
        }))
        .unwrap()
    }

    #[test]
    fn the_startup_taint_goes_back_beside_other_controllers_taints() {
        let gd = gd_with_taint();
        let other = json!({"key": "example.com/maintenance", "value": "x", "effect": "NoExecute"});
        let node = node_with_taints(json!([other]));
        let mut patch = json!({"metadata": {}});
        add_marks(&gd, &node, UNREADY, &mut patch);
        assert_eq!(
            patch,
            json!({
                "metadata": {"labels": {keys::READY_LABEL: null}, "resourceVersion": "42"},
                "spec": {"taints": [other, {"key": "gpu-driver.gardenlinux.io/not-ready",
                    "effect": "NoSchedule"}]},
            })
        );
        // Already there (the node pool's, with its own effect): the list is
        // not rewritten, and no resourceVersion pins the patch.
        let pool = json!({"key": "gpu-driver.gardenlinux.io/not-ready", "effect": "NoExecute"});
        let node = node_with_taints(json!([pool, other]));
        let mut patch = json!({"metadata": {}});
        add_marks(&gd, &node, UNREADY, &mut patch);
        assert_eq!(
            patch,
            json!({"metadata": {"labels": {keys::READY_LABEL: null}}})
        );
        // Removed again: only ours goes.
        let mut patch = json!({"metadata": {}});
        let ready = Marks {
            ready_label: Some(true),
            startup_taint: Some(false),
        };
        add_marks(&gd, &node, ready, &mut patch);
        assert_eq!(patch["spec"], json!({"taints": [other]}));
        assert_eq!(patch["metadata"]["labels"][keys::READY_LABEL], "true");
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
    }

    const UNREADY: Marks = Marks {
        ready_label: Some(false),
        startup_taint: Some(true),
    };

    #[test]
    fn a_failure_message_reaches_the_node_without_credentials() {
        let msg = "every source failed: https://user:pass@mirror.example/NVIDIA.run: HTTP 404; \
                   s3://AKIA:secret@bucket refused";
        let patch = failure_patch("k", 1, "DownloadFailed", msg, Timestamp::UNIX_EPOCH);
        let text = patch.to_string();
        assert!(!text.contains("pass") && !text.contains("secret"), "{text}");
        assert!(
            text.contains("https://***@mirror.example/NVIDIA.run"),
            "{text}"
        );
    }
}
