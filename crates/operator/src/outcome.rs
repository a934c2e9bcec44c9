//! What a finished Job pod says: its container's termination message is the
//! installer's own result document (`report::termination_message`: the
//! whole RunResult or HostReport, or a compact copy when it would exceed
//! Kubernetes' 4096 bytes), parsed with the installer's types.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use gpu_driver_contract::detect::HostReport;
use gpu_driver_contract::report::{Kind, Outcome, Phase, Reason};
use gpu_driver_contract::run::{Installed, RunResult};

/// The container whose termination message carries the result.
pub(crate) const MAIN_CONTAINER: &str = "installer";

/// A Job pod's result, from its termination message.
#[derive(Debug, Clone, PartialEq)]
pub struct PodResult {
    pub phase: Phase,
    pub reason: Reason,
    pub message: String,
    pub installed: Option<Installed>,
    /// The cache outcome (`Hit`, `Miss`, …) when the installer reports one.
    pub cache: Option<String>,
    /// A build Job's stored artifact (`prebuild`'s `status.built`).
    pub built: Option<BuiltArtifact>,
}

/// What a build Job stored: the operator hands the digest to install Jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltArtifact {
    pub artifact_sha256: String,
    pub driver_version: Option<String>,
    /// The entry it is stored in (`cacheKey`), when the result names one.
    pub cache_key: Option<String>,
}

/// `status.built`, read loosely (also from the compact copy, which keeps
/// it); only a well-formed sha256 counts.
fn built_of(value: &serde_json::Value) -> Option<BuiltArtifact> {
    let b = value.pointer("/status/built")?;
    let sha = b.get("artifactSha256")?.as_str()?;
    let ok = sha.len() == 64 && sha.bytes().all(|c| c.is_ascii_hexdigit());
    ok.then(|| BuiltArtifact {
        artifact_sha256: sha.to_ascii_lowercase(),
        driver_version: b
            .get("driverVersion")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        cache_key: b
            .get("cacheKey")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    })
}

/// The compact copy (`"truncated": true`) has only the outcome.
#[derive(Deserialize)]
struct Compact {
    kind: Kind,
    status: Outcome,
}

/// Parses a termination message. `None` when it is not a result document
/// (empty, or a log tail from `FallbackToLogsOnError`).
pub(crate) fn parse_message(message: &str) -> Option<PodResult> {
    let value: serde_json::Value = serde_json::from_str(message.trim()).ok()?;
    // `status.cache.outcome` is the artifact cache's field; read loosely so
    // that a result without it still parses.
    let cache = value
        .pointer("/status/cache/outcome")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let built = built_of(&value);
    let truncated = value.get("truncated").and_then(|v| v.as_bool()) == Some(true);
    let kind = value.get("kind").cloned();
    if !truncated {
        if kind == Some(serde_json::json!("RunResult")) {
            if let Ok(doc) = serde_json::from_value::<RunResult>(value.clone()) {
                let o = doc.status.outcome;
                return Some(PodResult {
                    phase: o.phase,
                    reason: o.reason,
                    message: o.message,
                    installed: doc.status.installed,
                    cache,
                    built,
                });
            }
        } else if kind == Some(serde_json::json!("HostReport"))
            && let Ok(doc) = serde_json::from_value::<HostReport>(value.clone())
        {
            let o = doc.status.outcome;
            return Some(PodResult {
                phase: o.phase,
                reason: o.reason,
                message: o.message,
                installed: None,
                cache,
                built,
            });
        }
    }
    let installed = value
        .pointer("/status/installed")
        .and_then(|v| serde_json::from_value::<Installed>(v.clone()).ok());
    let c: Compact = serde_json::from_value(value).ok()?;
    let _ = c.kind;
    Some(PodResult {
        phase: c.status.phase,
        reason: c.status.reason,
        message: c.status.message,
        installed,
        cache,
        built,
    })
}

/// The main container's termination message, once it has terminated.
pub(crate) fn termination_message(pod: &Pod) -> Option<&str> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .find(|c| c.name == MAIN_CONTAINER)?
        .state
        .as_ref()?
        .terminated
        .as_ref()?
        .message
        .as_deref()
}

/// Where a Job stands, from the Job and its pods.
#[derive(Debug, Clone, PartialEq)]
pub enum JobState {
    Running,
    /// A pod succeeded: its result (the Job controller's Complete condition
    /// follows later; waiting for it would only add latency).
    Succeeded(Option<PodResult>),
    /// The Job failed for good (backoff limit, deadline, a FailJob rule).
    Failed {
        result: Option<PodResult>,
        job_reason: String,
        job_message: String,
    },
}

impl JobState {
    /// A finished Job's pod result and, when the Job failed, its reason and
    /// message as one line; `None` while it runs.
    pub fn finished(self) -> Option<(Option<PodResult>, Option<String>)> {
        match self {
            JobState::Running => None,
            JobState::Succeeded(result) => Some((result, None)),
            JobState::Failed {
                result,
                job_reason,
                job_message,
            } => Some((result, Some(format!("{job_reason}: {job_message}")))),
        }
    }
}

