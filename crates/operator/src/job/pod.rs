//! The Job pods: the privileged install/detect pod pinned to its node,
//! and the unprivileged, scheduled build pod.

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvFromSource,
    KeyToPath, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, SecretEnvSource,
    SecretVolumeSource, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::args::installer_args;
use super::layout::{
    CATALOG_DIR, CATALOG_KEY, INSTALLER_DIR, INSTALLER_IN_IMAGE, INSTALLER_PATH, SERVICE_ACCOUNT,
    SIGNING_CERT, SIGNING_DIR, SIGNING_KEY,
};
use super::request::JobRequest;
use crate::crd::GpuDriver;
use crate::decide::JobRole;
use crate::outcome::MAIN_CONTAINER;

/// The emptyDir the init container fills and the installer runs from.
const VOLUME: &str = "installer";

pub(super) fn pod_spec(gd: &GpuDriver, req: &JobRequest<'_>) -> PodSpec {
    if req.role == JobRole::Build {
        return build_pod_spec(gd, req);
    }
    let spec = &gd.spec;
    PodSpec {
        node_name: Some(req.node.to_string()),
        host_pid: Some(true),
        restart_policy: Some("Never".into()),
        service_account_name: Some(SERVICE_ACCOUNT.into()),
        automount_service_account_token: Some(false),
        priority_class_name: Some("system-node-critical".into()),
        tolerations: Some(tolerations(gd)),
        image_pull_secrets: (!spec.image_pull_secrets.is_empty())
            .then(|| spec.image_pull_secrets.clone()),
        init_containers: Some(vec![copy_container(gd)]),
        containers: vec![installer_container(gd, req)],
        volumes: Some(with_catalog(
            gd,
            vec![Volume {
                name: VOLUME.into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            }],
        )),
        ..Default::default()
    }
}

const CATALOG_VOLUME: &str = "catalog";

/// `volumes` and the GpuDriver's catalog ConfigMap, when it names one
/// (only its `catalog.toml` key becomes a file).
fn with_catalog(gd: &GpuDriver, mut volumes: Vec<Volume>) -> Vec<Volume> {
    if let Some(name) = &gd.spec.driver.catalog_config_map {
        volumes.push(Volume {
            name: CATALOG_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: name.clone(),
                items: Some(vec![KeyToPath {
                    key: CATALOG_KEY.into(),
                    path: CATALOG_KEY.into(),
                    mode: None,
                }]),
                optional: Some(false),
                default_mode: None,
            }),
            ..Default::default()
        });
    }
    volumes
}

