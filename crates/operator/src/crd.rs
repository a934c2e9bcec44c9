//! The `GpuDriver` custom resource: which nodes get which driver, built in
//! which image. Cluster-scoped, because it selects nodes (cluster-scoped
//! themselves); the Jobs it owns live in the operator's namespace.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired driver installation for the nodes that `nodeSelector` matches.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "gpu-driver.gardenlinux.io",
    version = "v1alpha1",
    kind = "GpuDriver",
    plural = "gpudrivers",
    shortname = "gpud",
    status = "GpuDriverStatus",
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyNodes"}"#,
    printcolumn = r#"{"name":"GPU nodes","type":"integer","jsonPath":".status.gpuNodes"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.failedNodes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuDriverSpec {
    /// Labels a node must carry to be considered (all must match). Empty:
    /// every node.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// How a node is known to have an NVIDIA GPU before any driver exists.
    #[serde(default)]
    pub gpu_detection: GpuDetection,
    /// Driver version and module flavor.
    #[serde(default)]
    pub driver: DriverPolicy,
    /// Builder images (kernel headers and the kernel's compiler) by Garden
    /// Linux version, Debian version or kernel release; the most specific
    /// matching entry wins. `{gardenLinuxVersion}`, `{debianVersion}`,
    /// `{kernelRelease}` and `{arch}` in `image` are replaced.
    #[schemars(length(max = 64))]
    pub builder_images: Vec<BuilderImage>,
    /// The image holding the static installer at `/gpu-driver-installer`;
    /// an init container copies it into each builder image's pod.
    pub installer_image: String,
    /// The cluster owner's artifact cache (compile once per kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    /// At most this many install Jobs run at once (0: no limit).
    #[serde(default = "default_max_parallel")]
    pub max_parallel: u32,
    /// Added to every install and detect Job pod (the nodes' own taints
    /// must be tolerated); build Jobs take `build.tolerations`.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub tolerations: Vec<Toleration>,
    /// Pull secrets for the builder and installer images.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// A taint key kept on GPU nodes while no verified driver is loaded
    /// for their current boot, so that new pods land only where the driver
    /// works: added (effect NoSchedule) to a new GPU node and again after a
    /// reboot or a new kernel or OS image, removed with the verified
    /// install's result. A node pool may give it too; on Gardener don't
    /// (its machine-controller-manager puts pool taints back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_taint: Option<String>,
    /// Job limits.
    #[serde(default)]
    pub job: JobSettings,
    /// Extra arguments for `gpu-driver-installer run` (e.g. `--peermem`).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub extra_args: Vec<String>,
    /// Build Jobs: where they run, whether a node may still compile for
    /// itself, and the key they sign modules with.
    #[serde(default)]
    pub build: BuildPolicy,
    /// Targets to build before any node runs them (a worker pool's next
    /// Garden Linux version): (OS version, kernel release, arch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub prebuild: Vec<PrebuildTarget>,
    /// How a new driver version or flavor reaches nodes that already run
    /// one: a few nodes at a time, drained of GPU pods first.
    #[serde(default)]
    pub upgrade_policy: UpgradePolicy,
    /// Extra annotations on the Job pods (e.g. for a service mesh or cost
    /// accounting; the tests use it to tell the simulated kubelet how a pod
    /// ends).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
}

