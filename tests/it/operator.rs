//! The operator against a real control plane (tests/it/support/cluster.rs:
//! etcd, kube-apiserver, the Job controller, KWOK): the deploy/ manifests
//! are accepted, GPU nodes get pinned Jobs whose pods end with the
//! installer's own result documents as termination messages, and the nodes
//! get annotated; a failure leaves an Event and no ready label; a reboot
//! (new bootID) and an OS upgrade (new osImage and kernel) reinstall. The operator runs in-process with a real kube
//! client, authenticated as its own ServiceAccount (deploy/rbac.yaml). Fails (does not skip) under CI=true without the binaries.

use std::sync::Arc;
use std::time::Duration;

use crate::support::cluster::{Cluster, EXIT_CODE, JobPods, TERMINATION_MESSAGE};
use crate::support::deploy::{install_crd, repo_file, yaml_files};
use gpu_driver_installer::report::Reason;
use gpu_driver_installer::run::{BuiltArtifact, Installed, RunSpec, Steps};
use gpu_driver_installer::step::Done;
use gpu_driver_installer::{Error, Success};
use gpu_driver_operator::controller::{self, Options};
use gpu_driver_operator::keys;
use gpu_driver_operator::leader;
use gpu_driver_operator::metrics::Metrics;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "gpu-driver";

/// What a real `gpu-driver-installer run` writes on success or failure.
fn run_result(reason: Reason, message: &str) -> String {
    run_result_of(reason, message, "580.95.05")
}

/// [`run_result`] of an installer that installed driver `version`.
fn run_result_of(reason: Reason, message: &str, version: &str) -> String {
    let mut steps = Steps::new();
    if reason == Reason::Verified {
        steps.set_installed(Installed {
            driver_version: Some(version.into()),
            flavor: Some(gpu_driver_installer::host::ModuleFlavor::Open),
            kernel_release: Some("6.6.63-cloud-amd64".into()),
        });
    }
    let spec = RunSpec {
        host_root: "/proc/1/root".into(),
        artifact: None,
        driver_version: None,
        target: None,
    };
    let doc = match reason.split() {
        Ok(success) => steps.succeed(spec, Done::new(success, message)),
        Err(failure) => steps.stop(spec, &Error::new(failure, message)),
    };
    gpu_driver_installer::report::termination_message(
        gpu_driver_installer::report::Kind::RunResult,
        &doc,
    )
    .unwrap()
}

fn gpudriver(name: &str, pool: &str, pod_annotations: Value) -> String {
    json!({
        "apiVersion": "gpu-driver.gardenlinux.io/v1alpha1",
        "kind": "GpuDriver",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"pool": pool},
            "builderImages": [{"gardenLinuxVersion": "1592", "image": "kmodbuild:{gardenLinuxVersion}"}],
            "installerImage": "gpu-driver-installer:test",
            "startupTaint": "gpu-driver.gardenlinux.io/driver-not-ready",
            "driver": {"flavor": "open"},
            "job": {"retryBaseSeconds": 3600},
            "podAnnotations": pod_annotations,
        }
    })
    .to_string()
}

fn node(name: &str, pool: &str, gpu: bool, taint: bool) -> String {
    let mut labels = json!({"pool": pool});
    if gpu {
        labels[keys::NFD_NVIDIA_LABEL] = json!("true");
    }
    let mut n = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"nodeInfo": {
            "kernelVersion": "6.6.63-cloud-amd64",
            "osImage": "Garden Linux 1592.4",
            "bootID": "boot-1",
            "architecture": "amd64",
        }}
    });
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

/// Every manifest shipped under deploy/ (examples and NVIDIA's side
/// included), and the kustomization's rendering, pass a server-side dry run
/// on a real apiserver: its schemas, defaulting and admission. The CRD and
/// RBAC are applied first, so the GpuDriver example meets its CRD. Helm
/// values files are not manifests (tests/it/operator_manifests.rs checks them
/// against the charts they are for).
#[test]
fn manifests_are_accepted_by_the_apiserver() {
    let Some(c) = Cluster::start() else { return };
    install_base(&c);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = yaml_files(&root.join("deploy"));
    let mut checked = Vec::new();
    for path in &files {
        let f = path.strip_prefix(root).unwrap().to_str().unwrap();
        if f.ends_with("-values.yaml") || f == "deploy/kustomization.yaml" {
            continue;
        }
        let out = c.kubectl_output(
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&repo_file(f)),
        );
        assert!(
            out.status.success(),
            "{f}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        checked.push(f.to_string());
    }
    for want in [
        "deploy/operator.yaml",
        "deploy/job-template.yaml",
        "deploy/cached-job-template.yaml",
        "deploy/build-job-template.yaml",
        "deploy/examples/gpudriver.yaml",
        "deploy/examples/cuda-vectoradd.yaml",
    ] {
        assert!(
            checked.iter().any(|f| f == want),
            "{want} not checked: {checked:?}"
        );
    }
    // The kustomization renders, and what it renders is accepted.
    let rendered = c.kubectl(&["kustomize", concat!(env!("CARGO_MANIFEST_DIR"), "/deploy")]);
    let out = c.kubectl_output(&["apply", "--dry-run=server", "-f", "-"], Some(&rendered));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The installer's account may do nothing.
    let can = c.kubectl_output(
        &[
            "auth",
            "can-i",
            "--list",
            "--as=system:serviceaccount:gpu-driver:gpu-driver-installer",
        ],
        None,
    );
    let list = String::from_utf8_lossy(&can.stdout);
    for line in list.lines().skip(1) {
        // Lines starting blank are non-resource URLs (discovery, health):
        // open to every authenticated user.
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let res = line.split_whitespace().next().unwrap_or("");
        // What every authenticated user may do (discovery, self reviews).
        assert!(
            res.ends_with(".authorization.k8s.io")
                || res.ends_with(".authentication.k8s.io")
                || res.is_empty(),
            "installer account can: {line}"
        );
    }
}

