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
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use super::crd::{GpuDriver, TargetStatus};
use super::decide::{
    self, DrainStep, Gate, JobRole, Marks, NodeFacts, Plan, Target, TargetPhase, UpgradeState,
};
use super::job::{self, JobRequest};
use super::keys;
use super::metrics::Metrics;
use super::outcome::{self, JobState, PodResult};
use super::status;
use gpu_driver_contract::report::{Phase, Reason};
use gpu_driver_contract::text::truncate;

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
    /// Nodes whose upgrade this process started (cordon patch sent), until
    /// it finished: the caches may not show the patch yet.
    upgrading: HashMap<String, Instant>,
    /// Nodes waiting for an upgrade slot.
    upgrade_waiting: HashSet<String>,
    /// Nodes told that their install waits for a build or was refused, by
    /// node and target key (one Event each).
    gated: HashMap<String, String>,
    /// Nodes this process cordoned for an upgrade: the ready patch
    /// uncordons them even when the cached node does not show the
    /// `upgrade-cordoned` annotation yet.
    cordoned: HashMap<String, Instant>,
    /// Verified installs by node → key: a reconcile on a cached node older
    /// than that patch must not start anything for the key again.
    installed: HashMap<String, (String, Instant)>,
}

/// Nodes waiting for a target's build Job, by target key: a build Job's
/// change wakes them (it serves no node of its own).
type Waiters = Arc<Mutex<HashMap<String, HashSet<String>>>>;

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
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            let name = obj.meta().name.clone().unwrap_or_default();
            tracing::warn!("event {reason} for {} {name}: {e}", K::kind(&()));
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
        memo.cordoned.retain(|_, t| t.elapsed() < old);
        memo.installed.retain(|_, (_, t)| t.elapsed() < old);
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
    cordoned_by_us: bool,
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
    end_upgrade(&f, cordoned_by_us, &mut patch);
    patch
}

/// Clears the upgrade annotations (a null for a key the cached node does
/// not show yet costs nothing); an upgrade that cordoned the node
/// uncordons it, one that found it cordoned by someone else leaves it so.
/// `cordoned_by_us`: this process sent the cordon (the cache may lag).
fn end_upgrade(f: &NodeFacts, cordoned_by_us: bool, patch: &mut Value) {
    for k in [keys::UPGRADE, keys::UPGRADE_STARTED, keys::UPGRADE_CORDONED] {
        patch["metadata"]["annotations"][k] = Value::Null;
    }
    let annotated = f
        .annotations
        .get(keys::UPGRADE_CORDONED)
        .map(String::as_str)
        == Some("true");
    if cordoned_by_us || annotated {
        patch["spec"]["unschedulable"] = json!(false);
    }
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
                keys::FAILURE_MESSAGE: truncate(&gpu_driver_contract::redact::text(message), 1024),
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
            // An upgrade left half-way because the policy went back to what
            // the node runs: nothing to install, so end it (uncordon if
            // ours) in the same patch.
            let stale_upgrade = f.annotations.contains_key(keys::UPGRADE);
            if (stale_upgrade || !marks.is_empty()) && ctx.memo().fixed.get(&f.name) != Some(&key) {
                let mut patch = json!({"metadata": {}});
                add_marks(&gd, &node, marks, &mut patch);
                if stale_upgrade {
                    let ours = ctx.memo().cordoned.contains_key(&f.name);
                    end_upgrade(&f, ours, &mut patch);
                }
                ctx.patch_node(&f.name, &patch).await?;
                ctx.memo().fixed.insert(f.name.clone(), key);
                if stale_upgrade {
                    ctx.memo().cordoned.remove(&f.name);
                    ctx.upgrade_done(&f.name);
                }
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
            let ns = ctx.opts.namespace.clone();
            let req = JobRequest::node_job(JobRole::Detect, &job, &ns, &f.name, &image, &f.boot_id);
            drive_job(&ctx, &gd, &node, &req).await
        }
        Plan::Install {
            job, image, key, ..
        } => {
            // A node without a verified driver for this boot (new, rebooted,
            // upgraded) gets label off and startup taint on before the Job,
            // so nothing new lands there until the install is verified. A
            // node waiting for its turn in a driver upgrade keeps serving
            // with its old driver, label and all: taking every node's label
            // at once would take the device plugin off the whole pool.
            // Installed for this key already by a patch the cache does not
            // show yet: its watch event brings the node back.
            if ctx.memo().installed.get(&f.name).map(|(k, _)| k) == Some(&key) {
                return Ok(Action::await_change());
            }
            let upgrading = decide::needs_upgrade(&f, &key);
            if !upgrading || UpgradeState::of(&f) != UpgradeState::Idle {
                unready(&ctx, &gd, &node, Some("Pending")).await?;
            }
            // A running driver of an older policy: cordon and drain first,
            // a few nodes at a time.
            if upgrading && let Some(action) = upgrade(&ctx, &gd, &node, &key).await? {
                return Ok(action);
            }
            let ns = ctx.opts.namespace.clone();
            let mut req = JobRequest::node_job(JobRole::Install, &job, &ns, &f.name, &image, &key);
            let expect: String;
            match gate(&ctx, &gd, &f).await? {
                (
                    Gate::Go {
                        expect_sha256,
                        compile,
                    },
                    _,
                ) => {
                    expect = expect_sha256.unwrap_or_default();
                    req.expect_sha256 = Some(expect.as_str()).filter(|e| !e.is_empty());
                    req.compile = compile;
                }
                (Gate::Wait, _) => return Ok(Action::requeue(Duration::from_secs(60))),
                (Gate::Refuse { reason, message }, retry) => {
                    refuse(&ctx, &node, &key, &reason, &message).await?;
                    return Ok(Action::requeue(Duration::from_secs(retry.clamp(5, 600))));
                }
            }
            drive_job(&ctx, &gd, &node, &req).await
        }
    }
}