pub fn default_max_parallel() -> u32 {
    20
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuDetection {
    /// Trust Node Feature Discovery's
    /// `feature.node.kubernetes.io/pci-10de.present=true` label.
    #[serde(default = "yes")]
    pub nfd: bool,
    /// Values of `node.kubernetes.io/instance-type` that have NVIDIA GPUs.
    #[serde(default)]
    pub instance_types: Vec<String>,
    /// When neither says so: run a short `detect` Job (installer image
    /// only, no build) and read its HostReport from the termination message.
    #[serde(default)]
    pub detect_job: bool,
}

fn yes() -> bool {
    true
}

impl Default for GpuDetection {
    fn default() -> Self {
        GpuDetection {
            nfd: true,
            instance_types: Vec::new(),
            detect_job: false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriverPolicy {
    /// A pinned driver version (e.g. `580.95.05`). Empty: the installer's
    /// catalog policy for the node's OS and kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Kernel module flavor.
    #[serde(default)]
    pub flavor: Flavor,
    /// A ConfigMap in the operator's namespace whose key `catalog.toml`
    /// replaces the installer's embedded catalog (driver releases and
    /// their sha256 digests, policies, exclusions): a driver NVIDIA shipped
    /// after this release installs without a new one. Every Job mounts it
    /// read-only and passes it as `--catalog`; the installer refuses it
    /// unless it passes every check of `catalog-check` (every default has a
    /// digest), and every download is still checked against its digest.
    /// Whoever can write that ConfigMap decides which drivers the GPU nodes
    /// load: the admission policy allows only the names its owner lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_config_map: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// Open modules for Turing and newer, proprietary otherwise.
    #[default]
    Auto,
    Open,
    Proprietary,
}

impl Flavor {
    pub fn as_str(self) -> &'static str {
        match self {
            Flavor::Auto => "auto",
            Flavor::Open => "open",
            Flavor::Proprietary => "proprietary",
        }
    }
}

/// One builder image rule. Fields left out match anything; an entry with
/// none is the default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuilderImage {
    /// Garden Linux version, matched by components: `1592` matches
    /// `1592.4` and `1592.4.1`; `1592.4` matches `1592.4.1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub garden_linux_version: Option<String>,
    /// Debian major version (`12`, `13`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debian_version: Option<String>,
    /// Kernel release, exact, or a prefix ending in `*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    pub image: String,
}

/// With a cache, compiling happens in build Jobs: unprivileged, without
/// host access, and the only pods that get the store's write credentials.
/// Install Jobs read the cache (read-only credentials) and check the
/// artifact's sha256 against what the build Job reported.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheSpec {
    /// `s3://bucket/prefix`, `gs://…`, `az://…` or `file:///dir`; passed
    /// to the installer as `--cache-url`.
    pub url: String,
    /// A Secret in the operator's namespace with **read-only** credentials
    /// (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, …): the install Jobs'
    /// environment. Install Jobs never write the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// A Secret in the operator's namespace with credentials that may
    /// write the store: only build Jobs get it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_secret_name: Option<String>,
    /// Allow a plain-http endpoint (trusted networks only).
    #[serde(default)]
    pub allow_http: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildPolicy {
    /// When no build Job could store a node's artifact (or there is no
    /// cache): may the install Job compile on the node itself? `false`:
    /// install Jobs only load what a build Job stored (`--no-compile`).
    #[serde(default = "yes")]
    pub compile_on_node: bool,
    /// Labels a node must carry to run build Jobs (besides
    /// `kubernetes.io/arch`, which always matches the target's). A build
    /// Job holds the cache's write Secret, and a node's kubelet can read
    /// its pods' Secrets: name the nodes you trust with it (the admission
    /// policy requires this when `cache.writeSecretName` is set).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of build Jobs: their own, not `spec.tolerations` (which
    /// let install Jobs onto GPU nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tolerations: Vec<Toleration>,
    /// At most this many build Jobs run at once in the operator's
    /// namespace, whichever GpuDriver started them (0: no limit): each
    /// distinct kernel and every prebuild target is a compile of minutes.
    #[serde(default = "default_build_parallel")]
    pub max_parallel: u32,
    /// May build Jobs run on GPU nodes (NVIDIA PCI label, or selected by
    /// this GpuDriver)? `false`: never on the nodes they serve, so that one
    /// compromised GPU node cannot plant what every other one loads.
    /// `true`: build Jobs also tolerate `startupTaint`, which waits for them.
    #[serde(default)]
    pub allow_gpu_nodes: bool,
    /// CPU and memory of the build Job's installer container. Unset:
    /// requests 1 CPU and 1Gi memory, limit 4Gi memory, no CPU limit; the
    /// build runs as many compilers as the memory limit holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// A `kubernetes.io/tls` Secret in the operator's namespace (`kubectl
    /// create secret tls NAME --cert cert.pem --key key.pem`) whose key
    /// signs every module a build Job builds, for nodes that load only
    /// signed modules (UEFI Secure Boot; its certificate must be enrolled
    /// there). Only build Jobs mount it (read-only: `tls.key`, `tls.crt`),
    /// so it needs `cache`; install Jobs never see the key. Part of the
    /// target key: naming it (or another Secret) builds every target anew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_secret_name: Option<String>,
}

fn default_build_parallel() -> u32 {
    2
}

impl Default for BuildPolicy {
    fn default() -> Self {
        BuildPolicy {
            compile_on_node: true,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            max_parallel: default_build_parallel(),
            allow_gpu_nodes: false,
            resources: None,
            signing_secret_name: None,
        }
    }
}

/// A kernel to build for before any node runs it. Give the Garden Linux
/// version or the Debian version (it picks the builder image and the
/// headers' apt repository) and the kernel release.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrebuildTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub garden_linux_version: Option<String>,
    /// Debian major version (`12`, `13`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debian_version: Option<String>,
    pub kernel_release: String,
    /// `amd64` or `arm64`.
    #[serde(default = "default_arch")]
    pub arch: String,
}

fn default_arch() -> String {
    "amd64".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradePolicy {
    /// At most this many GPU nodes upgrade at once: a number, or a
    /// percentage of the GpuDriver's GPU nodes (`"10%"`, rounded down, at
    /// least 1).
    #[serde(default = "default_max_unavailable")]
    pub max_unavailable: IntOrString,
    /// Evict pods that use `nvidia.com/*` resources through the Eviction
    /// API (PodDisruptionBudgets apply). `false`: only wait for them to end.
    #[serde(default = "yes")]
    pub evict: bool,
    /// Longest wait for a node's GPU pods to go, in seconds (0: no limit).
    /// Past it the node's upgrade fails with `DrainTimeout` and the roll
    /// stops there.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout_seconds: u64,
    /// NVIDIA GPU Operator operands that hold the driver open without
    /// requesting a GPU, taken off an upgrading node through their per-node
    /// deploy label `nvidia.com/gpu.deploy.<name>` (NVIDIA's driver manager
    /// does the same): each label that is `"true"` becomes
    /// `paused-for-driver-upgrade` before the install, the drain waits for
    /// those pods to leave, and the labels go back to `"true"` once the new
    /// driver is verified. Labels with another value are left alone. `[]`:
    /// pause none.
    #[serde(default = "default_gpu_operator_operands")]
    pub gpu_operator_operands: Vec<String>,
    /// Labels of the GPU Operator's container toolkit pods. After a driver
    /// version change the node's toolkit pod is evicted once the driver is
    /// verified, and its DaemonSet starts a new one, which writes a new CDI
    /// specification (it names the driver's versioned library files). `{}`:
    /// restart none.
    #[serde(default = "default_toolkit_pod_labels")]
    pub toolkit_pod_labels: BTreeMap<String, String>,
}

/// The operands NVIDIA's driver manager pauses before it unloads a driver
/// (NVIDIA/k8s-driver-manager @bd62ca7d, cmd/driver-manager/main.go,
/// `evictAllGPUOperatorComponents`), less the container toolkit, which
/// holds no device open and is restarted instead (`toolkitPodLabels`), and
/// the DRA kubelet plugin, which NVIDIA drains last, after its clients;
/// plus the node status exporter, which NVIDIA leaves running although it
/// runs `nvidia-smi` on the host every 60 s (gpu-operator @a22dbf67,
/// cmd/nvidia-validator/metrics.go).
fn default_gpu_operator_operands() -> Vec<String> {
    [
        "operator-validator",
        "device-plugin",
        "gpu-feature-discovery",
        "dcgm-exporter",
        "dcgm",
        "mig-manager",
        "nvsm",
        "sandbox-validator",
        "sandbox-device-plugin",
        "vgpu-device-manager",
        "dra-validator",
        "dcgm-dra",
        "dcgm-exporter-dra",
        "client",
        "node-status-exporter",
    ]
    .map(String::from)
    .to_vec()
}

/// The GPU Operator's toolkit DaemonSet's pod label.
fn default_toolkit_pod_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("app".into(), "nvidia-container-toolkit-daemonset".into())])
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