/// `mounts` and the catalog's, read-only, when the GpuDriver names one.
fn with_catalog_mount(gd: &GpuDriver, mut mounts: Vec<VolumeMount>) -> Vec<VolumeMount> {
    if gd.spec.driver.catalog_config_map.is_some() {
        mounts.push(VolumeMount {
            name: CATALOG_VOLUME.into(),
            mount_path: CATALOG_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    mounts
}

const SIGNING_VOLUME: &str = "signing";

/// A build pod's `volumes` and the signing Secret, when the GpuDriver
/// names one: its key and certificate only, mode 0400 (the kubelet makes
/// it 0440 for the pod's fsGroup, the build user's own group, which is
/// how that user reads it). Install and detect pods never call this.
fn with_signing(gd: &GpuDriver, mut volumes: Vec<Volume>) -> Vec<Volume> {
    if let Some(name) = &gd.spec.build.signing_secret_name {
        let item = |key: &str| KeyToPath {
            key: key.into(),
            path: key.into(),
            mode: None,
        };
        volumes.push(Volume {
            name: SIGNING_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(name.clone()),
                items: Some(vec![item(SIGNING_KEY), item(SIGNING_CERT)]),
                default_mode: Some(0o400),
                optional: Some(false),
            }),
            ..Default::default()
        });
    }
    volumes
}

/// A build container's `mounts` and the signing Secret's, read-only.
fn with_signing_mount(gd: &GpuDriver, mut mounts: Vec<VolumeMount>) -> Vec<VolumeMount> {
    if gd.spec.build.signing_secret_name.is_some() {
        mounts.push(VolumeMount {
            name: SIGNING_VOLUME.into(),
            mount_path: SIGNING_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    mounts
}

/// Where `prebuild` keeps the package, the headers and the build tree:
/// the build pod's root filesystem is read-only.
const BUILD_CACHE_DIR: &str = "/var/cache/gpu-driver";
const BUILD_SCRATCH: &str = "scratch";
const BUILD_TMP: &str = "tmp";
/// nobody: the build needs no privilege at all.
const BUILD_UID: i64 = 65534;

/// A build Job's pod: scheduled (no nodeName) onto a node of the target's
/// architecture, no hostPID, no host mount, not privileged, non-root with
/// every capability dropped; the installer is copied in as for installs.
fn build_pod_spec(gd: &GpuDriver, req: &JobRequest<'_>) -> PodSpec {
    let spec = &gd.spec;
    let mut node_selector = spec.build.node_selector.clone();
    if let Some(t) = req.target {
        node_selector.insert("kubernetes.io/arch".into(), t.arch.clone());
    }
    let main = Container {
        name: MAIN_CONTAINER.into(),
        image: Some(req.image.to_string()),
        command: Some(vec![INSTALLER_PATH.into()]),
        args: Some(installer_args(gd, req)),
        env_from: secret_env(
            spec.cache
                .as_ref()
                .and_then(|c| c.write_secret_name.clone()),
        ),
        volume_mounts: Some(build_mounts(gd)),
        security_context: Some(unprivileged()),
        resources: Some(
            spec.build
                .resources
                .clone()
                .unwrap_or_else(|| BUILD_RESOURCES.get()),
        ),
        termination_message_path: Some("/dev/termination-log".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    PodSpec {
        node_selector: Some(node_selector),
        host_pid: Some(false),
        restart_policy: Some("Never".into()),
        service_account_name: Some(SERVICE_ACCOUNT.into()),
        automount_service_account_token: Some(false),
        tolerations: build_tolerations(spec),
        affinity: (!spec.build.allow_gpu_nodes).then(|| off_gpu_nodes(gd)),
        image_pull_secrets: (!spec.image_pull_secrets.is_empty())
            .then(|| spec.image_pull_secrets.clone()),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(BUILD_UID),
            run_as_group: Some(BUILD_UID),
            fs_group: Some(BUILD_UID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        init_containers: Some(vec![copy_container(gd)]),
        containers: vec![main],
        volumes: Some(build_volumes(gd)),
        ..Default::default()
    }
}

/// A build pod's volumes: the installer's, the build's scratch and /tmp
/// (the root filesystem is read-only), the catalog and the signing Secret
/// where the GpuDriver names them.
fn build_volumes(gd: &GpuDriver) -> Vec<Volume> {
    let empty = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let volumes = vec![empty(VOLUME), empty(BUILD_SCRATCH), empty(BUILD_TMP)];
    with_signing(gd, with_catalog(gd, volumes))
}

/// The build container's mounts of [`build_volumes`].
fn build_mounts(gd: &GpuDriver) -> Vec<VolumeMount> {
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..Default::default()
    };
    let mounts = vec![
        mount(VOLUME, INSTALLER_DIR, true),
        mount(BUILD_SCRATCH, BUILD_CACHE_DIR, false),
        mount(BUILD_TMP, "/tmp", false),
    ];
    with_signing_mount(gd, with_catalog_mount(gd, mounts))
}

/// Keeps a build pod off the GPU nodes it serves: no node with NVIDIA's
/// PCI label (Node Feature Discovery), and none that this GpuDriver's
/// nodeSelector picks. A build Job holds the write Secret; a kubelet can
/// read its pods' Secrets, so a node that loads the artifacts must not be
/// one that can write them. Terms are ORed, so "not all of the selector's
/// labels" is one term per label, each also off NVIDIA nodes.
fn off_gpu_nodes(gd: &GpuDriver) -> Affinity {
    let not = |key: &str, value: &str| NodeSelectorRequirement {
        key: key.into(),
        operator: "NotIn".into(),
        values: Some(vec![value.into()]),
    };
    let no_nvidia = not(crate::keys::NFD_NVIDIA_LABEL, "true");
    let mut terms: Vec<NodeSelectorTerm> = gd
        .spec
        .node_selector
        .iter()
        .map(|(k, v)| NodeSelectorTerm {
            match_expressions: Some(vec![no_nvidia.clone(), not(k, v)]),
            ..Default::default()
        })
        .collect();
    if terms.is_empty() {
        terms.push(NodeSelectorTerm {
            match_expressions: Some(vec![no_nvidia]),
            ..Default::default()
        });
    }
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Non-root, no privilege escalation, no capability, read-only root.
fn unprivileged() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(BUILD_UID),
        privileged: Some(false),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A build Job's tolerations: the owner's `build.tolerations`, plus the
/// startup taint where builds may run on GPU nodes. That taint waits for
/// the build; a build that cannot land on a tainted GPU node (the only
/// nodes of a one-pool cluster) would wait for the taint, forever.
fn build_tolerations(spec: &crate::crd::GpuDriverSpec) -> Option<Vec<Toleration>> {
    let mut tolerations = spec.build.tolerations.clone();
    if let (true, Some(t)) = (spec.build.allow_gpu_nodes, &spec.startup_taint) {
        tolerations.push(Toleration {
            key: Some(t.clone()),
            operator: Some("Exists".into()),
            ..Default::default()
        });
    }
    (!tolerations.is_empty()).then_some(tolerations)
}

fn tolerations(gd: &GpuDriver) -> Vec<Toleration> {
    let spec = &gd.spec;
    let mut tolerations: Vec<Toleration> = spec.tolerations.clone();
    if let Some(t) = &spec.startup_taint {
        tolerations.push(Toleration {
            key: Some(t.clone()),
            operator: Some("Exists".into()),
            ..Default::default()
        });
    }
    // The node is not "ready" for GPU workloads yet; the Job must run there
    // anyway, and a NoExecute taint must not evict it half-way.
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        tolerations.push(Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            ..Default::default()
        });
    }
    tolerations
}

/// Init container `copy-installer`: the static installer copies itself
/// from the installer image into the emptyDir, unprivileged.
fn copy_container(gd: &GpuDriver) -> Container {
    Container {
        name: "copy-installer".into(),
        image: Some(gd.spec.installer_image.clone()),
        command: Some(vec![
            INSTALLER_IN_IMAGE.into(),
            "copy-self".into(),
            INSTALLER_PATH.into(),
        ]),
        volume_mounts: Some(vec![VolumeMount {
            name: VOLUME.into(),
            mount_path: INSTALLER_DIR.into(),
            ..Default::default()
        }]),
        security_context: Some(SecurityContext {
            privileged: None,
            ..unprivileged()
        }),
        resources: Some(COPY_RESOURCES.get()),
        ..Default::default()
    }
}

/// Container `installer`: the copied installer in the job's image (the
/// builder image for install, the installer image for detect).
fn installer_container(gd: &GpuDriver, req: &JobRequest<'_>) -> Container {
    Container {
        name: MAIN_CONTAINER.into(),
        image: Some(req.image.to_string()),
        command: Some(vec![INSTALLER_PATH.into()]),
        args: Some(installer_args(gd, req)),
        env_from: cache_credentials(gd, req),
        volume_mounts: Some(with_catalog_mount(
            gd,
            vec![VolumeMount {
                name: VOLUME.into(),
                mount_path: INSTALLER_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            }],
        )),
        // finit_module, mknod and /dev/kmsg need it; detect only reads
        // /proc/1/root, which hostPID and root already allow.
        security_context: Some(SecurityContext {
            privileged: Some(req.role == JobRole::Install),
            // Root for an install whatever the image's USER: the installer
            // image runs as nobody by default.
            run_as_user: (req.role == JobRole::Install).then_some(0),
            ..Default::default()
        }),
        resources: Some(match req.role {
            JobRole::Detect => DETECT_RESOURCES.get(),
            _ => gd
                .spec
                .job
                .resources
                .clone()
                .unwrap_or_else(|| INSTALL_RESOURCES.get()),
        }),
        termination_message_path: Some("/dev/termination-log".into()),
        // The installer writes its result there; if it crashed before that,
        // the log tail is the next best thing.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// The cache's read-only credentials Secret as environment, for install
/// Jobs that use the cache (pinned to a build Job's digest) only: detect
/// never touches the cache, build Jobs get the write Secret instead.
fn cache_credentials(gd: &GpuDriver, req: &JobRequest<'_>) -> Option<Vec<EnvFromSource>> {
    secret_env(
        gd.spec
            .cache
            .as_ref()
            .and_then(|c| c.secret_name.clone())
            .filter(|_| req.role == JobRole::Install && req.expect_sha256.is_some()),
    )
}

fn secret_env(name: Option<String>) -> Option<Vec<EnvFromSource>> {
    name.map(|name| {
        vec![EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name,
                optional: Some(false),
            }),
            ..Default::default()
        }]
    })
}

/// A container's default requests and limits. No CPU limit: a compile
/// throttled by CFS quota only takes longer, and the installer sizes its
/// `-j` by the memory limit (`build::default_jobs`).
struct Resources {
    cpu: &'static str,
    memory: &'static str,
    memory_limit: &'static str,
}

impl Resources {
    fn get(&self) -> ResourceRequirements {
        let q = |s: &str| Quantity(s.to_string());
        ResourceRequirements {
            requests: Some(
                [("cpu", self.cpu), ("memory", self.memory)]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), q(v)))
                    .collect(),
            ),
            limits: Some([("memory".to_string(), q(self.memory_limit))].into()),
            ..Default::default()
        }
    }
}

// Sized from `scripts/bench-cache` (docs/operator.md, "Memory"): a cache
// hit peaks at a few MiB of anonymous memory; a compile at 295 MiB with one
// compiler, 850 MiB with eight. The installer counts 320 MiB plus 128 MiB
// per compiler, so an install Job's limit holds a compile on the node at
// -j13 and a build Job's at -j29.
const INSTALL_RESOURCES: Resources = Resources {
    cpu: "250m",
    memory: "512Mi",
    memory_limit: "2Gi",
};
const BUILD_RESOURCES: Resources = Resources {
    cpu: "1",
    memory: "1Gi",
    memory_limit: "4Gi",
};
/// `detect` reads a few host files.
const DETECT_RESOURCES: Resources = Resources {
    cpu: "10m",
    memory: "32Mi",
    memory_limit: "128Mi",
};
/// `copy-self` copies one 20 MB file.
const COPY_RESOURCES: Resources = Resources {
    cpu: "10m",
    memory: "16Mi",
    memory_limit: "64Mi",
};
