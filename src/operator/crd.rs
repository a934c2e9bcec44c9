//! The `GpuDriver` custom resource: which nodes get which driver, built in
//! which image. Cluster-scoped, because it selects nodes (cluster-scoped
//! themselves); the Jobs it owns live in the operator's namespace.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LocalObjectReference, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
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
    /// Added to every Job pod (the nodes' own taints must be tolerated).
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// Pull secrets for the builder and installer images.
    #[serde(default)]
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
    pub extra_args: Vec<String>,
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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheSpec {
    /// `s3://bucket/prefix`, `gs://…`, `az://…` or `file:///dir`; passed
    /// to the installer as `--cache-url`.
    pub url: String,
    /// A Secret in the operator's namespace whose keys become the Job's
    /// environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Allow a plain-http endpoint (trusted networks only).
    #[serde(default)]
    pub allow_http: bool,
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
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    pub name: String,
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The CRD as YAML, as committed in `deploy/crd.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let header =
        "# Generated by `gpu-driver-operator crd` from src/operator/crd.rs; do not edit.\n";
    Ok(format!(
        "{header}{}",
        serde_yaml::to_string(&GpuDriver::crd())?
    ))
}