fn pod_phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn pod_finished_at(pod: &Pod) -> i64 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == MAIN_CONTAINER))
        .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map_or(0, |t| t.0.as_second())
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(pod_phase(pod), "Succeeded" | "Failed")
}

/// How long a finished Job may show no pod at all before the result is
/// taken as lost (the pod was garbage-collected): the caches of Jobs and
/// pods are separate watches, and under load the Job's condition arrives
/// well before the pod's last status.
pub(crate) const LOST_POD_GRACE_SECONDS: i64 = 120;

pub fn job_state(job: &Job, pods: &[&Pod], now_unix: i64) -> JobState {
    if let Some(p) = pods.iter().find(|p| pod_phase(p) == "Succeeded") {
        return JobState::Succeeded(termination_message(p).and_then(parse_message));
    }
    let status = job.status.as_ref();
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let true_cond = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t && c.status == "True")
    };
    let since = |c: &k8s_openapi::api::batch::v1::JobCondition| {
        c.last_transition_time
            .as_ref()
            .map_or(0, |t| now_unix - t.0.as_second())
    };
    if let Some(c) = true_cond("Complete").or_else(|| true_cond("SuccessCriteriaMet")) {
        // Complete, but our pod cache has not seen the pod succeed yet:
        // wait for it (its event triggers the next reconcile). Only a pod
        // that is gone for good means the result is lost.
        if pods.is_empty() && since(c) > LOST_POD_GRACE_SECONDS {
            return JobState::Succeeded(None);
        }
        return JobState::Running;
    }
    if let Some(c) = true_cond("Failed").or_else(|| true_cond("FailureTarget")) {
        // Wait until the cache shows every pod ended, so that the last
        // pod's result (the installer's reason) is there to report.
        if pods.iter().any(|p| !is_terminal(p)) && since(c) <= LOST_POD_GRACE_SECONDS {
            return JobState::Running;
        }
        let last = pods
            .iter()
            .filter(|p| pod_phase(p) == "Failed")
            .max_by_key(|p| pod_finished_at(p));
        return JobState::Failed {
            result: last
                .and_then(|p| termination_message(p))
                .and_then(parse_message),
            job_reason: c.reason.clone().unwrap_or_default(),
            job_message: c.message.clone().unwrap_or_default(),
        };
    }
    JobState::Running
}

/// Seconds from the Job's start to now (for the duration histogram).
pub(crate) fn job_seconds(job: &Job, now_unix: i64) -> Option<f64> {
    let start = job
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(job.metadata.creation_timestamp.as_ref())?;
    Some((now_unix - start.0.as_second()).max(0) as f64)
}

/// Replaces `(pod <uid>)` in an installer's message with
/// `(pod <namespace>/<name>)` for the pods known by UID.
pub fn name_pods(message: &str, pods: &[(String, String)]) -> String {
    let mut out = message.to_string();
    for (uid, name) in pods {
        out = out.replace(&format!("(pod {uid})"), &format!("(pod {name})"));
    }
    out
}

/// A `run` RunResult with `reason`, on the host root a Job mounts, and
/// driver 580.95.05 (open) installed when `installed`: the unit tests'
/// installer result.
#[cfg(test)]
pub(crate) fn run_result(reason: Reason, installed: bool) -> RunResult {
    sample_run_result(reason, "done", installed.then_some("580.95.05"))
}

