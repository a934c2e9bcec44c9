//! What the reflector caches keep of each object: only what the reconciles
//! read. At 5000 nodes the caches hold 5000 Nodes, install Jobs and their
//! pods; kept whole (parsed, with `managedFields`) they were most of the
//! operator's 798 MiB peak. Writes never start from a cached object (they
//! are patches), so nothing dropped here can be written back by mistake.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod};
use kube::{Resource, ResourceExt};

/// `metadata.managedFields` of any kind: nothing here reads it, and it is
/// about 40 % of a simulated Node's, Job's or pod's JSON.
pub(super) fn metadata<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
}

/// A Node keeps its metadata, its spec (taints, `unschedulable`: patches
/// write the other taints back as they were) and `status.nodeInfo`
/// (kernel, OS image, boot ID, architecture). Gone: images, conditions,
/// capacity, addresses, volumes; a real node's image list alone is often
/// several KB.
pub(super) fn node(node: &mut Node) {
    metadata(node);
    if let Some(st) = node.status.as_mut() {
        *st = NodeStatus {
            node_info: st.node_info.take(),
            ..NodeStatus::default()
        };
    }
}

/// A Job keeps its metadata (labels and annotations: role, node, key,
/// target) and status (conditions, counts, times). Its spec, the whole pod
/// template this operator wrote, is never read back.
pub(super) fn job(job: &mut Job) {
    metadata(job);
    job.spec = None;
}

/// A Job's pod keeps its metadata and status (phase, the containers'
/// termination messages: the installer's result). Its spec is never read
/// from the cache (a drain lists the node's pods from the API).
pub(super) fn pod(pod: &mut Pod) {
    metadata(pod);
    pod.spec = None;
}
