//! The node and status merge patches the controller sends, as typed
//! structs: a field left at [`Change::Keep`] is not sent, one at
//! [`Change::Remove`] is sent as null (a merge patch's removal).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::{Serialize, Serializer};

use super::lookup::facts;
use crate::crd::{GpuDriver, GpuDriverStatus};
use crate::decide::{self, Marks, NodeFacts, NodeState, UpgradeState};
use crate::outcome::PodResult;
use gpu_driver_contract::text::truncate;

/// One field of a merge patch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Change<T> {
    /// Not in the patch: the node's value stays.
    #[default]
    Keep,
    Set(T),
    /// Sent as null: the key goes.
    Remove,
}

impl<T> Change<T> {
    pub fn is_keep(&self) -> bool {
        matches!(self, Change::Keep)
    }
}

impl<T: Serialize> Serialize for Change<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Change::Set(v) => v.serialize(s),
            // Keep is skipped by its field's `skip_serializing_if`.
            Change::Keep | Change::Remove => s.serialize_none(),
        }
    }
}

/// A merge patch of a Node.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NodePatch {
    pub metadata: NodeMetaPatch,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<NodeSpecPatch>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMetaPatch {
    #[serde(skip_serializing_if = "NodeLabels::is_empty")]
    pub labels: NodeLabels,
    #[serde(skip_serializing_if = "NodeAnnotations::is_empty")]
    pub annotations: NodeAnnotations,
    /// Pins the patch to the node it was computed from: a merge patch
    /// replaces the taint list whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

/// The node labels the operator writes (names as in [`crate::keys`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NodeLabels {
    #[serde(
        rename = "gpu-driver.gardenlinux.io/ready",
        skip_serializing_if = "Change::is_keep"
    )]
    pub ready: Change<String>,
    /// The GPU Operator's deploy labels an upgrade pauses and restores
    /// (`nvidia.com/gpu.deploy.<operand>`): a value sets, `None` removes.
    #[serde(flatten)]
    pub operands: BTreeMap<String, Option<String>>,
}

impl NodeLabels {
    fn is_empty(&self) -> bool {
        self == &NodeLabels::default()
    }
}

/// The node annotations the operator writes (names as in [`crate::keys`];
/// a unit test holds them to it).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NodeAnnotations {
    #[serde(
        rename = "gpu-driver.gardenlinux.io/state",
        skip_serializing_if = "Change::is_keep"
    )]
    pub state: Change<NodeState>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/key",
        skip_serializing_if = "Change::is_keep"
    )]
    pub key: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/driver-version",
        skip_serializing_if = "Change::is_keep"
    )]
    pub driver_version: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/flavor",
        skip_serializing_if = "Change::is_keep"
    )]
    pub flavor: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/kernel",
        skip_serializing_if = "Change::is_keep"
    )]
    pub kernel: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/boot-id",
        skip_serializing_if = "Change::is_keep"
    )]
    pub boot_id: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/os-image",
        skip_serializing_if = "Change::is_keep"
    )]
    pub os_image: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/installed-at",
        skip_serializing_if = "Change::is_keep"
    )]
    pub installed_at: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/job",
        skip_serializing_if = "Change::is_keep"
    )]
    pub job: Change<String>,
    /// The detect Job's answer: `true` or `false`.
    #[serde(
        rename = "gpu-driver.gardenlinux.io/gpu",
        skip_serializing_if = "Change::is_keep"
    )]
    pub gpu: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/failures",
        skip_serializing_if = "Change::is_keep"
    )]
    pub failures: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/failure-key",
        skip_serializing_if = "Change::is_keep"
    )]
    pub failure_key: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/failed-at",
        skip_serializing_if = "Change::is_keep"
    )]
    pub failed_at: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/failure-reason",
        skip_serializing_if = "Change::is_keep"
    )]
    pub failure_reason: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/failure-message",
        skip_serializing_if = "Change::is_keep"
    )]
    pub failure_message: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/upgrade",
        skip_serializing_if = "Change::is_keep"
    )]
    pub upgrade: Change<UpgradeState>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/upgrade-started-at",
        skip_serializing_if = "Change::is_keep"
    )]
    pub upgrade_started: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/upgrade-cordoned",
        skip_serializing_if = "Change::is_keep"
    )]
    pub upgrade_cordoned: Change<String>,
    #[serde(
        rename = "gpu-driver.gardenlinux.io/paused-operands",
        skip_serializing_if = "Change::is_keep"
    )]
    pub paused_operands: Change<String>,
}

impl NodeAnnotations {
    fn is_empty(&self) -> bool {
        self == &NodeAnnotations::default()
    }

    /// A failure for `key` (reason, message, count for the backoff).
    pub fn failed(key: &str, failures: u32, reason: &str, message: &str, now: Timestamp) -> Self {
        NodeAnnotations {
            state: Change::Set(NodeState::Failed),
            failure_key: Change::Set(key.to_string()),
            failures: Change::Set(failures.to_string()),
            failed_at: Change::Set(now.to_string()),
            failure_reason: Change::Set(reason.to_string()),
            failure_message: Change::Set(redacted(message)),
            ..Default::default()
        }
    }
}