/// A `run` RunResult with `reason` and `message`, on the host root a Job
/// mounts, and with driver `installed` (open, on 6.6.63-cloud-amd64) where
/// one is: an installer's result as the unit tests and the benchmark's
/// simulated Jobs report it.
pub fn sample_run_result(
    reason: Reason,
    message: impl Into<String>,
    installed: Option<&str>,
) -> RunResult {
    use gpu_driver_contract::report::Document;
    use gpu_driver_contract::run::{RunSpec, RunStatus};
    let mut status = RunStatus::new(Outcome::new(reason, message));
    status.installed = installed.map(|version| Installed {
        driver_version: Some(version.into()),
        flavor: Some(gpu_driver_contract::node::ModuleFlavor::Open),
        kernel_release: Some("6.6.63-cloud-amd64".into()),
    });
    let spec = RunSpec {
        host_root: "/proc/1/root".into(),
        artifact: None,
        driver_version: None,
        target: None,
    };
    Document::new(Kind::RunResult, spec, status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_driver_contract::report::{TERMINATION_LOG_LIMIT, termination_message as compact};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };

    #[test]
    fn a_full_run_result_parses_with_what_was_installed() {
        let doc = run_result(Reason::Verified, true);
        let msg = serde_json::to_string(&doc).unwrap();
        let r = parse_message(&msg).unwrap();
        assert_eq!(r.phase, Phase::Succeeded);
        assert_eq!(r.reason, Reason::Verified);
        assert_eq!(
            r.installed.unwrap().driver_version.as_deref(),
            Some("580.95.05")
        );
    }

    #[test]
    fn the_compact_copy_of_a_long_failure_parses() {
        let mut doc = run_result(Reason::KernelApiMismatch, false);
        doc.status.outcome.message = "error: too few arguments ".repeat(400);
        let msg = compact(Kind::RunResult, &doc).unwrap();
        assert!(msg.len() <= TERMINATION_LOG_LIMIT);
        let r = parse_message(&msg).unwrap();
        assert_eq!(r.phase, Phase::Failed);
        assert_eq!(r.reason, Reason::KernelApiMismatch);
        assert!(r.installed.is_none());
    }

    #[test]
    fn a_host_report_and_a_cache_outcome_parse() {
        // A real HostReport: the installer's `detect` on the fixture host
        // gardenlinux-1592-nogpu, captured.
        let doc = include_str!("../../../tests/fixtures/operator/hostreport-nogpu.json");
        let r = parse_message(doc).unwrap();
        assert_eq!(r.reason, Reason::NoGpu);
        let mut v = serde_json::to_value(run_result(Reason::Verified, true)).unwrap();
        v["status"]["cache"] = serde_json::json!({"outcome": "Hit"});
        let r = parse_message(&v.to_string()).unwrap();
        assert_eq!(r.cache.as_deref(), Some("Hit"));
    }

    #[test]
    fn log_tails_are_not_results() {
        assert!(parse_message("").is_none());
        assert!(parse_message("panic: something\nat line 3").is_none());
        assert!(parse_message("{\"kind\":\"RunResult\"}").is_none());
    }

    fn pod(phase: &str, message: Option<String>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: MAIN_CONTAINER.into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: 0,
                            message,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn job_state_from_pods_and_conditions() {
        use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
        let ok = serde_json::to_string(&run_result(Reason::Verified, true)).unwrap();
        let bad = serde_json::to_string(&run_result(Reason::BuildFailed, false)).unwrap();
        let mut job = Job::default();
        assert_eq!(job_state(&job, &[], 0), JobState::Running);
        let p = pod("Succeeded", Some(ok));
        assert!(matches!(
            job_state(&job, &[&p], 0),
            JobState::Succeeded(Some(r)) if r.reason == Reason::Verified
        ));
        let f = pod("Failed", Some(bad));
        assert_eq!(job_state(&job, &[&f], 0), JobState::Running);
        job.status = Some(JobStatus {
            conditions: Some(vec![JobCondition {
                type_: "Failed".into(),
                status: "True".into(),
                reason: Some("BackoffLimitExceeded".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let JobState::Failed {
            result, job_reason, ..
        } = job_state(&job, &[&f], 0)
        else {
            panic!()
        };
        assert_eq!(result.unwrap().reason, Reason::BuildFailed);
        assert_eq!(job_reason, "BackoffLimitExceeded");
    }

    #[test]
    fn a_finished_job_waits_for_its_pods_in_the_cache() {
        use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let t0: k8s_openapi::jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let job = |type_: &str| Job {
            status: Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: type_.into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(t0)),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let now = t0.as_second();
        // Complete before the cache shows the pod succeed: wait.
        let running = pod("Running", None);
        assert_eq!(
            job_state(&job("Complete"), &[&running], now + 1),
            JobState::Running
        );
        assert_eq!(job_state(&job("Complete"), &[], now + 1), JobState::Running);
        // No pod long after: the result is lost.
        assert_eq!(
            job_state(&job("Complete"), &[], now + LOST_POD_GRACE_SECONDS + 1),
            JobState::Succeeded(None)
        );
        // Failed while the cache still shows the pod running: wait for
        // the pod's reason.
        assert_eq!(
            job_state(&job("Failed"), &[&running], now + 1),
            JobState::Running
        );
        assert!(matches!(
            job_state(&job("Failed"), &[], now + 1),
            JobState::Failed { result: None, .. }
        ));
    }

    #[test]
    fn holders_are_named_by_their_pods() {
        let m = "in use: nvidia (refcount 3); held open by pid 4242 dcgm-exporter (pod 1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9) holds /dev/nvidia0; pid 7 nvidia-persiste holds /dev/nvidiactl";
        let pods = vec![(
            "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9".to_string(),
            "gpu-operator/nvidia-dcgm-exporter-x7k2p".to_string(),
        )];
        assert_eq!(
            name_pods(m, &pods),
            "in use: nvidia (refcount 3); held open by pid 4242 dcgm-exporter (pod gpu-operator/nvidia-dcgm-exporter-x7k2p) holds /dev/nvidia0; pid 7 nvidia-persiste holds /dev/nvidiactl"
        );
        assert_eq!(name_pods(m, &[]), m, "an unknown UID stays as it is");
    }
}