/// The install gate for the node: its target's build (created here when
/// due), or straight on without build Jobs. With the gate, the seconds
/// until the target's next build attempt (for a refusal's requeue).
async fn gate(ctx: &Context, gd: &GpuDriver, f: &NodeFacts) -> Result<(Gate, u64), Error> {
    if !decide::builds_enabled(&gd.spec) {
        return Ok((decide::install_gate(&gd.spec, None), 0));
    }
    let Some(target) = Target::of_node(f) else {
        return Ok((decide::install_gate(&gd.spec, None), 60));
    };
    let key = decide::target_key(&gd.spec, &target);
    let phase = ensure_target(ctx, gd, &target).await?;
    let retry = match &phase {
        TargetPhase::Failed { retry_in, .. } => *retry_in,
        _ => 60,
    };
    let gate = decide::install_gate(&gd.spec, Some(&phase));
    {
        let mut w = ctx.waiters.lock().unwrap_or_else(|e| e.into_inner());
        if gate == Gate::Wait {
            w.entry(key).or_default().insert(f.name.clone());
        } else if let Some(set) = w.get_mut(&key) {
            set.remove(&f.name);
            if set.is_empty() {
                w.remove(&key);
            }
        }
    }
    Ok((gate, retry))
}

/// No build can serve the node and compiling on it is forbidden: its state
/// says why (once per key), with a Warning Event.
async fn refuse(
    ctx: &Context,
    node: &Node,
    key: &str,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let name = node.name_any();
    if ctx.memo().gated.get(&name).map(String::as_str) == Some(key) {
        return Ok(());
    }
    let current = node.annotations().get(keys::STATE).map(String::as_str);
    if current != Some("BuildFailed") {
        ctx.event(
            node,
            EventType::Warning,
            "BuildFailed",
            format!("{reason}: {message}"),
        )
        .await;
        let patch = json!({"metadata": {"annotations": {
            keys::STATE: "BuildFailed",
            keys::FAILURE_REASON: reason,
            keys::FAILURE_MESSAGE: truncate(&gpu_driver_contract::redact::text(message), 1024),
        }}});
        ctx.patch_node(&name, &patch).await?;
    }
    ctx.memo().gated.insert(name, key.to_string());
    Ok(())
}

// ------------------------------------------------------------ build targets

