//! A real apiserver accepts the chart; helm installs and uninstalls it.

use super::*;

/// The rendered chart on a real apiserver: a server-side dry run of every
/// part (the GpuDriver after its CRD), then a real `helm install` of the
/// defaults and the example GpuDriver, whose CRD Helm installs from crds/
/// first; the exporter's account may do nothing; `helm uninstall` removes
/// the release.
#[test]
fn apiserver_accepts_the_chart_and_helm_installs_it() {
    let Some(mut helm) = Helm::new() else { return };
    let Some(c) = Cluster::start() else { return };
    c.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n  labels:\n    pod-security.kubernetes.io/enforce: privileged\n"
    ));

    // Dry run: the CRD first (a GpuDriver needs it), then everything.
    // prometheus-operator's CRD is not in this cluster: no ServiceMonitor.
    let has_sm = c
        .kubectl_output(
            &["get", "crd", "servicemonitors.monitoring.coreos.com"],
            None,
        )
        .status
        .success();
    let sets: Vec<&str> = ALL_ON
        .iter()
        .copied()
        .filter(|s| has_sm || !s.starts_with("serviceMonitor."))
        .filter(|s| !s.starts_with("dashboard.namespace"))
        .collect();
    let rendered = helm.template(&sets);
    let crds: Vec<&str> = rendered
        .split("\n---")
        .filter(|d| d.contains("kind: CustomResourceDefinition"))
        .collect();
    assert_eq!(crds.len(), 1);
    let out = c.kubectl_output(&["create", "--dry-run=server", "-f", "-"], Some(crds[0]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.apply(crds[0]);
    c.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/gpudrivers.gpu-driver.gardenlinux.io",
        "--timeout=60s",
    ]);
    let out = c.kubectl_output(&["apply", "--dry-run=server", "-f", "-"], Some(&rendered));
    assert!(
        out.status.success(),
        "dry run of the chart with every option: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let accepted = String::from_utf8_lossy(&out.stdout);
    for want in [
        "daemonset.apps/gpu-driver-exporter",
        "deployment.apps/gpu-driver-operator",
        "gpudriver.gpu-driver.gardenlinux.io/default",
        "validatingadmissionpolicy.admissionregistration.k8s.io/gpudriver-sources",
        "validatingadmissionpolicy.admissionregistration.k8s.io/gpu-driver-jobs",
        "configmap/gpu-driver-dashboard",
    ] {
        assert!(accepted.contains(want), "{want} not in: {accepted}");
    }
    c.kubectl(&[
        "delete",
        "crd",
        "gpudrivers.gpu-driver.gardenlinux.io",
        "--wait=true",
    ]);

    // A real install: Helm creates the CRD from crds/, then the rest.
    helm.kubeconfig = Some(c.kubeconfig.clone());
    helm.run(&[
        "install",
        "gpu-driver",
        CHART,
        "--namespace",
        NS,
        "--set",
        "gpuDriver.create=true",
        "--timeout",
        "120s",
    ]);
    let status = helm.run(&["status", "gpu-driver", "--namespace", NS, "-o", "json"]);
    let status: Json = serde_json::from_str(&status).unwrap();
    assert_eq!(status["info"]["status"], "deployed", "{status}");
    c.kubectl(&["get", "gpudriver", "default"]);
    c.kubectl(&[
        "-n",
        NS,
        "get",
        "daemonset/gpu-driver-exporter",
        "deployment/gpu-driver-operator",
    ]);
    c.kubectl(&["-n", NS, "get", "configmap", "gpu-driver-dashboard"]);
    assert_the_exporter_account_may_do_nothing(&c);
    helm.run(&[
        "uninstall",
        "gpu-driver",
        "--namespace",
        NS,
        "--wait",
        "--timeout",
        "120s",
    ]);
    let left = c.kubectl(&[
        "-n",
        NS,
        "get",
        "deployment,daemonset,configmap,serviceaccount",
        "-o",
        "name",
    ]);
    for gone in [
        "gpu-driver-operator",
        "gpu-driver-exporter",
        "gpu-driver-dashboard",
    ] {
        assert!(!left.contains(gone), "{gone} left after uninstall: {left}");
    }
    // Helm keeps CRDs (and so the GpuDrivers' definition) on uninstall.
    c.kubectl(&["get", "crd", "gpudrivers.gpu-driver.gardenlinux.io"]);
}

/// The exporter's account may do nothing (no RBAC at all).
fn assert_the_exporter_account_may_do_nothing(c: &Cluster) {
    // The exporter's account may do nothing (no RBAC at all).
    let can = c.kubectl_output(
        &[
            "auth",
            "can-i",
            "--list",
            &format!("--as=system:serviceaccount:{NS}:gpu-driver-exporter"),
        ],
        None,
    );
    for line in String::from_utf8_lossy(&can.stdout).lines().skip(1) {
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let res = line.split_whitespace().next().unwrap_or("");
        assert!(
            res.ends_with(".authorization.k8s.io") || res.ends_with(".authentication.k8s.io"),
            "exporter account can: {line}"
        );
    }
}
