//! Pure decisions, no API calls: what a node is (OS, kernel, GPU), what it
//! should have, whether that is already there, which builder image, which
//! Job name, how long to back off. The controller only feeds these the
//! objects from its caches and carries out the answer.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::crd::{BuilderImage, GpuDriverSpec};
use crate::keys;

mod marks;
mod operands;
mod targets;
mod upgrade;

pub use marks::Marks;
pub(crate) use marks::{STARTUP_TAINT_EFFECT, marks, verified_driver_loaded};
pub(crate) use operands::{
    PAUSED as OPERAND_PAUSED, deploy_label, follows_labels, labels_taken,
    paused as operands_paused, to_pause as operands_to_pause, to_restore as operands_to_restore,
};
pub use targets::Target;
pub(crate) use targets::{
    Gate, TargetPhase, build_job_name, builds_enabled, idle_targets_kept, install_gate,
    install_image, target_key,
};
pub(crate) use upgrade::{DrainStep, drain_step, is_gpu_resource, needs_upgrade, upgrade_started};
pub use upgrade::{UpgradeState, max_unavailable};

/// The operating system as the kubelet reports it in `status.nodeInfo.osImage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OsImage {
    /// `Garden Linux 1592.4`, `Garden Linux 1877.3.1`.
    GardenLinux {
        version: String,
    },
    /// `Debian GNU/Linux 12 (bookworm)`.
    Debian {
        version: String,
    },
    Other(String),
}

impl OsImage {
    pub fn parse(s: &str) -> OsImage {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("Garden Linux") {
            // The version is the first token of digits and dots; anything
            // after it (a codename, "(dev)") is not part of it.
            let v = rest.split_whitespace().next().unwrap_or("");
            if is_dotted_version(v) {
                return OsImage::GardenLinux {
                    version: v.to_string(),
                };
            }
        }
        if let Some(rest) = s.strip_prefix("Debian GNU/Linux") {
            let v = rest.split_whitespace().next().unwrap_or("");
            if !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.') {
                let major = v.split('.').next().unwrap_or(v);
                return OsImage::Debian {
                    version: major.to_string(),
                };
            }
        }
        OsImage::Other(s.to_string())
    }

    pub fn garden_linux_version(&self) -> Option<&str> {
        match self {
            OsImage::GardenLinux { version } => Some(version),
            _ => None,
        }
    }

    pub fn debian_version(&self) -> Option<&str> {
        match self {
            OsImage::Debian { version } => Some(version),
            _ => None,
        }
    }
}

fn is_dotted_version(v: &str) -> bool {
    !v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// `1592` matches `1592.4` and `1592.4.1`, `1592.4` matches `1592.4.1`
/// but not `1592.40`: whole components, from the left.
pub(crate) fn version_matches(pattern: &str, version: &str) -> bool {
    let p: Vec<&str> = pattern.trim().split('.').collect();
    let v: Vec<&str> = version.split('.').collect();
    p.len() <= v.len() && p.iter().zip(&v).all(|(a, b)| a == b)
}

fn kernel_matches(pattern: &str, kernel: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => kernel.starts_with(prefix),
        None => pattern == kernel,
    }
}

/// What the node says about itself, from its labels and `status.nodeInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub kernel: String,
    pub os_image: String,
    pub boot_id: String,
    pub arch: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Keys of the node's taints.
    pub taints: Vec<String>,
}

impl NodeFacts {
    pub(crate) fn os(&self) -> OsImage {
        OsImage::parse(&self.os_image)
    }

    pub(crate) fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// Does the selector pick this node? Every label must be present with
/// the same value.
pub(crate) fn selects(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gpu {
    Yes,
    No,
    /// Only a detect Job can tell.
    Unknown,
}

/// GPU presence before any driver exists: NFD's PCI vendor label, the
/// instance type, or an earlier detect Job's answer (an annotation).
pub(crate) fn gpu_presence(spec: &GpuDriverSpec, node: &NodeFacts) -> Gpu {
    gpu_presence_in(spec, &node.labels, &node.annotations)
}

/// [`gpu_presence`] from a node's labels and annotations as they are (a
/// cached Node's, without copying them into [`NodeFacts`]).
pub(crate) fn gpu_presence_in(
    spec: &GpuDriverSpec,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Gpu {
    let det = &spec.gpu_detection;
    if det.nfd && labels.get(keys::NFD_NVIDIA_LABEL).map(String::as_str) == Some("true") {
        return Gpu::Yes;
    }
    if let Some(t) = labels.get(keys::INSTANCE_TYPE_LABEL)
        && det.instance_types.iter().any(|i| i == t)
    {
        return Gpu::Yes;
    }
    match annotations.get(keys::GPU).map(String::as_str) {
        Some("true") => Gpu::Yes,
        Some("false") => Gpu::No,
        _ if det.detect_job => Gpu::Unknown,
        _ => Gpu::No,
    }
}

/// The most specific builder image for this node, with its placeholders
/// filled in. `None`: no entry matches (the node cannot be served).
pub fn builder_image(images: &[BuilderImage], node: &NodeFacts) -> Option<String> {
    let os = node.os();
    let mut best: Option<(u32, &BuilderImage)> = None;
    for img in images {
        let mut score = 0u32;
        if let Some(k) = &img.kernel_release {
            if !kernel_matches(k, &node.kernel) {
                continue;
            }
            score += if k.ends_with('*') {
                500 + k.len() as u32
            } else {
                2000
            };
        }
        if let Some(g) = &img.garden_linux_version {
            match os.garden_linux_version() {
                Some(v) if version_matches(g, v) => score += 100 * g.split('.').count() as u32,
                _ => continue,
            }
        }
        if let Some(d) = &img.debian_version {
            match os.debian_version() {
                Some(v) if version_matches(d, v) => score += 100,
                _ => continue,
            }
        }
        // Ties go to the earlier entry.
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, img));
        }
    }
    best.map(|(_, img)| {
        img.image
            .replace(
                "{gardenLinuxVersion}",
                os.garden_linux_version().unwrap_or(""),
            )
            .replace("{debianVersion}", os.debian_version().unwrap_or(""))
            .replace("{kernelRelease}", &node.kernel)
            .replace("{arch}", &node.arch)
    })
}

fn short_hash(parts: &[&str]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{DriverPolicy, Flavor, GpuDetection};

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

    pub(super) fn installed(n: &mut NodeFacts, key: &str) {
        n.annotations.insert(keys::KEY.into(), key.into());
        n.annotations.insert(keys::STATE.into(), "Installed".into());
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