impl Context {
    /// The target's record: this process's, else the GpuDriver's status
    /// (after a restart), else a new one.
    fn target_record(&self, gd: &GpuDriver, key: &str, t: &Target) -> TargetStatus {
        let id = (gd.name_any(), key.to_string());
        if let Some(r) = self
            .targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
        {
            return r.clone();
        }
        gd.status
            .as_ref()
            .and_then(|s| s.targets.iter().find(|r| r.key == key))
            .cloned()
            .unwrap_or_else(|| TargetStatus {
                key: key.to_string(),
                os_image: t.os_image.clone(),
                kernel_release: t.kernel.clone(),
                arch: t.arch.clone(),
                phase: "Pending".into(),
                ..Default::default()
            })
    }

    fn save_target(&self, gd: &GpuDriver, rec: TargetStatus) {
        self.targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((gd.name_any(), rec.key.clone()), rec);
    }

    async fn gd_event(&self, gd: &GpuDriver, type_: EventType, reason: &str, note: String) {
        self.publish(gd, "BuildDriver", type_, reason, note).await;
    }
}

/// Where the target's artifact stands; creates its build Job when none
/// runs and none is due to wait. One build per target cluster-wide: the
/// Job's name is the target's key and attempt, so a second create (another
/// reconcile, a restarted operator) answers AlreadyExists.
async fn ensure_target(
    ctx: &Context,
    gd: &GpuDriver,
    target: &Target,
) -> Result<TargetPhase, Error> {
    let key = decide::target_key(&gd.spec, target);
    let mut rec = ctx.target_record(gd, &key, target);
    let now = Timestamp::now();
    if let Some(phase) = settled(gd, &rec, now.as_second()) {
        return Ok(phase);
    }
    let name = decide::build_job_name(target, &key, rec.failures);
    let Some(job) = ctx.jobs.get(&ctx.job_ref(&name)) else {
        return start_build(ctx, gd, target, &name, rec).await;
    };
    let pods = ctx.pods_of(&name);
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let (result, failure) = match outcome::job_state(&job, &pod_refs, now.as_second()) {
        JobState::Running => {
            if rec.phase != "Building" {
                rec.phase = "Building".into();
                rec.job = Some(name);
                ctx.save_target(gd, rec);
            }
            return Ok(TargetPhase::Building);
        }
        JobState::Succeeded(result) => (result, None),
        JobState::Failed {
            result,
            job_reason,
            job_message,
        } => (result, Some(format!("{job_reason}: {job_message}"))),
    };
    Ok(build_finished(ctx, gd, target, &name, rec, result, failure).await)
}

/// A target that needs no look at Jobs: cached, or failed and still
/// backing off.
fn settled(gd: &GpuDriver, rec: &TargetStatus, now_unix: i64) -> Option<TargetPhase> {
    if rec.phase == "Cached" {
        return rec.artifact_sha256.as_ref().map(|sha| TargetPhase::Cached {
            sha256: sha.clone(),
        });
    }
    if rec.phase != "Failed" {
        return None;
    }
    let wait = decide::backoff_seconds(
        rec.failures,
        gd.spec.job.retry_base_seconds,
        gd.spec.job.retry_max_seconds,
    );
    let at = rec
        .failed_at
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map_or(0, |t| t.as_second());
    let left = (at.saturating_add(wait as i64) - now_unix).max(0) as u64;
    (left > 0).then(|| TargetPhase::Failed {
        reason: rec.reason.clone().unwrap_or_default(),
        message: rec.message.clone().unwrap_or_default(),
        retry_in: left,
    })
}

