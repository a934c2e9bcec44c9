//! The operator against a real control plane (tests/it/support/cluster.rs:
//! etcd, kube-apiserver, the Job controller, KWOK): the deploy/ manifests
//! are accepted, GPU nodes get pinned Jobs whose pods end with the
//! installer's own result documents as termination messages, and the nodes
//! get annotated; a failure leaves an Event and no ready label; a reboot
//! (new bootID) and an OS upgrade (new osImage and kernel) reinstall. The operator runs in-process with a real kube
//! client, authenticated as its own ServiceAccount (deploy/rbac.yaml). Fails (does not skip) under CI=true without the binaries.

use crate::support::cluster::{Cluster, EXIT_CODE, JobPods, TERMINATION_MESSAGE};
use crate::support::deploy::{install_crd, repo_file, yaml_files};
use crate::support::manifests as objects;
use crate::support::results::{build_result, host_report, run_result, run_result_of};
use gpu_driver_installer::report::Reason;
use gpu_driver_operator::controller::{self, Options};
use gpu_driver_operator::keys;
use gpu_driver_operator::leader;
use gpu_driver_operator::metrics::Metrics;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

mod binary;
mod build_jobs;
mod manifests;
mod nodes;
mod upgrade;

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "gpu-driver";

fn gpudriver(name: &str, pool: &str, pod_annotations: Value) -> String {
    objects::gpudriver(
        name,
        json!({
            "nodeSelector": {"pool": pool},
            "builderImages": [{"gardenLinuxVersion": "1592", "image": "kmodbuild:{gardenLinuxVersion}"}],
            "installerImage": "gpu-driver-installer:test",
            "startupTaint": "gpu-driver.gardenlinux.io/driver-not-ready",
            "driver": {"flavor": "open"},
            "job": {"retryBaseSeconds": 3600},
            "podAnnotations": pod_annotations,
        }),
    )
    .to_string()
}

fn node(name: &str, pool: &str, gpu: bool, taint: bool) -> String {
    let mut labels = json!({"pool": pool});
    if gpu {
        labels[keys::NFD_NVIDIA_LABEL] = json!("true");
    }
    let mut n = objects::garden_linux_node(name, labels);
    n["status"]["nodeInfo"]["architecture"] = json!("amd64");
    if taint {
        n["spec"] = json!({"taints": [{"key": "gpu-driver.gardenlinux.io/driver-not-ready", "effect": "NoSchedule"}]});
    }
    n.to_string()
}

/// Waits until node `node` has annotation `key` = `want`.
fn wait_annotation(c: &Cluster, node: &str, key: &str, want: &str) {
    let path = format!("{{.metadata.annotations.{}}}", key.replace('.', "\\."));
    c.wait_for(&["node", node], &path, want, WAIT);
}

/// Waits until node `node` has label `key` = `want`.
fn wait_label(c: &Cluster, node: &str, key: &str, want: &str) {
    let path = format!("{{.metadata.labels.{}}}", key.replace('.', "\\."));
    c.wait_for(&["node", node], &path, want, WAIT);
}

/// What a kubelet reports after a reboot or upgrade: a merge patch of
/// the node's status.
fn patch_node_info(c: &Cluster, node: &str, status_patch: &str) {
    c.kubectl(&[
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        status_patch,
    ]);
}

fn get_json(c: &Cluster, args: &[&str]) -> Value {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&c.kubectl(&full)).unwrap()
}

/// The operator, in this process, on its own runtime thread.
struct Running {
    metrics: Arc<Metrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A kubeconfig with a token of the operator's own ServiceAccount: the
/// operator runs with exactly the RBAC of deploy/rbac.yaml, not as admin.
fn operator_kubeconfig(c: &Cluster) -> std::path::PathBuf {
    let token = c.kubectl(&[
        "create",
        "token",
        "gpu-driver-operator",
        "-n",
        NS,
        "--duration=2h",
    ]);
    let cfg = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": c.server, "certificate-authority": c.ca_file}}],
        "users": [{"name": "operator", "user": {"token": token.trim()}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator"}}],
        "current-context": "operator",
    });
    let path = c.dir.join("operator.kubeconfig");
    std::fs::write(&path, cfg.to_string()).unwrap();
    path
}

impl Running {
    fn start(c: &Cluster) -> Running {
        let metrics = Arc::new(Metrics::default());
        let m = metrics.clone();
        let kubeconfig = operator_kubeconfig(c);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let client = client(&kubeconfig).await;
                let opts = Options {
                    namespace: NS.into(),
                    instance: "test".into(),
                    status_interval: Duration::from_millis(500),
                };
                controller::run(client, opts, m, async move {
                    let _ = rx.await;
                })
                .await;
            });
        });
        Running {
            metrics,
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn client(kubeconfig: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    // The operator's own client: no retries hidden under its deadlines.
    gpu_driver_operator::client(cfg).unwrap()
}

fn install_base(c: &Cluster) {
    install_crd(c);
    c.apply(&repo_file("deploy/rbac.yaml"));
}

/// A control plane whose Job pods the test plays (`JobPods::Manual`),
/// with the CRD and RBAC applied; `None` where no control plane is at hand.
fn manual_cluster() -> Option<Cluster> {
    let c = Cluster::start_with(JobPods::Manual)?;
    install_base(&c);
    Some(c)
}

/// Ends a `JobPods::Manual` pod with `exit_code` and `message`: the
/// annotations the simulated kubelet (tools/k8s/stages) completes it by.
fn finish_pod(c: &Cluster, pod: &Value, exit_code: &str, message: &str) {
    let patch = json!({"metadata": {"annotations": {
        EXIT_CODE: exit_code, TERMINATION_MESSAGE: message}}})
    .to_string();
    c.kubectl(&[
        "patch",
        "pod",
        pod["metadata"]["name"].as_str().unwrap(),
        "-n",
        NS,
        "--type",
        "merge",
        "-p",
        &patch,
    ]);
}

/// `gpudriver(name, name, {})` as a value, for a test to edit its spec.
fn gpudriver_value(name: &str) -> Value {
    serde_json::from_str(&gpudriver(name, name, json!({}))).unwrap()
}

mod coexist;

/// Now as a Lease's MicroTime (RFC 3339 with microseconds, UTC).
fn micro_time_now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!(
        "{}.{:06}Z",
        now.strftime("%Y-%m-%dT%H:%M:%S"),
        now.subsec_microsecond()
    )
}

