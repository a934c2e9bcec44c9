//! Beside NVIDIA's GPU Operator: a driver upgrade takes the operands that
//! hold the driver open (without requesting a GPU) off each node through
//! their per-node deploy labels, before that node's install Job, and brings
//! them back after; the toolkit is restarted for its CDI specification.
//! Against the real apiserver, the real DaemonSet controller and KWOK.
//!
//! The DaemonSets are shaped like the GPU Operator's (v26.x assets): each
//! selects `nvidia.com/gpu.deploy.<operand>: "true"` and labels its pods
//! `app: <name>`; `docs/workloads.md` cites the files.

use std::collections::BTreeMap;

use super::*;
use crate::support::cluster::Options as ClusterOptions;

const GPU_OPERATOR_NS: &str = "gpu-operator";
const OLD: &str = "550.163.01";
const NEW: &str = "580.95.05";

/// (DaemonSet name = pod `app` label, its deploy label's operand; `None`:
/// our exporter, which follows the ready label).
const DAEMONSETS: [(&str, Option<&str>); 5] = [
    ("nvidia-dcgm-exporter", Some("dcgm-exporter")),
    ("gpu-feature-discovery", Some("gpu-feature-discovery")),
    ("nvidia-mig-manager", Some("mig-manager")),
    (
        "nvidia-container-toolkit-daemonset",
        Some("container-toolkit"),
    ),
    ("gpu-driver-exporter", None),
];

/// The operands that hold the driver and are paused (not the toolkit,
/// which is restarted instead, nor our exporter, which follows the ready
/// label).
const HOLDERS: [&str; 4] = [
    "nvidia-dcgm-exporter",
    "gpu-feature-discovery",
    "nvidia-mig-manager",
    "gpu-driver-exporter",
];

fn daemonset(name: &str, operand: Option<&str>) -> String {
    let (ns, selector) = match operand {
        Some(o) => (GPU_OPERATOR_NS, format!("nvidia.com/gpu.deploy.{o}")),
        None => (NS, keys::READY_LABEL.to_string()),
    };
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {selector: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": format!("{name}:test")}],
                }
            }
        }
    })
    .to_string()
}

/// The running (not deleting) DaemonSet pods on `node`: app label → UID.
fn operand_pods(c: &Cluster, node: &str) -> BTreeMap<String, String> {
    let field = format!("spec.nodeName={node}");
    let pods = get_json(c, &["pods", "-A", "--field-selector", &field]);
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| {
            let app = p["metadata"]["labels"]["app"].as_str()?;
            Some((app.to_string(), p["metadata"]["uid"].as_str()?.to_string()))
        })
        .collect()
}

fn labels_of(c: &Cluster, node: &str) -> Value {
    get_json(c, &["node", node])["metadata"]["labels"].clone()
}

fn deploy_label(operand: &str) -> String {
    format!("nvidia.com/gpu.deploy.{operand}")
}