/// No build Job for the target's current attempt yet: create it (unless
/// this process just did).
async fn start_build(
    ctx: &Context,
    gd: &GpuDriver,
    target: &Target,
    name: &str,
    mut rec: TargetStatus,
) -> Result<TargetPhase, Error> {
    if !ctx.memo().created.contains_key(name) {
        let Some(image) = decide::builder_image(&gd.spec.builder_images, &target.facts()) else {
            let message = format!(
                "no builder image matches OS {:?}, kernel {}",
                target.os_image, target.kernel
            );
            rec.phase = "Failed".into();
            rec.reason = Some("NoBuilderImage".into());
            rec.message = Some(message.clone());
            rec.failed_at = Some(Timestamp::now().to_string());
            ctx.save_target(gd, rec);
            return Ok(TargetPhase::Failed {
                reason: "NoBuilderImage".into(),
                message,
                retry_in: gd.spec.job.retry_max_seconds,
            });
        };
        let obj = job::build(
            gd,
            &JobRequest::build(name, &ctx.opts.namespace, &image, &rec.key, target),
        );
        create_job(ctx, &obj, name, JobRole::Build).await?;
        tracing::info!(
            "target {} {} {}: created build Job {name}",
            target.os_image,
            target.kernel,
            target.arch
        );
    }
    rec.phase = "Building".into();
    rec.job = Some(name.to_string());
    ctx.save_target(gd, rec);
    Ok(TargetPhase::Building)
}

/// A build Job ended: cached with the digest its result reports, or
/// failed (counted for the backoff); an Event on the GpuDriver once.
async fn build_finished(
    ctx: &Context,
    gd: &GpuDriver,
    target: &Target,
    name: &str,
    mut rec: TargetStatus,
    result: Option<PodResult>,
    failure: Option<String>,
) -> TargetPhase {
    rec.job = Some(name.to_string());
    let first = |ctx: &Context| {
        ctx.memo()
            .handled
            .insert(name.to_string(), Instant::now())
            .is_none()
    };
    if failure.is_none()
        && let Some(r) = result.as_ref().filter(|r| r.phase == Phase::Succeeded)
        && let Some(b) = &r.built
    {
        let sha = b.artifact_sha256.clone();
        rec.phase = "Cached".into();
        rec.artifact_sha256 = Some(sha.clone());
        rec.driver_version = b.driver_version.clone();
        rec.reason = None;
        rec.message = None;
        ctx.save_target(gd, rec);
        if first(ctx) {
            ctx.metrics
                .inc("gpu_driver_builds_total", &[("result", "succeeded")]);
            let note = format!(
                "Job {name} stored the driver for {} {} {} (sha256 {sha})",
                target.os_image, target.kernel, target.arch
            );
            ctx.gd_event(gd, EventType::Normal, "ArtifactBuilt", note)
                .await;
        }
        return TargetPhase::Cached { sha256: sha };
    }
    let (reason, message) = match (&result, &failure) {
        (Some(r), _) if r.phase == Phase::Failed => (r.reason.to_string(), r.message.clone()),
        (_, Some(why)) => ("JobFailed".to_string(), why.clone()),
        _ => (
            "NoResult".to_string(),
            "the build Job's pod ended without a stored artifact in its result".to_string(),
        ),
    };
    let message = gpu_driver_contract::redact::text(&message).into_owned();
    rec.phase = "Failed".into();
    rec.failures += 1;
    rec.failed_at = Some(Timestamp::now().to_string());
    rec.reason = Some(reason.clone());
    rec.message = Some(truncate(&message, 1024));
    let wait = decide::backoff_seconds(
        rec.failures,
        gd.spec.job.retry_base_seconds,
        gd.spec.job.retry_max_seconds,
    );
    ctx.save_target(gd, rec);
    if first(ctx) {
        ctx.metrics
            .inc("gpu_driver_builds_total", &[("result", "failed")]);
        let note = format!(
            "Job {name} for {} {}: {reason}: {message} (next build in {wait}s)",
            target.os_image, target.kernel
        );
        ctx.gd_event(gd, EventType::Warning, "BuildFailed", note)
            .await;
    }
    TargetPhase::Failed {
        reason,
        message,
        retry_in: wait,
    }
}

/// Every target the GpuDriver should have built: its prebuild list and
/// the targets of its selected GPU nodes (the second node of a pool never
/// waits), each with how many nodes run it.
fn wanted_targets(gd: &GpuDriver, nodes: &[NodeFacts]) -> BTreeMap<Target, u32> {
    let mut out: BTreeMap<Target, u32> = BTreeMap::new();
    for t in gd.spec.prebuild.iter().filter_map(Target::of_prebuild) {
        out.entry(t).or_default();
    }
    for n in nodes {
        if decide::gpu_presence(&gd.spec, n) != decide::Gpu::Yes {
            continue;
        }
        if let Some(t) = Target::of_node(n) {
            *out.entry(t).or_default() += 1;
        }
    }
    out
}

