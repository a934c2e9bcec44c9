//! The Kubernetes objects the cluster tests create: one builder per kind,
//! the tests adding what their case needs.

use serde_json::{Value, json};

/// A Node named `name` with `labels`; KWOK turns it Ready.
pub fn node(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
    })
}

/// [`node`] of a Garden Linux 1592.4 machine on kernel 6.6.63, first boot:
/// the nodeInfo the operator reads. Status at creation is kept for Nodes,
/// and KWOK's node-initialize stage keeps the nodeInfo it finds.
pub fn garden_linux_node(name: &str, labels: Value) -> Value {
    let mut n = node(name, labels);
    n["status"] = json!({"nodeInfo": {
        "kernelVersion": "6.6.63-cloud-amd64",
        "osImage": "Garden Linux 1592.4",
        "bootID": "boot-1",
    }});
    n
}

/// A GpuDriver named `name` with `spec`.
pub fn gpudriver(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "gpu-driver.gardenlinux.io/v1alpha1",
        "kind": "GpuDriver",
        "metadata": {"name": name},
        "spec": spec,
    })
}
