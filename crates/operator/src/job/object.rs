//! The Job object around the pod: metadata (labels, annotations, owner),
//! retries, deadlines and the pod failure policy.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use super::pod::pod_spec;
use super::request::JobRequest;
use crate::crd::GpuDriver;
use crate::decide::JobRole;
use crate::keys;
use crate::outcome::MAIN_CONTAINER;
use gpu_driver_contract::report::Reason;

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

pub fn build(gd: &GpuDriver, req: &JobRequest<'_>) -> Job {
    let labels = labels(gd, req.role);
    let annotations = if req.role == JobRole::Build {
        BTreeMap::from([(keys::TARGET.to_string(), req.key.to_string())])
    } else {
        BTreeMap::from([
            (keys::NODE.to_string(), req.node.to_string()),
            (keys::KEY.to_string(), req.key.to_string()),
        ])
    };
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
            JobRole::Install | JobRole::Build => settings.backoff_limit,
            JobRole::Detect => 1,
        }),
        active_deadline_seconds: Some(match role {
            JobRole::Install | JobRole::Build => settings.active_deadline_seconds,
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