/// The build side of a status tick: ensures every wanted target's build
/// and returns their records for `status.targets`.
async fn build_targets(ctx: &Context, gd: &GpuDriver, nodes: &[NodeFacts]) -> Vec<TargetStatus> {
    if !decide::builds_enabled(&gd.spec) {
        return Vec::new();
    }
    let wanted = wanted_targets(gd, nodes);
    let mut out = Vec::new();
    for (t, count) in &wanted {
        if let Err(e) = ensure_target(ctx, gd, t).await {
            tracing::warn!("target {} {}: {e}", t.os_image, t.kernel);
        }
        let key = decide::target_key(&gd.spec, t);
        let mut rec = ctx.target_record(gd, &key, t);
        rec.nodes = *count;
        out.push(rec);
    }
    // Targets nobody wants any more (an old driver policy, a kernel no node
    // runs) are forgotten.
    let keys: HashSet<String> = out.iter().map(|r| r.key.clone()).collect();
    let owner = gd.name_any();
    ctx.targets
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(g, k), _| g != &owner || keys.contains(k));
    out.sort_by(|a, b| {
        (&a.os_image, &a.kernel_release, &a.arch).cmp(&(&b.os_image, &b.kernel_release, &b.arch))
    });
    out
}

// ------------------------------------------------------------ rolling upgrades

/// The pods on `node` that use an NVIDIA device plugin resource and have
/// not ended.
async fn gpu_pods(ctx: &Context, node: &str) -> Result<Vec<Pod>, Error> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let list = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|e| Error::Kube(format!("listing the pods on node {node}"), e))?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter(uses_gpu)
        .collect())
}

/// Does any container of the pod request or limit an `nvidia.com/*`
/// resource?
pub fn uses_gpu(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .any(|r| {
            r.limits
                .iter()
                .chain(r.requests.iter())
                .flat_map(|m| m.keys())
                .any(|k| decide::is_gpu_resource(k))
        })
}

impl Context {
    /// The roll of `gd`'s nodes: (maxUnavailable as a count, nodes in
    /// progress, the node it stopped at).
    fn roll(&self, gd: &GpuDriver) -> (u32, HashSet<String>, Option<String>) {
        let drivers = self.drivers.state();
        let owner = gd.name_any();
        let mut gpu_nodes = 0u32;
        let mut busy = HashSet::new();
        let mut stopped = None;
        for n in self.nodes.state().iter() {
            let f = facts(n);
            if driver_for(&drivers, &f).is_none_or(|d| d.name_any() != owner) {
                continue;
            }
            if decide::gpu_presence(&gd.spec, &f) == decide::Gpu::Yes {
                gpu_nodes += 1;
            }
            let st = UpgradeState::of(&f);
            if st.in_progress() {
                busy.insert(f.name.clone());
            }
            if st == UpgradeState::Failed && stopped.is_none() {
                stopped = Some(f.name.clone());
            }
        }
        let max = decide::max_unavailable(&gd.spec.upgrade_policy.max_unavailable, gpu_nodes);
        (max, busy, stopped)
    }

    /// Takes an upgrade slot for `node` if one is free and the roll is not
    /// stopped; the count and the reservation are one step under the memo
    /// lock, so that concurrent reconciles never overshoot.
    fn reserve_upgrade(&self, gd: &GpuDriver, node: &str) -> Slot {
        let (max, mut busy, stopped) = self.roll(gd);
        let mut memo = self.memo();
        // Started by us, not in the cache yet (or finished and forgotten).
        memo.upgrading
            .retain(|n, at| busy.contains(n) || at.elapsed() < Duration::from_secs(60));
        if memo.upgrading.contains_key(node) || busy.contains(node) {
            // Our start patch is on its way through the watch: sending it
            // again would cost a write and an Event.
            return Slot::Started;
        }
        busy.extend(memo.upgrading.keys().cloned());
        if stopped.is_some() || busy.len() as u32 >= max {
            memo.upgrade_waiting.insert(node.to_string());
            return Slot::Full;
        }
        memo.upgrade_waiting.remove(node);
        memo.upgrading.insert(node.to_string(), Instant::now());
        Slot::Reserved
    }

