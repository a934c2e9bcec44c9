//! Pure decisions, no API calls: what a node is (OS, kernel, GPU), what it
//! should have, whether that is already there, which builder image, which
//! Job name, how long to back off. The controller only feeds these the
//! objects from its caches and carries out the answer.

mod marks;
mod naming;
mod node;
mod operands;
mod plan;
mod targets;
mod upgrade;

#[cfg(test)]
mod fixtures;

pub use marks::Marks;
pub(crate) use marks::{STARTUP_TAINT_EFFECT, marks};
pub use naming::{JobRole, desired_key};
pub(crate) use node::{Gpu, gpu_presence, gpu_presence_in, selects};
pub use node::{NodeFacts, builder_image};
pub(crate) use operands::{
    PAUSED as OPERAND_PAUSED, deploy_label, follows_labels, labels_taken,
    paused as operands_paused, to_pause as operands_to_pause, to_restore as operands_to_restore,
};
pub use plan::{NodeState, Plan, plan};
pub(crate) use plan::{backoff_seconds, failures};
pub use targets::Target;
pub(crate) use targets::{
    Gate, TargetPhase, build_job_name, builds_enabled, idle_targets_kept, install_gate,
    install_image, target_key,
};
pub(crate) use upgrade::{DrainStep, drain_step, is_gpu_resource, needs_upgrade, upgrade_started};
pub use upgrade::{UpgradeState, max_unavailable};

#[cfg(test)]
mod tests {
    use super::fixtures::{gl_node, installed, spec};
    use super::naming::job_name;
    use super::node::{OsImage, version_matches};
    use super::*;
    use crate::crd::Flavor;
    use crate::keys;
    use std::collections::BTreeMap;

    #[test]
    fn os_images_parse() {
        assert_eq!(
            OsImage::parse("Garden Linux 1592.4"),
            OsImage::GardenLinux {
                version: "1592.4".into()
            }
        );
        assert_eq!(
            OsImage::parse("Garden Linux 1877.3.1"),
            OsImage::GardenLinux {
                version: "1877.3.1".into()
            }
        );
        assert_eq!(
            OsImage::parse("Debian GNU/Linux 12 (bookworm)"),
            OsImage::Debian {
                version: "12".into()
            }
        );
        assert_eq!(
            OsImage::parse("Debian GNU/Linux 13.1 (trixie)").debian_version(),
            Some("13")
        );
        assert!(matches!(
            OsImage::parse("Ubuntu 24.04.1 LTS"),
            OsImage::Other(_)
        ));
        assert!(matches!(OsImage::parse("Garden Linux"), OsImage::Other(_)));
        assert!(matches!(
            OsImage::parse("Garden Linux 1592.x"),
            OsImage::Other(_)
        ));
    }

    #[test]
    fn versions_match_by_whole_components() {
        assert!(version_matches("1592", "1592.4"));
        assert!(version_matches("1592.4", "1592.4.1"));
        assert!(version_matches("1592.4", "1592.4"));
        assert!(!version_matches("1592.4", "1592.40"));
        assert!(!version_matches("1592.4.1", "1592.4"));
        assert!(!version_matches("159", "1592.4"));
    }

    #[test]
    fn most_specific_builder_image_wins() {
        let s = spec();
        let img = |os: &str, k: &str| builder_image(&s.builder_images, &gl_node(os, k));
        assert_eq!(
            img("Garden Linux 1592.6", "6.6.71-cloud-amd64").as_deref(),
            Some("kmodbuild:1592.6")
        );
        assert_eq!(
            img("Garden Linux 1592.4.1", "6.6.71-cloud-amd64").as_deref(),
            Some("kmodbuild:1592.4-special")
        );
        // A kernel rule beats an OS version rule.
        assert_eq!(
            img("Garden Linux 1592.4", "6.6.63-cloud-amd64").as_deref(),
            Some("k:prefix")
        );
        assert_eq!(
            img("Debian GNU/Linux 12 (bookworm)", "6.1.0-50-cloud-amd64").as_deref(),
            Some("debian-builder:12-6.1.0-50-cloud-amd64")
        );
        assert_eq!(
            img("Garden Linux 1877.3", "6.12.1").as_deref(),
            Some("builder:default")
        );
        let no_default = &s.builder_images[1..];
        assert_eq!(
            builder_image(no_default, &gl_node("Garden Linux 1877.3", "6.12.1")),
            None
        );
    }

