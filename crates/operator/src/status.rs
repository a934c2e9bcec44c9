//! The GpuDriver's status, computed from the caches (no API reads) and
//! written only when it changed: counts, a per-node summary, conditions.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::crd::{GpuDriverSpec, GpuDriverStatus, NodePhase, NodeSummary, UpgradeStatus};
use crate::decide::{self, NodeFacts, NodeState, Plan};
use crate::keys;

/// At most this many nodes are listed in `status.nodes`.
pub const MAX_LISTED_NODES: usize = 200;

/// One node's phase, for the status and the metrics.
pub fn node_phase(
    spec: &GpuDriverSpec,
    node: &NodeFacts,
    job_running: impl Fn(&str) -> bool,
    now_unix: i64,
) -> NodePhase {
    let failed = NodeState::of(node) == Some(NodeState::Failed);
    match decide::plan(spec, node, now_unix) {
        Plan::NoGpu => NodePhase::NoGpu,
        Plan::Ready { .. } => NodePhase::Ready,
        Plan::Detect { job } if job_running(&job) => NodePhase::Detecting,
        Plan::Detect { .. } => NodePhase::Pending,
        Plan::Install { job, .. } if job_running(&job) => NodePhase::Installing,
        Plan::Install { .. } if failed => NodePhase::Failed,
        Plan::Install { .. } => NodePhase::Pending,
        Plan::Backoff { .. } => NodePhase::Failed,
        Plan::NoBuilderImage => NodePhase::NoBuilderImage,
    }
}

pub fn compute(
    spec: &GpuDriverSpec,
    generation: Option<i64>,
    nodes: &[NodeFacts],
    job_running: impl Fn(&str) -> bool,
    previous: Option<&GpuDriverStatus>,
    now: k8s_openapi::jiff::Timestamp,
) -> GpuDriverStatus {
    let mut st = GpuDriverStatus {
        observed_generation: generation,
        ..Default::default()
    };
    let mut listed: Vec<(u8, NodeSummary)> = Vec::new();
    for n in nodes {
        st.selected_nodes += 1;
        let phase = node_phase(spec, n, &job_running, now.as_second());
        *st.phases.entry(phase.to_string()).or_default() += 1;
        match phase {
            NodePhase::NoGpu => continue,
            NodePhase::Ready => st.ready_nodes += 1,
            NodePhase::Installing | NodePhase::Detecting => st.installing_nodes += 1,
            NodePhase::Failed => st.failed_nodes += 1,
            _ => {}
        }
        st.gpu_nodes += 1;
        let order = match phase {
            NodePhase::Failed | NodePhase::NoBuilderImage => 0,
            NodePhase::Ready => 2,
            _ => 1,
        };
        listed.push((order, summary(spec, n, phase)));
    }
    listed.sort_by(|a, b| (a.0, &a.1.name).cmp(&(b.0, &b.1.name)));
    st.nodes_truncated = listed.len() > MAX_LISTED_NODES;
    st.nodes = listed
        .into_iter()
        .take(MAX_LISTED_NODES)
        .map(|(_, s)| s)
        .collect();
    st.conditions = conditions(&st, generation, previous, now);
    st
}

/// One GPU node's line in `status.nodes`.
fn summary(spec: &GpuDriverSpec, n: &NodeFacts, phase: NodePhase) -> NodeSummary {
    let a = |k: &str| n.annotations.get(k).cloned();
    NodeSummary {
        name: n.name.clone(),
        phase,
        kernel: Some(n.kernel.clone()).filter(|k| !k.is_empty()),
        driver_version: (phase == NodePhase::Ready)
            .then(|| a(keys::DRIVER_VERSION))
            .flatten(),
        message: (phase == NodePhase::Failed)
            .then(|| {
                a(keys::FAILURE_REASON)
                    .map(|r| format!("{r}: {}", a(keys::FAILURE_MESSAGE).unwrap_or_default()))
            })
            .flatten(),
        upgrade: upgrade_state(spec, n),
    }
}

/// The Ready and Degraded conditions for the counts in `st`.
fn conditions(
    st: &GpuDriverStatus,
    generation: Option<i64>,
    previous: Option<&GpuDriverStatus>,
    now: k8s_openapi::jiff::Timestamp,
) -> Vec<Condition> {
    let all_ready = st.ready_nodes == st.gpu_nodes;
    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        // Keep the transition time while the status stays the same, so
        // that an unchanged status is an unchanged object (no write).
        let since = previous
            .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
            .filter(|c| c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time: since,
        }
    };
    vec![
        cond(
            "Ready",
            all_ready,
            if all_ready {
                "AllNodesReady"
            } else {
                "NodesNotReady"
            },
            format!("{} of {} GPU nodes ready", st.ready_nodes, st.gpu_nodes),
        ),
        cond(
            "Degraded",
            st.failed_nodes > 0,
            if st.failed_nodes > 0 {
                "InstallFailed"
            } else {
                "NoFailures"
            },
            format!("{} GPU nodes failed", st.failed_nodes),
        ),
    ]
}

