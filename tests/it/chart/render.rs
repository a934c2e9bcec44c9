//! The chart lints and renders, with defaults and with every option on,
//! the same objects as deploy/.

use super::*;

#[test]
fn chart_lints_and_renders_with_defaults_and_every_option() {
    let Some(helm) = Helm::new() else { return };
    helm.run(&["lint", "--strict", CHART]);
    let mut lint_all_on = vec!["lint", "--strict", CHART];
    for s in ALL_ON {
        lint_all_on.extend(["--set", s]);
    }
    helm.run(&lint_all_on);

    // Defaults: no GpuDriver, no ServiceMonitor, images by the crate's tag.
    let defaults = by_kind_and_name(&documents(&helm.template(&[])));
    let kinds: BTreeSet<&str> = defaults.keys().map(|(k, _)| k.as_str()).collect();
    for k in [
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "DaemonSet",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ConfigMap",
    ] {
        assert!(kinds.contains(k), "{k} missing with defaults: {kinds:?}");
    }
    assert!(!kinds.contains("GpuDriver") && !kinds.contains("ServiceMonitor"));
    assert!(
        !kinds.contains("Namespace"),
        "the namespace is Helm's --namespace"
    );
    let version = env!("CARGO_PKG_VERSION");
    let op: Deployment = typed(&defaults[&("Deployment".into(), "gpu-driver-operator".into())]);
    let op_pod = op.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        op_pod.containers[0].image.as_deref(),
        Some(format!("ghcr.io/gardenlinux/gpu-driver-operator:{version}").as_str())
    );
    let chart: Value = serde_yaml::from_str(&read("charts/gpu-driver/Chart.yaml")).unwrap();
    assert_eq!(
        chart["version"].as_str(),
        Some(version),
        "Chart.yaml version"
    );
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(version),
        "Chart.yaml appVersion"
    );

    // The dashboard ConfigMap: the Grafana sidecar's label, the file as is.
    let cm: ConfigMap = typed(&defaults[&("ConfigMap".into(), "gpu-driver-dashboard".into())]);
    assert_eq!(cm.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(
        cm.metadata.labels.as_ref().unwrap()["grafana_dashboard"],
        "1"
    );
    assert_eq!(
        cm.data.as_ref().unwrap()["gpu-driver.json"],
        read("charts/gpu-driver/dashboards/gpu-driver.json").trim_end()
    );

    // Every option on.
    let all = by_kind_and_name(&documents(&helm.template(ALL_ON)));
    let gd: gpu_driver_operator::crd::GpuDriver =
        typed(&all[&("GpuDriver".into(), "default".into())]);
    assert!(!gd.spec.builder_images.is_empty());
    for name in ["gpu-driver-operator", "gpu-driver-exporter"] {
        let sm = &all[&("ServiceMonitor".into(), name.into())];
        assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(sm["metadata"]["labels"]["release"], "kube-prometheus-stack");
        assert_eq!(
            sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
            name
        );
        // It selects a Service of the chart, by a port that Service names.
        let svc = all
            .iter()
            .find(|((k, _), v)| {
                k == "Service" && v["metadata"]["labels"]["app.kubernetes.io/name"] == name
            })
            .unwrap_or_else(|| panic!("no Service labelled {name}"))
            .1;
        assert_eq!(
            svc["spec"]["ports"][0]["name"],
            sm["spec"]["endpoints"][0]["port"]
        );
    }
    // The exporter's samples keep their own pod and namespace labels.
    assert_eq!(
        all[&("ServiceMonitor".into(), "gpu-driver-exporter".into())]["spec"]["endpoints"][0]["honorLabels"],
        true
    );
    let cm = &all[&("ConfigMap".into(), "gpu-driver-dashboard".into())];
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "GPU");
    assert_digests_and_owners_lists(&all);

    assert_parts_off_and_unsafe_values_refused(&helm);
}

