//! The label and annotation keys the operator reads and writes on nodes,
//! Jobs and pods: one list, so that the controller, the decisions and the
//! Job builder name each key alike.

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