/// The node's place in a driver upgrade: `None` when it has none (not
/// started and not needed).
fn upgrade_state(spec: &GpuDriverSpec, n: &NodeFacts) -> Option<decide::UpgradeState> {
    let st = decide::UpgradeState::of(n);
    (st.in_progress() || decide::needs_upgrade(n, &decide::desired_key(spec, n))).then_some(st)
}

/// The roll over the GpuDriver's nodes; `None` when no node needs or
/// undergoes an upgrade.
pub fn upgrade(spec: &GpuDriverSpec, nodes: &[NodeFacts]) -> Option<UpgradeStatus> {
    let gpu_nodes = nodes
        .iter()
        .filter(|n| decide::gpu_presence(spec, n) == decide::Gpu::Yes)
        .count() as u32;
    let mut st = UpgradeStatus {
        max_unavailable: decide::max_unavailable(&spec.upgrade_policy.max_unavailable, gpu_nodes),
        ..Default::default()
    };
    for n in nodes {
        let Some(u) = upgrade_state(spec, n) else {
            continue;
        };
        st.pending_nodes += 1;
        if u.in_progress() {
            st.in_progress.push(n.name.clone());
        }
        if u == decide::UpgradeState::Failed && st.stopped_at.is_none() {
            st.stopped_at = Some(n.name.clone());
            st.message = n.annotations.get(keys::FAILURE_REASON).map(|r| {
                format!(
                    "{r}: {}",
                    n.annotations
                        .get(keys::FAILURE_MESSAGE)
                        .cloned()
                        .unwrap_or_default()
                )
            });
        }
    }
    st.in_progress.sort();
    (st.pending_nodes > 0).then_some(st)
}

/// Counts by phase over all GpuDrivers, for the nodes gauge.
pub fn merge_phases(into: &mut BTreeMap<String, u32>, from: &BTreeMap<String, u32>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> GpuDriverSpec {
        serde_json::from_value(serde_json::json!({
            "builderImages": [{"image": "b"}],
            "installerImage": "i"
        }))
        .unwrap()
    }

    fn node(name: &str, gpu: bool) -> NodeFacts {
        let mut n = NodeFacts {
            name: name.into(),
            kernel: "6.6.63-cloud-amd64".into(),
            os_image: "Garden Linux 1592.4".into(),
            boot_id: format!("boot-{name}"),
            ..Default::default()
        };
        if gpu {
            n.labels
                .insert(keys::NFD_NVIDIA_LABEL.into(), "true".into());
        }
        n
    }

    #[test]
    fn counts_phases_and_lists_failures_first() {
        let s = spec();
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut ready = node("a-ready", true);
        ready
            .annotations
            .insert(keys::KEY.into(), decide::desired_key(&s, &ready));
        ready
            .annotations
            .insert(keys::STATE.into(), "Installed".into());
        let mut failed = node("z-failed", true);
        let key = decide::desired_key(&s, &failed);
        failed.annotations.extend([
            (keys::STATE.to_string(), "Failed".to_string()),
            (keys::FAILURE_KEY.to_string(), key),
            (keys::FAILURES.to_string(), "1".to_string()),
            (keys::FAILED_AT.to_string(), now.to_string()),
            (keys::FAILURE_REASON.to_string(), "BuildFailed".to_string()),
        ]);
        let nodes = vec![
            ready,
            failed,
            node("b-installing", true),
            node("c-cpu", false),
        ];
        let running = |j: &str| j.contains("b-installing");
        let st = compute(&s, Some(3), &nodes, running, None, now);
        assert_eq!(st.selected_nodes, 4);
        assert_eq!(st.gpu_nodes, 3);
        assert_eq!(st.ready_nodes, 1);
        assert_eq!(st.installing_nodes, 1);
        assert_eq!(st.failed_nodes, 1);
        assert_eq!(st.phases["NoGpu"], 1);
        assert_eq!(st.nodes[0].name, "z-failed");
        assert!(
            st.nodes[0]
                .message
                .as_deref()
                .unwrap()
                .starts_with("BuildFailed")
        );
        assert_eq!(st.observed_generation, Some(3));
        assert_eq!(st.conditions[0].status, "False");
        // Recomputing later with nothing changed gives the same object.
        let later = now + k8s_openapi::jiff::SignedDuration::from_secs(1);
        let again = compute(&s, Some(3), &nodes, running, Some(&st), later);
        assert_eq!(again, st);
    }
}
