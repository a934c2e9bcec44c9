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

/// How the ready label and the startup taint follow the plan.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::{gl_node, installed, ready_node, spec};
    use crate::decide::marks::verified_driver_loaded;

    const UNREADY: Marks = Marks {
        ready_label: Some(false),
        startup_taint: Some(true),
    };

    #[test]
    fn a_new_boot_kernel_or_os_image_puts_the_taint_back_and_the_label_off() {
        let (s, n) = ready_node();
        assert!(verified_driver_loaded(&n));
        assert_eq!(marks(&s, &n, true), Marks::default());
        type Change = fn(&mut NodeFacts);
        let changes: [(&str, Change); 3] = [
            ("reboot", |n| n.boot_id = "boot-2".into()),
            ("kernel", |n| n.kernel = "6.6.72-cloud-amd64".into()),
            ("OS image", |n| n.os_image = "Garden Linux 1592.5".into()),
        ];
        for (what, change) in changes {
            let mut m = n.clone();
            change(&mut m);
            assert!(!verified_driver_loaded(&m), "{what}");
            assert!(matches!(plan(&s, &m, 0), Plan::Install { .. }), "{what}");
            assert_eq!(marks(&s, &m, false), UNREADY, "{what}");
            // Once written, nothing more to write (no patch storm).
            m.labels.remove(keys::READY_LABEL);
            m.taints.push(s.startup_taint.clone().unwrap());
            assert_eq!(marks(&s, &m, false), Marks::default(), "{what}");
            // The reinstall for the new boot, verified: both undone.
            let key = desired_key(&s, &m);
            installed(&mut m, &key);
            assert_eq!(
                plan(&s, &m, 0),
                Plan::Ready {
                    marks: Marks {
                        ready_label: Some(true),
                        startup_taint: Some(false)
                    }
                },
                "{what}"
            );
        }
    }

    #[test]
    fn the_taint_stays_on_while_the_reinstall_fails_or_has_no_builder() {
        let (s, mut n) = ready_node();
        n.boot_id = "boot-2".into();
        let key = desired_key(&s, &n);
        // A failed reinstall for the new boot: backing off, still gone.
        n.annotations.insert(keys::STATE.into(), "Failed".into());
        n.annotations.insert(keys::FAILURE_KEY.into(), key);
        n.annotations.insert(keys::FAILURES.into(), "1".into());
        n.annotations
            .insert(keys::FAILED_AT.into(), "2026-01-01T00:00:00Z".into());
        assert!(matches!(plan(&s, &n, 0), Plan::Backoff { .. }));
        assert_eq!(marks(&s, &n, false), UNREADY);
        // An upgrade to an OS nobody builds for.
        let (mut s, mut n) = ready_node();
        s.builder_images
            .retain(|b| b.garden_linux_version.is_some());
        n.os_image = "Garden Linux 2000.0".into();
        assert_eq!(plan(&s, &n, 0), Plan::NoBuilderImage);
        assert_eq!(marks(&s, &n, false), UNREADY);
    }

    #[test]
    fn nodes_never_installed_get_the_taint_until_their_first_install() {
        let s = spec();
        let mut n = gl_node("Garden Linux 1592.4", "6.6.71-cloud-amd64");
        assert!(!verified_driver_loaded(&n));
        // A node pool that cannot keep a taint off once removed (Gardener's
        // machine-controller-manager puts its pool taints back) cannot give
        // it: the operator does, as soon as it knows the node has a GPU.
        assert_eq!(
            marks(&s, &n, false),
            Marks {
                ready_label: None,
                startup_taint: Some(true)
            }
        );
        // Given by the pool already: nothing to write.
        n.taints.push(s.startup_taint.clone().unwrap());
        assert_eq!(marks(&s, &n, false), Marks::default());
        // A failed first install leaves no label behind.
        n.labels.insert(keys::READY_LABEL.into(), "true".into());
        assert_eq!(
            marks(&s, &n, false),
            Marks {
                ready_label: Some(false),
                startup_taint: None
            }
        );
        // No GPU, or not known yet: the plan never gets to the marks.
        let mut cpu = gl_node("Garden Linux 1592.4", "6.6.71-cloud-amd64");
        cpu.labels.clear();
        assert_eq!(plan(&s, &cpu, 0), Plan::NoGpu);
    }

    #[test]
    fn a_new_driver_policy_alone_takes_the_label_not_the_node() {
        // The old driver is still loaded and serving until the new one
        // replaces it: only the label goes.
        let (mut s, n) = ready_node();
        s.driver.version = Some("580.95.05".into());
        assert!(matches!(plan(&s, &n, 0), Plan::Install { .. }));
        assert_eq!(
            marks(&s, &n, false),
            Marks {
                ready_label: Some(false),
                startup_taint: None
            }
        );
    }
}
