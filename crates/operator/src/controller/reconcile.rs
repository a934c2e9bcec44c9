//! One node's reconcile: what its plan says, carried out.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::context::{Context, Error};
use super::expect::Kind;
use super::finish::drive_job;
use super::lookup::{driver_for, facts};
use super::patch::{Change, NodeAnnotations, NodePatch, add_marks, end_upgrade, redacted};
use super::targets::ensure_target;
use super::upgrade::upgrade;
use crate::crd::GpuDriver;
use crate::decide::{
    self, Gate, JobRole, Marks, NodeFacts, NodeState, Plan, Target, TargetPhase, UpgradeState,
};
use crate::job::JobRequest;
use crate::keys;

pub(super) async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, Error> {
    let f = facts(&node);
    let Some(gd) = driver_for(&ctx.drivers.state(), &f) else {
        return Ok(Action::await_change());
    };
    match decide::plan(&gd.spec, &f, Timestamp::now().as_second()) {
        Plan::NoGpu => Ok(Action::await_change()),
        Plan::Ready { marks } => fix_ready(&ctx, &gd, &node, marks).await,
        Plan::NoBuilderImage => {
            let first = NodeState::of(&f) != Some(NodeState::NoBuilderImage);
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
            unready(&ctx, &gd, &node, first.then_some(NodeState::NoBuilderImage)).await?;
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
        } => install(&ctx, &gd, &node, &job, &image, &key).await,
    }
}

/// An installed node whose ready label or startup taint still needs a
/// fix, once per key. An upgrade left half-way because the policy went
/// back to what the node runs has nothing to install: it ends (uncordon if
/// ours) in the same patch.
async fn fix_ready(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    marks: Marks,
) -> Result<Action, Error> {
    let f = facts(node);
    let key = decide::desired_key(&gd.spec, &f);
    let stale_upgrade = f.annotations.contains_key(keys::UPGRADE);
    if (!stale_upgrade && marks.is_empty())
        || ctx.expect().holds_for(Kind::MarksFixed, &f.name, &key)
    {
        return Ok(Action::await_change());
    }
    let mut patch = NodePatch::default();
    add_marks(gd, node, marks, &mut patch);
    if stale_upgrade {
        let ours = ctx.expect().holds(Kind::Cordoned, &f.name);
        end_upgrade(&f, ours, &mut patch);
    }
    ctx.patch_node(&f.name, &patch).await?;
    ctx.expect().expect(Kind::MarksFixed, &f.name, &key);
    if stale_upgrade {
        ctx.expect().forget(Kind::Cordoned, &f.name);
        ctx.upgrade_done(&f.name);
    }
    Ok(Action::await_change())
}

/// A GPU node not installed for its key. A node without a verified driver
/// for this boot (new, rebooted, upgraded) gets label off and startup taint
/// on before the Job, so nothing new lands there until the install is
/// verified. A node waiting for its turn in a driver upgrade keeps serving
/// with its old driver, label and all: taking every node's label at once
/// would take the device plugin off the whole pool.
async fn install(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    job: &str,
    image: &str,
    key: &str,
) -> Result<Action, Error> {
    let f = facts(node);
    // Installed for this key already by a patch the cache does not show
    // yet: its watch event brings the node back.
    if ctx.expect().holds_for(Kind::Installed, &f.name, key) {
        return Ok(Action::await_change());
    }
    let upgrading = decide::needs_upgrade(&f, key);
    if !upgrading || UpgradeState::of(&f) != UpgradeState::Idle {
        unready(ctx, gd, node, Some(NodeState::Pending)).await?;
    }
    // A running driver of an older policy: cordon and drain first, a few
    // nodes at a time.
    if upgrading && let Some(action) = upgrade(ctx, gd, node, key).await? {
        return Ok(action);
    }
    let ns = ctx.opts.namespace.clone();
    let mut req = JobRequest::node_job(JobRole::Install, job, &ns, &f.name, image, key);
    let (expect, pinned): (String, String);
    match gate(ctx, gd, &f).await? {
        (
            Gate::Go {
                expect_sha256,
                entry,
                compile,
            },
            _,
        ) => {
            expect = expect_sha256.unwrap_or_default();
            pinned = entry.unwrap_or_default();
            req.expect_sha256 = Some(expect.as_str()).filter(|e| !e.is_empty());
            req.cache_entry = Some(pinned.as_str()).filter(|e| !e.is_empty());
            let failures = decide::failures(&f, key);
            let cached = req.expect_sha256.is_some();
            (req.image, req.compile) =
                decide::install_image(&gd.spec, image, cached, compile, failures);
        }
        (Gate::Wait, _) => return Ok(Action::requeue(Duration::from_secs(60))),
        (Gate::Refuse { reason, message }, retry) => {
            refuse(ctx, node, key, &reason, &message).await?;
            return Ok(Action::requeue(Duration::from_secs(retry.clamp(5, 600))));
        }
    }
    drive_job(ctx, gd, node, &req).await
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
    if ctx.expect().holds_for(Kind::Gated, &name, key) {
        return Ok(());
    }
    let current = node.annotations().get(keys::STATE);
    if current.and_then(|s| NodeState::parse(s)) != Some(NodeState::BuildFailed) {
        ctx.event(
            node,
            EventType::Warning,
            "BuildFailed",
            format!("{reason}: {message}"),
        )
        .await;
        let patch = NodePatch::annotations(NodeAnnotations {
            state: Change::Set(NodeState::BuildFailed),
            failure_reason: Change::Set(reason.to_string()),
            failure_message: Change::Set(redacted(message)),
            ..Default::default()
        });
        ctx.patch_node(&name, &patch).await?;
    }
    ctx.expect().expect(Kind::Gated, &name, key);
    Ok(())
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
    state: Option<NodeState>,
) -> Result<(), Error> {
    let f = facts(node);
    let key = decide::desired_key(&gd.spec, &f);
    let marks = decide::marks(&gd.spec, &f, false);
    let marks_due = !marks.is_empty() && !ctx.expect().holds_for(Kind::Unreadied, &f.name, &key);
    let current = NodeState::of(&f);
    let state_alone = state.filter(|s| *s != NodeState::Pending && current != Some(*s));
    if !marks_due && state_alone.is_none() {
        return Ok(());
    }
    let mut patch = NodePatch::default();
    if marks_due {
        add_marks(gd, node, marks, &mut patch);
    }
    if let Some(s) = state {
        patch.metadata.annotations.state = Change::Set(s);
    }
    ctx.patch_node(&f.name, &patch).await?;
    if marks_due {
        ctx.expect().expect(Kind::Unreadied, &f.name, &key);
    }
    Ok(())
}
