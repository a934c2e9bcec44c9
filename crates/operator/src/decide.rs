//! Pure decisions, no API calls: what a node is (OS, kernel, GPU), what it
//! should have, whether that is already there, which builder image, which
//! Job name, how long to back off. The controller only feeds these the
//! objects from its caches and carries out the answer.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::crd::{BuilderImage, GpuDriverSpec};
use super::keys;

/// The operating system as the kubelet reports it in `status.nodeInfo.osImage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OsImage {
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
pub fn version_matches(pattern: &str, version: &str) -> bool {
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
    pub fn os(&self) -> OsImage {
        OsImage::parse(&self.os_image)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// Does the selector pick this node? Every label must be present with
/// the same value.
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gpu {
    Yes,
    No,
    /// Only a detect Job can tell.
    Unknown,
}

/// GPU presence before any driver exists: NFD's PCI vendor label, the
/// instance type, or an earlier detect Job's answer (an annotation).
pub fn gpu_presence(spec: &GpuDriverSpec, node: &NodeFacts) -> Gpu {
    let det = &spec.gpu_detection;
    if det.nfd && node.labels.get(keys::NFD_NVIDIA_LABEL).map(String::as_str) == Some("true") {
        return Gpu::Yes;
    }
    if let Some(t) = node.labels.get(keys::INSTANCE_TYPE_LABEL)
        && det.instance_types.iter().any(|i| i == t)
    {
        return Gpu::Yes;
    }
    match node.annotation(keys::GPU) {
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
    short_hash(&[
        &node.kernel,
        &node.os_image,
        &node.boot_id,
        spec.driver.version.as_deref().unwrap_or("auto"),
        spec.driver.flavor.as_str(),
    ])
}

/// Installed for exactly the current kernel, boot and policy?
pub fn is_installed(node: &NodeFacts, key: &str) -> bool {
    node.annotation(keys::KEY) == Some(key) && node.annotation(keys::STATE) == Some("Installed")
}

/// Failed Jobs for the current key (earlier keys' failures do not count).
pub fn failures(node: &NodeFacts, key: &str) -> u32 {
    if node.annotation(keys::FAILURE_KEY) != Some(key) {
        return 0;
    }
    node.annotation(keys::FAILURES)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}

/// Wait after the n-th failure: base · 2^(n-1), at most `max`.
pub fn backoff_seconds(failures: u32, base: u64, max: u64) -> u64 {
    if failures == 0 {
        return 0;
    }
    let shift = (failures - 1).min(32);
    base.saturating_mul(1u64 << shift).min(max)
}

/// Seconds still to wait before the next attempt (0: go now).
pub fn retry_in(spec: &GpuDriverSpec, node: &NodeFacts, key: &str, now_unix: i64) -> u64 {
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

/// Is the driver of the node's last verified install still loaded? Its
/// annotations record the boot, kernel and OS image of that install; a new
/// `bootID` (a reboot empties the kernel of its modules), another kernel or
/// another OS image means it is gone, and a node never installed has
/// nothing recorded. Only a new driver policy on the same boot keeps it.
pub fn verified_driver_loaded(node: &NodeFacts) -> bool {
    [
        (keys::BOOT_ID, &node.boot_id),
        (keys::KERNEL, &node.kernel),
        (keys::OS_IMAGE, &node.os_image),
    ]
    .iter()
    .all(|(key, now)| node.annotation(key) == Some(now.as_str()))
}

/// Changes to a GPU node's ready label and startup taint; `None` leaves
/// that one as it is. Computed against the node as it is, so a node that
/// already looks right gets no write at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// `Some(true)`: set the ready label to `true`; `Some(false)`: remove it.
    pub ready_label: Option<bool>,
    /// `Some(true)`: add the startup taint (effect [`STARTUP_TAINT_EFFECT`]);
    /// `Some(false)`: remove it.
    pub startup_taint: Option<bool>,
}

impl Marks {
    pub fn is_empty(&self) -> bool {
        self.ready_label.is_none() && self.startup_taint.is_none()
    }
}

/// The effect of the startup taint when the operator adds it.
/// NoSchedule keeps new pods off until the driver is back, without
/// evicting what runs (the install Job tolerates it anyway).
pub const STARTUP_TAINT_EFFECT: &str = "NoSchedule";

/// What the ready label and the startup taint of a GPU node should become.
/// `installed`: a verified install for the node's current key (kernel, OS
/// image, boot, policy). Installed: label on, taint off. Not installed:
/// label off, and the taint on whenever no verified driver is loaded
/// ([`verified_driver_loaded`]): a new node, or one rebooted or upgraded
/// since its install. A new driver policy alone keeps the taint off: the
/// old driver is still loaded and serving what runs. Only the configured
/// `startupTaint` key is ever touched, and a taint of that key with any
/// effect counts as present (a node pool's own stays as it is).
pub fn marks(spec: &GpuDriverSpec, node: &NodeFacts, installed: bool) -> Marks {
    let label = node.labels.get(keys::READY_LABEL).map(String::as_str);
    let tainted = spec.startup_taint.as_ref().map(|t| node.taints.contains(t));
    if installed {
        return Marks {
            ready_label: (label != Some("true")).then_some(true),
            startup_taint: (tainted == Some(true)).then_some(false),
        };
    }
    Marks {
        ready_label: label.is_some().then_some(false),
        startup_taint: (tainted == Some(false) && !verified_driver_loaded(node)).then_some(true),
    }
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

// ------------------------------------------------------------ build targets

/// What a build Job compiles for: the OS (it picks the builder image and
/// the headers' repository), the kernel release and the architecture.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// Normalized: `Garden Linux 1877.3` or `Debian GNU/Linux 12`.
    pub os_image: String,
    pub kernel: String,
    /// Kubernetes' name: `amd64`, `arm64`.
    pub arch: String,
}

impl Target {
    fn new(os: &OsImage, kernel: &str, arch: &str) -> Option<Target> {
        let os_image = match os {
            OsImage::GardenLinux { version } => format!("Garden Linux {version}"),
            OsImage::Debian { version } => format!("Debian GNU/Linux {version}"),
            OsImage::Other(_) => return None,
        };
        let arch = if arch.is_empty() { "amd64" } else { arch };
        (!kernel.is_empty()).then(|| Target {
            os_image,
            kernel: kernel.to_string(),
            arch: arch.to_string(),
        })
    }

    /// The node's target; `None` for an OS the installer has no build
    /// recipe for, or a node that reports no kernel yet.
    pub fn of_node(node: &NodeFacts) -> Option<Target> {
        Target::new(&node.os(), &node.kernel, &node.arch)
    }

    /// A `spec.prebuild` entry's target; `None` when it names neither a
    /// Garden Linux nor a Debian version.
    pub fn of_prebuild(t: &super::crd::PrebuildTarget) -> Option<Target> {
        let os = match (&t.garden_linux_version, &t.debian_version) {
            (Some(v), _) if is_dotted_version(v) => OsImage::GardenLinux { version: v.clone() },
            (None, Some(v)) if is_dotted_version(v) => OsImage::Debian {
                version: v.split('.').next().unwrap_or(v).to_string(),
            },
            _ => return None,
        };
        Target::new(&os, &t.kernel_release, &t.arch)
    }

    /// The facts the builder image rules match on.
    pub fn facts(&self) -> NodeFacts {
        NodeFacts {
            kernel: self.kernel.clone(),
            os_image: self.os_image.clone(),
            arch: self.arch.clone(),
            ..Default::default()
        }
    }

    /// The installer's `--os-id` and `--os-version`.
    pub fn os_release(&self) -> (&'static str, String) {
        match OsImage::parse(&self.os_image) {
            OsImage::GardenLinux { version } => ("gardenlinux", version),
            OsImage::Debian { version } => ("debian", version),
            OsImage::Other(o) => ("unknown", o),
        }
    }
}

/// Build Jobs run when the GpuDriver has a cache to store into.
pub fn builds_enabled(spec: &GpuDriverSpec) -> bool {
    spec.cache.is_some()
}

/// The target's key under the current driver policy: a new driver version
/// or flavor is a new target.
pub fn target_key(spec: &GpuDriverSpec, t: &Target) -> String {
    short_hash(&[
        &t.os_image,
        &t.kernel,
        &t.arch,
        spec.driver.version.as_deref().unwrap_or("auto"),
        spec.driver.flavor.as_str(),
    ])
}

/// The build Job's name: one per target and attempt, cluster-wide (a
/// second operator or a restart finds the same name).
pub fn build_job_name(t: &Target, key: &str, attempt: u32) -> String {
    job_name(JobRole::Build, &t.kernel, key, attempt)
}

/// Where a target's artifact stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetPhase {
    /// No build Job yet.
    Pending,
    Building,
    /// In the store, with the sha256 the build Job reported.
    Cached {
        sha256: String,
    },
    /// The last build failed; the next one is due in `retry_in` seconds.
    Failed {
        reason: String,
        message: String,
        retry_in: u64,
    },
}

impl TargetPhase {
    pub fn as_str(&self) -> &'static str {
        match self {
            TargetPhase::Pending => "Pending",
            TargetPhase::Building => "Building",
            TargetPhase::Cached { .. } => "Cached",
            TargetPhase::Failed { .. } => "Failed",
        }
    }
}

/// May the node's install Job start, and how?
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Start it. `expect_sha256`: the artifact it must find in the cache;
    /// `compile`: whether it may compile on a miss.
    Go {
        expect_sha256: Option<String>,
        compile: bool,
    },
    /// The target's build Job has not finished.
    Wait,
    /// Nothing to install from, and compiling on the node is forbidden.
    Refuse { reason: String, message: String },
}

