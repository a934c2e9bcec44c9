//! Rolling driver upgrades: which node needs one, its state, how many at
//! once, and when a drain is over.

use std::collections::BTreeMap;

use super::marks::verified_driver_loaded;
use super::node::NodeFacts;
pub use crate::crd::UpgradeState;
use crate::keys;

/// Does this node run a verified driver of an older policy (version or
/// flavor)? Then it is upgraded in the roll (cordon, drain, install). A
/// reboot, kernel or OS change has no loaded driver to protect: it
/// reinstalls at once, as always.
pub(crate) fn needs_upgrade(node: &NodeFacts, key: &str) -> bool {
    node.annotation(keys::KEY).is_some_and(|k| k != key) && verified_driver_loaded(node)
}

impl UpgradeState {
    pub fn of(node: &NodeFacts) -> UpgradeState {
        UpgradeState::in_annotations(&node.annotations)
    }

    /// [`UpgradeState::of`] from a node's annotations as they are.
    pub fn in_annotations(annotations: &BTreeMap<String, String>) -> UpgradeState {
        annotations
            .get(keys::UPGRADE)
            .and_then(|v| UpgradeState::parse(v))
            .unwrap_or(UpgradeState::Idle)
    }

    /// Cordoned and counted against maxUnavailable.
    pub fn in_progress(self) -> bool {
        self != UpgradeState::Idle
    }
}

/// `maxUnavailable` as a node count: a number, or a percentage of
/// `gpu_nodes` rounded down; at least 1, so that a roll always moves.
pub fn max_unavailable(
    v: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
    gpu_nodes: u32,
) -> u32 {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let n = match v {
        IntOrString::Int(i) => (*i).max(0) as u32,
        IntOrString::String(s) => match s.trim().strip_suffix('%') {
            Some(p) => p
                .trim()
                .parse::<u64>()
                .map_or(0, |p| (u64::from(gpu_nodes) * p.min(100) / 100) as u32),
            None => s.trim().parse().unwrap_or(0),
        },
    };
    n.max(1)
}

/// Is `resource` one of NVIDIA's device plugin resources (a whole GPU or
/// a MIG slice)? Pods that request one use the driver.
pub(crate) fn is_gpu_resource(resource: &str) -> bool {
    resource.starts_with("nvidia.com/")
}

/// What an upgrading node does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainStep {
    /// No GPU pod left: install.
    Install,
    /// Evict (or wait for) the GPU pods and look again.
    Drain,
    /// The drain has taken longer than `drainTimeoutSeconds`.
    TimedOut,
}

pub(crate) fn drain_step(
    policy: &crate::crd::UpgradePolicy,
    gpu_pods: usize,
    started_unix: Option<i64>,
    now_unix: i64,
) -> DrainStep {
    if gpu_pods == 0 {
        return DrainStep::Install;
    }
    let limit = policy.drain_timeout_seconds;
    match started_unix {
        Some(t) if limit > 0 && now_unix.saturating_sub(t) >= limit as i64 => DrainStep::TimedOut,
        _ => DrainStep::Drain,
    }
}

/// When the node's drain started (its annotation).
pub(crate) fn upgrade_started(node: &NodeFacts) -> Option<i64> {
    node.annotation(keys::UPGRADE_STARTED)
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| t.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::{gl_node, ready_node};
    use crate::decide::naming::desired_key;

    #[test]
    fn only_a_policy_change_on_a_loaded_driver_is_an_upgrade() {
        let (s, mut n) = ready_node();
        let key = desired_key(&s, &n);
        assert!(!needs_upgrade(&n, &key), "installed for its key");
        let mut s2 = s.clone();
        s2.driver.version = Some("580.95.05".into());
        assert!(needs_upgrade(&n, &desired_key(&s2, &n)));
        // A reboot: the driver is gone, nothing to drain.
        n.boot_id = "boot-2".into();
        assert!(!needs_upgrade(&n, &desired_key(&s2, &n)));
        // Never installed: a first install.
        let fresh = gl_node("Garden Linux 1592.4", "6.6.63-cloud-amd64");
        assert!(!needs_upgrade(&fresh, &desired_key(&s2, &fresh)));
    }

    #[test]
    fn max_unavailable_counts_and_percentages() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString as I;
        assert_eq!(max_unavailable(&I::Int(3), 100), 3);
        assert_eq!(max_unavailable(&I::Int(0), 100), 1);
        assert_eq!(max_unavailable(&I::String("10%".into()), 100), 10);
        assert_eq!(max_unavailable(&I::String("10%".into()), 19), 1);
        assert_eq!(max_unavailable(&I::String("10%".into()), 5), 1);
        assert_eq!(max_unavailable(&I::String("150%".into()), 8), 8);
        assert_eq!(max_unavailable(&I::String("x".into()), 8), 1);
        assert_eq!(max_unavailable(&I::String("4".into()), 8), 4);
    }

    #[test]
    fn drains_end_by_emptiness_or_timeout() {
        let mut p = crate::crd::UpgradePolicy {
            drain_timeout_seconds: 600,
            ..Default::default()
        };
        assert_eq!(drain_step(&p, 0, Some(0), 10_000), DrainStep::Install);
        assert_eq!(drain_step(&p, 2, Some(1000), 1599), DrainStep::Drain);
        assert_eq!(drain_step(&p, 2, Some(1000), 1600), DrainStep::TimedOut);
        assert_eq!(drain_step(&p, 2, None, 1_000_000), DrainStep::Drain);
        p.drain_timeout_seconds = 0;
        assert_eq!(drain_step(&p, 2, Some(0), 1_000_000), DrainStep::Drain);
        assert!(is_gpu_resource("nvidia.com/gpu"));
        assert!(is_gpu_resource("nvidia.com/mig-1g.10gb"));
        assert!(!is_gpu_resource("cpu"));
    }
}
