//! The Jobs the operator creates. One pod per Job, pinned to its node with
//! `nodeName` (no scheduler decision, and no DaemonSet per kernel):
//!
//! - init container `copy-installer` (installer image, unprivileged): the
//!   static installer copies itself into an emptyDir;
//! - container `installer` (the node's builder image: headers and the
//!   kernel's compiler): `gpu-driver-installer run` on the host through
//!   `/proc/1/root` (hostPID), privileged because it loads kernel modules
//!   and makes device nodes. It needs no other mount and no API access.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvFromSource, PodSpec, PodTemplateSpec,
    SecretEnvSource, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use super::crd::GpuDriver;
use super::decide::JobRole;
use super::keys;
use super::outcome::MAIN_CONTAINER;
use crate::report::Reason;

/// Where the init container puts the installer inside the pod.
pub const INSTALLER_DIR: &str = "/opt/gpu-driver";
pub const INSTALLER_PATH: &str = "/opt/gpu-driver/gpu-driver-installer";
/// The installer's path in the installer image (scratch).
pub const INSTALLER_IN_IMAGE: &str = "/gpu-driver-installer";
/// The Job pods' ServiceAccount: no RBAC bindings, token not mounted.
pub const SERVICE_ACCOUNT: &str = "gpu-driver-installer";

/// What the controller decided to run.
#[derive(Debug, Clone)]
pub struct JobRequest<'a> {
    pub role: JobRole,
    pub name: &'a str,
    pub namespace: &'a str,
    pub node: &'a str,
    /// The builder image (install) or the installer image (detect).
    pub image: &'a str,
    /// The desired-state key, recorded on the Job for humans.
    pub key: &'a str,
}

fn owner(gd: &GpuDriver) -> Option<OwnerReference> {
    // Cluster-scoped owner of namespaced Jobs: allowed, and deleting the
    // GpuDriver garbage-collects its Jobs.
    gd.controller_owner_ref(&())
}

/// Exit codes of the installer's reasons that a retry in the same Job
/// cannot fix (usage, host, resolve, build, install, verify): the Job
/// fails at once and the operator's own backoff decides. Fetch errors
/// (12) and Internal (1) are retried within `backoffLimit`; NoGpu (3)
/// ends the Job too (nothing to do).
fn fail_job_codes() -> Vec<i32> {
    let mut codes: Vec<i32> = Reason::ALL
        .iter()
        .map(|r| i32::from(r.exit_code()))
        .filter(|c| ![0, 1, 12].contains(c))
        .collect();
    codes.sort_unstable();
    codes.dedup();
    codes
}

pub fn installer_args(gd: &GpuDriver, role: JobRole) -> Vec<String> {
    let mut args = vec![
        "--host-root".to_string(),
        "/proc/1/root".to_string(),
        "--log-level".to_string(),
        "info".to_string(),
    ];
    match role {
        JobRole::Detect => args.push("detect".into()),
        JobRole::Install => {
            args.push("run".into());
            let spec = &gd.spec;
            args.extend(["--flavor".into(), spec.driver.flavor.as_str().into()]);
            if let Some(v) = &spec.driver.version {
                args.extend(["--driver-version".into(), v.clone()]);
            }
            if let Some(c) = &spec.cache {
                args.extend(["--cache-url".into(), c.url.clone()]);
                if c.allow_http {
                    args.push("--allow-http".into());
                }
            }
            args.extend(spec.extra_args.iter().cloned());
        }
    }
    args
}

pub fn build(gd: &GpuDriver, req: &JobRequest<'_>) -> Job {
    let labels = labels(gd, req.role);
    let annotations = BTreeMap::from([
        (keys::NODE.to_string(), req.node.to_string()),
        (keys::KEY.to_string(), req.key.to_string()),
    ]);
    let mut pod_annotations = gd.spec.pod_annotations.clone();
    pod_annotations.extend(annotations.clone());
    Job {
        metadata: ObjectMeta {
            name: Some(req.name.to_string()),
            namespace: Some(req.namespace.to_string()),
            labels: Some(labels.clone()),
            annotations: Some(annotations),
            owner_references: owner(gd).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(pod_spec(gd, req)),
            },
            ..job_limits(gd, req.role)
        }),
        status: None,
    }
}