/// A node's ready label and its taints as `key:effect`.
fn readiness(c: &Cluster, node: &str) -> (Option<String>, Vec<String>) {
    let n = get_json(c, &["node", node]);
    let label = n["metadata"]["labels"][keys::READY_LABEL]
        .as_str()
        .map(str::to_string);
    let taints = n["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "{}:{}",
                t["key"].as_str().unwrap_or(""),
                t["effect"].as_str().unwrap_or("")
            )
        })
        .collect();
    (label, taints)
}

/// Polls until `done` holds for every node in `nodes`, answering Job pods
/// with `answer` when given; panics with the nodes' state after WAIT.
fn until_nodes(
    c: &Cluster,
    nodes: &[&str],
    answer: Option<&str>,
    done: impl Fn(&str, &(Option<String>, Vec<String>)) -> bool,
) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(message) = answer {
            answer_pods(c, message);
        }
        let states: Vec<_> = nodes.iter().map(|n| (*n, readiness(c, n))).collect();
        if states.iter().all(|(n, s)| done(n, s)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nodes not there yet: {states:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Jobs of `role` (install, build, detect) in the operator's namespace.
fn jobs_of(c: &Cluster, role: &str) -> Vec<Value> {
    let jobs = of_role(c, "jobs", role);
    jobs["items"].as_array().unwrap().clone()
}

/// The list of `resource` (jobs, pods) of `role` in the operator's
/// namespace, as kubectl prints it.
fn of_role(c: &Cluster, resource: &str, role: &str) -> Value {
    get_json(
        c,
        &[
            resource,
            "-n",
            NS,
            "-l",
            &format!("{}={role}", keys::ROLE_LABEL),
        ],
    )
}

/// Plays the installer for the unanswered pods of `role` jobs whose
/// annotation `key` (node or target) satisfies `pick`.
fn answer_role(
    c: &Cluster,
    role: &str,
    pick: impl Fn(&Value) -> bool,
    exit_code: &str,
    message: &str,
) -> usize {
    answer_matching(c, Some(role), pick, exit_code, message)
}

/// Ends every unanswered Job pod (of `role`, when given) that `pick`
/// accepts with `exit_code` and `message`; how many it answered.
fn answer_matching(
    c: &Cluster,
    role: Option<&str>,
    pick: impl Fn(&Value) -> bool,
    exit_code: &str,
    message: &str,
) -> usize {
    let selector = role.map(|r| format!("{}={r}", keys::ROLE_LABEL));
    let mut args = vec!["pods", "-n", NS];
    if let Some(sel) = &selector {
        args.extend(["-l", sel.as_str()]);
    }
    let pods = get_json(c, &args);
    let mut n = 0;
    for p in pods["items"].as_array().unwrap() {
        if !p["metadata"]["annotations"][EXIT_CODE].is_null() || !pick(p) {
            continue;
        }
        finish_pod(c, p, exit_code, message);
        n += 1;
    }
    n
}

fn on_node(node: &str) -> impl Fn(&Value) -> bool + '_ {
    move |p: &Value| p["metadata"]["annotations"][keys::NODE] == node
}

/// Polls `f` until it returns Some, for at most WAIT.
fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A node's cordon, upgrade annotation and whether its GPU pod is still
/// there.
fn upgrade_view(c: &Cluster, node: &str) -> (bool, Option<String>) {
    let n = get_json(c, &["node", node]);
    (
        n["spec"]["unschedulable"] == true,
        n["metadata"]["annotations"][keys::UPGRADE]
            .as_str()
            .map(str::to_string),
    )
}

/// Plays the installer in a `JobPods::Manual` cluster: every Job pod not
/// answered yet ends with exit code 0 and `message` as its termination
/// message.
fn answer_pods(c: &Cluster, message: &str) {
    answer_matching(c, None, |_| true, "0", message);
}
