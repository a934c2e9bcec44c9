//! Living beside NVIDIA's GPU Operator during a driver upgrade: its
//! operands (dcgm-exporter, GPU feature discovery, the MIG manager, …)
//! hold the driver open without requesting a GPU, so a drain of GPU pods
//! alone leaves the install at `DriverInUse`. Like NVIDIA's own driver
//! manager, the upgrade sets each operand's per-node deploy label from
//! `true` to [`PAUSED`], waits for the DaemonSet controller to take those
//! pods off the node, installs, and sets exactly those labels back.
//! Labels with any other value (a user's `false`) are never touched.

use std::collections::BTreeMap;

use super::node::NodeFacts;
use crate::keys;

/// The value NVIDIA's driver manager (k8s-driver-manager) writes to a
/// deploy label it pauses; the GPU Operator's DaemonSets select `"true"`,
/// so any other value takes the operand off the node.
pub(crate) const PAUSED: &str = "paused-for-driver-upgrade";

/// `nvidia.com/gpu.deploy.<operand>`.
pub(crate) fn deploy_label(operand: &str) -> String {
    format!("{}{operand}", keys::DEPLOY_LABEL_PREFIX)
}

/// The operands to pause on this node: those whose deploy label is
/// `"true"` now, in the order configured.
pub(crate) fn to_pause(operands: &[String], node: &NodeFacts) -> Vec<String> {
    operands
        .iter()
        .filter(|o| node.labels.get(&deploy_label(o)).map(String::as_str) == Some("true"))
        .cloned()
        .collect()
}

/// The operands this node's upgrade paused (its annotation).
pub(crate) fn paused(node: &NodeFacts) -> Vec<String> {
    node.annotation(keys::PAUSED_OPERANDS)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The operands to set back to `"true"` when the upgrade ends: those it
/// paused whose label still says [`PAUSED`]. One a user changed
/// meanwhile keeps the user's value.
pub(crate) fn to_restore(node: &NodeFacts) -> Vec<String> {
    paused(node)
        .into_iter()
        .filter(|o| node.labels.get(&deploy_label(o)).map(String::as_str) == Some(PAUSED))
        .collect()
}

/// Does a pod (by its `spec.nodeSelector`, which a DaemonSet copies into
/// each pod) run on this node only while one of `labels` holds? Then it
/// leaves when the upgrade takes them away: the DaemonSet controller
/// deletes it, and the drain waits for that instead of evicting it.
pub(crate) fn follows_labels(node_selector: &BTreeMap<String, String>, labels: &[String]) -> bool {
    labels.iter().any(|l| node_selector.contains_key(l))
}

/// The labels an upgrading node loses, whose pods must leave before its
/// install: the ready label (our exporter, NVIDIA's device plugin as
/// `docs/workloads.md` deploys it) and the paused operands' labels.
pub(crate) fn labels_taken(operands: &[String]) -> Vec<String> {
    std::iter::once(keys::READY_LABEL.to_string())
        .chain(operands.iter().map(|o| deploy_label(o)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)], paused: Option<&str>) -> NodeFacts {
        NodeFacts {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: paused
                .map(|p| (keys::PAUSED_OPERANDS.to_string(), p.to_string()))
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    fn ops(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_operands_deployed_by_true_are_paused() {
        let n = node(
            &[
                ("nvidia.com/gpu.deploy.dcgm-exporter", "true"),
                // Set by hand: left as it is.
                ("nvidia.com/gpu.deploy.gpu-feature-discovery", "false"),
                ("nvidia.com/gpu.deploy.mig-manager", "true"),
            ],
            None,
        );
        let all = ops(&[
            "dcgm-exporter",
            "gpu-feature-discovery",
            "dcgm",
            "mig-manager",
        ]);
        assert_eq!(to_pause(&all, &n), ops(&["dcgm-exporter", "mig-manager"]));
        assert!(to_pause(&[], &n).is_empty(), "an empty list pauses nothing");
    }

    #[test]
    fn restores_only_what_it_paused_and_what_still_says_so() {
        let n = node(
            &[
                ("nvidia.com/gpu.deploy.dcgm-exporter", PAUSED),
                // The user turned it off meanwhile: theirs stays.
                ("nvidia.com/gpu.deploy.mig-manager", "false"),
                // Paused by someone else (not in our annotation).
                ("nvidia.com/gpu.deploy.dcgm", PAUSED),
            ],
            Some("dcgm-exporter, mig-manager"),
        );
        assert_eq!(paused(&n), ops(&["dcgm-exporter", "mig-manager"]));
        assert_eq!(to_restore(&n), ops(&["dcgm-exporter"]));
        assert!(to_restore(&node(&[], None)).is_empty());
    }

    #[test]
    fn pods_follow_the_labels_their_node_selector_names() {
        let taken = labels_taken(&ops(&["dcgm-exporter"]));
        assert_eq!(
            taken,
            ops(&[keys::READY_LABEL, "nvidia.com/gpu.deploy.dcgm-exporter"])
        );
        let sel = |k: &str| BTreeMap::from([(k.to_string(), "true".to_string())]);
        assert!(follows_labels(
            &sel("nvidia.com/gpu.deploy.dcgm-exporter"),
            &taken
        ));
        assert!(follows_labels(&sel(keys::READY_LABEL), &taken));
        assert!(!follows_labels(&sel("nvidia.com/gpu.deploy.dcgm"), &taken));
        assert!(!follows_labels(&BTreeMap::new(), &taken));
    }
}