    /// An upgrade ended (installed, or the node left): wake nodes waiting
    /// for a slot.
    fn upgrade_done(&self, node: &str) {
        let mut memo = self.memo();
        memo.upgrading.remove(node);
        let picked: Vec<String> = memo.upgrade_waiting.iter().cloned().collect();
        for name in picked {
            memo.upgrade_waiting.remove(&name);
            let _ = self.wake.send(ObjectRef::new(&name));
        }
    }
}

/// What [`Context::reserve_upgrade`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Reserved,
    /// This process started the node's upgrade; the cache lags.
    Started,
    Full,
}

/// One step of a node's driver upgrade. `None`: drained, go install;
/// `Some(action)`: not yet (no slot, still draining, failed).
async fn upgrade(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    key: &str,
) -> Result<Option<Action>, Error> {
    let f = facts(node);
    let name = f.name.clone();
    let policy = &gd.spec.upgrade_policy;
    let now = Timestamp::now();
    let state = UpgradeState::of(&f);
    if state == UpgradeState::Installing {
        return Ok(None);
    }
    if state == UpgradeState::Idle {
        return start_upgrade(ctx, gd, node).await;
    }
    // Draining, or Failed with its backoff over (plan() held it back
    // until then): drain (again).
    let pods = gpu_pods(ctx, &name).await?;
    let started = if state == UpgradeState::Failed {
        None
    } else {
        decide::upgrade_started(&f)
    };
    match decide::drain_step(policy, pods.len(), started, now.as_second()) {
        DrainStep::Install => {
            let patch = json!({"metadata": {"annotations": {keys::UPGRADE: "Installing"}}});
            ctx.patch_node(&name, &patch).await?;
            ctx.event(
                node,
                EventType::Normal,
                "UpgradeDrained",
                "no GPU pod left on the node: installing".into(),
            )
            .await;
            Ok(None)
        }
        DrainStep::Drain => {
            if state == UpgradeState::Failed {
                // A retry after the backoff: the drain's clock starts anew.
                let patch = json!({"metadata": {"annotations": {
                    keys::UPGRADE: "Draining", keys::UPGRADE_STARTED: now.to_string()}}});
                ctx.patch_node(&name, &patch).await?;
                ctx.event(
                    node,
                    EventType::Normal,
                    "UpgradeRetry",
                    format!("draining {} GPU pod(s) again", pods.len()),
                )
                .await;
            }
            if policy.evict {
                evict(ctx, &name, &pods).await;
            }
            Ok(Some(Action::requeue(Duration::from_secs(2))))
        }
        DrainStep::TimedOut => {
            let names: Vec<String> = pods
                .iter()
                .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
                .collect();
            let message = format!(
                "GPU pods still on the node after {}s{}: {}",
                policy.drain_timeout_seconds,
                if policy.evict {
                    " (evictions refused, e.g. by a PodDisruptionBudget)"
                } else {
                    " (upgradePolicy.evict is false: waiting for them to end)"
                },
                names.join(", ")
            );
            let attempts = decide::failures(&f, key) + 1;
            let mut patch = failure_patch(key, attempts, "DrainTimeout", &message, now);
            patch["metadata"]["annotations"][keys::UPGRADE] = json!("Failed");
            ctx.patch_node(&name, &patch).await?;
            ctx.event(
                node,
                EventType::Warning,
                "UpgradeFailed",
                format!("DrainTimeout: {message}; the roll stops here"),
            )
            .await;
            ctx.metrics
                .inc("gpu_driver_upgrades_total", &[("step", "failed")]);
            let wait = decide::backoff_seconds(
                attempts,
                gd.spec.job.retry_base_seconds,
                gd.spec.job.retry_max_seconds,
            );
            Ok(Some(Action::requeue(Duration::from_secs(wait.max(1)))))
        }
    }
}