    #[test]
    fn gpu_presence_from_labels_instance_type_or_detect_job() {
        let mut s = spec();
        let mut n = gl_node("Garden Linux 1592.4", "6.6.63-cloud-amd64");
        assert_eq!(gpu_presence(&s, &n), Gpu::Yes);
        n.labels.clear();
        assert_eq!(gpu_presence(&s, &n), Gpu::No);
        n.labels
            .insert(keys::INSTANCE_TYPE_LABEL.into(), "p4d.24xlarge".into());
        s.gpu_detection.instance_types = vec!["p4d.24xlarge".into()];
        assert_eq!(gpu_presence(&s, &n), Gpu::Yes);
        s.gpu_detection.instance_types.clear();
        s.gpu_detection.detect_job = true;
        assert_eq!(gpu_presence(&s, &n), Gpu::Unknown);
        n.annotations.insert(keys::GPU.into(), "false".into());
        assert_eq!(gpu_presence(&s, &n), Gpu::No);
        n.annotations.insert(keys::GPU.into(), "true".into());
        assert_eq!(gpu_presence(&s, &n), Gpu::Yes);
        // NFD can be switched off.
        s.gpu_detection.nfd = false;
        n.annotations.clear();
        n.labels
            .insert(keys::NFD_NVIDIA_LABEL.into(), "true".into());
        assert_eq!(gpu_presence(&s, &n), Gpu::Unknown);
    }

    #[test]
    fn kernel_boot_os_and_policy_changes_change_the_key() {
        let s = spec();
        let n = gl_node("Garden Linux 1592.4", "6.6.63-cloud-amd64");
        let k = desired_key(&s, &n);
        assert_eq!(k, desired_key(&s, &n.clone()));
        let mut m = n.clone();
        m.boot_id = "boot-2".into();
        assert_ne!(k, desired_key(&s, &m));
        let mut m = n.clone();
        m.kernel = "6.6.64-cloud-amd64".into();
        assert_ne!(k, desired_key(&s, &m));
        let mut m = n.clone();
        m.os_image = "Garden Linux 1592.5".into();
        assert_ne!(k, desired_key(&s, &m));
        let mut s2 = s.clone();
        s2.driver.flavor = Flavor::Open;
        assert_ne!(k, desired_key(&s2, &n));
        let mut s3 = s.clone();
        s3.driver.version = Some("580.95.05".into());
        assert_ne!(k, desired_key(&s3, &n));
        // Labels, the installer image and parallelism do not reinstall.
        let mut s4 = s.clone();
        s4.installer_image = "installer:2".into();
        s4.max_parallel = 1;
        let mut m = n.clone();
        m.labels.insert("x".into(), "y".into());
        assert_eq!(k, desired_key(&s4, &m));
    }