/// The labels of the Job and its pod: managed-by, role, name, and the
/// owning GpuDriver where its name fits a label value.
fn labels(gd: &GpuDriver, role: JobRole) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (
            keys::MANAGED_BY_LABEL.to_string(),
            keys::MANAGED_BY.to_string(),
        ),
        (keys::ROLE_LABEL.to_string(), role.as_str().to_string()),
        (
            "app.kubernetes.io/name".to_string(),
            "gpu-driver-installer".to_string(),
        ),
    ]);
    if let Some(n) = gd.metadata.name.as_ref().filter(|n| n.len() <= 63) {
        labels.insert(keys::OWNER_LABEL.to_string(), n.clone());
    }
    labels
}

/// Retries, deadlines, cleanup and the pod failure policy; the template is
/// the caller's.
fn job_limits(gd: &GpuDriver, role: JobRole) -> JobSpec {
    let settings = &gd.spec.job;
    JobSpec {
        backoff_limit: Some(match role {
            JobRole::Install => settings.backoff_limit,
            JobRole::Detect => 1,
        }),
        active_deadline_seconds: Some(match role {
            JobRole::Install => settings.active_deadline_seconds,
            JobRole::Detect => 300,
        }),
        ttl_seconds_after_finished: Some(settings.ttl_seconds_after_finished),
        pod_failure_policy: Some(pod_failure_policy()),
        ..Default::default()
    }
}

fn pod_failure_policy() -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: "FailJob".into(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some(MAIN_CONTAINER.into()),
                    operator: "In".into(),
                    values: fail_job_codes(),
                }),
                ..Default::default()
            },
            // A drained or preempted node is not the Job's fault.
            PodFailurePolicyRule {
                action: "Ignore".into(),
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: "True".into(),
                }]),
                ..Default::default()
            },
        ],
    }
}

/// The emptyDir the init container fills and the installer runs from.
const VOLUME: &str = "installer";

fn pod_spec(gd: &GpuDriver, req: &JobRequest<'_>) -> PodSpec {
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
        volumes: Some(vec![Volume {
            name: VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }]),
        ..Default::default()
    }
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
            run_as_non_root: Some(true),
            run_as_user: Some(65534),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
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
        args: Some(installer_args(gd, req.role)),
        env_from: cache_credentials(gd, req.role),
        volume_mounts: Some(vec![VolumeMount {
            name: VOLUME.into(),
            mount_path: INSTALLER_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        // finit_module, mknod and /dev/kmsg need it; detect only reads
        // /proc/1/root, which hostPID and root already allow.
        security_context: Some(SecurityContext {
            privileged: Some(req.role == JobRole::Install),
            ..Default::default()
        }),
        termination_message_path: Some("/dev/termination-log".into()),
        // The installer writes its result there; if it crashed before that,
        // the log tail is the next best thing.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// The cache's credentials Secret as environment, for install Jobs only
/// (detect never touches the cache).
fn cache_credentials(gd: &GpuDriver, role: JobRole) -> Option<Vec<EnvFromSource>> {
    gd.spec
        .cache
        .as_ref()
        .and_then(|c| c.secret_name.clone())
        .filter(|_| role == JobRole::Install)
        .map(|name| {
            vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name,
                    optional: Some(false),
                }),
                ..Default::default()
            }]
        })
}

/// The node's plan is not an install Job (no GPU, no builder image, …):
/// nothing for `job-template` to print.
#[derive(Debug, thiserror::Error)]
#[error("no install Job for that node: {0:?}")]
pub struct NoInstallJob(pub super::decide::Plan);