/// A roll from OLD to NEW across three nodes with maxUnavailable 1:
/// - before each node's upgrade install Job exists, the paused operands'
///   pods and our exporter's are gone from that node (the DaemonSet
///   controller deleted them), while the toolkit stays;
/// - after, the labels that were `true` are `true` again, the one a user
///   set to `false` by hand is still `false`, every operand is back, and
///   the toolkit's pod is a new one (evicted for its CDI specification).
#[test]
fn an_upgrade_pauses_the_gpu_operators_operands_and_restores_them() {
    let Some(c) = Cluster::start_with_options(ClusterOptions {
        job_pods: JobPods::Manual,
        daemonsets: true,
        ..ClusterOptions::default()
    }) else {
        return;
    };
    install_base(&c);
    let mut gd = gpudriver_value("co");
    gd["spec"]["driver"] = json!({"version": OLD, "flavor": "open"});
    gd["spec"]["upgradePolicy"] = json!({"maxUnavailable": 1, "drainTimeoutSeconds": 600});
    c.apply(&gd.to_string());
    let nodes = ["co-1", "co-2", "co-3"];
    for n in nodes {
        apply_node_with_operands(&c, n);
    }
    c.kubectl(&["create", "namespace", GPU_OPERATOR_NS]);
    for (name, operand) in DAEMONSETS {
        c.apply(&daemonset(name, operand));
    }
    let op = Running::start(&c);
    let installed = run_result_of(Reason::Verified, "driver verified", OLD);
    until_nodes(&c, &nodes, Some(&installed), |_, (label, _)| {
        label.as_deref() == Some("true")
    });
    let expected = |n: &str| -> Vec<&str> {
        let mut apps: Vec<&str> = DAEMONSETS.iter().map(|(a, _)| *a).collect();
        if n == "co-2" {
            apps.retain(|a| *a != "nvidia-mig-manager");
        }
        apps.sort();
        apps
    };
    let mut toolkit_before = BTreeMap::new();
    for n in nodes {
        let pods = until(&format!("every operand on {n}"), || {
            let pods = operand_pods(&c, n);
            (pods.keys().map(String::as_str).collect::<Vec<_>>() == expected(n)).then_some(pods)
        });
        toolkit_before.insert(n, pods["nvidia-container-toolkit-daemonset"].clone());
    }

    c.kubectl(&[
        "patch",
        "gpudriver",
        "co",
        "--type=merge",
        "-p",
        &json!({"spec": {"driver": {"version": NEW}}}).to_string(),
    ]);
    let upgraded = run_result_of(Reason::Verified, "driver verified", NEW);
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let mut checked = Vec::new();
    loop {
        let busy: Vec<&str> = nodes
            .iter()
            .filter(|n| upgrade_view(&c, n).1.is_some())
            .copied()
            .collect();
        assert!(
            busy.len() <= 1,
            "more than maxUnavailable upgrading: {busy:?}"
        );
        for n in nodes {
            let jobs: Vec<Value> = jobs_of(&c, "install")
                .into_iter()
                .filter(|j| j["metadata"]["annotations"][keys::NODE] == n)
                .collect();
            if jobs.len() == 2 && !checked.contains(&n) {
                assert_holders_left(&c, n);
                checked.push(n);
                answer_role(&c, "install", on_node(n), "0", &upgraded);
            }
        }
        let done = nodes.iter().all(|n| {
            let node = get_json(&c, &["node", n]);
            let a = &node["metadata"]["annotations"];
            a[keys::DRIVER_VERSION] == NEW && a[keys::UPGRADE].is_null()
        });
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "roll not done; checked {checked:?}; {}",
            get_json(&c, &["gpudriver", "co"])["status"]
        );
        std::thread::sleep(Duration::from_millis(150));
    }
    assert_eq!(checked.len(), 3, "{checked:?}");

    for n in nodes {
        assert_labels_restored(&c, n);
        let pods = until(&format!("every operand back on {n}"), || {
            let pods = operand_pods(&c, n);
            (pods.keys().map(String::as_str).collect::<Vec<_>>() == expected(n)).then_some(pods)
        });
        assert_ne!(
            pods["nvidia-container-toolkit-daemonset"], toolkit_before[n],
            "{n}: the toolkit's pod was not restarted"
        );
    }
    let events = get_json(&c, &["events.events.k8s.io", "-A"]);
    let restarted = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "ToolkitRestarted")
        .count();
    assert!(restarted >= 3, "{restarted} ToolkitRestarted events");
    drop(op);
}

/// After the roll: every label as it was before, nothing left paused.
fn assert_labels_restored(c: &Cluster, n: &str) {
    let labels = labels_of(c, n);
    for o in [
        "dcgm-exporter",
        "gpu-feature-discovery",
        "container-toolkit",
    ] {
        assert_eq!(labels[deploy_label(o)], "true", "{n}: {o}");
    }
    let mig = if n == "co-2" { "false" } else { "true" };
    assert_eq!(
        labels[deploy_label("mig-manager")],
        mig,
        "{n}: kept as it was"
    );
    let a = &get_json(c, &["node", n])["metadata"]["annotations"];
    assert!(a[keys::PAUSED_OPERANDS].is_null(), "{n}: {a}");
}

/// A GPU node of the pool whose GPU Operator operands are all deployed
/// (co-2 without the MIG manager, set by hand).
fn apply_node_with_operands(c: &Cluster, n: &str) {
    let mut node: Value = serde_json::from_str(&node(n, "co", true, true)).unwrap();
    let labels = &mut node["metadata"]["labels"];
    for o in [
        "dcgm-exporter",
        "gpu-feature-discovery",
        "mig-manager",
        "container-toolkit",
    ] {
        labels[deploy_label(o)] = json!("true");
    }
    if n == "co-2" {
        // Set by hand: no MIG manager on this node.
        labels[deploy_label("mig-manager")] = json!("false");
    }
    c.apply(&node.to_string());
}

/// Its upgrade install Job exists: the holders left first, their labels
/// paused; the toolkit stays, as does a label set by hand.
fn assert_holders_left(c: &Cluster, n: &str) {
    // Its upgrade install Job exists: the holders left first.
    let pods = operand_pods(c, n);
    for h in HOLDERS {
        assert!(
            !pods.contains_key(h),
            "{h} still on {n} when its install Job started: {pods:?}"
        );
    }
    assert!(pods.contains_key("nvidia-container-toolkit-daemonset"));
    let labels = labels_of(c, n);
    assert_eq!(
        labels[deploy_label("dcgm-exporter")],
        "paused-for-driver-upgrade"
    );
    assert_eq!(
        labels[deploy_label("container-toolkit")],
        "true",
        "not paused"
    );
    if n == "co-2" {
        assert_eq!(labels[deploy_label("mig-manager")], "false");
    }
}
