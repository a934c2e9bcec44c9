//! Build Jobs: prebuild targets, and their digest handed to the installs.

use super::*;

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
        &objects::node(
            "cpu-1",
            json!({"kubernetes.io/arch": "amd64", "pool": "cpu"}),
        )
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
    assert_unprivileged_build_job(&build);
    let sha_a = "a".repeat(64);
    answer_the_build_on_the_cpu_node(&c, &sha_a);

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

    assert_a_new_kernel_waits_for_its_build(&c);

    assert_a_failed_build_compiles_on_the_node(&c);

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
    assert_eq!(by_kernel(KERNEL_B)["phase"], "Cached");
    assert_eq!(by_kernel("6.6.80-cloud-amd64")["reason"], "BuildFailed");
    assert_eq!(by_kernel("6.6.70-cloud-amd64")["nodes"], 1);
    drop(op);
}

/// The build pod, scheduled onto the CPU node by the real scheduler,
/// answers with the artifact; its target is then Cached.
fn answer_the_build_on_the_cpu_node(c: &Cluster, sha_a: &str) {
    until("the build pod scheduled and answered", || {
        (answer_role(
            c,
            "build",
            |_| true,
            "0",
            &build_result(sha_a, "6.6.70-cloud-amd64"),
        ) > 0)
            .then_some(())
    });
    let pods = of_role(c, "pods", "build");
    assert_eq!(pods["items"][0]["spec"]["nodeName"], "cpu-1");
    c.wait_for(
        &["gpudriver", "bld"],
        "{.status.targets[0].phase}",
        "Cached",
        WAIT,
    );
}

/// The prebuild target's build Job: unpinned, unprivileged, no host paths,
/// the writer's secret only.
fn assert_unprivileged_build_job(build: &Value) {
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
    assert_eq!(secrets_of(build), ["cache-writer"]);
    let args = args_of(build);
    assert!(
        args.contains("prebuild --os-id gardenlinux --os-version 1592.4 --kernel-release 6.6.70-cloud-amd64 --arch amd64"),
        "{args}"
    );
}

/// The second node's kernel, built after the prebuild target's.
const KERNEL_B: &str = "6.6.63-cloud-amd64";

/// A new kernel: its build Job first; the install waits for it.
fn assert_a_new_kernel_waits_for_its_build(c: &Cluster) {
    // A new kernel: its build Job first; the install waits for it.
    c.apply(&node("bld-2", "bld", true, true));
    until("bld-2's build Job", || {
        (jobs_of(c, "build").len() == 2).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        install_job_of(&jobs_of(c, "install"), "bld-2").is_none(),
        "bld-2 must wait for its build"
    );
    let sha_b = "b".repeat(64);
    answer_role(
        c,
        "build",
        |p| p["metadata"]["annotations"][EXIT_CODE].is_null(),
        "0",
        &build_result(&sha_b, KERNEL_B),
    );
    let install2 = until("bld-2's install Job after its build", || {
        install_job_of(&jobs_of(c, "install"), "bld-2").cloned()
    });
    assert!(args_of(&install2).contains(&format!("--artifact-sha256 {sha_b}")));
}

/// A failed build: the node compiles for itself (compileOnNode).
fn assert_a_failed_build_compiles_on_the_node(c: &Cluster) {
    // A failed build: the node compiles for itself (compileOnNode).
    let mut n3: Value = serde_json::from_str(&node("bld-3", "bld", true, true)).unwrap();
    n3["status"]["nodeInfo"]["kernelVersion"] = json!("6.6.80-cloud-amd64");
    c.apply(&n3.to_string());
    until("bld-3's build Job", || {
        (jobs_of(c, "build").len() == 3).then_some(())
    });
    let failed = run_result(Reason::BuildFailed, "make: *** [Makefile:42] Error 2");
    until("bld-3's build failed", || {
        (answer_role(c, "build", |_| true, "13", &failed) > 0).then_some(())
    });
    let install3 = until("bld-3's install Job after the failed build", || {
        install_job_of(&jobs_of(c, "install"), "bld-3").cloned()
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
}
