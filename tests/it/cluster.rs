//! The test harness's real control plane (tests/it/support/cluster.rs): the
//! apiserver answers over TLS with the harness's CA and token, KWOK turns a
//! new Node Ready keeping its nodeInfo, and a Job pinned to that node runs a
//! pod that completes with the termination message (or exit code) the test
//! asked for, as the operator's installer Jobs will; the audit log records
//! each write with its client.

use std::time::Duration;

use crate::support::cluster::{Cluster, EXIT_CODE, JobPods, Options, TERMINATION_MESSAGE};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);

fn node(name: &str) -> String {
    crate::support::manifests::garden_linux_node(
        name,
        serde_json::json!({"feature.node.kubernetes.io/pci-10de.present": "true"}),
    )
    .to_string()
}

fn job(name: &str, node: &str, annotations: Value) -> String {
    serde_json::json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 600,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "initContainers": [{"name": "copy", "image": "installer:test"}],
                    "containers": [{
                        "name": "install",
                        "image": "builder:test",
                        "securityContext": {"privileged": true},
                    }],
                },
            },
        },
    })
    .to_string()
}

/// Waits until the `kind` (`job` or `node`) `name` has the condition
/// `condition` True.
fn wait_condition(c: &Cluster, kind: &str, name: &str, condition: &str) {
    let mut what = vec![kind, name];
    if kind == "job" {
        what.extend(["-n", "default"]);
    }
    c.wait_for(
        &what,
        &format!("{{.status.conditions[?(@.type==\"{condition}\")].status}}"),
        "True",
        WAIT,
    );
}

fn pod_of(c: &Cluster, job: &str) -> Value {
    let pods = c.kubectl(&[
        "get",
        "pods",
        "-n",
        "default",
        "-l",
        &format!("batch.kubernetes.io/job-name={job}"),
        "-o",
        "json",
    ]);
    let pods: Value = serde_json::from_str(&pods).unwrap();
    let items = pods["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "one pod for job {job}: {pods}");
    items[0].clone()
}

#[test]
fn control_plane_runs_jobs_on_simulated_nodes() {
    let Some(c) = Cluster::start_with_options(Options {
        audit: true,
        ..Options::default()
    }) else {
        return;
    };

    // TLS with the harness's CA, the admin token, a real apiserver.
    let (status, body) = c.get("/version");
    assert_eq!(status, 200, "{body}");
    let version: Value = serde_json::from_str(&body).unwrap();
    assert!(
        version["gitVersion"].as_str().unwrap().starts_with("v1."),
        "{version}"
    );
    let (status, body) = c.get("/readyz");
    assert_eq!((status, body.as_str()), (200, "ok"));

    c.apply(&node("gpu-node-1"));
    wait_condition(&c, "node", "gpu-node-1", "Ready");
    let n: Value =
        serde_json::from_str(&c.kubectl(&["get", "node", "gpu-node-1", "-o", "json"])).unwrap();
    assert_eq!(
        n["status"]["nodeInfo"]["kernelVersion"],
        "6.6.63-cloud-amd64"
    );
    assert_eq!(n["status"]["nodeInfo"]["osImage"], "Garden Linux 1592.4");
    assert!(
        n["spec"]["taints"].is_null(),
        "a simulated node must be schedulable: {}",
        n["spec"]
    );

    // The audit log tells who wrote what: the benchmark's writes per node.
    let writes = c.writes();
    assert!(
        writes.iter().any(|w| w.verb == "create"
            && w.resource == "nodes"
            && w.name == "gpu-node-1"
            && w.user_agent.starts_with("kubectl")
            && w.code == 201),
        "{writes:#?}"
    );
    assert!(
        writes.iter().any(|w| w.resource == "nodes"
            && w.subresource == "status"
            && w.user_agent.starts_with("kwok")),
        "KWOK made the node Ready: {writes:#?}"
    );

    // Success with a termination message (JSON, quotes and a newline).
    let message = "{\"result\": \"Installed\",\n \"kernel\": \"6.6.63-cloud-amd64\"}";
    c.apply(&job(
        "install-ok",
        "gpu-node-1",
        serde_json::json!({ TERMINATION_MESSAGE: message }),
    ));
    wait_condition(&c, "job", "install-ok", "Complete");
    let pod = pod_of(&c, "install-ok");
    assert_eq!(pod["status"]["phase"], "Succeeded", "{pod}");
    assert_eq!(pod["spec"]["nodeName"], "gpu-node-1");
    let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["exitCode"], 0, "{pod}");
    assert_eq!(terminated["message"], message, "{pod}");
    assert_eq!(
        pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"], "Completed",
        "{pod}"
    );

    // Failure: a non-zero exit fails the pod, and with backoffLimit 0 the Job.
    c.apply(&job(
        "install-fail",
        "gpu-node-1",
        serde_json::json!({ EXIT_CODE: "3", TERMINATION_MESSAGE: "compile failed" }),
    ));
    wait_condition(&c, "job", "install-fail", "Failed");
    let pod = pod_of(&c, "install-fail");
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["exitCode"], 3, "{pod}");
    assert_eq!(terminated["message"], "compile failed", "{pod}");
}

#[test]
fn manual_job_pods_wait_for_the_test_to_finish_them() {
    let Some(c) = Cluster::start_with(JobPods::Manual) else {
        return;
    };
    c.apply(&node("gpu-node-2"));
    wait_condition(&c, "node", "gpu-node-2", "Ready");
    c.apply(&job("detect", "gpu-node-2", serde_json::json!({})));
    // The pod runs and stays running: nothing has finished it yet.
    c.wait_for(
        &[
            "pods",
            "-n",
            "default",
            "-l",
            "batch.kubernetes.io/job-name=detect",
        ],
        "{.items[0].status.phase}",
        "Running",
        WAIT,
    );
    std::thread::sleep(Duration::from_secs(2));
    let pod = pod_of(&c, "detect");
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");

    // The test plays the node: it writes the result, and the pod completes.
    let name = pod["metadata"]["name"].as_str().unwrap();
    let patch = serde_json::json!({"metadata": {"annotations": {
        EXIT_CODE: "0",
        TERMINATION_MESSAGE: "{\"gpus\": 8}",
    }}})
    .to_string();
    c.kubectl(&[
        "patch", "pod", name, "-n", "default", "--type", "merge", "-p", &patch,
    ]);
    wait_condition(&c, "job", "detect", "Complete");
    let pod = pod_of(&c, "detect");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"],
        "{\"gpus\": 8}"
    );
}
