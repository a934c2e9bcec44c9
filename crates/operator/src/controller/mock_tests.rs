//! Reconciles against a mocked API server, in kube-rs's `tower-test`
//! pattern (as its controller-rs example): the caches are filled by hand,
//! and an [`ApiServerVerifier`] asserts every request a reconcile sends
//! (method, path, body) in order and answers it. A request the scenario
//! does not expect is never answered, so the reconcile times out.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde_json::{Value, json};

use super::{Caches, Context, Options, reconcile, targets};
use crate::crd::GpuDriver;
use crate::decide::{self, Plan};
use crate::keys;
use crate::metrics::Metrics;
use gpu_driver_contract::report::Reason;

const NS: &str = "gpu-driver";
const TAINT: &str = "gpu-driver.gardenlinux.io/not-ready";

type ApiServerHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Answers the requests of one scenario, in order.
struct ApiServerVerifier(ApiServerHandle);

/// One request the scenario expects, and what the server answers: the
/// request's own body (a create or a patch echoed back) or `answer`.
struct Step {
    method: Method,
    path: String,
    check: Box<dyn Fn(&Value) + Send>,
    answer: Option<Value>,
}

fn step(method: Method, path: &str, check: impl Fn(&Value) + Send + 'static) -> Step {
    Step {
        method,
        path: path.to_string(),
        check: Box::new(check),
        answer: None,
    }
}

/// A patch of node `gpu-1`, answered with the node (a merge patch's nulls
/// are no Node).
fn node_patch(check: impl Fn(&Value) + Send + 'static) -> Step {
    Step {
        answer: Some(json!({"metadata": {"name": "gpu-1"}})),
        ..step(Method::PATCH, "/api/v1/nodes/gpu-1", check)
    }
}

/// An Event about a node (the Recorder creates it in `default`).
fn event(reason: &'static str) -> Step {
    step(
        Method::POST,
        "/apis/events.k8s.io/v1/namespaces/default/events",
        move |b| assert_eq!(b["reason"], reason, "{b}"),
    )
}

impl ApiServerVerifier {
    fn run(mut self, steps: Vec<Step>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            for s in steps {
                let (request, send) = self.0.next_request().await.expect("no request sent");
                assert_eq!(request.method(), s.method, "{}", request.uri());
                assert_eq!(request.uri().path(), s.path);
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                (s.check)(&body);
                let answer = s.answer.unwrap_or(body);
                let bytes = serde_json::to_vec(&answer).unwrap();
                send.send_response(Response::builder().body(Body::from(bytes)).unwrap());
            }
        })
    }
}

/// The context the reconciles get, with hand-filled caches.
struct Fixture {
    ctx: Arc<Context>,
    nodes: Writer<Node>,
    jobs: Writer<Job>,
    pods: Writer<Pod>,
    drivers: Writer<GpuDriver>,
}

impl Fixture {
    fn new() -> (Fixture, ApiServerVerifier) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let (nodes_r, nodes) = reflector::store();
        let (jobs_r, jobs) = reflector::store();
        let (pods_r, pods) = reflector::store();
        let (drivers_r, drivers) = reflector::store();
        let caches = Caches {
            nodes: nodes_r,
            jobs: jobs_r,
            pods: pods_r,
            drivers: drivers_r,
        };
        let opts = Options {
            namespace: NS.into(),
            instance: "test".into(),
            status_interval: Duration::from_secs(2),
        };
        let (wake, _) = tokio::sync::mpsc::unbounded_channel();
        let metrics = Arc::new(Metrics::default());
        let ctx = Arc::new(Context::new(client, opts, metrics, caches, wake));
        let f = Fixture {
            ctx,
            nodes,
            jobs,
            pods,
            drivers,
        };
        (f, ApiServerVerifier(handle))
    }

    fn with<K: Resource<DynamicType = ()> + Clone>(w: &mut Writer<K>, obj: K) {
        w.apply_watcher_event(&watcher::Event::Apply(obj));
    }
}