/// The install gate for a node whose target is in `phase` (`None`: the
/// node has no build target, e.g. an OS without a build recipe).
pub fn install_gate(spec: &GpuDriverSpec, phase: Option<&TargetPhase>) -> Gate {
    if !builds_enabled(spec) {
        // No store to build into: the node compiles, as without build Jobs.
        return Gate::Go {
            expect_sha256: None,
            compile: true,
        };
    }
    let compile = spec.build.compile_on_node;
    match phase {
        Some(TargetPhase::Pending | TargetPhase::Building) => Gate::Wait,
        Some(TargetPhase::Cached { sha256 }) => Gate::Go {
            expect_sha256: Some(sha256.clone()),
            compile,
        },
        Some(TargetPhase::Failed {
            reason, message, ..
        }) if !compile => Gate::Refuse {
            reason: reason.clone(),
            message: format!(
                "the build Job failed ({message}) and compileOnNode is false; \
                 the build is retried with backoff"
            ),
        },
        None if !compile => Gate::Refuse {
            reason: "NoBuildTarget".into(),
            message: "no build Job can serve this node's OS (only Garden Linux and Debian \
                      targets are built) and compileOnNode is false"
                .into(),
        },
        Some(TargetPhase::Failed { .. }) | None => Gate::Go {
            expect_sha256: None,
            compile: true,
        },
    }
}

