//! Where things are in a Job's pod: the installer, the catalog and the
//! signing Secret's files; and the pods' ServiceAccount.

/// Where the init container puts the installer inside the pod.
pub(super) const INSTALLER_DIR: &str = "/opt/gpu-driver";
pub(super) const INSTALLER_PATH: &str = "/opt/gpu-driver/gpu-driver-installer";
/// The installer's path in the installer image (scratch).
pub(super) const INSTALLER_IN_IMAGE: &str = "/gpu-driver-installer";
/// The Job pods' ServiceAccount: no RBAC bindings, token not mounted.
pub(super) const SERVICE_ACCOUNT: &str = "gpu-driver-installer";
/// Where a GpuDriver's catalog ConfigMap is mounted in its Jobs.
pub(super) const CATALOG_DIR: &str = "/etc/gpu-driver/catalog";
/// The ConfigMap's key, and the file it becomes.
pub(super) const CATALOG_KEY: &str = "catalog.toml";
/// Where a build Job mounts `build.signingSecretName` (a tls Secret).
pub(super) const SIGNING_DIR: &str = "/run/gpu-driver/signing";
/// The tls Secret's keys, and the files they become.
pub(super) const SIGNING_KEY: &str = "tls.key";
pub(super) const SIGNING_CERT: &str = "tls.crt";