fn gpu_driver(extra: Value) -> GpuDriver {
    let mut spec = json!({
        "builderImages": [{"image": "builder:1"}],
        "installerImage": "installer:1",
        "startupTaint": TAINT,
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    let mut gd = GpuDriver::new("default", serde_json::from_value(spec).unwrap());
    gd.metadata.uid = Some("uid-1".into());
    gd
}

/// A GPU node (NFD's label) as the kubelet reports it; `tainted`: it
/// carries the startup taint already.
fn gpu_node(tainted: bool) -> Node {
    let taints = if tainted {
        json!([{"key": TAINT, "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "gpu-1", "resourceVersion": "7",
            "labels": {keys::NFD_NVIDIA_LABEL: "true"}},
        "spec": {"taints": taints},
        "status": {"nodeInfo": {
            "kernelVersion": "6.6.63-cloud-amd64", "osImage": "Garden Linux 1592.4",
            "bootID": "boot-1", "architecture": "amd64", "machineID": "m",
            "systemUUID": "u", "containerRuntimeVersion": "", "kubeletVersion": "",
            "kubeProxyVersion": "", "operatingSystem": "linux"}},
    }))
    .unwrap()
}

/// The node's install plan: Job name and desired-state key.
fn install_plan(gd: &GpuDriver, node: &Node) -> (String, String) {
    match decide::plan(&gd.spec, &super::facts(node), 0) {
        Plan::Install { job, key, .. } => (job, key),
        other => panic!("{other:?}"),
    }
}

/// The installer's result document, as its pod's termination message.
fn result_message(reason: Reason, installed: bool) -> String {
    serde_json::to_string(&crate::outcome::run_result(reason, installed)).unwrap()
}

/// A finished install Job of `node` and its one pod.
fn finished_job(name: &str, key: &str, ok: bool, message: String) -> (Job, Pod) {
    let condition = if ok { "Complete" } else { "Failed" };
    let job = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS,
            "labels": {keys::ROLE_LABEL: "install", keys::OWNER_LABEL: "default"},
            "annotations": {keys::NODE: "gpu-1", keys::KEY: key}},
        "status": {"succeeded": if ok { 1 } else { 0 }, "failed": if ok { 0 } else { 1 },
            "conditions": [{"type": condition, "status": "True",
                "reason": if ok { "" } else { "PodFailurePolicy" },
                "message": if ok { "" } else { "exit code 13" }}]},
    }))
    .unwrap();
    let pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-abc"), "namespace": NS,
            "labels": {"batch.kubernetes.io/job-name": name}},
        "status": {"phase": if ok { "Succeeded" } else { "Failed" },
            "containerStatuses": [{"name": crate::outcome::MAIN_CONTAINER, "image": "",
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": if ok { 0 } else { 13 },
                    "message": message}}}]},
    }))
    .unwrap();
    (job, pod)
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("a request the scenario does not expect, or none answered")
}

