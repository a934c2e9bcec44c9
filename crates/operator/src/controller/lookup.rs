//! What the reconcilers read off cached objects: a node's facts, the
//! GpuDriver that selects it, whether a Job is done.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::crd::GpuDriver;
use crate::decide::{self, NodeFacts};

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
    driver_for_labels(drivers, &node.labels).cloned()
}

/// [`driver_for`] from a node's labels as they are: no copy of them, no
/// allocation (what a scan over every cached node calls).
pub(super) fn driver_for_labels<'a>(
    drivers: &'a [Arc<GpuDriver>],
    labels: &BTreeMap<String, String>,
) -> Option<&'a Arc<GpuDriver>> {
    drivers
        .iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .filter(|d| decide::selects(&d.spec.node_selector, labels))
        .min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
}

pub(super) fn job_is_terminal(job: &Job) -> bool {
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
