//! Build targets: one build Job per (OS, kernel, arch, driver policy)
//! cluster-wide, and the records `status.targets` shows.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::context::{Context, Error};
use super::expect::Kind;
use super::finish::{create_job, failure_of};
use crate::crd::{BuildPhase, GpuDriver, TargetStatus};
use crate::decide::{self, JobRole, NodeFacts, Target, TargetPhase};
use crate::job::{self, JobRequest};
use crate::outcome::{self, PodResult};
use gpu_driver_contract::report::Phase;
use gpu_driver_contract::text::truncate;

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
                phase: BuildPhase::Pending,
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
pub(super) async fn ensure_target(
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
    let state = outcome::job_state(&job, &pod_refs, now.as_second());
    let Some((result, failure)) = state.finished() else {
        if rec.phase != BuildPhase::Building {
            rec.phase = BuildPhase::Building;
            rec.job = Some(name);
            ctx.save_target(gd, rec);
        }
        return Ok(TargetPhase::Building);
    };
    Ok(build_finished(ctx, gd, target, &name, rec, result, failure).await)
}

/// A target that needs no look at Jobs: cached, or failed and still
/// backing off.
fn settled(gd: &GpuDriver, rec: &TargetStatus, now_unix: i64) -> Option<TargetPhase> {
    if rec.phase == BuildPhase::Cached {
        return rec.artifact_sha256.as_ref().map(|sha| TargetPhase::Cached {
            sha256: sha.clone(),
            entry: rec.cache_entry.clone(),
        });
    }
    if rec.phase != BuildPhase::Failed {
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
    if !ctx.expect().holds(Kind::JobCreated, name) {
        let cap = gd.spec.build.max_parallel as usize;
        if cap > 0 && ctx.active_builds() >= cap {
            // Waits for a slot: the status interval looks again.
            let message = format!("waiting: build.maxParallel ({cap}) build Jobs are running");
            if rec.phase != BuildPhase::Pending || rec.message.as_ref() != Some(&message) {
                rec.phase = BuildPhase::Pending;
                rec.message = Some(message);
                ctx.save_target(gd, rec);
            }
            return Ok(TargetPhase::Pending);
        }
        let Some(image) = decide::builder_image(&gd.spec.builder_images, &target.facts()) else {
            let message = format!(
                "no builder image matches OS {:?}, kernel {}",
                target.os_image, target.kernel
            );
            rec.phase = BuildPhase::Failed;
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
    rec.phase = BuildPhase::Building;
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
    let first = |ctx: &Context| ctx.expect().expect(Kind::JobHandled, name, "");
    if failure.is_none()
        && let Some(r) = result.as_ref().filter(|r| r.phase == Phase::Succeeded)
        && let Some(b) = &r.built
    {
        let sha = b.artifact_sha256.clone();
        rec.phase = BuildPhase::Cached;
        rec.artifact_sha256 = Some(sha.clone());
        rec.cache_entry = b.cache_key.clone();
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
        return TargetPhase::Cached {
            sha256: sha,
            entry: b.cache_key.clone(),
        };
    }
    let (reason, message) = failure_of(
        result.as_ref(),
        failure.as_deref(),
        "the build Job's pod ended without a stored artifact in its result",
    );
    rec.phase = BuildPhase::Failed;
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

/// A GpuDriver's reconcile: ensures the build of every target it wants
/// (its prebuild list and its GPU nodes' targets), creating build Jobs when
/// due, and forgets the targets nobody wants any more (an old driver
/// policy, a kernel no node runs). Looked at again every status interval,
/// as a failed build's backoff runs out without any watch event.
pub(super) async fn reconcile_targets(
    gd: Arc<GpuDriver>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let again = Action::requeue(ctx.opts.status_interval);
    if !decide::builds_enabled(&gd.spec) {
        return Ok(again);
    }
    let wanted = wanted_targets(&gd, &ctx.selected_nodes(&gd));
    let mut keys = HashSet::new();
    for t in wanted.keys() {
        if let Err(e) = ensure_target(&ctx, &gd, t).await {
            tracing::warn!("target {} {}: {e}", t.os_image, t.kernel);
        }
        keys.insert(decide::target_key(&gd.spec, t));
    }
    let owner = gd.name_any();
    let idle = idle_kept(&ctx, &gd, &keys);
    let mut map = ctx.targets.lock().unwrap_or_else(|e| e.into_inner());
    map.retain(|(g, k), _| g != &owner || keys.contains(k) || idle.contains_key(k));
    // Kept records the status held (after a restart) come into memory, so
    // that the next status write keeps them too.
    for (key, rec) in idle {
        map.entry((owner.clone(), key)).or_insert(rec);
    }
    Ok(again)
}

/// Every target record of the GpuDriver: this process's, and the status's
/// that this process has not seen.
fn all_records(ctx: &Context, gd: &GpuDriver) -> Vec<TargetStatus> {
    let owner = gd.name_any();
    let mut out: Vec<TargetStatus> = ctx
        .targets
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|((g, _), _)| g == &owner)
        .map(|(_, r)| r.clone())
        .collect();
    let seen: HashSet<String> = out.iter().map(|r| r.key.clone()).collect();
    if let Some(st) = &gd.status {
        out.extend(
            st.targets
                .iter()
                .filter(|r| !seen.contains(&r.key))
                .cloned(),
        );
    }
    out
}

/// The cached records no wanted target has, that the GpuDriver keeps
/// ([`decide::idle_targets_kept`]), by key, each with no nodes.
fn idle_kept(
    ctx: &Context,
    gd: &GpuDriver,
    wanted: &HashSet<String>,
) -> BTreeMap<String, TargetStatus> {
    let all = all_records(ctx, gd);
    let kept = decide::idle_targets_kept(&all, wanted);
    all.into_iter()
        .filter(|r| kept.contains(&r.key))
        .map(|r| (r.key.clone(), TargetStatus { nodes: 0, ..r }))
        .collect()
}

/// `status.targets`: the record of every wanted target, as the reconciles
/// left it, with how many selected nodes run it.
pub(super) fn target_records(
    ctx: &Context,
    gd: &GpuDriver,
    nodes: &[NodeFacts],
) -> Vec<TargetStatus> {
    if !decide::builds_enabled(&gd.spec) {
        return Vec::new();
    }
    let mut out: Vec<TargetStatus> = wanted_targets(gd, nodes)
        .into_iter()
        .map(|(t, count)| {
            let key = decide::target_key(&gd.spec, &t);
            TargetStatus {
                nodes: count,
                ..ctx.target_record(gd, &key, &t)
            }
        })
        .collect();
    let wanted: HashSet<String> = out.iter().map(|r| r.key.clone()).collect();
    out.extend(idle_kept(ctx, gd, &wanted).into_values());
    out.sort_by(|a, b| {
        (&a.os_image, &a.kernel_release, &a.arch).cmp(&(&b.os_image, &b.kernel_release, &b.arch))
    });
    out
}