    #[test]
    fn plan_walks_from_nothing_to_ready_and_back_after_a_reboot() {
        let s = spec();
        let mut n = gl_node("Garden Linux 1592.4", "6.6.71-cloud-amd64");
        let Plan::Install {
            job, image, key, ..
        } = plan(&s, &n, 0)
        else {
            panic!("{:?}", plan(&s, &n, 0));
        };
        assert_eq!(image, "kmodbuild:1592.4-special");
        assert!(job.starts_with("gpu-install-node-a-"), "{job}");
        assert!(job.len() <= 63);
        installed(&mut n, &key);
        let label_on = Marks {
            ready_label: Some(true),
            startup_taint: None,
        };
        assert_eq!(plan(&s, &n, 0), Plan::Ready { marks: label_on });
        n.labels.insert(keys::READY_LABEL.into(), "true".into());
        assert_eq!(
            plan(&s, &n, 0),
            Plan::Ready {
                marks: Marks::default()
            }
        );
        n.taints.push("gpu-driver.gardenlinux.io/not-ready".into());
        assert_eq!(
            plan(&s, &n, 0),
            Plan::Ready {
                marks: Marks {
                    ready_label: None,
                    startup_taint: Some(false)
                }
            }
        );
        // A reboot: new boot id, the modules are gone.
        n.boot_id = "boot-2".into();
        let Plan::Install { job: job2, .. } = plan(&s, &n, 0) else {
            panic!()
        };
        assert_ne!(job, job2);
    }

    #[test]
    fn failures_back_off_exponentially_and_new_attempts_get_new_jobs() {
        assert_eq!(backoff_seconds(0, 60, 3600), 0);
        assert_eq!(backoff_seconds(1, 60, 3600), 60);
        assert_eq!(backoff_seconds(2, 60, 3600), 120);
        assert_eq!(backoff_seconds(4, 60, 3600), 480);
        assert_eq!(backoff_seconds(10, 60, 3600), 3600);
        assert_eq!(backoff_seconds(200, 60, 3600), 3600);

        let s = spec();
        let mut n = gl_node("Garden Linux 1592.4", "6.6.71-cloud-amd64");
        let Plan::Install {
            key, job: first, ..
        } = plan(&s, &n, 0)
        else {
            panic!()
        };
        let t0: k8s_openapi::jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        n.annotations.insert(keys::FAILURE_KEY.into(), key.clone());
        n.annotations.insert(keys::FAILURES.into(), "2".into());
        n.annotations.insert(keys::FAILED_AT.into(), t0.to_string());
        let now = t0.as_second();
        assert_eq!(plan(&s, &n, now + 10), Plan::Backoff { seconds: 110 });
        let Plan::Install { job, attempt, .. } = plan(&s, &n, now + 120) else {
            panic!()
        };
        assert_eq!(attempt, 2);
        assert_ne!(job, first);
        // Failures of an earlier key (before a reboot) do not delay.
        n.boot_id = "boot-9".into();
        assert!(matches!(
            plan(&s, &n, now + 10),
            Plan::Install { attempt: 0, .. }
        ));
    }

    #[test]
    fn unknown_os_without_default_image_is_reported() {
        let mut s = spec();
        s.builder_images.remove(0);
        let n = gl_node("Ubuntu 24.04 LTS", "6.8.0-1-generic");
        assert_eq!(plan(&s, &n, 0), Plan::NoBuilderImage);
    }

    #[test]
    fn detect_job_when_nothing_else_tells() {
        let mut s = spec();
        s.gpu_detection.detect_job = true;
        let mut n = gl_node("Garden Linux 1592.4", "6.6.71-cloud-amd64");
        n.labels.clear();
        assert!(matches!(plan(&s, &n, 0), Plan::Detect { job } if job.starts_with("gpu-detect-")));
        s.gpu_detection.detect_job = false;
        assert_eq!(plan(&s, &n, 0), Plan::NoGpu);
    }

    #[test]
    fn job_names_are_valid_and_short() {
        let long = "a".repeat(253);
        let n = job_name(JobRole::Install, &long, "k", 0);
        assert!(n.len() <= 63, "{}", n.len());
        let n = job_name(JobRole::Install, "Node_With.Dots", "k", 3);
        assert!(
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{n}"
        );
        assert!(selects(
            &[("a".into(), "b".into())].into(),
            &[("a".into(), "b".into()), ("c".into(), "d".into())].into()
        ));
        assert!(!selects(
            &[("a".into(), "b".into())].into(),
            &BTreeMap::new()
        ));
    }
}
