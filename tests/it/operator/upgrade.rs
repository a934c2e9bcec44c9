//! Driver upgrades: rolling within maxUnavailable, drains and PodDisruptionBudgets.

use super::*;

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

    place_gpu_workloads(&c);
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
    assert_evicted_uncordoned_and_done(&c);
    drop(op);
}

/// GPU workloads: one on up-1 behind a PDB that forbids its eviction,
/// one on up-2 without; up-3 cordoned by someone else.
fn place_gpu_workloads(c: &Cluster) {
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
}

/// After the roll: the pods evicted, our cordons undone, the Events
/// written, the roll gone from the status.
fn assert_evicted_uncordoned_and_done(c: &Cluster) {
    // Evicted: both pods gone once their nodes upgraded.
    for p in ["train-1", "train-2"] {
        let out = c.kubectl_output(&["get", "pod", p, "-n", "work"], None);
        assert!(!out.status.success(), "{p} still there");
    }
    // Uncordoned where we cordoned; up-3 stays as its owner left it.
    assert_eq!(upgrade_view(c, "up-1"), (false, None));
    assert_eq!(upgrade_view(c, "up-2"), (false, None));
    assert_eq!(upgrade_view(c, "up-3"), (true, None));
    let events = get_json(c, &["events.events.k8s.io", "-A"]);
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
        get_json(c, &["gpudriver", "up"])["status"]["upgrade"]
            .is_null()
            .then_some(())
    });
}