/// A message for a node annotation: an installer of another version may
/// not have masked its URLs; at most 1024 characters.
pub(super) fn redacted(message: &str) -> String {
    truncate(&gpu_driver_contract::redact::text(message), 1024)
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NodeSpecPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<Taint>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unschedulable: Option<bool>,
}

impl NodePatch {
    /// A patch of annotations alone.
    pub fn annotations(annotations: NodeAnnotations) -> Self {
        NodePatch {
            metadata: NodeMetaPatch {
                annotations,
                ..Default::default()
            },
            spec: None,
        }
    }

    fn spec(&mut self) -> &mut NodeSpecPatch {
        self.spec.get_or_insert_with(NodeSpecPatch::default)
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
) -> NodePatch {
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
    let mut patch = NodePatch::annotations(NodeAnnotations {
        state: Change::Set(NodeState::Installed),
        key: Change::Set(key.to_string()),
        driver_version: Change::Set(driver),
        flavor: Change::Set(flavor),
        kernel: Change::Set(f.kernel.clone()),
        boot_id: Change::Set(f.boot_id.clone()),
        os_image: Change::Set(f.os_image.clone()),
        installed_at: Change::Set(now.to_string()),
        job: Change::Set(job.to_string()),
        failures: Change::Remove,
        failure_key: Change::Remove,
        failed_at: Change::Remove,
        failure_reason: Change::Remove,
        failure_message: Change::Remove,
        ..Default::default()
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
/// uncordons it, one that found it cordoned by someone else leaves it so;
/// the GPU Operator operands it paused are deployed again.
/// `cordoned_by_us`: this process sent the cordon (the cache may lag).
pub(super) fn end_upgrade(f: &NodeFacts, cordoned_by_us: bool, patch: &mut NodePatch) {
    let a = &mut patch.metadata.annotations;
    a.upgrade = Change::Remove;
    a.upgrade_started = Change::Remove;
    a.upgrade_cordoned = Change::Remove;
    if f.annotations.contains_key(crate::keys::PAUSED_OPERANDS) {
        a.paused_operands = Change::Remove;
        for operand in decide::operands_to_restore(f) {
            let label = decide::deploy_label(&operand);
            patch
                .metadata
                .labels
                .operands
                .insert(label, Some("true".into()));
        }
    }
    let annotated = f
        .annotations
        .get(crate::keys::UPGRADE_CORDONED)
        .map(String::as_str)
        == Some("true");
    if cordoned_by_us || annotated {
        patch.spec().unschedulable = Some(false);
    }
}

/// Adds the ready label's and the startup taint's changes to `patch`. The
/// label is one key of the labels map. Taints are a list, which a merge
/// patch replaces whole: the patch carries the node's resourceVersion, so
/// that a taint another controller changed meanwhile makes it fail (409)
/// rather than be overwritten, and the reconcile retries on the new node.
/// Only the configured startup taint's key is added or removed; every
/// other taint is written back as it was.
pub(super) fn add_marks(gd: &GpuDriver, node: &Node, marks: Marks, patch: &mut NodePatch) {
    if let Some(on) = marks.ready_label {
        patch.metadata.labels.ready = if on {
            Change::Set("true".into())
        } else {
            Change::Remove
        };
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
    patch.spec().taints = Some(rest);
    patch.metadata.resource_version = node.resource_version();
}

/// The patch after a failed install Job: the failure on the node (reason,
/// message, count for the backoff), never the ready label.
pub(crate) fn failure_patch(
    key: &str,
    failures: u32,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> NodePatch {
    let mut patch =
        NodePatch::annotations(NodeAnnotations::failed(key, failures, reason, message, now));
    patch.metadata.labels.ready = Change::Remove;
    patch
}

/// The merge patch that makes the status `st`.
#[derive(Debug, Serialize)]
pub(super) struct StatusPatch<'a> {
    status: StatusBody<'a>,
}

#[derive(Debug, Serialize)]
struct StatusBody<'a> {
    #[serde(flatten)]
    status: &'a GpuDriverStatus,
    /// Fields the previous status had and `status` leaves out (an upgrade
    /// that ended, targets no longer wanted): null, else the merge would
    /// keep the old value.
    #[serde(flatten)]
    removed: BTreeMap<String, ()>,
}

pub(super) fn status_patch<'a>(
    st: &'a GpuDriverStatus,
    previous: Option<&GpuDriverStatus>,
) -> StatusPatch<'a> {
    let fields = |s: &GpuDriverStatus| match serde_json::to_value(s) {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    };
    let now = fields(st);
    let removed = previous
        .map(fields)
        .unwrap_or_default()
        .into_iter()
        .filter(|k| !now.contains(k))
        .map(|k| (k, ()))
        .collect();
    StatusPatch {
        status: StatusBody {
            status: st,
            removed,
        },
    }
}

#[cfg(test)]
mod tests;
