use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::*;
use crate::keys;

fn gd_with_taint() -> GpuDriver {
    GpuDriver::new(
        "gd",
        serde_json::from_value(json!({
            "builderImages": [{"image": "b:1"}],
            "installerImage": "i:1",
            "startupTaint": "gpu-driver.gardenlinux.io/not-ready",
        }))
        .unwrap(),
    )
}

fn node_with_taints(taints: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n", "resourceVersion": "42",
            "labels": {keys::READY_LABEL: "true"}},
        "spec": {"taints": taints},
    }))
    .unwrap()
}

fn body(patch: &impl Serialize) -> Value {
    serde_json::to_value(patch).unwrap()
}

#[test]
fn the_startup_taint_goes_back_beside_other_controllers_taints() {
    let gd = gd_with_taint();
    let other = json!({"key": "example.com/maintenance", "value": "x", "effect": "NoExecute"});
    let node = node_with_taints(json!([other]));
    let mut patch = NodePatch::default();
    add_marks(&gd, &node, UNREADY, &mut patch);
    assert_eq!(
        body(&patch),
        json!({
            "metadata": {"labels": {keys::READY_LABEL: null}, "resourceVersion": "42"},
            "spec": {"taints": [other, {"key": "gpu-driver.gardenlinux.io/not-ready",
                "effect": "NoSchedule"}]},
        })
    );
    // Already there (the node pool's, with its own effect): the list is
    // not rewritten, and no resourceVersion pins the patch.
    let pool = json!({"key": "gpu-driver.gardenlinux.io/not-ready", "effect": "NoExecute"});
    let node = node_with_taints(json!([pool, other]));
    let mut patch = NodePatch::default();
    add_marks(&gd, &node, UNREADY, &mut patch);
    assert_eq!(
        body(&patch),
        json!({"metadata": {"labels": {keys::READY_LABEL: null}}})
    );
    // Removed again: only ours goes.
    let mut patch = NodePatch::default();
    let ready = Marks {
        ready_label: Some(true),
        startup_taint: Some(false),
    };
    add_marks(&gd, &node, ready, &mut patch);
    let patch = body(&patch);
    assert_eq!(patch["spec"], json!({"taints": [other]}));
    assert_eq!(patch["metadata"]["labels"][keys::READY_LABEL], "true");
    assert_eq!(patch["metadata"]["resourceVersion"], "42");
}

const UNREADY: Marks = Marks {
    ready_label: Some(false),
    startup_taint: Some(true),
};

