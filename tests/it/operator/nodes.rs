//! GPU nodes: pinned install Jobs, annotations, reinstalls, and a reboot's
//! taint until the reinstall is verified.

use super::*;

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
        assert_installed(&c, n);
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

    assert_failed_and_gpu_less(&c);

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

    assert_retries_back_off(&c);
    drop(op);
}

/// The failed node, the node without a GPU, and the status counting them.
fn assert_failed_and_gpu_less(c: &Cluster) {
    // Failure: an Event, the failure on the node, never the ready label.
    wait_annotation(c, "bad-1", keys::STATE, "Failed");
    let bad_node = get_json(c, &["node", "bad-1"]);
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
    let cpu = get_json(c, &["node", "cpu-1"]);
    assert!(
        cpu["metadata"]["annotations"][keys::STATE].is_null(),
        "{cpu}"
    );
    let jobs = get_json(c, &["jobs", "-n", NS]);
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
    let st = get_json(c, &["gpudriver", "ok"]);
    assert_eq!(st["status"]["selectedNodes"], 3, "{st}");
    assert_eq!(st["status"]["gpuNodes"], 2, "{st}");
}

/// Exponential backoff: a node whose installs keep failing gets a new Job
/// after 2 s, then 4 s, then 8 s (retryBaseSeconds 2, doubling), and
/// never the ready label.
fn assert_retries_back_off(c: &Cluster) {
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
    wait_annotation(c, "retry-1", keys::FAILURES, "3");
    let failing = get_json(c, &["node", "retry-1"]);
    assert!(failing["metadata"]["labels"][keys::READY_LABEL].is_null());
    assert_eq!(
        failing["metadata"]["annotations"][keys::FAILURE_REASON],
        "BuildFailed"
    );
    let jobs = get_json(c, &["jobs", "-n", NS]);
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
        c,
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
}

/// An installed node: labelled, annotated, untainted, its Job pinned.
fn assert_installed(c: &Cluster, n: &str) {
    wait_label(c, n, keys::READY_LABEL, "true");
    let node = get_json(c, &["node", n]);
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
    let job = get_json(c, &["job", job_name, "-n", NS]);
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