fn default_drain_timeout() -> u64 {
    600
}

impl Default for UpgradePolicy {
    fn default() -> Self {
        UpgradePolicy {
            max_unavailable: default_max_unavailable(),
            evict: true,
            drain_timeout_seconds: default_drain_timeout(),
            gpu_operator_operands: default_gpu_operator_operands(),
            toolkit_pod_labels: default_toolkit_pod_labels(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSettings {
    /// Pod retries inside one Job (the installer's own deterministic
    /// failures end the Job at once).
    #[serde(default = "default_backoff_limit")]
    pub backoff_limit: i32,
    /// Upper bound on one Job's run time, in seconds.
    #[serde(default = "default_active_deadline")]
    pub active_deadline_seconds: i64,
    /// Finished Jobs are deleted after this many seconds.
    #[serde(default = "default_ttl")]
    pub ttl_seconds_after_finished: i32,
    /// First wait after a failed Job, in seconds; doubles per failure.
    #[serde(default = "default_retry_base")]
    pub retry_base_seconds: u64,
    /// Longest wait between failed Jobs, in seconds.
    #[serde(default = "default_retry_max")]
    pub retry_max_seconds: u64,
    /// CPU and memory of the install Job's installer container. Unset:
    /// requests 250m CPU and 512Mi memory, limit 2Gi memory, no CPU limit
    /// (sized from `scripts/bench-cache`'s measurement, docs/operator.md
    /// "Memory"); a compile on the node runs as many compilers as the
    /// memory limit holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

fn default_backoff_limit() -> i32 {
    2
}
fn default_active_deadline() -> i64 {
    1800
}
fn default_ttl() -> i32 {
    3600
}
fn default_retry_base() -> u64 {
    60
}
fn default_retry_max() -> u64 {
    3600
}

impl Default for JobSettings {
    fn default() -> Self {
        JobSettings {
            backoff_limit: default_backoff_limit(),
            active_deadline_seconds: default_active_deadline(),
            ttl_seconds_after_finished: default_ttl(),
            retry_base_seconds: default_retry_base(),
            retry_max_seconds: default_retry_max(),
            resources: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuDriverStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes the selector matches.
    #[serde(default)]
    pub selected_nodes: u32,
    /// Selected nodes with an NVIDIA GPU (or not yet known not to have one).
    #[serde(default)]
    pub gpu_nodes: u32,
    /// GPU nodes whose driver is installed for their current kernel and boot.
    #[serde(default)]
    pub ready_nodes: u32,
    /// GPU nodes with a Job running.
    #[serde(default)]
    pub installing_nodes: u32,
    /// GPU nodes whose last Job failed (retried with backoff).
    #[serde(default)]
    pub failed_nodes: u32,
    /// Node count by phase.
    #[serde(default)]
    pub phases: BTreeMap<String, u32>,
    /// Per-node summary: nodes that are not Ready first, at most 200.
    #[serde(default)]
    pub nodes: Vec<NodeSummary>,
    /// True when `nodes` was cut at its limit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nodes_truncated: bool,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Every build target: prebuild targets and those of selected GPU
    /// nodes, for the current driver policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetStatus>,
    /// The rolling driver upgrade, when one is under way or stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeStatus>,
}

/// One build target and its artifact.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetStatus {
    /// The target's key (OS, kernel, arch, driver policy, flavor).
    pub key: String,
    /// `Garden Linux 1877.3` or `Debian GNU/Linux 12`.
    pub os_image: String,
    pub kernel_release: String,
    pub arch: String,
    /// Pending, Building, Cached or Failed.
    #[schemars(with = "String")]
    pub phase: BuildPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The stored artifact's sha256, from the build Job's result: install
    /// Jobs refuse any other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_sha256: Option<String>,
    /// The store entry holding it (the build Job's `status.built.cacheKey`):
    /// install Jobs read it directly (`--cache-entry`), without headers or a
    /// compiler of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_entry: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Failed build attempts (the next waits, doubling from
    /// `job.retryBaseSeconds`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<String>,
    /// Selected nodes that run this target now.
    #[serde(default)]
    pub nodes: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// The most nodes upgrading at once (maxUnavailable resolved).
    pub max_unavailable: u32,
    /// Nodes still on an older driver policy (waiting or upgrading).
    pub pending_nodes: u32,
    /// Nodes cordoned and draining or installing now.
    pub in_progress: Vec<String>,
    /// The node the roll stopped at, with why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    pub name: String,
    #[schemars(with = "String")]
    pub phase: NodePhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The node's driver upgrade state: Waiting, Draining, Installing or
    /// Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub upgrade: Option<UpgradeState>,
}

str_enum! {
    /// Where a build target's artifact stands (`status.targets[].phase`).
    #[derive(Default)]
    pub enum BuildPhase {
        #[default]
        Pending = "Pending",
        Building = "Building",
        Cached = "Cached",
        Failed = "Failed",
    }
}

str_enum! {
    /// A selected node's phase (`status.nodes[].phase`, the keys of
    /// `status.phases`, the nodes gauge's label).
    #[derive(Default)]
    pub enum NodePhase {
        NoGpu = "NoGpu",
        Ready = "Ready",
        Detecting = "Detecting",
        #[default]
        Pending = "Pending",
        Installing = "Installing",
        Failed = "Failed",
        NoBuilderImage = "NoBuilderImage",
    }
}

/// The CRD as YAML, as committed in `deploy/crd.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let header =
        "# Generated by `gpu-driver-operator crd` from crates/operator/src/crd.rs; do not edit.\n";
    Ok(format!(
        "{header}{}",
        serde_yaml::to_string(&GpuDriver::crd())?
    ))
}

str_enum! {
    /// The node's upgrade state: its annotation's value, and
    /// `status.nodes[].upgrade` (where Idle reads Waiting; the annotation
    /// is never written so).
    pub enum UpgradeState {
        /// Not started (waiting for a slot, or no upgrade).
        Idle = "Waiting",
        Draining = "Draining",
        Installing = "Installing",
        Failed = "Failed",
    }
}
