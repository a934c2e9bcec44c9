//! Names that stand for what they name: the desired-state key (a hash of
//! what a node should have), Job roles and deterministic Job names.

use sha2::{Digest, Sha256};

use super::node::NodeFacts;
use crate::crd::GpuDriverSpec;

pub(super) fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    hex::encode(h.finalize())[..12].to_string()
}

/// What the node should have, as one key: the kernel, OS image and boot
/// (a reboot unloads the modules), the driver policy and flavor. The key
/// is stored on the node when installed; any change means reinstall.
pub fn desired_key(spec: &GpuDriverSpec, node: &NodeFacts) -> String {
    let mut parts = vec![
        node.kernel.as_str(),
        &node.os_image,
        &node.boot_id,
        spec.driver.version.as_deref().unwrap_or("auto"),
        spec.driver.flavor.as_str(),
    ];
    // Another catalog may pick another default: a new key, a reinstall.
    // Without one, keys stay what they were.
    parts.extend(spec.driver.catalog_config_map.as_deref());
    short_hash(&parts)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobRole {
    Install,
    Detect,
    /// Compiles for a target and stores the artifact; no host access.
    Build,
}

impl JobRole {
    pub fn as_str(self) -> &'static str {
        match self {
            JobRole::Install => "install",
            JobRole::Detect => "detect",
            JobRole::Build => "build",
        }
    }
}

/// Deterministic Job name: a crashed or restarted operator finds the Job
/// it already made (a create answers AlreadyExists) instead of making
/// another. A new attempt after a failure, a new kernel or a new boot is
/// another name. At most 63 characters (the job-name label's limit).
pub(crate) fn job_name(role: JobRole, node: &str, key: &str, attempt: u32) -> String {
    let h = short_hash(&[node, key, &attempt.to_string()]);
    // The node name's start makes `kubectl get jobs` readable; the hash
    // makes it unique.
    let mut prefix: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(30)
        .collect();
    while prefix.ends_with('-') {
        prefix.pop();
    }
    format!("gpu-{}-{prefix}-{h}", role.as_str())
}
