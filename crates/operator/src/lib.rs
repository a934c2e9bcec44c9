//! `gpu-driver-operator`: watches GPU nodes and runs one short-lived
//! installer Job per node and (kernel, boot, driver, flavor), then marks the
//! node. No DaemonSet and no long-running privileged pod.
//!
//! - [`crd`]: the `GpuDriver` resource;
//! - [`decide`]: pure decisions (OS and kernel, builder image, Job name,
//!   backoff), unit-tested;
//! - [`job`]: the Job objects;
//! - [`outcome`]: reading a Job pod's termination message (the installer's
//!   own result documents);
//! - [`controller`]: the watch-based reconciler;
//! - [`status`], [`metrics`], [`leader`]; [`cli`]: the binary's commands.
//!
//! The benchmark's polling baseline is not here: it lives with the
//! benchmark (`crates/operator/examples/bench_operator/naive.rs`).

/// An enum whose values are fixed strings on the wire (a status field, an
/// annotation value): serde, `as_str` and `parse` from one list, so the
/// strings stay exactly as they were.
macro_rules! str_enum {
    ($(#[$m:meta])* $vis:vis enum $name:ident {
        $($(#[$vm:meta])* $var:ident = $s:literal),+ $(,)?
    }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        $vis enum $name {
            $($(#[$vm])* #[serde(rename = $s)] $var),+
        }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$var => $s),+
                }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($s => Some($name::$var),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod cli;
pub mod controller;
pub mod crd;
pub mod decide;
pub mod job;
pub mod leader;
pub mod metrics;
pub mod outcome;
pub(crate) mod status;

/// Installs ring as the process's rustls provider, once: kube's client looks
/// the default up when it is built, and no other provider is compiled in
/// (no aws-lc-rs). Idempotent.
pub fn init_tls() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err only means another thread installed one first: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The operator's API client: kube's defaults, except that it does not
/// retry 429, 503 and 504 by itself. kube's default policy (15 tries, backoff
/// up to 1000 s) turned one eviction that a PodDisruptionBudget refuses
/// (429, at once) into minutes of blocking, past `drainTimeoutSeconds`.
/// Every reconcile requeues on its own, so a refusal or a busy apiserver
/// comes back to it at once.
pub async fn connect() -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    client(config)
}

/// [`connect`]'s client for a given configuration.
pub fn client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    init_tls();
    config.default_retry = false;
    kube::Client::try_from(config)
}

/// Node labels and annotations the operator reads and writes.
pub mod keys {
    /// Node Feature Discovery: a PCI device of vendor 0x10de (NVIDIA).
    pub const NFD_NVIDIA_LABEL: &str = "feature.node.kubernetes.io/pci-10de.present";
    pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

    /// `true` once the driver is installed for the node's current kernel
    /// and boot; removed on failure and before a reinstall.
    pub const READY_LABEL: &str = "gpu-driver.gardenlinux.io/ready";

    /// The node's [`crate::decide::NodeState`].
    pub const STATE: &str = "gpu-driver.gardenlinux.io/state";
    /// The desired-state key the installation is for (kernel, OS image,
    /// boot id, driver policy, flavor).
    pub const KEY: &str = "gpu-driver.gardenlinux.io/key";
    pub const DRIVER_VERSION: &str = "gpu-driver.gardenlinux.io/driver-version";
    pub const FLAVOR: &str = "gpu-driver.gardenlinux.io/flavor";
    pub const KERNEL: &str = "gpu-driver.gardenlinux.io/kernel";
    pub const BOOT_ID: &str = "gpu-driver.gardenlinux.io/boot-id";
    pub const OS_IMAGE: &str = "gpu-driver.gardenlinux.io/os-image";
    pub const INSTALLED_AT: &str = "gpu-driver.gardenlinux.io/installed-at";
    pub const JOB: &str = "gpu-driver.gardenlinux.io/job";
    /// The detect Job's answer: `true` or `false`.
    pub const GPU: &str = "gpu-driver.gardenlinux.io/gpu";

    pub const FAILURES: &str = "gpu-driver.gardenlinux.io/failures";
    pub const FAILURE_KEY: &str = "gpu-driver.gardenlinux.io/failure-key";
    pub const FAILED_AT: &str = "gpu-driver.gardenlinux.io/failed-at";
    pub const FAILURE_REASON: &str = "gpu-driver.gardenlinux.io/failure-reason";
    pub const FAILURE_MESSAGE: &str = "gpu-driver.gardenlinux.io/failure-message";

    /// A driver upgrade in progress on the node
    /// ([`crate::decide::UpgradeState`]): Draining, Installing or Failed
    /// (absent: none, or waiting for a slot).
    pub const UPGRADE: &str = "gpu-driver.gardenlinux.io/upgrade";
    /// When the node's upgrade started draining (RFC 3339).
    pub const UPGRADE_STARTED: &str = "gpu-driver.gardenlinux.io/upgrade-started-at";
    /// `true` when the operator cordoned the node for the upgrade (and so
    /// uncordons it after); a node cordoned by someone else stays so.
    pub const UPGRADE_CORDONED: &str = "gpu-driver.gardenlinux.io/upgrade-cordoned";

    /// The GPU Operator operands this node's upgrade paused (comma
    /// separated names, `dcgm-exporter,gpu-feature-discovery`): their
    /// deploy labels go back to `true` when the upgrade ends.
    pub const PAUSED_OPERANDS: &str = "gpu-driver.gardenlinux.io/paused-operands";
    /// The GPU Operator's per-node deploy label of an operand is this
    /// prefix and the operand's name; its DaemonSets select `"true"`.
    pub const DEPLOY_LABEL_PREFIX: &str = "nvidia.com/gpu.deploy.";

    /// On build Jobs and their pods: the target key they build.
    pub const TARGET: &str = "gpu-driver.gardenlinux.io/target";

    /// On Jobs and their pods: the node they serve (names can exceed a
    /// label value's 63 characters, so it is an annotation).
    pub const NODE: &str = "gpu-driver.gardenlinux.io/node";
    /// On Jobs and pods: install, detect or build.
    pub const ROLE_LABEL: &str = "gpu-driver.gardenlinux.io/role";
    pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
    pub const MANAGED_BY: &str = "gpu-driver-operator";
    /// On Jobs: the GpuDriver they belong to.
    pub const OWNER_LABEL: &str = "gpu-driver.gardenlinux.io/gpudriver";
}