/// The install Job for a made-up GPU node: what `deploy/job-template.yaml`
/// shows.
pub fn example(
    gd: &GpuDriver,
    node: &str,
    os_image: &str,
    kernel: &str,
    namespace: &str,
) -> Result<Job, NoInstallJob> {
    let facts = super::decide::NodeFacts {
        name: node.to_string(),
        kernel: kernel.to_string(),
        os_image: os_image.to_string(),
        boot_id: "00000000-0000-0000-0000-000000000000".to_string(),
        arch: "amd64".to_string(),
        labels: [(keys::NFD_NVIDIA_LABEL.to_string(), "true".to_string())].into(),
        ..Default::default()
    };
    match super::decide::plan(&gd.spec, &facts, 0) {
        super::decide::Plan::Install {
            job, image, key, ..
        } => Ok(build(
            gd,
            &JobRequest {
                role: JobRole::Install,
                name: &job,
                namespace,
                node,
                image: &image,
                key: &key,
            },
        )),
        other => Err(NoInstallJob(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::crd::{CacheSpec, GpuDriverSpec};

    fn gd() -> GpuDriver {
        let mut gd = GpuDriver::new(
            "default",
            serde_json::from_value::<GpuDriverSpec>(serde_json::json!({
                "builderImages": [{"image": "builder:1"}],
                "installerImage": "installer:1",
                "startupTaint": "gpu-driver.gardenlinux.io/not-ready",
                "driver": {"version": "580.95.05", "flavor": "open"}
            }))
            .unwrap(),
        );
        gd.metadata.uid = Some("uid-1".into());
        gd
    }

    #[test]
    fn the_install_job_is_pinned_privileged_only_where_needed_and_owned() {
        let mut g = gd();
        g.spec.cache = Some(CacheSpec {
            url: "s3://bucket/gpu".into(),
            secret_name: Some("cache-creds".into()),
            allow_http: true,
        });
        let job = build(
            &g,
            &JobRequest {
                role: JobRole::Install,
                name: "gpu-install-n1-abc",
                namespace: "gpu-driver",
                node: "n1",
                image: "builder:1",
                key: "k",
            },
        );
        let spec = job.spec.as_ref().unwrap();
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.node_name.as_deref(), Some("n1"));
        assert_eq!(pod.host_pid, Some(true));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let init = &pod.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            init.security_context.as_ref().unwrap().run_as_non_root,
            Some(true)
        );
        assert_eq!(init.image.as_deref(), Some("installer:1"));
        let main = &pod.containers[0];
        assert_eq!(main.image.as_deref(), Some("builder:1"));
        assert_eq!(
            main.security_context.as_ref().unwrap().privileged,
            Some(true)
        );
        let args = main.args.as_ref().unwrap().join(" ");
        assert!(
            args.contains("--host-root /proc/1/root --log-level info run --flavor open --driver-version 580.95.05 --cache-url s3://bucket/gpu --allow-http"),
            "{args}"
        );
        assert!(main.env_from.is_some());
        // Only the emptyDir: no hostPath.
        assert!(
            pod.volumes
                .as_ref()
                .unwrap()
                .iter()
                .all(|v| v.host_path.is_none())
        );
        let o = &job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((o.kind.as_str(), o.uid.as_str()), ("GpuDriver", "uid-1"));
        assert!(spec.backoff_limit.is_some());
        assert!(spec.active_deadline_seconds.is_some());
        assert!(spec.ttl_seconds_after_finished.is_some());
        let codes = &spec.pod_failure_policy.as_ref().unwrap().rules[0]
            .on_exit_codes
            .as_ref()
            .unwrap()
            .values;
        assert!(codes.contains(&3) && codes.contains(&13) && !codes.contains(&12));
        assert!(
            pod.tolerations
                .as_ref()
                .unwrap()
                .iter()
                .any(|t| t.key.as_deref() == Some("gpu-driver.gardenlinux.io/not-ready"))
        );
    }

    #[test]
    fn the_detect_job_is_not_privileged() {
        let job = build(
            &gd(),
            &JobRequest {
                role: JobRole::Detect,
                name: "gpu-detect-n1-abc",
                namespace: "gpu-driver",
                node: "n1",
                image: "installer:1",
                key: "boot",
            },
        );
        let pod = job.spec.unwrap().template.spec.unwrap();
        let main = &pod.containers[0];
        assert_eq!(
            main.security_context.as_ref().unwrap().privileged,
            Some(false)
        );
        assert!(
            main.args
                .as_ref()
                .unwrap()
                .ends_with(&["detect".to_string()])
        );
    }
}