#[test]
fn leader_lease_has_one_holder() {
    let Some(c) = Cluster::start() else { return };
    install_base(&c);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = client(&c.kubeconfig).await;
        let m = Metrics::default();
        let a = leader::LeaseConfig::new(NS, "a");
        let b = leader::LeaseConfig::new(NS, "b");
        assert!(leader::try_acquire(&client, &a, &m).await.unwrap());
        assert!(!leader::try_acquire(&client, &b, &m).await.unwrap());
        // The holder renews.
        assert!(leader::try_acquire(&client, &a, &m).await.unwrap());
        assert!(!leader::try_acquire(&client, &b, &m).await.unwrap());
    });
    let lease = get_json(&c, &["lease", "gpu-driver-operator", "-n", NS]);
    assert_eq!(lease["spec"]["holderIdentity"], "a");
}

#[test]
fn gpu_nodes_get_pinned_jobs_annotations_and_reinstalls() {
    let Some(c) = Cluster::start() else { return };
    install_base(&c);
    let ok = run_result(Reason::Verified, "driver 580.95.05 verified");
    let bad = run_result(
        Reason::KernelApiMismatch,
        "error: too few arguments to function 'pci_resize_resource'",
    );
    c.apply(&gpudriver("ok", "ok", json!({ TERMINATION_MESSAGE: ok })));
    c.apply(&gpudriver(
        "bad",
        "bad",
        json!({ TERMINATION_MESSAGE: bad, EXIT_CODE: "13" }),
    ));
    c.apply(&node("ok-1", "ok", true, true));
    c.apply(&node("ok-2", "ok", true, false));
    c.apply(&node("cpu-1", "ok", false, false));
    c.apply(&node("bad-1", "bad", true, false));
    let op = Running::start(&c);

    for n in ["ok-1", "ok-2"] {
        wait_label(&c, n, keys::READY_LABEL, "true");
        let node = get_json(&c, &["node", n]);
        let a = &node["metadata"]["annotations"];
        assert_eq!(a[keys::STATE], "Installed", "{a}");
        assert_eq!(a[keys::DRIVER_VERSION], "580.95.05");
        assert_eq!(a[keys::FLAVOR], "open");
        assert_eq!(a[keys::KERNEL], "6.6.63-cloud-amd64");
        assert_eq!(a[keys::BOOT_ID], "boot-1");
        assert_eq!(a[keys::OS_IMAGE], "Garden Linux 1592.4");
        assert!(a[keys::INSTALLED_AT].as_str().is_some());
        // The startup taint is gone (ok-1 had it).
        let taints = node["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            !taints
                .iter()
                .any(|t| t["key"] == "gpu-driver.gardenlinux.io/driver-not-ready"),
            "{taints:?}"
        );
        // The Job ran pinned to the node, in the builder image, owned.
        let job_name = a[keys::JOB].as_str().unwrap();
        let job = get_json(&c, &["job", job_name, "-n", NS]);
        let pod = &job["spec"]["template"]["spec"];
        assert_eq!(pod["nodeName"], n);
        assert_eq!(pod["containers"][0]["image"], "kmodbuild:1592.4");
        assert_eq!(
            pod["initContainers"][0]["image"],
            "gpu-driver-installer:test"
        );
        assert_eq!(pod["hostPID"], true);
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(job["metadata"]["ownerReferences"][0]["kind"], "GpuDriver");
    }
    // An Event says so.
    c.wait_for(
        &[
            "events.events.k8s.io",
            "-A",
            "--field-selector",
            "regarding.name=ok-2,reason=DriverInstalled",
        ],
        "{.items[0].type}",
        "Normal",
        WAIT,
    );

    // Failure: an Event, the failure on the node, never the ready label.
    wait_annotation(&c, "bad-1", keys::STATE, "Failed");
    let bad_node = get_json(&c, &["node", "bad-1"]);
    let a = &bad_node["metadata"]["annotations"];
    assert_eq!(a[keys::FAILURE_REASON], "KernelApiMismatch", "{a}");
    assert_eq!(a[keys::FAILURES], "1");
    assert!(
        a[keys::FAILURE_MESSAGE]
            .as_str()
            .unwrap()
            .contains("pci_resize_resource")
    );
    assert!(bad_node["metadata"]["labels"][keys::READY_LABEL].is_null());
    assert!(a[keys::DRIVER_VERSION].is_null());
    c.wait_for(
        &[
            "events.events.k8s.io",
            "-A",
            "--field-selector",
            "regarding.name=bad-1,reason=InstallFailed",
        ],
        "{.items[0].type}",
        "Warning",
        WAIT,
    );

    // The node without a GPU got nothing.
    let cpu = get_json(&c, &["node", "cpu-1"]);
    assert!(
        cpu["metadata"]["annotations"][keys::STATE].is_null(),
        "{cpu}"
    );
    let jobs = get_json(&c, &["jobs", "-n", NS]);
    let pinned: Vec<&str> = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["spec"]["template"]["spec"]["nodeName"].as_str().unwrap())
        .collect();
    assert!(!pinned.contains(&"cpu-1"), "{pinned:?}");
    assert_eq!(pinned.len(), 3, "one Job per GPU node: {pinned:?}");

    // The status counts them.
    c.wait_for(&["gpudriver", "ok"], "{.status.readyNodes}", "2", WAIT);
    c.wait_for(&["gpudriver", "bad"], "{.status.failedNodes}", "1", WAIT);
    let st = get_json(&c, &["gpudriver", "ok"]);
    assert_eq!(st["status"]["selectedNodes"], 3, "{st}");
    assert_eq!(st["status"]["gpuNodes"], 2, "{st}");

    // Few writes: per installed node a Job, one node patch and one Event;
    // a GPU node that came without the startup taint (ok-2, bad-1) gets it
    // in one more patch before its Job.
    let writes = |res: &str| {
        op.metrics
            .render()
            .lines()
            .filter(|l| {
                l.starts_with("gpu_driver_api_writes_total")
                    && l.contains(&format!("resource=\"{res}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>()
    };
    assert_eq!(writes("jobs"), 3);
    assert_eq!(writes("nodes"), 5);

    // A reboot: new bootID, the modules are gone: ready label off, a new
    // Job, and the node annotated for the new boot.
    let first_job = get_json(&c, &["node", "ok-2"])["metadata"]["annotations"][keys::JOB].clone();
    patch_node_info(&c, "ok-2", r#"{"status":{"nodeInfo":{"bootID":"boot-2"}}}"#);
    wait_annotation(&c, "ok-2", keys::BOOT_ID, "boot-2");
    let node = get_json(&c, &["node", "ok-2"]);
    assert_eq!(node["metadata"]["labels"][keys::READY_LABEL], "true");
    assert_ne!(node["metadata"]["annotations"][keys::JOB], first_job);
    assert_eq!(writes("jobs"), 4);

    // An OS upgrade (new Garden Linux version and kernel, after its reboot):
    // a new Job in the new version's builder image, annotated for the new
    // kernel.
    patch_node_info(
        &c,
        "ok-2",
        r#"{"status":{"nodeInfo":{"bootID":"boot-3","osImage":"Garden Linux 1592.5","kernelVersion":"6.6.64-cloud-amd64"}}}"#,
    );
    wait_annotation(&c, "ok-2", keys::KERNEL, "6.6.64-cloud-amd64");
    let node = get_json(&c, &["node", "ok-2"]);
    let a = &node["metadata"]["annotations"];
    assert_eq!(a[keys::OS_IMAGE], "Garden Linux 1592.5", "{a}");
    assert_eq!(a[keys::BOOT_ID], "boot-3");
    assert_eq!(node["metadata"]["labels"][keys::READY_LABEL], "true");
    let job = get_json(&c, &["job", a[keys::JOB].as_str().unwrap(), "-n", NS]);
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["image"],
        "kmodbuild:1592.5"
    );
    assert_eq!(writes("jobs"), 5);

    // Exponential backoff: a node whose installs keep failing gets a new Job
    // after 2 s, then 4 s, then 8 s (retryBaseSeconds 2, doubling), and
    // never the ready label.
    let mut retry: Value = serde_json::from_str(&gpudriver(
        "retry",
        "retry",
        json!({ TERMINATION_MESSAGE: run_result(Reason::BuildFailed, "make exit status 2"), EXIT_CODE: "13" }),
    ))
    .unwrap();
    retry["spec"]["job"] = json!({"retryBaseSeconds": 2, "retryMaxSeconds": 60});
    c.apply(&retry.to_string());
    c.apply(&self::node("retry-1", "retry", true, false));
    wait_annotation(&c, "retry-1", keys::FAILURES, "3");
    let failing = get_json(&c, &["node", "retry-1"]);
    assert!(failing["metadata"]["labels"][keys::READY_LABEL].is_null());
    assert_eq!(
        failing["metadata"]["annotations"][keys::FAILURE_REASON],
        "BuildFailed"
    );
    let jobs = get_json(&c, &["jobs", "-n", NS]);
    let mut created: Vec<i64> = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["spec"]["template"]["spec"]["nodeName"] == "retry-1")
        .map(|j| {
            j["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap()
                .parse::<k8s_openapi::jiff::Timestamp>()
                .unwrap()
                .as_second()
        })
        .collect();
    created.sort();
    assert!(created.len() >= 3, "{created:?}");
    // The waits were kept: each gap is the backoff plus the Job's run, so
    // in whole seconds at least 2 and then 4.
    assert!(created[1] - created[0] >= 2, "{created:?}");
    assert!(created[2] - created[1] >= 4, "{created:?}");
    // The failures' Event: the first says how long the next wait is; kube's
    // event recorder folds the repeats into its series count.
    let events = get_json(
        &c,
        &[
            "events.events.k8s.io",
            "-A",
            "--field-selector",
            "regarding.name=retry-1,reason=InstallFailed",
        ],
    );
    let items = events["items"].as_array().unwrap();
    assert!(
        items.iter().any(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.ends_with("(attempt 1, next in 2s)"))),
        "{events}"
    );
    let count: u64 = items
        .iter()
        .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
        .sum();
    assert!(count >= 3, "{events}");
    drop(op);
}

/// What a real `gpu-driver-installer detect` writes for a fixture host.
fn host_report(fixture: &str) -> String {
    let root = gpu_driver_installer::host::HostRoot::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hosts")
            .join(fixture),
        gpu_driver_installer::host::HostRootSource::Flag,
    );
    let catalog = gpu_driver_installer::catalog::Catalog::embedded().unwrap();
    let doc = gpu_driver_installer::detect::detect(&gpu_driver_installer::detect::DetectOptions {
        root: &root,
        catalog: &catalog,
        kernel_release: None,
        arch: None,
    });
    gpu_driver_installer::report::termination_message(
        gpu_driver_installer::report::Kind::HostReport,
        &doc,
    )
    .unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The released binary, as its Deployment runs it (own ServiceAccount,
/// leader Lease, /metrics), on nodes that only a detect Job can tell
/// apart: the test plays each node's installer (`--job-pods manual`),
/// answering detect pods with the HostReport of a fixture host and install
/// pods with a RunResult. Then another instance takes the Lease, and the
/// binary stops.
#[test]
fn binary_detects_gpus_by_job_serves_metrics_and_yields_the_lease() {
    let Some(c) = manual_cluster() else { return };
    let mut gd = gpudriver_value("det");
    gd["spec"]["gpuDetection"] = json!({"nfd": false, "detectJob": true});
    c.apply(&gd.to_string());
    c.apply(&node("det-gpu", "det", false, false));
    c.apply(&node("det-cpu", "det", false, false));

    let port = free_port();
    let log = c.dir.join("operator-binary.log");
    let mut child = std::process::Command::new(crate::support::bin::operator())
        .args([
            "run",
            "--namespace",
            NS,
            "--identity",
            "op-a",
            "--status-interval-ms",
            "500",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .env("KUBECONFIG", operator_kubeconfig(&c))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // Kills the binary however the test ends.
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Kill(&mut child);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    let gpu_report = host_report("gardenlinux-1592-t4");
    let cpu_report = host_report("gardenlinux-1592-nogpu");
    let installed = run_result(Reason::Verified, "driver 580.95.05 verified");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let pods = get_json(&c, &["pods", "-n", NS]);
        for p in pods["items"].as_array().unwrap() {
            if !p["metadata"]["annotations"][EXIT_CODE].is_null() {
                continue;
            }
            let role = p["metadata"]["labels"][keys::ROLE_LABEL].as_str().unwrap();
            let node = p["spec"]["nodeName"].as_str().unwrap();
            let message = match (role, node) {
                ("detect", "det-gpu") => &gpu_report,
                ("detect", _) => &cpu_report,
                ("install", "det-gpu") => &installed,
                other => panic!("unexpected Job pod {other:?}"),
            };
            finish_pod(&c, p, "0", message);
        }
        let gpu = get_json(&c, &["node", "det-gpu"]);
        let cpu = get_json(&c, &["node", "det-cpu"]);
        if gpu["metadata"]["labels"][keys::READY_LABEL] == "true"
            && cpu["metadata"]["annotations"][keys::STATE] == "NoGpu"
        {
            assert_eq!(gpu["metadata"]["annotations"][keys::GPU], "true", "{gpu}");
            assert_eq!(cpu["metadata"]["annotations"][keys::GPU], "false", "{cpu}");
            assert!(cpu["metadata"]["labels"][keys::READY_LABEL].is_null());
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nodes not settled: {gpu}\n{cpu}\noperator log:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // Detect Jobs ran the installer image unprivileged; only det-gpu got an
    // install Job.
    let jobs = get_json(&c, &["jobs", "-n", NS]);
    let mut seen = Vec::new();
    for j in jobs["items"].as_array().unwrap() {
        let role = j["metadata"]["labels"][keys::ROLE_LABEL].as_str().unwrap();
        let pod = &j["spec"]["template"]["spec"];
        let node = pod["nodeName"].as_str().unwrap();
        if role == "detect" {
            assert_eq!(pod["containers"][0]["image"], "gpu-driver-installer:test");
            assert_ne!(
                pod["containers"][0]["securityContext"]["privileged"], true,
                "{pod}"
            );
        }
        seen.push(format!("{role}/{node}"));
    }
    seen.sort();
    assert_eq!(
        seen,
        ["detect/det-cpu", "detect/det-gpu", "install/det-gpu"],
        "{jobs}"
    );

    // /metrics and /healthz over HTTP, as Prometheus and the kubelet see them.
    // reqwest finds no crypto provider of its own: install ring, as the
    // installer does, whether or not another test in this binary did first.
    gpu_driver_installer::tls::init();
    let agent = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    let metrics = agent
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    for want in [
        "gpu_driver_installs_total{result=\"succeeded\"} 1",
        "gpu_driver_is_leader 1",
        "gpu_driver_install_duration_seconds_count 1",
    ] {
        assert!(metrics.contains(want), "{want} missing:\n{metrics}");
    }
    // What a Prometheus server scraping it reads, by Prometheus's parser.
    assert!(crate::support::om::series(&metrics) >= 3, "{metrics}");
    let health = agent
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .unwrap();
    assert_eq!(health.status(), 200);

    // Another instance takes the Lease: this one stops at its next renewal
    // (every 5 s) with an error, rather than act alongside it.
    let lease = get_json(&c, &["lease", "gpu-driver-operator", "-n", NS]);
    assert_eq!(lease["spec"]["holderIdentity"], "op-a");
    let renew = micro_time_now();
    c.kubectl(&[
        "patch",
        "lease",
        "gpu-driver-operator",
        "-n",
        NS,
        "--type",
        "merge",
        "-p",
        &json!({"spec": {"holderIdentity": "op-b", "renewTime": renew,
            "leaseDurationSeconds": 3600}})
        .to_string(),
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running after losing the lease:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(!status.success(), "{status:?}");
    assert!(
        log_text().contains("lost the leader lease"),
        "{}",
        log_text()
    );
}

/// Now as a Lease's MicroTime (RFC 3339 with microseconds, UTC).
fn micro_time_now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!(
        "{}.{:06}Z",
        now.strftime("%Y-%m-%dT%H:%M:%S"),
        now.subsec_microsecond()
    )
}

/// Plays the installer in a `JobPods::Manual` cluster: every Job pod not
/// answered yet ends with exit code 0 and `message` as its termination
/// message.
fn answer_pods(c: &Cluster, message: &str) {
    answer_matching(c, None, |_| true, "0", message);
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

/// Readiness across reboots: once installed, a node loses its startup
/// taint and gets the ready label; a new bootID (the modules are gone)
/// puts the taint back and takes the label off at once, before the
/// reinstall Job has finished, and only that Job's verified result undoes
/// it. A new GPU node that came without the taint gets it before its first
/// install. Another controller's taint survives every patch; a GpuDriver
/// without a startup taint only moves the label. Writes stay at one node
/// patch per change.
#[test]
fn a_reboot_taints_and_unreadies_the_node_until_the_reinstall_is_verified() {
    let Some(c) = manual_cluster() else { return };
    const STARTUP: &str = "gpu-driver.gardenlinux.io/driver-not-ready:NoSchedule";
    const OTHER: &str = "example.com/maintenance:NoSchedule";
    c.apply(&gpudriver("rb", "rb", json!({})));
    let mut plain = gpudriver_value("plain");
    plain["spec"]
        .as_object_mut()
        .unwrap()
        .remove("startupTaint");
    c.apply(&plain.to_string());
    c.apply(&node("rb-1", "rb", true, true));
    c.kubectl(&[
        "taint",
        "node",
        "rb-1",
        "example.com/maintenance=x:NoSchedule",
    ]);
    c.apply(&node("plain-1", "plain", true, false));
    c.apply(&node("rb-new", "rb", true, false));
    let op = Running::start(&c);
    let node_writes = || {
        op.metrics
            .render()
            .lines()
            .filter(|l| {
                l.starts_with("gpu_driver_api_writes_total") && l.contains("resource=\"nodes\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>()
    };
    let installed = run_result(Reason::Verified, "driver 580.95.05 verified");
    let ready = |n: &str, (label, taints): &(Option<String>, Vec<String>)| {
        label.as_deref() == Some("true")
            && !taints.iter().any(|t| t == STARTUP)
            && (n != "rb-1" || taints.iter().any(|t| t == OTHER))
    };

    // The new node is tainted while its first install runs.
    until_nodes(&c, &["rb-new"], None, |_, (label, taints)| {
        label.is_none() && taints.iter().any(|t| t == STARTUP)
    });
    // Installed: taint off, label on, in one patch per node (rb-new: one
    // more for its taint).
    until_nodes(&c, &["rb-1", "plain-1", "rb-new"], Some(&installed), ready);
    assert_eq!(node_writes(), 4);

    // Reboot: the taint is back (NoSchedule) and the label gone while the
    // reinstall Job still runs (nobody answers its pod yet).
    let rebooted = std::time::Instant::now();
    for n in ["rb-1", "plain-1"] {
        patch_node_info(&c, n, r#"{"status":{"nodeInfo":{"bootID":"boot-2"}}}"#);
    }
    until_nodes(&c, &["rb-1", "plain-1"], None, |n, (label, taints)| {
        label.is_none()
            && match n {
                "rb-1" => taints.iter().any(|t| t == STARTUP) && taints.iter().any(|t| t == OTHER),
                _ => taints.is_empty(),
            }
    });
    assert!(
        rebooted.elapsed() < Duration::from_secs(15),
        "took {:?}",
        rebooted.elapsed()
    );
    for n in ["rb-1", "plain-1"] {
        let node = get_json(&c, &["node", n]);
        let a = &node["metadata"]["annotations"];
        assert_eq!(a[keys::STATE], "Pending", "{a}");
        // Still what was verified last, for the boot before.
        assert_eq!(a[keys::BOOT_ID], "boot-1", "{a}");
    }
    let jobs = get_json(&c, &["jobs", "-n", NS]);
    assert_eq!(jobs["items"].as_array().unwrap().len(), 5, "{jobs}");
    // No patch storm while the Job runs: one more patch per node.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(node_writes(), 6);
    let (_, taints) = readiness(&c, "rb-1");
    assert_eq!(
        taints.iter().filter(|t| *t == STARTUP).count(),
        1,
        "{taints:?}"
    );

    // The reinstall's verified result for boot-2 undoes both.
    until_nodes(&c, &["rb-1", "plain-1"], Some(&installed), ready);
    for n in ["rb-1", "plain-1"] {
        wait_annotation(&c, n, keys::BOOT_ID, "boot-2");
        wait_annotation(&c, n, keys::STATE, "Installed");
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(node_writes(), 8);
    drop(op);
}

/// What a real `gpu-driver-installer prebuild` writes once the artifact is
/// in the store.
fn build_result(sha: &str, kernel: &str) -> String {
    let mut steps = Steps::new();
    steps.set_built(BuiltArtifact {
        driver_version: "580.95.05".into(),
        flavor: gpu_driver_installer::host::ModuleFlavor::Open,
        kernel_release: kernel.into(),
        arch: gpu_driver_installer::host::CpuArch::X86_64,
        cache_key: format!("artifacts/v1.1/x86_64/{kernel}/580.95.05/open/cc-0123456789abcdef"),
        artifact_sha256: sha.into(),
    });
    let doc = steps.succeed(
        RunSpec {
            host_root: "/".into(),
            artifact: None,
            driver_version: None,
            target: None,
        },
        Done::new(Success::Built, "stored"),
    );
    gpu_driver_installer::report::termination_message(
        gpu_driver_installer::report::Kind::RunResult,
        &doc,
    )
    .unwrap()
}

/// Jobs of `role` (install, build, detect) in the operator's namespace.
fn jobs_of(c: &Cluster, role: &str) -> Vec<Value> {
    let jobs = get_json(
        c,
        &[
            "jobs",
            "-n",
            NS,
            "-l",
            &format!("{}={role}", keys::ROLE_LABEL),
        ],
    );
    jobs["items"].as_array().unwrap().clone()
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

fn args_of(job: &Value) -> String {
    job["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect::<Vec<_>>()
        .join(" ")
}

fn secrets_of(job: &Value) -> Vec<String> {
    job["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["secretRef"]["name"].as_str().map(str::to_string))
        .collect()
}

fn install_job_of<'a>(jobs: &'a [Value], node: &str) -> Option<&'a Value> {
    jobs.iter()
        .find(|j| j["metadata"]["annotations"][keys::NODE] == node)
}

/// Build apart from install, against the real apiserver, the Job
/// controller, the scheduler and KWOK: a prebuild target gets its build Job
/// before any node runs it, and the build Job is scheduled (not pinned),
/// not privileged, without hostPID or host mounts, and alone holds the
/// write Secret. A node of that target installs at once, with the build's
/// digest and only the read-only Secret; a node of a new kernel waits for
/// its build Job; a failed build lets the node compile for itself
/// (compileOnNode). The status lists every target.
#[test]
fn build_jobs_prebuild_targets_and_hand_their_digest_to_installs() {
    let Some(c) = manual_cluster() else { return };
    // A CPU node for build Jobs (the kubelet's arch label), in no GPU pool.
    c.apply(
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1",
            "labels": {"kubernetes.io/arch": "amd64", "pool": "cpu"}}})
        .to_string(),
    );
    let mut gd = gpudriver_value("bld");
    gd["spec"]["cache"] = json!({"url": "s3://gpu-cache/cluster-a",
        "secretName": "cache-reader", "writeSecretName": "cache-writer"});
    gd["spec"]["prebuild"] = json!([{"gardenLinuxVersion": "1592.4",
        "kernelRelease": "6.6.70-cloud-amd64", "arch": "amd64"}]);
    gd["spec"]["job"] = json!({"retryBaseSeconds": 3600});
    c.apply(&gd.to_string());
    let op = Running::start(&c);

    // The prebuild target's build Job, before any node runs its kernel.
    let build = until("the prebuild's build Job", || {
        jobs_of(&c, "build").into_iter().next()
    });
    let pod = &build["spec"]["template"]["spec"];
    assert!(pod["nodeName"].is_null(), "{pod}");
    assert_ne!(pod["hostPID"], true);
    assert_eq!(pod["nodeSelector"]["kubernetes.io/arch"], "amd64");
    for ctr in pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(pod["initContainers"].as_array().unwrap())
    {
        assert_ne!(ctr["securityContext"]["privileged"], true, "{ctr}");
        assert_eq!(ctr["securityContext"]["allowPrivilegeEscalation"], false);
    }
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["hostPath"].is_null()),
        "{pod}"
    );
    assert_eq!(secrets_of(&build), ["cache-writer"]);
    let args = args_of(&build);
    assert!(
        args.contains("prebuild --os-id gardenlinux --os-version 1592.4 --kernel-release 6.6.70-cloud-amd64 --arch amd64"),
        "{args}"
    );
    // Scheduled onto the CPU node by the real scheduler.
    let sha_a = "a".repeat(64);
    until("the build pod scheduled and answered", || {
        (answer_role(
            &c,
            "build",
            |_| true,
            "0",
            &build_result(&sha_a, "6.6.70-cloud-amd64"),
        ) > 0)
            .then_some(())
    });
    let pods = get_json(
        &c,
        &[
            "pods",
            "-n",
            NS,
            "-l",
            &format!("{}=build", keys::ROLE_LABEL),
        ],
    );
    assert_eq!(pods["items"][0]["spec"]["nodeName"], "cpu-1");
    c.wait_for(
        &["gpudriver", "bld"],
        "{.status.targets[0].phase}",
        "Cached",
        WAIT,
    );

    // A node of the prebuilt target installs at once, with the digest.
    let mut n1: Value = serde_json::from_str(&node("bld-1", "bld", true, true)).unwrap();
    n1["status"]["nodeInfo"]["kernelVersion"] = json!("6.6.70-cloud-amd64");
    c.apply(&n1.to_string());
    let install = until("bld-1's install Job", || {
        install_job_of(&jobs_of(&c, "install"), "bld-1").cloned()
    });
    let t = |j: &Value| {
        j["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(t(&build) <= t(&install), "build Job first");
    assert_eq!(secrets_of(&install), ["cache-reader"]);
    let args = args_of(&install);
    assert!(
        args.contains(&format!("--cache-read-only --artifact-sha256 {sha_a}")),
        "{args}"
    );
    // The entry the build Job named, so the node needs no headers.
    assert!(
        args.contains(
            "--cache-entry artifacts/v1.1/x86_64/6.6.70-cloud-amd64/580.95.05/open/cc-0123456789abcdef"
        ),
        "{args}"
    );
    // Cached: the installer image alone, never compiling (the builder
    // image and compiling come back only after a failed attempt).
    assert!(args.ends_with("--no-compile"), "{args}");
    assert_eq!(
        install["spec"]["template"]["spec"]["containers"][0]["image"],
        "gpu-driver-installer:test"
    );
    assert_eq!(jobs_of(&c, "build").len(), 1, "one build per target");

    // A new kernel: its build Job first; the install waits for it.
    c.apply(&node("bld-2", "bld", true, true));
    until("bld-2's build Job", || {
        (jobs_of(&c, "build").len() == 2).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        install_job_of(&jobs_of(&c, "install"), "bld-2").is_none(),
        "bld-2 must wait for its build"
    );
    let sha_b = "b".repeat(64);
    let kernel_b = "6.6.63-cloud-amd64";
    answer_role(
        &c,
        "build",
        |p| p["metadata"]["annotations"][EXIT_CODE].is_null(),
        "0",
        &build_result(&sha_b, kernel_b),
    );
    let install2 = until("bld-2's install Job after its build", || {
        install_job_of(&jobs_of(&c, "install"), "bld-2").cloned()
    });
    assert!(args_of(&install2).contains(&format!("--artifact-sha256 {sha_b}")));

    // A failed build: the node compiles for itself (compileOnNode).
    let mut n3: Value = serde_json::from_str(&node("bld-3", "bld", true, true)).unwrap();
    n3["status"]["nodeInfo"]["kernelVersion"] = json!("6.6.80-cloud-amd64");
    c.apply(&n3.to_string());
    until("bld-3's build Job", || {
        (jobs_of(&c, "build").len() == 3).then_some(())
    });
    let failed = run_result(Reason::BuildFailed, "make: *** [Makefile:42] Error 2");
    until("bld-3's build failed", || {
        (answer_role(&c, "build", |_| true, "13", &failed) > 0).then_some(())
    });
    let install3 = until("bld-3's install Job after the failed build", || {
        install_job_of(&jobs_of(&c, "install"), "bld-3").cloned()
    });
    // No unpinned lookup because the build failed: the node compiles
    // without the cache (no URL, no credentials).
    let args = args_of(&install3);
    assert!(
        !args.contains("--cache") && !args.contains("--artifact-sha256"),
        "{args}"
    );
    let pod = &install3["spec"]["template"]["spec"];
    assert!(pod["containers"][0]["envFrom"].is_null(), "{pod}");

    // The nodes install; the status shows every target.
    let installed = run_result(Reason::Verified, "driver 580.95.05 verified");
    for n in ["bld-1", "bld-2", "bld-3"] {
        until(&format!("{n} answered"), || {
            (answer_role(&c, "install", on_node(n), "0", &installed) > 0).then_some(())
        });
        wait_annotation(&c, n, keys::STATE, "Installed");
    }
    let targets = until("three targets in the status", || {
        let gd = get_json(&c, &["gpudriver", "bld"]);
        let ts = gd["status"]["targets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (ts.len() == 3 && ts.iter().any(|t| t["phase"] == "Failed")).then_some(ts)
    });
    let by_kernel = |k: &str| {
        targets
            .iter()
            .find(|t| t["kernelRelease"] == k)
            .unwrap_or_else(|| panic!("{k}: {targets:?}"))
    };
    assert_eq!(
        by_kernel("6.6.70-cloud-amd64")["artifactSha256"],
        sha_a.as_str()
    );
    assert_eq!(by_kernel(kernel_b)["phase"], "Cached");
    assert_eq!(by_kernel("6.6.80-cloud-amd64")["reason"], "BuildFailed");
    assert_eq!(by_kernel("6.6.70-cloud-amd64")["nodes"], 1);
    drop(op);
}

/// A PodDisruptionBudget refuses every eviction for longer than the drain
/// timeout: each refusal (429, at once) comes back to the drain loop, and
/// the node's upgrade fails with DrainTimeout at the timeout, within a few
/// seconds. kube's default client retried each 429 for minutes, so one
/// eviction call blocked the node's reconcile far past the timeout.
#[test]
fn a_pdb_that_refuses_every_eviction_fails_the_drain_at_its_timeout() {
    let Some(c) = manual_cluster() else { return };
    let timeout_s: i64 = 15;
    let mut gd = gpudriver_value("pdb");
    gd["spec"]["driver"] = json!({"version": "550.163.01", "flavor": "open"});
    gd["spec"]["upgradePolicy"] = json!({"maxUnavailable": 1, "drainTimeoutSeconds": timeout_s});
    c.apply(&gd.to_string());
    c.apply(&node("pdb-1", "pdb", true, true));
    let op = Running::start(&c);
    let installed = run_result(Reason::Verified, "driver verified");
    until_nodes(&c, &["pdb-1"], Some(&installed), |_, (label, _)| {
        label.as_deref() == Some("true")
    });
    c.kubectl(&["create", "namespace", "work"]);
    c.apply(&gpu_pod("held", "pdb-1"));
    c.apply(
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "held", "namespace": "work"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}}})
        .to_string(),
    );
    c.wait_for(
        &["pdb", "held", "-n", "work"],
        "{.status.currentHealthy}",
        "1",
        WAIT,
    );
    c.kubectl(&[
        "patch",
        "gpudriver",
        "pdb",
        "--type=merge",
        "-p",
        r#"{"spec":{"driver":{"version":"580.95.05"}}}"#,
    ]);
    // Far above the timeout: the old client needed 4-5 minutes.
    let deadline = std::time::Instant::now() + Duration::from_secs(timeout_s as u64 + 90);
    let annotations = loop {
        let a = get_json(&c, &["node", "pdb-1"])["metadata"]["annotations"].clone();
        if a[keys::FAILURE_REASON] == "DrainTimeout" {
            break a;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no DrainTimeout within {timeout_s}s + 90s: {a}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let at = |k: &str| {
        let v = annotations[k]
            .as_str()
            .unwrap_or_else(|| panic!("{k}: {annotations}"));
        v.parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap_or_else(|e| panic!("{k} {v}: {e}"))
    };
    let took = at(keys::FAILED_AT).duration_since(at(keys::UPGRADE_STARTED));
    assert!(
        // The operator's clock counts whole seconds: up to 1 s early.
        (timeout_s - 1..=timeout_s + 10).contains(&took.as_secs()),
        "the drain failed after {took:?}, not at its {timeout_s}s timeout: {annotations}"
    );
    let pod = c.kubectl_output(&["get", "pod", "held", "-n", "work"], None);
    assert!(pod.status.success(), "the pod was evicted despite its PDB");
    drop(op);
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

fn gpu_pod(name: &str, node: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "work", "labels": {"app": name}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "cuda", "image": "cuda:12",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    })
    .to_string()
}

/// A rolling driver upgrade against the real apiserver, the disruption
/// controller and KWOK: changing the driver version upgrades at most
/// maxUnavailable (1) nodes at a time; each is cordoned, its GPU pods are
/// evicted through the Eviction API, and a PodDisruptionBudget that
/// forbids the eviction holds the node (and so the roll) in Draining with
/// no install Job until the budget allows it; then install, verify,
/// uncordon. A node someone else cordoned stays cordoned. Each
/// transition is on the node and an Event.
#[test]
fn a_driver_upgrade_rolls_within_max_unavailable_and_respects_a_pdb() {
    let Some(c) = manual_cluster() else { return };
    let mut gd = gpudriver_value("up");
    gd["spec"]["driver"] = json!({"version": "550.163.01", "flavor": "open"});
    gd["spec"]["upgradePolicy"] = json!({"maxUnavailable": 1, "drainTimeoutSeconds": 600});
    c.apply(&gd.to_string());
    let nodes = ["up-1", "up-2", "up-3"];
    for n in nodes {
        c.apply(&node(n, "up", true, true));
    }
    let op = Running::start(&c);
    let installed = run_result(Reason::Verified, "driver verified");
    until_nodes(&c, &nodes, Some(&installed), |_, (label, _)| {
        label.as_deref() == Some("true")
    });

    // GPU workloads: one on up-1 behind a PDB that forbids its eviction,
    // one on up-2 without; up-3 cordoned by someone else.
    c.kubectl(&["create", "namespace", "work"]);
    c.apply(&gpu_pod("train-1", "up-1"));
    c.apply(&gpu_pod("train-2", "up-2"));
    c.apply(
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "train-1", "namespace": "work"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train-1"}}}})
        .to_string(),
    );
    c.wait_for(
        &["pdb", "train-1", "-n", "work"],
        "{.status.currentHealthy}",
        "1",
        WAIT,
    );
    c.kubectl(&["cordon", "up-3"]);

    c.kubectl(&[
        "patch",
        "gpudriver",
        "up",
        "--type=merge",
        "-p",
        r#"{"spec":{"driver":{"version":"580.95.05"}}}"#,
    ]);

    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let mut seen_blocked = false;
    let mut max_busy = 0;
    loop {
        let views: Vec<_> = nodes.iter().map(|n| (*n, upgrade_view(&c, n))).collect();
        let busy: Vec<&str> = views
            .iter()
            .filter(|(_, (_, u))| u.is_some())
            .map(|(n, _)| *n)
            .collect();
        max_busy = max_busy.max(busy.len());
        assert!(
            busy.len() <= 1,
            "more than maxUnavailable upgrading: {views:?}"
        );
        let done = nodes.iter().all(|n| {
            let a = get_json(&c, &["node", n]);
            a["metadata"]["annotations"][keys::STATE] == "Installed"
                && a["metadata"]["annotations"][keys::UPGRADE].is_null()
                && a["metadata"]["labels"][keys::READY_LABEL] == "true"
                && jobs_of(&c, "install").len() == 6
        });
        if done {
            break;
        }
        if !seen_blocked && views[0].1 == (true, Some("Draining".into())) {
            // The PDB refuses the eviction: the pod stays, no install Job
            // starts on up-1, and no other node starts either.
            std::thread::sleep(Duration::from_secs(4));
            assert_eq!(upgrade_view(&c, "up-1"), (true, Some("Draining".into())));
            let pod = c.kubectl_output(&["get", "pod", "train-1", "-n", "work"], None);
            assert!(pod.status.success(), "train-1 evicted despite its PDB");
            let up1_jobs = jobs_of(&c, "install")
                .into_iter()
                .filter(|j| j["metadata"]["annotations"][keys::NODE] == "up-1")
                .count();
            assert_eq!(up1_jobs, 1, "no upgrade install Job while draining");
            let status = get_json(&c, &["gpudriver", "up"]);
            assert_eq!(status["status"]["upgrade"]["inProgress"], json!(["up-1"]));
            // The others (waiting for their turn, or done) keep the ready
            // label: the device plugin stays on them.
            for n in ["up-2", "up-3"] {
                assert_eq!(readiness(&c, n).0.as_deref(), Some("true"), "{n}");
            }
            assert_eq!(readiness(&c, "up-1").0, None);
            c.kubectl(&["delete", "pdb", "train-1", "-n", "work"]);
            seen_blocked = true;
        }
        // Answer only the install Jobs of nodes that are drained.
        for (n, (_, u)) in &views {
            if u.as_deref() == Some("Installing") {
                answer_role(&c, "install", on_node(n), "0", &installed);
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "roll not done: {views:?} {}",
            get_json(&c, &["gpudriver", "up"])["status"]
        );
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(seen_blocked, "up-1 was never seen held by its PDB");
    assert_eq!(max_busy, 1);
    // Evicted: both pods gone once their nodes upgraded.
    for p in ["train-1", "train-2"] {
        let out = c.kubectl_output(&["get", "pod", p, "-n", "work"], None);
        assert!(!out.status.success(), "{p} still there");
    }
    // Uncordoned where we cordoned; up-3 stays as its owner left it.
    assert_eq!(upgrade_view(&c, "up-1"), (false, None));
    assert_eq!(upgrade_view(&c, "up-2"), (false, None));
    assert_eq!(upgrade_view(&c, "up-3"), (true, None));
    let events = get_json(&c, &["events.events.k8s.io", "-A"]);
    let reasons: Vec<String> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["regarding"]["name"] == "up-1")
        .map(|e| e["reason"].as_str().unwrap_or("").to_string())
        .collect();
    for r in ["UpgradeStarted", "UpgradeDrained", "DriverInstalled"] {
        assert!(reasons.iter().any(|x| x == r), "{r} not in {reasons:?}");
    }
    until("the roll gone from the status", || {
        get_json(&c, &["gpudriver", "up"])["status"]["upgrade"]
            .is_null()
            .then_some(())
    });
    drop(op);
}

mod coexist;