/// The node's turn in the roll, if a slot is free: cordon it (unless
/// someone else did), record the start, and go straight to installing when
/// no GPU pod runs there.
async fn start_upgrade(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
) -> Result<Option<Action>, Error> {
    let f = facts(node);
    let name = f.name.clone();
    let now = Timestamp::now();
    match ctx.reserve_upgrade(gd, &name) {
        Slot::Reserved => {}
        Slot::Started => return Ok(Some(Action::requeue(Duration::from_secs(2)))),
        Slot::Full => return Ok(Some(Action::requeue(Duration::from_secs(30)))),
    }
    let pods = gpu_pods(ctx, &name).await?;
    let cordon = !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let next = if pods.is_empty() {
        UpgradeState::Installing
    } else {
        UpgradeState::Draining
    };
    let mut patch = json!({"metadata": {"annotations": {
        keys::UPGRADE: next.as_str(),
        keys::UPGRADE_STARTED: now.to_string(),
        keys::UPGRADE_CORDONED: cordon.to_string(),
    }}});
    if f.labels.contains_key(keys::READY_LABEL) {
        // Its turn: the ready label goes with the cordon.
        patch["metadata"]["labels"] = json!({ keys::READY_LABEL: null });
    }
    if cordon {
        patch["spec"] = json!({"unschedulable": true});
    }
    if let Err(e) = ctx.patch_node(&name, &patch).await {
        // Not started after all: the next reconcile may try again.
        ctx.memo().upgrading.remove(&name);
        return Err(e);
    }
    if cordon {
        ctx.memo().cordoned.insert(name.clone(), Instant::now());
    }
    let from = f
        .annotations
        .get(keys::DRIVER_VERSION)
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    let to = gd
        .spec
        .driver
        .version
        .clone()
        .unwrap_or_else(|| "the catalog's".into());
    ctx.event(
        node,
        EventType::Normal,
        "UpgradeStarted",
        format!(
            "driver {from} → {to} ({}): {}; {} GPU pod(s) to drain",
            gd.spec.driver.flavor.as_str(),
            if cordon {
                "cordoned"
            } else {
                "already cordoned by someone else, left so"
            },
            pods.len()
        ),
    )
    .await;
    ctx.metrics
        .inc("gpu_driver_upgrades_total", &[("step", "started")]);
    Ok(match next {
        UpgradeState::Installing => None,
        _ => Some(Action::requeue(Duration::from_secs(1))),
    })
}