/// Every option on: images by digest, the owner's lists as CEL literals.
fn assert_digests_and_owners_lists(all: &BTreeMap<(String, String), Value>) {
    // Images by digest: repository@sha256:..., no tag.
    let image = |kind: &str, name: &str| -> String {
        let pod: PodSpec = typed(&all[&(kind.into(), name.into())]["spec"]["template"]["spec"]);
        pod.containers[0].image.clone().unwrap()
    };
    assert_eq!(
        image("Deployment", "gpu-driver-operator"),
        format!(
            "ghcr.io/gardenlinux/gpu-driver-operator@sha256:{}",
            "1".repeat(64)
        )
    );
    assert_eq!(
        image("DaemonSet", "gpu-driver-exporter"),
        format!(
            "ghcr.io/gardenlinux/gpu-driver-exporter@sha256:{}",
            "2".repeat(64)
        )
    );
    // The owner's lists from values, as CEL literals.
    let policy = &all[&(
        "ValidatingAdmissionPolicy".into(),
        "gpudriver-sources.gpu-driver.gardenlinux.io".into(),
    )];
    assert_eq!(
        owners_lists(policy),
        [
            vec!["ghcr.io/gardenlinux/".to_string()],
            vec!["s3://gpu-driver-cache/cluster-a".to_string()],
            vec!["gpu-driver-cache".to_string()],
            vec!["false".to_string()],
            vec!["gpu-driver-cache-writer".to_string()],
            vec!["drivers-2026-12".to_string()],
            vec!["gpu-driver-module-signing".to_string()],
        ]
    );
}

/// Parts off render nothing of theirs; values.schema.json and the
/// templates refuse what would be unsafe.
fn assert_parts_off_and_unsafe_values_refused(helm: &Helm) {
    // Parts off.
    let off = by_kind_and_name(&documents(&helm.template(&[
        "exporter.enabled=false",
        "admissionPolicy.enabled=false",
        "dashboard.enabled=false",
        "serviceMonitor.enabled=true",
    ])));
    let kinds: BTreeSet<&str> = off.keys().map(|(k, _)| k.as_str()).collect();
    for k in [
        "DaemonSet",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ConfigMap",
    ] {
        assert!(!kinds.contains(k), "{k} rendered although off");
    }
    assert!(
        off.contains_key(&("ServiceMonitor".into(), "gpu-driver-operator".into()))
            && !off.contains_key(&("ServiceMonitor".into(), "gpu-driver-exporter".into())),
        "without the exporter, only the operator's ServiceMonitor"
    );

    // values.schema.json and the templates refuse what would be unsafe.
    for (set, why) in [
        ("operator.image.tag=latest", "a :latest tag"),
        ("operator.image.digest=sha256:abc", "a short digest"),
        (
            "admissionPolicy.allowedRegistries={ghcr.io/x'] + ['y}",
            "a quote into CEL",
        ),
        (
            "admissionPolicy.allowedCacheSecrets={Not_A_Name}",
            "not a Secret name",
        ),
        (
            "admissionPolicy.allowedSigningSecrets={Not_A_Name}",
            "not a signing Secret name",
        ),
        ("operator.replica=3", "an unknown key (typo)"),
    ] {
        let out = helm.output(&["template", "x", CHART, "--set", set]);
        assert!(!out.status.success(), "{why} ({set}) was rendered");
    }
}

/// The seven owner's lists of the policy (`spec.variables[0..7]`) as values:
/// a CEL list of quoted strings, or a CEL boolean.
fn owners_lists(policy: &Value) -> Vec<Vec<String>> {
    let vars = policy["spec"]["variables"].as_sequence().unwrap();
    vars[..7]
        .iter()
        .map(|v| {
            let e = v["expression"].as_str().unwrap().trim();
            match e.strip_prefix('[').and_then(|e| e.strip_suffix(']')) {
                Some(inner) => inner
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| {
                        s.strip_prefix('\'')
                            .and_then(|s| s.strip_suffix('\''))
                            .or_else(|| s.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                            .unwrap_or_else(|| panic!("not a CEL string: {s}"))
                            .to_string()
                    })
                    .collect(),
                None => vec![e.to_string()],
            }
        })
        .collect()
}