#[tokio::test]
async fn a_new_gpu_node_is_tainted_and_gets_its_install_job() {
    let (mut fx, server) = Fixture::new();
    let gd = gpu_driver(json!({}));
    let node = gpu_node(false);
    let (job, _) = install_plan(&gd, &node);
    Fixture::with(&mut fx.drivers, gd);
    Fixture::with(&mut fx.nodes, node.clone());
    let want_job = job.clone();
    let scenario = server.run(vec![
        // Unready first: startup taint on (pinned to the node's version),
        // state Pending, in one patch.
        node_patch(|b| {
            assert_eq!(
                b,
                &json!({
                    "metadata": {"annotations": {keys::STATE: "Pending"},
                        "resourceVersion": "7"},
                    "spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]},
                })
            )
        }),
        step(
            Method::POST,
            &format!("/apis/batch/v1/namespaces/{NS}/jobs"),
            move |b| {
                assert_eq!(b["metadata"]["name"], want_job.as_str());
                assert_eq!(b["metadata"]["annotations"][keys::NODE], "gpu-1");
                assert_eq!(b["metadata"]["labels"][keys::ROLE_LABEL], "install");
                assert_eq!(b["spec"]["template"]["spec"]["nodeName"], "gpu-1");
            },
        ),
    ]);
    let action = within(reconcile::reconcile(Arc::new(node), fx.ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    within(scenario).await.unwrap();
    assert_eq!(fx.ctx.metrics.total("gpu_driver_jobs_created_total"), 1);
}

#[tokio::test]
async fn a_successful_job_makes_the_node_ready_in_one_patch() {
    let (mut fx, server) = Fixture::new();
    let gd = gpu_driver(json!({}));
    let node = gpu_node(true);
    let (name, key) = install_plan(&gd, &node);
    let (job, pod) = finished_job(&name, &key, true, result_message(Reason::Verified, true));
    Fixture::with(&mut fx.drivers, gd);
    Fixture::with(&mut fx.nodes, node.clone());
    Fixture::with(&mut fx.jobs, job);
    Fixture::with(&mut fx.pods, pod);
    let (want_key, want_job) = (key.clone(), name.clone());
    let scenario = server.run(vec![
        node_patch(move |b| {
            let a = &b["metadata"]["annotations"];
            assert_eq!(a[keys::STATE], "Installed");
            assert_eq!(a[keys::KEY], want_key.as_str());
            assert_eq!(a[keys::JOB], want_job.as_str());
            assert_eq!(a[keys::DRIVER_VERSION], "580.95.05");
            assert_eq!(a[keys::FLAVOR], "open");
            assert_eq!(a[keys::BOOT_ID], "boot-1");
            for k in [keys::FAILURES, keys::FAILURE_KEY, keys::UPGRADE] {
                assert_eq!(a.get(k), Some(&Value::Null), "{k}");
            }
            assert_eq!(b["metadata"]["labels"], json!({keys::READY_LABEL: "true"}));
            // The startup taint goes in the same write, pinned to the node.
            assert_eq!(b["spec"], json!({"taints": []}));
            assert_eq!(b["metadata"]["resourceVersion"], "7");
        }),
        event("DriverInstalled"),
    ]);
    let action = within(reconcile::reconcile(Arc::new(node.clone()), fx.ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    within(scenario).await.unwrap();
    // Reconciled again before the watch shows the patch: nothing sent.
    let action = within(reconcile::reconcile(Arc::new(node), fx.ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_failed_job_records_the_failure_and_backs_off() {
    let (mut fx, server) = Fixture::new();
    let gd = gpu_driver(json!({"job": {"retryBaseSeconds": 90}}));
    let node = gpu_node(true);
    let (name, key) = install_plan(&gd, &node);
    let message = result_message(Reason::BuildFailed, false);
    let (job, pod) = finished_job(&name, &key, false, message);
    Fixture::with(&mut fx.drivers, gd);
    Fixture::with(&mut fx.nodes, node.clone());
    Fixture::with(&mut fx.jobs, job);
    Fixture::with(&mut fx.pods, pod);
    let want_key = key.clone();
    let scenario = server.run(vec![
        event("InstallFailed"),
        node_patch(move |b| {
            let a = &b["metadata"]["annotations"];
            assert_eq!(a[keys::STATE], "Failed");
            assert_eq!(a[keys::FAILURE_KEY], want_key.as_str());
            assert_eq!(a[keys::FAILURES], "1");
            assert_eq!(a[keys::FAILURE_REASON], Reason::BuildFailed.to_string());
            assert!(a[keys::FAILED_AT].is_string());
            assert_eq!(b["metadata"]["labels"], json!({keys::READY_LABEL: null}));
            assert!(b.get("spec").is_none(), "{b}");
        }),
    ]);
    let action = within(reconcile::reconcile(Arc::new(node), fx.ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(90)));
    within(scenario).await.unwrap();
    assert_eq!(fx.ctx.metrics.total("gpu_driver_install_failures_total"), 1);
}

#[tokio::test]
async fn a_build_target_gets_one_build_job() {
    let (mut fx, server) = Fixture::new();
    let gd = gpu_driver(json!({
        "cache": {"url": "s3://bucket/gpu", "writeSecretName": "writer"},
        "prebuild": [{"gardenLinuxVersion": "1877.3", "kernelRelease": "6.12.44-cloud-amd64"}],
    }));
    Fixture::with(&mut fx.drivers, gd.clone());
    let scenario = server.run(vec![step(
        Method::POST,
        &format!("/apis/batch/v1/namespaces/{NS}/jobs"),
        |b| {
            assert_eq!(b["metadata"]["labels"][keys::ROLE_LABEL], "build");
            assert!(
                b["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("gpu-build-6-12-44-cloud-amd64-")
            );
            assert!(b["metadata"]["annotations"][keys::TARGET].is_string());
        },
    )]);
    let gd = Arc::new(gd);
    let action = within(targets::reconcile_targets(gd.clone(), fx.ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(2)));
    within(scenario).await.unwrap();
    // Again before the Job's watch event: no second create.
    within(targets::reconcile_targets(gd.clone(), fx.ctx.clone()))
        .await
        .unwrap();
    let records = targets::target_records(&fx.ctx, &gd, &[]);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].phase, crate::crd::BuildPhase::Building);
    assert_eq!(fx.ctx.metrics.total("gpu_driver_jobs_created_total"), 1);
}

/// Three prebuild targets under `build.maxParallel: 2`: two build Jobs
/// start, the third target waits (Pending, no create) until one ends.
#[tokio::test]
async fn build_jobs_wait_for_a_slot_under_max_parallel() {
    let (mut fx, server) = Fixture::new();
    let gd = gpu_driver(json!({
        "cache": {"url": "s3://bucket/gpu", "writeSecretName": "writer"},
        "build": {"maxParallel": 2, "nodeSelector": {"pool": "build"}},
        "prebuild": [
            {"gardenLinuxVersion": "1877.3", "kernelRelease": "6.12.44-cloud-amd64"},
            {"gardenLinuxVersion": "1877.3", "kernelRelease": "6.12.45-cloud-amd64"},
            {"gardenLinuxVersion": "1877.3", "kernelRelease": "6.12.46-cloud-amd64"},
        ],
    }));
    Fixture::with(&mut fx.drivers, gd.clone());
    let create = || {
        step(
            Method::POST,
            &format!("/apis/batch/v1/namespaces/{NS}/jobs"),
            |b| assert_eq!(b["metadata"]["labels"][keys::ROLE_LABEL], "build"),
        )
    };
    // Exactly two creates: a third request would never be answered.
    let scenario = server.run(vec![create(), create()]);
    let gd = Arc::new(gd);
    within(targets::reconcile_targets(gd.clone(), fx.ctx.clone()))
        .await
        .unwrap();
    within(scenario).await.unwrap();
    let records = targets::target_records(&fx.ctx, &gd, &[]);
    let phases: Vec<_> = records.iter().map(|r| r.phase).collect();
    use crate::crd::BuildPhase::{Building, Pending};
    assert_eq!(
        phases.iter().filter(|p| **p == Building).count(),
        2,
        "{records:?}"
    );
    let waiting: Vec<_> = records.iter().filter(|r| r.phase == Pending).collect();
    assert_eq!(waiting.len(), 1, "{records:?}");
    assert!(
        waiting[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("build.maxParallel (2)")),
        "{records:?}"
    );
    assert_eq!(fx.ctx.metrics.total("gpu_driver_jobs_created_total"), 2);
}

/// kube's Recorder folds a repeated Event (same node, reason and action)
/// into the first one's series, keeping the first note. A repeat with the
/// same note still folds (a PATCH of the series); a new note (a second
/// upgrade's versions) is a new Event (a POST) that says what happened.
#[tokio::test]
async fn an_event_with_a_new_note_is_a_new_event_not_the_first_ones_series() {
    let (fx, mut server) = Fixture::new();
    let node = gpu_node(false);
    let seen = tokio::spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let (request, send) = server.0.next_request().await.expect("no request sent");
            let method = request.method().clone();
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let mut answer = body.clone();
            if method == Method::POST {
                answer["metadata"]["name"] = json!("gpu-1.1");
            }
            seen.push((method, body["note"].as_str().map(str::to_string)));
            let bytes = serde_json::to_vec(&answer).unwrap();
            send.send_response(Response::builder().body(Body::from(bytes)).unwrap());
        }
        seen
    });
    let started = |note: &str| {
        fx.ctx.event(
            &node,
            kube::runtime::events::EventType::Normal,
            "UpgradeStarted",
            note.to_string(),
        )
    };
    started("driver 550.163.01 -> 580.95.05").await;
    started("driver 550.163.01 -> 580.95.05").await;
    started("driver 580.95.05 -> 590.44.01").await;
    let seen = tokio::time::timeout(Duration::from_secs(10), seen)
        .await
        .expect("three requests")
        .unwrap();
    assert_eq!(seen[0].0, Method::POST);
    assert_eq!(seen[1].0, Method::PATCH, "an identical repeat folds");
    assert_eq!(seen[2].0, Method::POST, "{seen:?}");
    assert_eq!(seen[2].1.as_deref(), Some("driver 580.95.05 -> 590.44.01"));
}

/// A node named `name` with these labels and annotations.
fn node_with(name: &str, labels: Value, annotations: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_roll_counts_its_own_gpu_nodes_and_those_in_progress() {
    let (mut fx, _server) = Fixture::new();
    let gpu = keys::NFD_NVIDIA_LABEL;
    let gd = gpu_driver(json!({"upgradePolicy": {"maxUnavailable": "50%"}}));
    // A driver that sorts first takes the nodes of pool "other".
    let mut other = gpu_driver(json!({"nodeSelector": {"pool": "other"}}));
    other.metadata.name = Some("a-other".into());
    Fixture::with(&mut fx.drivers, gd.clone());
    Fixture::with(&mut fx.drivers, other);
    let up = |s: &str| json!({keys::UPGRADE: s});
    for n in [
        node_with("idle", json!({gpu: "true"}), json!({})),
        node_with("draining", json!({gpu: "true"}), up("Draining")),
        node_with("failed", json!({gpu: "true"}), up("Failed")),
        node_with("gpu-by-detect", json!({}), json!({keys::GPU: "true"})),
        node_with("no-gpu", json!({}), json!({})),
        node_with(
            "others",
            json!({gpu: "true", "pool": "other"}),
            up("Installing"),
        ),
    ] {
        Fixture::with(&mut fx.nodes, n);
    }
    let (max, busy, stopped) = fx.ctx.roll(&gd);
    // Four GPU nodes are this driver's: 50% of them.
    assert_eq!(max, 2);
    let mut busy: Vec<String> = busy.into_iter().collect();
    busy.sort();
    assert_eq!(busy, ["draining", "failed"]);
    assert_eq!(stopped.as_deref(), Some("failed"));
}

/// The caches keep what the reconciles read and drop the rest: the node's
/// facts and taints, a Job's state from the Job and its pod, unchanged.
#[test]
fn the_caches_keep_what_the_reconciles_read() {
    let managed = json!([{"manager": "kwok", "operation": "Update",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]);
    let mut node: Node = serde_json::from_value(json!({
        "metadata": {"name": "gpu-1", "managedFields": managed,
            "labels": {"a": "b"}, "annotations": {"c": "d"}},
        "spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}], "unschedulable": true},
        "status": {
            "nodeInfo": {"kernelVersion": "6.12.44-cloud-amd64", "osImage": "Garden Linux 1877.3",
                "bootID": "b-1", "architecture": "amd64", "machineID": "", "systemUUID": "",
                "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "",
                "operatingSystem": "linux"},
            "images": [{"names": ["registry.example/cuda:12"], "sizeBytes": 1}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "capacity": {"cpu": "8"}}}))
    .unwrap();
    let before = super::facts(&node);
    super::slim::node(&mut node);
    assert_eq!(super::facts(&node), before);
    assert_eq!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    let st = node.status.as_ref().unwrap();
    assert!(st.images.is_none() && st.conditions.is_none() && st.capacity.is_none());
    assert!(node.metadata.managed_fields.unwrap_or_default().is_empty());

    let gd = gpu_driver(json!({}));
    let kind = crate::job::TemplateKind::Install;
    let mut job =
        crate::job::example(&gd, "gpu-1", "Garden Linux 1877.3", "6.12.44", "ns", kind).unwrap();
    job.metadata.managed_fields = serde_json::from_value(managed.clone()).unwrap();
    job.status = serde_json::from_value(json!({"succeeded": 1,
        "conditions": [{"type": "Complete", "status": "True"}]}))
    .unwrap();
    let result =
        serde_json::to_string(&crate::outcome::run_result(Reason::Verified, true)).unwrap();
    let mut pod = Pod {
        metadata: job
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .clone()
            .unwrap_or_default(),
        spec: job.spec.as_ref().unwrap().template.spec.clone(),
        status: serde_json::from_value(json!({"phase": "Succeeded", "containerStatuses": [{
            "name": crate::outcome::MAIN_CONTAINER, "image": "", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0, "message": result}}}]}))
        .unwrap(),
    };
    let before = crate::outcome::job_state(&job, &[&pod], 0);
    assert!(matches!(
        before,
        crate::outcome::JobState::Succeeded(Some(_))
    ));
    let labels = (job.metadata.labels.clone(), pod.metadata.labels.clone());
    super::slim::job(&mut job);
    super::slim::pod(&mut pod);
    assert_eq!(crate::outcome::job_state(&job, &[&pod], 0), before);
    assert_eq!(
        (job.metadata.labels.clone(), pod.metadata.labels.clone()),
        labels
    );
    assert!(job.spec.is_none() && pod.spec.is_none());
    assert!(job.metadata.managed_fields.unwrap_or_default().is_empty());
}

#[test]
fn only_a_gpu_drivers_spec_deletion_or_removal_reconciles_its_nodes() {
    let mut seen = super::DriverSeen::new();
    let mut gd = gpu_driver(json!({}));
    gd.metadata.generation = Some(1);
    let passes = |seen: &mut super::DriverSeen, ev| super::driver_change(seen, Ok(ev)).is_some();
    assert!(passes(&mut seen, watcher::Event::InitApply(gd.clone())));
    assert!(!passes(&mut seen, watcher::Event::InitDone));
    // A status write: same generation.
    let mut status_only = gd.clone();
    status_only.status = Some(Default::default());
    assert!(!passes(&mut seen, watcher::Event::Apply(status_only)));
    gd.metadata.generation = Some(2);
    assert!(passes(&mut seen, watcher::Event::Apply(gd.clone())));
    assert!(!passes(&mut seen, watcher::Event::Apply(gd.clone())));
    gd.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    assert!(passes(&mut seen, watcher::Event::Apply(gd.clone())));
    assert!(passes(&mut seen, watcher::Event::Delete(gd.clone())));
    assert!(seen.is_empty());
}