// ------------------------------------------------------------ rolling upgrades

/// Does this node run a verified driver of an older policy (version or
/// flavor)? Then it is upgraded in the roll (cordon, drain, install). A
/// reboot, kernel or OS change has no loaded driver to protect: it
/// reinstalls at once, as always.
pub fn needs_upgrade(node: &NodeFacts, key: &str) -> bool {
    node.annotation(keys::KEY).is_some_and(|k| k != key) && verified_driver_loaded(node)
}

/// The node's upgrade state (its annotation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpgradeState {
    /// Not started (waiting for a slot, or no upgrade).
    Idle,
    Draining,
    Installing,
    Failed,
}

impl UpgradeState {
    pub fn of(node: &NodeFacts) -> UpgradeState {
        match node.annotation(keys::UPGRADE) {
            Some("Draining") => UpgradeState::Draining,
            Some("Installing") => UpgradeState::Installing,
            Some("Failed") => UpgradeState::Failed,
            _ => UpgradeState::Idle,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeState::Idle => "Waiting",
            UpgradeState::Draining => "Draining",
            UpgradeState::Installing => "Installing",
            UpgradeState::Failed => "Failed",
        }
    }

    /// Cordoned and counted against maxUnavailable.
    pub fn in_progress(self) -> bool {
        self != UpgradeState::Idle
    }
}

/// `maxUnavailable` as a node count: a number, or a percentage of
/// `gpu_nodes` rounded down; at least 1, so that a roll always moves.
pub fn max_unavailable(
    v: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
    gpu_nodes: u32,
) -> u32 {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let n = match v {
        IntOrString::Int(i) => (*i).max(0) as u32,
        IntOrString::String(s) => match s.trim().strip_suffix('%') {
            Some(p) => p
                .trim()
                .parse::<u64>()
                .map_or(0, |p| (u64::from(gpu_nodes) * p.min(100) / 100) as u32),
            None => s.trim().parse().unwrap_or(0),
        },
    };
    n.max(1)
}

