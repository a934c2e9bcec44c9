use serde_json::json;

use super::node;

/// A Node as the kubelet and the operator leave it (trimmed from a run's
/// node.json).
fn sample() -> serde_json::Value {
    json!({
      "metadata": {
        "name": "gpu-node-1",
        "uid": "0c6f3c1e-2f7e-4b6a-9a55-8f1e2d3c4b5a",
        "annotations": {
          "gpu-driver.gardenlinux.io/boot-id": "5b1f0a44-3c6e-4d0b-a7a1-2b8f9d0e1c2d",
          "gpu-driver.gardenlinux.io/state": "Installed",
          "node.alpha.kubernetes.io/ttl": "0"
        },
        "labels": {"gpu-driver.gardenlinux.io/ready": "true", "kubernetes.io/hostname": "gpu-node-1"}
      },
      "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
      "status": {
        "allocatable": {"cpu": "2", "nvidia.com/gpu": "1"},
        "conditions": [
          {"type": "MemoryPressure", "status": "False"},
          {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        ],
        "nodeInfo": {"bootID": "5b1f0a44-3c6e-4d0b-a7a1-2b8f9d0e1c2d", "osImage": "Garden Linux 1877.3"}
      }
    })
}

#[test]
fn reads_the_node() {
    let n = sample();
    assert!(node::ready(&n));
    assert_eq!(node::state(&n), "Installed");
    assert_eq!(node::ready_label(&n), "true");
    assert_eq!(node::gpus(&n), "1");
    assert!(!node::tainted(&n));
    assert_eq!(node::boot_id(&n), "5b1f0a44-3c6e-4d0b-a7a1-2b8f9d0e1c2d");
    assert_eq!(node::uid(&n), "0c6f3c1e-2f7e-4b6a-9a55-8f1e2d3c4b5a");
    let gist = super::node_gist(&n);
    assert!(
        gist.contains("node taints: node.kubernetes.io/not-ready=:NoSchedule\n"),
        "{gist}"
    );
    assert!(
        gist.contains("nvidia.com/gpu: 1, unschedulable: false"),
        "{gist}"
    );
}

#[test]
fn reads_a_node_after_the_reboot() {
    let n = json!({
      "metadata": {"annotations": {"gpu-driver.gardenlinux.io/state": "Pending"}, "labels": {}},
      "spec": {"taints": [{"key": node::TAINT, "effect": "NoSchedule"}]},
      "status": {"allocatable": {"cpu": "2"}, "conditions": [{"type": "Ready", "status": "False"}]}
    });
    assert!(!node::ready(&n));
    assert_eq!(node::ready_label(&n), "absent");
    assert_eq!(node::gpus(&n), "0");
    assert!(node::tainted(&n));
    assert_eq!(node::boot_id(&n), "");
}

#[test]
fn tells_pods_that_do_not_run() {
    let list = json!({"items": [
      {"metadata": {"namespace": "default", "name": "gpu-pod"},
       "status": {"phase": "Pending",
         "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                         "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]}},
      {"metadata": {"namespace": "gpu-driver", "name": "op"}, "status": {"phase": "Running"}},
      {"metadata": {"namespace": "kube-system", "name": "plugin"},
       "status": {"phase": "Pending", "containerStatuses": [
         {"name": "plugin", "state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    ]});
    assert_eq!(
        super::pods_gist(&list),
        "pod default/gpu-pod: Pending  \n  PodScheduled: Unschedulable 0/1 nodes are available: 1 Insufficient nvidia.com/gpu.\n\
         pod kube-system/plugin: Pending  \n  plugin waiting: ContainerCreating \n"
    );
}

#[test]
fn reads_cluster_env() {
    let text = "KUBECONFIG=/t/real-node/cluster/kubeconfig\nSERVER=https://127.0.0.1:26443\n\
                CA_FILE=/t/real-node/cluster/pki/ca.crt\nBIN=/c/k8s/bin\nAUDIT_LOG=\nAPI_PORT=26443\n\
                KUBELET_NODE=gpu-node-1\nKUBELET_TOKEN_FILE=/t/real-node/cluster/kubelet-gpu-node-1.token\n";
    let e = super::parse_env(text).unwrap();
    assert_eq!(e.api_port, "26443");
    assert_eq!(
        e.kubelet_token_file.to_str(),
        Some("/t/real-node/cluster/kubelet-gpu-node-1.token")
    );
    assert!(super::parse_env("KUBECONFIG=/k\n").is_err());
}

#[test]
fn picks_scheduler_problems() {
    let text = "I1207 20:01:02.000 1 x.go:1] fine\nW1207 20:01:03.000 1 y.go:2] careful\n\
                E1207 20:01:04.000 1 z.go:3] broken\nError: not klog\n";
    assert_eq!(
        super::scheduler_problems(text, 8),
        [
            "W1207 20:01:03.000 1 y.go:2] careful",
            "E1207 20:01:04.000 1 z.go:3] broken"
        ]
    );
}
