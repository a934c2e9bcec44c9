//! The operator's binary end to end: GPU detection by Job, /metrics, and
//! yielding the leader lease.

use super::*;

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

    assert_detect_jobs(&c);

    assert_metrics_and_health(port);

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

/// Detect Jobs ran the installer image unprivileged; only det-gpu got an
/// install Job.
fn assert_detect_jobs(c: &Cluster) {
    // Detect Jobs ran the installer image unprivileged; only det-gpu got an
    // install Job.
    let jobs = get_json(c, &["jobs", "-n", NS]);
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
}

/// /metrics and /healthz over HTTP, as Prometheus and the kubelet see them.
fn assert_metrics_and_health(port: u16) {
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
}