/// Where two parsed objects differ first (mappings compared as maps), with
/// both values there; `None` when equal.
fn difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Mapping(x), Value::Mapping(y)) => {
            for k in x.keys().chain(y.keys()) {
                let key = format!("{path}.{}", k.as_str().unwrap_or("?"));
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => {
                        if let Some(d) = difference(p, q, &key) {
                            return Some(d);
                        }
                    }
                    (p, q) => return Some(format!("{key}: chart {p:?}, deploy/ {q:?}")),
                }
            }
            None
        }
        (Value::Sequence(x), Value::Sequence(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| difference(p, q, &format!("{path}[{i}]"))),
        _ => (a != b).then(|| format!("{path}: chart {a:?}, deploy/ {b:?}")),
    }
}

/// The chart with default values and the kustomization under deploy/ make
/// the same objects, compared parsed (not as text) and without the labels
/// Helm adds: the CRD, every ServiceAccount, (Cluster)Role and binding,
/// the operator's Deployment and Service, the admission policy and its
/// binding, the exporter's DaemonSet and Service. The chart's crds/ file is
/// deploy/crd.yaml's copy.
#[test]
fn chart_with_defaults_renders_what_deploy_has() {
    assert_eq!(
        read("charts/gpu-driver/crds/gpudrivers.gpu-driver.gardenlinux.io.yaml"),
        read("deploy/crd.yaml"),
        "the chart's CRD drifted from deploy/crd.yaml: \
         cp deploy/crd.yaml charts/gpu-driver/crds/gpudrivers.gpu-driver.gardenlinux.io.yaml"
    );
    let Some(helm) = Helm::new() else { return };
    let chart = by_kind_and_name(&documents(&helm.template(&[])));

    let kustomization = &documents(&read("deploy/kustomization.yaml"))[0];
    let mut deploy = Vec::new();
    for r in kustomization["resources"].as_sequence().unwrap() {
        deploy.extend(documents(&read(&format!("deploy/{}", r.as_str().unwrap()))));
    }
    // The kustomization's image tags are what the files name.
    for i in kustomization["images"].as_sequence().unwrap() {
        let want = format!(
            "{}:{}",
            i["name"].as_str().unwrap(),
            i["newTag"].as_str().unwrap()
        );
        assert!(
            deploy
                .iter()
                .any(|d| serde_yaml::to_string(d).unwrap().contains(&want)),
            "no deploy/ file names {want}"
        );
    }
    let deploy = by_kind_and_name(&deploy);
    let mut compared = BTreeSet::new();
    for ((kind, name), want) in &deploy {
        if kind == "Namespace" {
            // Helm's --namespace; docs/chart.md says how to label it.
            continue;
        }
        let got = chart
            .get(&(kind.clone(), name.clone()))
            .unwrap_or_else(|| panic!("the chart has no {kind} {name}"));
        if let Some(d) = difference(&without_meta_labels(got), &without_meta_labels(want), "") {
            panic!("{kind} {name}: the chart's default rendering differs from deploy/ at {d}");
        }
        compared.insert(kind.as_str());
    }
    for k in [
        "CustomResourceDefinition",
        "ClusterRole",
        "Role",
        "ClusterRoleBinding",
        "RoleBinding",
        "ServiceAccount",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DaemonSet",
        "Service",
    ] {
        assert!(compared.contains(k), "{k} not compared: {compared:?}");
    }
    // What the chart has beyond deploy/: the dashboard only.
    let extra: Vec<_> = chart.keys().filter(|k| !deploy.contains_key(*k)).collect();
    assert_eq!(
        extra,
        [&("ConfigMap".to_string(), "gpu-driver-dashboard".to_string())]
    );
}