/// Evicts each pod through the Eviction API, so that PodDisruptionBudgets
/// decide; a refusal (429) is left for the next look.
async fn evict(ctx: &Context, node: &str, pods: &[Pod]) {
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ns = p.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        ctx.metrics.write("create", "pods/eviction");
        match api.evict(&p.name_any(), &EvictParams::default()).await {
            Ok(_) => tracing::info!("node {node}: evicted {ns}/{}", p.name_any()),
            Err(kube::Error::Api(e)) if e.code == 429 => {
                tracing::info!(
                    "node {node}: eviction of {ns}/{} refused for now: {}",
                    p.name_any(),
                    e.message
                );
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!("node {node}: evicting {ns}/{}: {e}", p.name_any()),
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

/// Creates a Job, counting the write; AlreadyExists is success (made by
/// an earlier incarnation of this operator: same name, same desired state).
async fn create_job(ctx: &Context, obj: &Job, name: &str, role: JobRole) -> Result<(), Error> {
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &ctx.opts.namespace);
    ctx.metrics.write("create", "jobs");
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => {
            ctx.metrics
                .inc("gpu_driver_jobs_created_total", &[("role", role.as_str())]);
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(Error::Kube(format!("creating Job {name}"), e)),
    }
    ctx.memo().created.insert(name.to_string(), Instant::now());
    Ok(())
}

async fn drive_job(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    req: &JobRequest<'_>,
) -> Result<Action, Error> {
    let (role, name, key) = (req.role, req.name, req.key);
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
        let obj = job::build(gd, req);
        create_job(ctx, &obj, name, role).await?;
        tracing::info!("node {node_name}: created {} Job {name}", role.as_str());
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
    let message = gpu_driver_contract::redact::text(&message).into_owned();
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
    let mut patch = failure_patch(key, attempts, &reason, &message, now);
    let upgrading = UpgradeState::of(&f) == UpgradeState::Installing;
    if upgrading && role == JobRole::Install {
        // The roll stops at this node; it stays cordoned and is retried
        // with the usual backoff.
        patch["metadata"]["annotations"][keys::UPGRADE] = json!("Failed");
    }
    ctx.patch_node(&node_name, &patch).await?;
    if upgrading && role == JobRole::Install {
        ctx.event(
            node,
            EventType::Warning,
            "UpgradeFailed",
            format!("{reason}: {message}; the roll stops here"),
        )
        .await;
        m.inc("gpu_driver_upgrades_total", &[("step", "failed")]);
    }
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
    let ours = ctx.memo().cordoned.contains_key(&node_name);
    let upgraded = ours
        || facts(node).annotations.contains_key(keys::UPGRADE)
        || ctx.memo().upgrading.contains_key(&node_name);
    let patch = ready_patch(gd, node, key, &name, r, now, ours);
    ctx.patch_node(&node_name, &patch).await?;
    {
        let mut memo = ctx.memo();
        memo.handled.insert(name.clone(), Instant::now());
        memo.gated.remove(&node_name);
        memo.cordoned.remove(&node_name);
        memo.installed
            .insert(node_name.clone(), (key.to_string(), Instant::now()));
    }
    if upgraded {
        m.inc("gpu_driver_upgrades_total", &[("step", "done")]);
        ctx.upgrade_done(&node_name);
    }
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
        targets: Mutex::new(HashMap::new()),
        waiters: Waiters::default(),
    });
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

    let status_task = tokio::spawn(status_loop(ctx.clone()));
    controller
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()))
        .await;
    status_task.abort();
}

/// The merge patch that makes the status `st`: a field the new status
/// leaves out (an upgrade that ended, targets no longer wanted) is null,
/// else the merge would keep the old value.
fn status_patch(
    st: &super::crd::GpuDriverStatus,
    previous: Option<&super::crd::GpuDriverStatus>,
) -> Value {
    let mut body = serde_json::to_value(st).unwrap_or_default();
    let prev = previous.and_then(|p| serde_json::to_value(p).ok());
    if let (Some(obj), Some(Value::Object(prev))) = (body.as_object_mut(), prev) {
        for k in prev.keys() {
            if !obj.contains_key(k) {
                obj.insert(k.clone(), Value::Null);
            }
        }
    }
    json!({ "status": body })
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
            let mut st = st;
            st.targets = build_targets(&ctx, gd, &mine).await;
            st.upgrade = status::upgrade(&gd.spec, &mine);
            status::merge_phases(&mut phases, &st.phases);
            if gd.status.as_ref() == Some(&st) || written.get(&gd.name_any()) == Some(&st) {
                continue;
            }
            let api: Api<GpuDriver> = Api::all(ctx.client.clone());
            ctx.metrics.write("patch", "gpudrivers/status");
            let body = status_patch(&st, written.get(&gd.name_any()).or(gd.status.as_ref()));
            match api
                .patch_status(&gd.name_any(), &PatchParams::default(), &Patch::Merge(body))
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
    fn a_status_field_that_went_away_is_nulled_in_the_patch() {
        use crate::crd::{GpuDriverStatus, UpgradeStatus};
        let before = GpuDriverStatus {
            upgrade: Some(UpgradeStatus {
                max_unavailable: 1,
                pending_nodes: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let after = GpuDriverStatus::default();
        let patch = status_patch(&after, Some(&before));
        assert_eq!(patch["status"]["upgrade"], Value::Null);
        assert!(patch["status"].as_object().unwrap().contains_key("upgrade"));
        let patch = status_patch(&after, None);
        assert!(!patch["status"].as_object().unwrap().contains_key("upgrade"));
    }

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
