//! The nodes and the GpuDriver spec the decisions' tests start from.

use std::collections::BTreeMap;

use super::naming::desired_key;
use super::node::NodeFacts;
use crate::crd::{BuilderImage, DriverPolicy, GpuDetection, GpuDriverSpec};
use crate::keys;

pub(super) fn spec() -> GpuDriverSpec {
    GpuDriverSpec {
        node_selector: BTreeMap::new(),
        gpu_detection: GpuDetection::default(),
        driver: DriverPolicy::default(),
        builder_images: vec![
            BuilderImage {
                image: "builder:default".into(),
                ..Default::default()
            },
            BuilderImage {
                garden_linux_version: Some("1592".into()),
                image: "kmodbuild:{gardenLinuxVersion}".into(),
                ..Default::default()
            },
            BuilderImage {
                garden_linux_version: Some("1592.4".into()),
                image: "kmodbuild:1592.4-special".into(),
                ..Default::default()
            },
            BuilderImage {
                kernel_release: Some("6.6.63-cloud-*".into()),
                image: "k:prefix".into(),
                ..Default::default()
            },
            BuilderImage {
                debian_version: Some("12".into()),
                image: "debian-builder:{debianVersion}-{kernelRelease}".into(),
                ..Default::default()
            },
        ],
        installer_image: "installer:1".into(),
        cache: None,
        max_parallel: 20,
        tolerations: vec![],
        image_pull_secrets: vec![],
        startup_taint: Some("gpu-driver.gardenlinux.io/not-ready".into()),
        job: Default::default(),
        extra_args: vec![],
        pod_annotations: BTreeMap::new(),
        build: Default::default(),
        prebuild: vec![],
        upgrade_policy: Default::default(),
    }
}

pub(super) fn gl_node(os: &str, kernel: &str) -> NodeFacts {
    NodeFacts {
        name: "node-a".into(),
        kernel: kernel.into(),
        os_image: os.into(),
        boot_id: "boot-1".into(),
        arch: "amd64".into(),
        labels: [(keys::NFD_NVIDIA_LABEL.to_string(), "true".to_string())].into(),
        annotations: BTreeMap::new(),
        taints: vec![],
    }
}

pub(super) fn installed(n: &mut NodeFacts, key: &str) {
    n.annotations.insert(keys::KEY.into(), key.into());
    n.annotations.insert(keys::STATE.into(), "Installed".into());
}

/// A node as the controller leaves it after a verified install: the
/// annotations record what was installed, label on, no startup taint.
pub(super) fn ready_node() -> (GpuDriverSpec, NodeFacts) {
    let s = spec();
    let mut n = gl_node("Garden Linux 1592.4", "6.6.71-cloud-amd64");
    let key = desired_key(&s, &n);
    installed(&mut n, &key);
    n.annotations
        .insert(keys::BOOT_ID.into(), n.boot_id.clone());
    n.annotations.insert(keys::KERNEL.into(), n.kernel.clone());
    n.annotations
        .insert(keys::OS_IMAGE.into(), n.os_image.clone());
    n.labels.insert(keys::READY_LABEL.into(), "true".into());
    n.taints.push("other.example.com/maintenance".into());
    (s, n)
}