#[test]
fn a_status_field_that_went_away_is_nulled_in_the_patch() {
    use crate::crd::UpgradeStatus;
    let before = GpuDriverStatus {
        upgrade: Some(UpgradeStatus {
            max_unavailable: 1,
            pending_nodes: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    let after = GpuDriverStatus::default();
    let patch = body(&status_patch(&after, Some(&before)));
    assert_eq!(patch["status"]["upgrade"], Value::Null);
    assert!(patch["status"].as_object().unwrap().contains_key("upgrade"));
    let patch = body(&status_patch(&after, None));
    assert!(!patch["status"].as_object().unwrap().contains_key("upgrade"));
    // Everything else is the status itself.
    let mut whole = body(&after);
    whole["upgrade"] = Value::Null;
    assert_eq!(body(&status_patch(&after, Some(&before)))["status"], whole);
}

#[test]
fn a_failure_message_reaches_the_node_without_credentials() {
    let msg = "every source failed: https://user:pass@mirror.example/NVIDIA.run: HTTP 404; \
               s3://AKIA:secret@bucket refused";
    let patch = failure_patch("k", 1, "DownloadFailed", msg, Timestamp::UNIX_EPOCH);
    let text = serde_json::to_string(&patch).unwrap();
    assert!(!text.contains("pass") && !text.contains("secret"), "{text}");
    assert!(
        text.contains("https://***@mirror.example/NVIDIA.run"),
        "{text}"
    );
}

/// Every annotation field, set, under the name `keys` gives it.
#[test]
fn annotation_fields_carry_the_keys_names() {
    let s = |v: &str| Change::Set(v.to_string());
    let all = NodeAnnotations {
        state: Change::Set(NodeState::Installed),
        key: s("k"),
        driver_version: s("d"),
        flavor: s("f"),
        kernel: s("kr"),
        boot_id: s("b"),
        os_image: s("o"),
        installed_at: s("i"),
        job: s("j"),
        gpu: s("true"),
        failures: s("1"),
        failure_key: s("fk"),
        failed_at: s("fa"),
        failure_reason: s("fr"),
        failure_message: s("fm"),
        upgrade: Change::Set(UpgradeState::Draining),
        upgrade_started: s("us"),
        upgrade_cordoned: s("true"),
        paused_operands: s("dcgm-exporter"),
    };
    let mut names: Vec<String> = body(&all).as_object().unwrap().keys().cloned().collect();
    names.sort();
    let mut want = vec![
        keys::STATE,
        keys::KEY,
        keys::DRIVER_VERSION,
        keys::FLAVOR,
        keys::KERNEL,
        keys::BOOT_ID,
        keys::OS_IMAGE,
        keys::INSTALLED_AT,
        keys::JOB,
        keys::GPU,
        keys::PAUSED_OPERANDS,
    ];
    want.extend(CLEARED_WHEN_READY);
    want.sort();
    assert_eq!(names, want);
    assert_eq!(body(&all)[keys::STATE], "Installed");
    assert_eq!(body(&all)[keys::UPGRADE], "Draining");
    let labels = NodeLabels {
        ready: Change::Remove,
        operands: [
            (
                "nvidia.com/gpu.deploy.dcgm".to_string(),
                Some("true".to_string()),
            ),
            ("nvidia.com/gpu.deploy.x".to_string(), None),
        ]
        .into(),
    };
    assert_eq!(
        body(&labels),
        json!({ keys::READY_LABEL: null, "nvidia.com/gpu.deploy.dcgm": "true", "nvidia.com/gpu.deploy.x": null })
    );
}

/// The failure's and the upgrade's keys: a ready node has none.
const CLEARED_WHEN_READY: [&str; 8] = [
    keys::FAILURES,
    keys::FAILURE_KEY,
    keys::FAILED_AT,
    keys::FAILURE_REASON,
    keys::FAILURE_MESSAGE,
    keys::UPGRADE,
    keys::UPGRADE_STARTED,
    keys::UPGRADE_CORDONED,
];

/// The ready patch as the apiserver receives it: every key, the failure's
/// and the upgrade's as nulls, and the uncordon of a node we cordoned.
#[test]
fn the_ready_patch_sets_the_install_and_nulls_the_failure_and_upgrade() {
    let gd = gd_with_taint();
    let mut node = node_with_taints(json!([
        {"key": "gpu-driver.gardenlinux.io/not-ready", "effect": "NoSchedule"}
    ]));
    node.metadata.labels = None;
    node.status = serde_json::from_value(json!({"nodeInfo": {
        "kernelVersion": "6.6", "osImage": "Garden Linux 1592.4", "bootID": "b1",
        "architecture": "amd64", "containerRuntimeVersion": "", "kubeProxyVersion": "",
        "kubeletVersion": "", "machineID": "", "operatingSystem": "linux", "systemUUID": ""}}))
    .unwrap();
    let result = PodResult {
        phase: gpu_driver_contract::report::Phase::Succeeded,
        reason: gpu_driver_contract::report::Reason::Detected,
        message: String::new(),
        installed: None,
        cache: None,
        built: None,
    };
    let now = Timestamp::UNIX_EPOCH;
    let patch = body(&ready_patch(&gd, &node, "key1", "job1", &result, now, true));
    let a = &patch["metadata"]["annotations"];
    assert_eq!(a[keys::STATE], "Installed");
    assert_eq!(a[keys::KEY], "key1");
    assert_eq!(a[keys::JOB], "job1");
    assert_eq!(a[keys::KERNEL], "6.6");
    assert_eq!(a[keys::BOOT_ID], "b1");
    assert_eq!(a[keys::INSTALLED_AT], now.to_string());
    for k in CLEARED_WHEN_READY {
        assert_eq!(a.get(k), Some(&Value::Null), "{k}");
    }
    assert_eq!(patch["metadata"]["labels"][keys::READY_LABEL], "true");
    assert_eq!(patch["metadata"]["resourceVersion"], "42");
    assert_eq!(patch["spec"], json!({"taints": [], "unschedulable": false}));
    assert!(a.get(keys::PAUSED_OPERANDS).is_none(), "nothing was paused");

    // An upgrade that paused two GPU Operator operands: the one still
    // paused is deployed again, the one a user set to false meanwhile
    // keeps the user's value, and the record goes.
    node.metadata.annotations = Some(
        [(
            keys::PAUSED_OPERANDS.to_string(),
            "dcgm-exporter,mig-manager".to_string(),
        )]
        .into(),
    );
    node.metadata.labels = Some(
        [
            (
                "nvidia.com/gpu.deploy.dcgm-exporter".to_string(),
                "paused-for-driver-upgrade".to_string(),
            ),
            (
                "nvidia.com/gpu.deploy.mig-manager".to_string(),
                "false".to_string(),
            ),
        ]
        .into(),
    );
    let patch = body(&ready_patch(&gd, &node, "key1", "job1", &result, now, true));
    assert_eq!(
        patch["metadata"]["annotations"][keys::PAUSED_OPERANDS],
        Value::Null
    );
    assert_eq!(
        patch["metadata"]["labels"],
        json!({keys::READY_LABEL: "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true"})
    );
}