/// Is `resource` one of NVIDIA's device plugin resources (a whole GPU or
/// a MIG slice)? Pods that request one use the driver.
pub fn is_gpu_resource(resource: &str) -> bool {
    resource.starts_with("nvidia.com/")
}

/// What an upgrading node does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainStep {
    /// No GPU pod left: install.
    Install,
    /// Evict (or wait for) the GPU pods and look again.
    Drain,
    /// The drain has taken longer than `drainTimeoutSeconds`.
    TimedOut,
}

pub fn drain_step(
    policy: &super::crd::UpgradePolicy,
    gpu_pods: usize,
    started_unix: Option<i64>,
    now_unix: i64,
) -> DrainStep {
    if gpu_pods == 0 {
        return DrainStep::Install;
    }
    let limit = policy.drain_timeout_seconds;
    match started_unix {
        Some(t) if limit > 0 && now_unix.saturating_sub(t) >= limit as i64 => DrainStep::TimedOut,
        _ => DrainStep::Drain,
    }
}

/// When the node's drain started (its annotation).
pub fn upgrade_started(node: &NodeFacts) -> Option<i64> {
    node.annotation(keys::UPGRADE_STARTED)
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| t.as_second())
}

/// Deterministic Job name: a crashed or restarted operator finds the Job
/// it already made (a create answers AlreadyExists) instead of making
/// another. A new attempt after a failure, a new kernel or a new boot is
/// another name. At most 63 characters (the job-name label's limit).
pub fn job_name(role: JobRole, node: &str, key: &str, attempt: u32) -> String {
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

    fn spec() -> GpuDriverSpec {
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

    fn gl_node(os: &str, kernel: &str) -> NodeFacts {
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

    fn installed(n: &mut NodeFacts, key: &str) {
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

    /// A node as the controller leaves it after a verified install: the
    /// annotations record what was installed, label on, no startup taint.
    fn ready_node() -> (GpuDriverSpec, NodeFacts) {
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
    fn without_a_startup_taint_only_the_label_moves() {
        let (mut s, mut n) = ready_node();
        s.startup_taint = None;
        n.boot_id = "boot-2".into();
        assert_eq!(
            marks(&s, &n, false),
            Marks {
                ready_label: Some(false),
                startup_taint: None
            }
        );
        // Another controller's taint of another key is never touched, even
        // one that looks like ours.
        n.taints.push("gpu-driver.gardenlinux.io/not-ready".into());
        n.labels.remove(keys::READY_LABEL);
        assert_eq!(marks(&s, &n, false), Marks::default());
        assert_eq!(
            marks(&s, &n, true),
            Marks {
                ready_label: Some(true),
                startup_taint: None
            }
        );
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

    #[test]
    fn targets_come_from_nodes_and_prebuild_entries_alike() {
        let node = gl_node("Garden Linux 1877.3.1", "6.12.44-cloud-amd64");
        let t = Target::of_node(&node).unwrap();
        assert_eq!(t.os_image, "Garden Linux 1877.3.1");
        assert_eq!(t.os_release(), ("gardenlinux", "1877.3.1".to_string()));
        let p = Target::of_prebuild(&crate::crd::PrebuildTarget {
            garden_linux_version: Some("1877.3.1".into()),
            debian_version: None,
            kernel_release: "6.12.44-cloud-amd64".into(),
            arch: "amd64".into(),
        })
        .unwrap();
        assert_eq!(p, t, "a prebuild entry is the same target as the node");
        let s = spec();
        assert_eq!(target_key(&s, &t), target_key(&s, &p));
        let deb = Target::of_node(&gl_node(
            "Debian GNU/Linux 12 (bookworm)",
            "6.1.0-50-cloud-amd64",
        ))
        .unwrap();
        assert_eq!(deb.os_release(), ("debian", "12".to_string()));
        assert!(Target::of_node(&gl_node("Ubuntu 24.04", "6.8.0")).is_none());
        // A new driver policy is a new target key and a new build Job.
        let mut s2 = spec();
        s2.driver.version = Some("580.95.05".into());
        assert_ne!(target_key(&s, &t), target_key(&s2, &t));
        let name = build_job_name(&t, &target_key(&s, &t), 0);
        assert!(name.starts_with("gpu-build-6-12-44-cloud-amd64-"), "{name}");
        assert!(name.len() <= 63);
    }

    #[test]
    fn install_waits_for_the_build_and_carries_its_digest() {
        let mut s = spec();
        // No cache: nothing to build into, the node compiles.
        assert_eq!(
            install_gate(&s, Some(&TargetPhase::Building)),
            Gate::Go {
                expect_sha256: None,
                compile: true
            }
        );
        s.cache = Some(crate::crd::CacheSpec {
            url: "s3://b/p".into(),
            ..Default::default()
        });
        assert_eq!(install_gate(&s, Some(&TargetPhase::Pending)), Gate::Wait);
        assert_eq!(install_gate(&s, Some(&TargetPhase::Building)), Gate::Wait);
        let sha = "ab".repeat(32);
        assert_eq!(
            install_gate(
                &s,
                Some(&TargetPhase::Cached {
                    sha256: sha.clone()
                })
            ),
            Gate::Go {
                expect_sha256: Some(sha.clone()),
                compile: true
            }
        );
        let failed = TargetPhase::Failed {
            reason: "BuildFailed".into(),
            message: "make: error".into(),
            retry_in: 60,
        };
        // A failed build: the node compiles for itself if allowed ...
        assert_eq!(
            install_gate(&s, Some(&failed)),
            Gate::Go {
                expect_sha256: None,
                compile: true
            }
        );
        // ... and is refused with the build's reason if not.
        s.build.compile_on_node = false;
        assert!(matches!(
            install_gate(&s, Some(&failed)),
            Gate::Refuse { reason, .. } if reason == "BuildFailed"
        ));
        assert_eq!(
            install_gate(
                &s,
                Some(&TargetPhase::Cached {
                    sha256: sha.clone()
                })
            ),
            Gate::Go {
                expect_sha256: Some(sha),
                compile: false
            }
        );
        assert!(matches!(
            install_gate(&s, None),
            Gate::Refuse { reason, .. } if reason == "NoBuildTarget"
        ));
    }

    #[test]
    fn only_a_policy_change_on_a_loaded_driver_is_an_upgrade() {
        let (s, mut n) = ready_node();
        let key = desired_key(&s, &n);
        assert!(!needs_upgrade(&n, &key), "installed for its key");
        let mut s2 = s.clone();
        s2.driver.version = Some("580.95.05".into());
        assert!(needs_upgrade(&n, &desired_key(&s2, &n)));
        // A reboot: the driver is gone, nothing to drain.
        n.boot_id = "boot-2".into();
        assert!(!needs_upgrade(&n, &desired_key(&s2, &n)));
        // Never installed: a first install.
        let fresh = gl_node("Garden Linux 1592.4", "6.6.63-cloud-amd64");
        assert!(!needs_upgrade(&fresh, &desired_key(&s2, &fresh)));
    }

    #[test]
    fn max_unavailable_counts_and_percentages() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString as I;
        assert_eq!(max_unavailable(&I::Int(3), 100), 3);
        assert_eq!(max_unavailable(&I::Int(0), 100), 1);
        assert_eq!(max_unavailable(&I::String("10%".into()), 100), 10);
        assert_eq!(max_unavailable(&I::String("10%".into()), 19), 1);
        assert_eq!(max_unavailable(&I::String("10%".into()), 5), 1);
        assert_eq!(max_unavailable(&I::String("150%".into()), 8), 8);
        assert_eq!(max_unavailable(&I::String("x".into()), 8), 1);
        assert_eq!(max_unavailable(&I::String("4".into()), 8), 4);
    }

    #[test]
    fn drains_end_by_emptiness_or_timeout() {
        let mut p = crate::crd::UpgradePolicy {
            drain_timeout_seconds: 600,
            ..Default::default()
        };
        assert_eq!(drain_step(&p, 0, Some(0), 10_000), DrainStep::Install);
        assert_eq!(drain_step(&p, 2, Some(1000), 1599), DrainStep::Drain);
        assert_eq!(drain_step(&p, 2, Some(1000), 1600), DrainStep::TimedOut);
        assert_eq!(drain_step(&p, 2, None, 1_000_000), DrainStep::Drain);
        p.drain_timeout_seconds = 0;
        assert_eq!(drain_step(&p, 2, Some(0), 1_000_000), DrainStep::Drain);
        assert!(is_gpu_resource("nvidia.com/gpu"));
        assert!(is_gpu_resource("nvidia.com/mig-1g.10gb"));
        assert!(!is_gpu_resource("cpu"));
    }
}
