//! A node's Job: created, or its result carried onto the node.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::context::{Context, Error};
use super::expect::Kind;
use super::lookup::{facts, job_is_terminal};
use super::patch::{Change, NodeAnnotations, NodePatch, failure_patch, ready_patch};
use crate::crd::GpuDriver;
use crate::decide::{self, JobRole, NodeState, UpgradeState};
use crate::job::{self, JobRequest};
use crate::keys;
use crate::outcome::{self, PodResult};
use gpu_driver_contract::report::{Phase, Reason};

/// Creates a Job, counting the write; AlreadyExists is success (made by
/// an earlier incarnation of this operator: same name, same desired state).
pub(super) async fn create_job(
    ctx: &Context,
    obj: &Job,
    name: &str,
    role: JobRole,
) -> Result<(), Error> {
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
    ctx.expect().expect(Kind::JobCreated, name, "");
    Ok(())
}

pub(super) async fn drive_job(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    req: &JobRequest<'_>,
) -> Result<Action, Error> {
    let (role, name, key) = (req.role, req.name, req.key);
    if ctx.expect().holds(Kind::JobHandled, name) {
        // Our node patch for this Job is on its way through the watch.
        return Ok(Action::await_change());
    }
    let node_name = node.name_any();
    let Some(job) = ctx.jobs.get(&ctx.job_ref(name)) else {
        if ctx.expect().holds(Kind::JobCreated, name) {
            return Ok(Action::await_change());
        }
        let max = gd.spec.max_parallel as usize;
        if role == JobRole::Install && max > 0 && ctx.active_installs(gd) >= max {
            ctx.expect().queue_install(&node_name);
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
    let state = outcome::job_state(&job, &pod_refs, Timestamp::now().as_second());
    let Some((result, failure)) = state.finished() else {
        // A finished Job whose pod the cache has not caught up with: the
        // pod's event comes; the requeue covers a pod that never does.
        if job_is_terminal(&job) {
            return Ok(Action::requeue(Duration::from_secs(
                outcome::LOST_POD_GRACE_SECONDS as u64 + 5,
            )));
        }
        return Ok(Action::await_change());
    };
    let done = Finished {
        role,
        job: &job,
        key,
        result,
        failure,
    };
    let action = handle_finished(ctx, gd, node, done).await;
    if role == JobRole::Install && action.is_ok() {
        // A parallel slot is free.
        ctx.wake_waiting(1);
    }
    action
}

/// A finished Job of a node: what its pod reported, and why the Job
/// failed if it did.
struct Finished<'a> {
    role: JobRole,
    job: &'a Job,
    key: &'a str,
    result: Option<PodResult>,
    failure: Option<String>,
}

async fn handle_finished(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    done: Finished<'_>,
) -> Result<Action, Error> {
    let name = done.job.name_any();
    let node_name = node.name_any();
    // No GPU after all (detect Job, or the install Job's own detect step).
    if let Some(r) = done.result.as_ref().filter(|r| r.reason == Reason::NoGpu) {
        let mut patch = NodePatch::annotations(NodeAnnotations {
            gpu: Change::Set("false".into()),
            state: Change::Set(NodeState::NoGpu),
            job: Change::Set(name.clone()),
            ..Default::default()
        });
        patch.metadata.labels.ready = Change::Remove;
        ctx.patch_node(&node_name, &patch).await?;
        ctx.expect().expect(Kind::JobHandled, &name, "");
        if done.role == JobRole::Install {
            ctx.metrics
                .inc("gpu_driver_installs_total", &[("result", "skipped")]);
        }
        tracing::info!("node {node_name}: no NVIDIA GPU ({})", r.message);
        return Ok(Action::await_change());
    }
    let succeeded = done.failure.is_none()
        && done
            .result
            .as_ref()
            .is_some_and(|r| r.phase == Phase::Succeeded);
    if done.role == JobRole::Detect && succeeded {
        let patch = NodePatch::annotations(NodeAnnotations {
            gpu: Change::Set("true".into()),
            job: Change::Set(name.clone()),
            ..Default::default()
        });
        ctx.patch_node(&node_name, &patch).await?;
        ctx.expect().expect(Kind::JobHandled, &name, "");
        return Ok(Action::await_change());
    }
    if succeeded && let Some(r) = &done.result {
        return mark_installed(ctx, gd, node, done.job, done.key, r, Timestamp::now()).await;
    }
    // Failed: the Job failed, or a pod "succeeded" without a result that
    // says so. Never marked installed.
    let (reason, message) = failure_of(
        done.result.as_ref(),
        done.failure.as_deref(),
        "the Job's pod ended without an installer result in its termination message",
    );
    let message = if reason == "DriverInUse" {
        name_holders(ctx, &node.name_any(), &message).await
    } else {
        message
    };
    mark_failed(ctx, gd, node, &done, &reason, &message).await
}

/// A `DriverInUse` message names the holders' pods by UID (the installer
/// sees only cgroups); the pods on the node turn them into `ns/name`.
async fn name_holders(ctx: &Context, node: &str, message: &str) -> String {
    if !message.contains("(pod ") {
        return message.to_string();
    }
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let Ok(Ok(list)) = tokio::time::timeout(Duration::from_secs(10), api.list(&params)).await
    else {
        return message.to_string();
    };
    let pods: Vec<(String, String)> = list
        .items
        .iter()
        .filter_map(|p| {
            let uid = p.metadata.uid.clone()?;
            Some((
                uid,
                format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
            ))
        })
        .collect();
    outcome::name_pods(message, &pods)
}

/// Why a Job failed: its result's reason, else the Job's, else none at
/// all (`no_result`). The message goes into an Event and an annotation
/// or status: an installer of another version may not have masked its
/// URLs.
pub(super) fn failure_of(
    result: Option<&PodResult>,
    job_failure: Option<&str>,
    no_result: &str,
) -> (String, String) {
    let (reason, message) = match (result, job_failure) {
        (Some(r), _) if r.phase == Phase::Failed => (r.reason.to_string(), r.message.clone()),
        (_, Some(why)) => ("JobFailed".to_string(), why.to_string()),
        _ => ("NoResult".to_string(), no_result.to_string()),
    };
    let message = gpu_driver_contract::redact::text(&message).into_owned();
    (reason, message)
}

/// A failed install or detect Job: the failure on the node (counted for
/// the backoff), a Warning Event, and for an upgrading node the roll's
/// stop.
async fn mark_failed(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    done: &Finished<'_>,
    reason: &str,
    message: &str,
) -> Result<Action, Error> {
    let (name, node_name, m) = (done.job.name_any(), node.name_any(), &ctx.metrics);
    let f = facts(node);
    let attempts = decide::failures(&f, done.key) + 1;
    let wait = decide::backoff_seconds(
        attempts,
        gd.spec.job.retry_base_seconds,
        gd.spec.job.retry_max_seconds,
    );
    let event = match done.role {
        JobRole::Install => "InstallFailed",
        _ => "DetectFailed",
    };
    let note = format!("Job {name}: {reason}: {message} (attempt {attempts}, next in {wait}s)");
    ctx.event(node, EventType::Warning, event, note).await;
    let mut patch = failure_patch(done.key, attempts, reason, message, Timestamp::now());
    let upgrading =
        UpgradeState::of(&f) == UpgradeState::Installing && done.role == JobRole::Install;
    if upgrading {
        // The roll stops at this node; it stays cordoned and is retried
        // with the usual backoff.
        patch.metadata.annotations.upgrade = Change::Set(UpgradeState::Failed);
    }
    ctx.patch_node(&node_name, &patch).await?;
    if upgrading {
        let note = format!("{reason}: {message}; the roll stops here");
        ctx.event(node, EventType::Warning, "UpgradeFailed", note)
            .await;
        m.inc("gpu_driver_upgrades_total", &[("step", "failed")]);
    }
    ctx.expect().expect(Kind::JobHandled, &name, "");
    m.inc("gpu_driver_installs_total", &[("result", "failed")]);
    m.inc("gpu_driver_install_failures_total", &[("reason", reason)]);
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
    let ours = ctx.expect().holds(Kind::Cordoned, &node_name);
    let upgraded = ours
        || facts(node).annotations.contains_key(keys::UPGRADE)
        || ctx.expect().holds(Kind::UpgradeStarted, &node_name);
    let before = facts(node).annotations.get(keys::DRIVER_VERSION).cloned();
    let after = r.installed.as_ref().and_then(|i| i.driver_version.clone());
    let toolkit = match (&before, &after) {
        (Some(b), Some(a)) if b != a => super::upgrade::restart_toolkit(ctx, gd, &node_name).await,
        _ => Vec::new(),
    };
    let patch = ready_patch(gd, node, key, &name, r, now, ours);
    ctx.patch_node(&node_name, &patch).await?;
    {
        let mut expect = ctx.expect();
        expect.expect(Kind::JobHandled, &name, "");
        expect.forget(Kind::Gated, &node_name);
        expect.forget(Kind::Cordoned, &node_name);
        expect.expect(Kind::Installed, &node_name, key);
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
    if !toolkit.is_empty() {
        let note = format!(
            "driver {} → {version}: restarting the container toolkit ({}) so that its CDI specification names the new driver's files",
            before.as_deref().unwrap_or("unknown"),
            toolkit.join(", ")
        );
        ctx.event(node, EventType::Normal, "ToolkitRestarted", note)
            .await;
    }
    tracing::info!("node {node_name}: driver {version} installed");
    Ok(Action::await_change())
}
