//! What to do about one node: its state annotation, failures and backoff,
//! and the plan (nothing, detect, install, back off, ready).

use super::marks::{Marks, marks};
use super::naming::{JobRole, desired_key, job_name};
use super::node::{Gpu, NodeFacts, builder_image, gpu_presence};
use crate::crd::GpuDriverSpec;
use crate::keys;

str_enum! {
    /// The node's `state` annotation.
    pub enum NodeState {
        /// A verified install for the node's `key`.
        Installed = "Installed",
        /// The last Job failed; retried with backoff.
        Failed = "Failed",
        /// No builder image matches the node's OS and kernel.
        NoBuilderImage = "NoBuilderImage",
        /// A Job is due or running.
        Pending = "Pending",
        /// No build can serve the node and it may not compile for itself.
        BuildFailed = "BuildFailed",
        /// A detect Job found no NVIDIA GPU.
        NoGpu = "NoGpu",
    }
}

impl NodeState {
    /// The node's state annotation, if it holds one of ours.
    pub fn of(node: &NodeFacts) -> Option<NodeState> {
        node.annotation(keys::STATE).and_then(NodeState::parse)
    }
}

/// Installed for exactly the current kernel, boot and policy?
pub(crate) fn is_installed(node: &NodeFacts, key: &str) -> bool {
    node.annotation(keys::KEY) == Some(key) && NodeState::of(node) == Some(NodeState::Installed)
}

/// Failed Jobs for the current key (earlier keys' failures do not count).
pub(crate) fn failures(node: &NodeFacts, key: &str) -> u32 {
    if node.annotation(keys::FAILURE_KEY) != Some(key) {
        return 0;
    }
    node.annotation(keys::FAILURES)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}

/// Wait after the n-th failure: base · 2^(n-1), at most `max`.
pub(crate) fn backoff_seconds(failures: u32, base: u64, max: u64) -> u64 {
    if failures == 0 {
        return 0;
    }
    let shift = (failures - 1).min(32);
    base.saturating_mul(1u64 << shift).min(max)
}

/// Seconds still to wait before the next attempt (0: go now).
pub(crate) fn retry_in(spec: &GpuDriverSpec, node: &NodeFacts, key: &str, now_unix: i64) -> u64 {
    let n = failures(node, key);
    if n == 0 {
        return 0;
    }
    let wait = backoff_seconds(n, spec.job.retry_base_seconds, spec.job.retry_max_seconds);
    let failed_at = node
        .annotation(keys::FAILED_AT)
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_second());
    let due = failed_at.saturating_add(wait as i64);
    (due - now_unix).max(0) as u64
}

/// What to do about one node, before looking at Jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Not a GPU node (or known to have none): nothing to do.
    NoGpu,
    /// Installed for the current key; `marks` are what the ready label and
    /// the startup taint still need (empty: nothing to write).
    Ready { marks: Marks },
    /// Run (or wait for) a detect Job.
    Detect { job: String },
    /// Run (or wait for) the install Job.
    Install {
        job: String,
        image: String,
        key: String,
        attempt: u32,
    },
    /// The last attempt failed; try again in this many seconds.
    Backoff { seconds: u64 },
    /// No builder image matches the node's OS and kernel.
    NoBuilderImage,
}

pub fn plan(spec: &GpuDriverSpec, node: &NodeFacts, now_unix: i64) -> Plan {
    match gpu_presence(spec, node) {
        Gpu::No => return Plan::NoGpu,
        Gpu::Unknown => {
            return Plan::Detect {
                job: job_name(JobRole::Detect, &node.name, &node.boot_id, 0),
            };
        }
        Gpu::Yes => {}
    }
    let key = desired_key(spec, node);
    if is_installed(node, &key) {
        return Plan::Ready {
            marks: marks(spec, node, true),
        };
    }
    let Some(image) = builder_image(&spec.builder_images, node) else {
        return Plan::NoBuilderImage;
    };
    let wait = retry_in(spec, node, &key, now_unix);
    if wait > 0 {
        return Plan::Backoff { seconds: wait };
    }
    let attempt = failures(node, &key);
    Plan::Install {
        job: job_name(JobRole::Install, &node.name, &key, attempt),
        image,
        key,
        attempt,
    }
}
