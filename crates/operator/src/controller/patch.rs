//! The node and status patches the controller sends.

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::facts;
use crate::crd::GpuDriver;
use crate::decide::{self, Marks, NodeFacts, NodeState};
use crate::keys;
use crate::outcome::PodResult;
use gpu_driver_contract::text::truncate;

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
                keys::STATE: NodeState::Installed.as_str(),
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
pub(super) fn end_upgrade(f: &NodeFacts, cordoned_by_us: bool, patch: &mut Value) {
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
pub(super) fn add_marks(gd: &GpuDriver, node: &Node, marks: Marks, patch: &mut Value) {
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
                keys::STATE: NodeState::Failed.as_str(),
                keys::FAILURE_KEY: key,
                keys::FAILURES: failures.to_string(),
                keys::FAILED_AT: now.to_string(),
                keys::FAILURE_REASON: reason,
                keys::FAILURE_MESSAGE: truncate(&gpu_driver_contract::redact::text(message), 1024),
            }
        }
    })
}

/// The merge patch that makes the status `st`: a field the new status
/// leaves out (an upgrade that ended, targets no longer wanted) is null,
/// else the merge would keep the old value.
pub(super) fn status_patch(
    st: &crate::crd::GpuDriverStatus,
    previous: Option<&crate::crd::GpuDriverStatus>,
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
