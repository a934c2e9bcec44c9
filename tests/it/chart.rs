//! The Helm chart (charts/gpu-driver) with a real helm (scripts/helm, or
//! `GPU_DRIVER_HELM`): it lints, renders with default values and with every
//! optional part on, renders the same CRD, RBAC, admission policy, operator
//! and exporter as the kustomization under deploy/ (parsed objects compared,
//! so the two cannot drift), is accepted by a real kube-apiserver
//! (server-side dry run, then a real `helm install` and `helm uninstall`;
//! tests/it/support/cluster.rs), and its Grafana dashboard is valid against
//! Grafana's dashboard JSON schema (tests/fixtures/grafana) and queries only
//! metrics the operator and the exporter export. Fails (does not skip) under
//! CI=true without helm or the cluster binaries.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::support::cluster::Cluster;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec};
use serde::Deserialize;
use serde_json::Value as Json;
use serde_yaml::Value;

const NS: &str = "gpu-driver";
const CHART: &str = "charts/gpu-driver";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(p: &str) -> String {
    std::fs::read_to_string(repo().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

const HOW_TO_GET_HELM: &str = "\
chart tests need a real helm: set GPU_DRIVER_HELM=$(scripts/helm | tail -1) (builds helm from \
the Go module proxy once, ~5 min cold on 2 cores, cached under ~/.cache/gpu-driver/helm). \
scripts/test does this. To skip these tests on purpose outside CI, set GPU_DRIVER_SKIP_HELM_TESTS=1.";

/// The helm binary: `GPU_DRIVER_HELM`, else what scripts/helm prints last
/// (cached, or built now). `None` only when skipping was asked for outside
/// CI; panics otherwise.
fn helm_bin() -> Option<&'static Path> {
    static HELM: OnceLock<Option<PathBuf>> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(h) = std::env::var_os("GPU_DRIVER_HELM").filter(|h| !h.is_empty()) {
            let h = PathBuf::from(h);
            assert!(
                h.is_file(),
                "GPU_DRIVER_HELM={} is no file. {HOW_TO_GET_HELM}",
                h.display()
            );
            return Some(h);
        }
        let ci = std::env::var("CI").as_deref() == Ok("true");
        if !ci && std::env::var("GPU_DRIVER_SKIP_HELM_TESTS").as_deref() == Ok("1") {
            eprintln!("skipped: GPU_DRIVER_SKIP_HELM_TESTS=1 and no GPU_DRIVER_HELM");
            return None;
        }
        let out = Command::new(repo().join("scripts/helm"))
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running scripts/helm: {e}. {HOW_TO_GET_HELM}"));
        let path = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        assert!(
            out.status.success() && Path::new(&path).is_file(),
            "scripts/helm failed ({}). {HOW_TO_GET_HELM}",
            out.status
        );
        Some(PathBuf::from(path))
    })
    .as_deref()
}

/// Helm with its own config, cache and data directories (never the user's)
/// and, when given, a kubeconfig.
struct Helm {
    bin: &'static Path,
    home: tempfile::TempDir,
    kubeconfig: Option<PathBuf>,
}

impl Helm {
    fn new() -> Option<Helm> {
        Some(Helm {
            bin: helm_bin()?,
            home: tempfile::tempdir().unwrap(),
            kubeconfig: None,
        })
    }

    fn output(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(self.bin);
        cmd.args(args)
            .current_dir(repo())
            .env("HELM_CACHE_HOME", self.home.path().join("cache"))
            .env("HELM_CONFIG_HOME", self.home.path().join("config"))
            .env("HELM_DATA_HOME", self.home.path().join("data"))
            .env_remove("KUBECONFIG");
        if let Some(k) = &self.kubeconfig {
            cmd.env("KUBECONFIG", k);
        }
        cmd.output().expect("running helm")
    }

    /// helm ARGS; panics unless it succeeds; returns stdout.
    fn run(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(
            out.status.success(),
            "helm {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `helm template` of the chart into namespace gpu-driver, CRDs included.
    fn template(&self, sets: &[&str]) -> String {
        let mut args = vec![
            "template",
            "gpu-driver",
            CHART,
            "--namespace",
            NS,
            "--include-crds",
        ];
        for s in sets {
            args.extend(["--set", s]);
        }
        self.run(&args)
    }
}

/// Every optional part on (the ServiceMonitor needs prometheus-operator's
/// CRD; [`apiserver_accepts_the_chart_and_helm_installs_it`] leaves it out).
const ALL_ON: &[&str] = &[
    "gpuDriver.create=true",
    "serviceMonitor.enabled=true",
    "serviceMonitor.labels.release=kube-prometheus-stack",
    "dashboard.namespace=monitoring",
    "dashboard.annotations.grafana_folder=GPU",
    "operator.image.digest=sha256:1111111111111111111111111111111111111111111111111111111111111111",
    "exporter.image.digest=sha256:2222222222222222222222222222222222222222222222222222222222222222",
    "exporter.priorityClassName=system-node-critical",
    "admissionPolicy.allowedCacheUrls={s3://gpu-driver-cache/cluster-a}",
    "admissionPolicy.allowedCacheSecrets={gpu-driver-cache}",
    "admissionPolicy.allowedCacheWriteSecrets={gpu-driver-cache-writer}",
    "admissionPolicy.allowedCatalogConfigMaps={drivers-2026-12}",
    "admissionPolicy.allowedSigningSecrets={gpu-driver-module-signing}",
];

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    serde_yaml::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v:?}"))
}

/// (kind, name) → object.
fn by_kind_and_name(docs: &[Value]) -> BTreeMap<(String, String), Value> {
    let mut m = BTreeMap::new();
    for d in docs {
        let kind = d["kind"].as_str().expect("kind").to_string();
        let name = d["metadata"]["name"].as_str().expect("name").to_string();
        assert!(
            m.insert((kind.clone(), name.clone()), d.clone()).is_none(),
            "{kind} {name} twice"
        );
    }
    m
}

/// The object without the labels and annotations of its metadata (Helm's
/// labels are the chart's own) and, for a namespaced object, with its
/// namespace as is.
fn without_meta_labels(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_mapping_mut) {
        m.remove("labels");
        m.remove("annotations");
    }
    v
}

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

fn fixture_schema(file: &str, definition: &str) -> jsonschema::Validator {
    let mut schema: Json =
        serde_json::from_str(&read(&format!("tests/fixtures/grafana/{file}"))).unwrap();
    // A definition of the file as the root, its siblings reachable.
    schema["$ref"] = Json::String(format!("#/definitions/{definition}"));
    jsonschema::draft7::new(&schema).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn schema_errors(v: &jsonschema::Validator, instance: &Json) -> Vec<String> {
    v.iter_errors(instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// The dashboard is a Grafana dashboard by Grafana's own JSON schema
/// (generated from its CUE schema; tests/fixtures/grafana/README.md), its
/// panels' options by their plugins' schemas and its queries by the
/// Prometheus data source's; the layout fits Grafana's 24-column grid
/// without overlaps; every query names metrics that gpu-driver-operator
/// (crates/operator/src/metrics.rs) or gpu-driver-exporter (crates/exporter/src/metrics.rs)
/// export, and only variables the dashboard defines.
#[test]
fn dashboard_is_valid_grafana_json_over_our_metrics() {
    let text = read("charts/gpu-driver/dashboards/gpu-driver.json");
    // A ConfigMap carries it: far below the 1 MiB object limit.
    assert!(text.len() < 256 * 1024, "{} bytes", text.len());
    let dash: Json = serde_json::from_str(&text).unwrap();
    assert_eq!(dash["uid"], "gpu-driver");
    let dashboard = fixture_schema("dashboard.jsonschema.json", "Dashboard");
    let errors = schema_errors(&dashboard, &dash);
    assert!(errors.is_empty(), "not a Grafana dashboard: {errors:#?}");
    // The validator does refuse a broken one.
    let mut broken = dash.clone();
    broken["panels"][1]["gridPos"]["w"] = Json::String("wide".into());
    broken["graphTooltip"] = Json::from(7);
    assert!(schema_errors(&dashboard, &broken).len() >= 2);

    let timeseries_options = fixture_schema("timeseries.jsonschema.json", "Options");
    let timeseries_field = fixture_schema("timeseries.jsonschema.json", "FieldConfig");
    let stat_options = fixture_schema("stat.jsonschema.json", "Options");
    let query = fixture_schema("prometheus.jsonschema.json", "Dataquery");

    let variables: BTreeSet<String> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert!(variables.contains("datasource"), "{variables:?}");
    let operator_metrics = gpu_driver_operator::metrics::Metrics::default().render();
    let exporter_source = read("crates/exporter/src/metrics.rs");
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    let mut metrics_seen = BTreeSet::new();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        let id = p["id"].as_i64().unwrap();
        assert!(ids.insert(id), "panel id {id} twice");
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_i64().unwrap(),
            g["y"].as_i64().unwrap(),
            g["w"].as_i64().unwrap(),
            g["h"].as_i64().unwrap(),
        );
        assert!(x >= 0 && w > 0 && x + w <= 24 && h > 0, "panel {id}: {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "panel {id} overlaps another at {cx},{cy}"
                );
            }
        }
        let title = p["title"].as_str().unwrap_or_default();
        let mut errs = Vec::new();
        match p["type"].as_str().unwrap() {
            "row" => continue,
            "timeseries" => {
                errs.extend(schema_errors(&timeseries_options, &p["options"]));
                errs.extend(schema_errors(
                    &timeseries_field,
                    &p["fieldConfig"]["defaults"]["custom"],
                ));
            }
            "stat" => errs.extend(schema_errors(&stat_options, &p["options"])),
            other => panic!("panel {title}: no vendored schema for panel type {other}"),
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            errs.extend(schema_errors(&query, t));
            exprs.push((title.to_string(), t["expr"].as_str().unwrap().to_string()));
        }
        assert!(errs.is_empty(), "panel {title}: {errs:#?}");
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"].as_str().filter(|_| v["type"] == "query") {
            exprs.push((format!("variable {}", v["name"]), q.to_string()));
        }
    }
    for (where_, expr) in &exprs {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("DCGM_FI_") || word.starts_with("gpu_driver_exporter_") {
                assert!(
                    exporter_source.contains(&format!("\"{word}\"")),
                    "{where_}: {word} is not a metric of crates/exporter/src/metrics.rs"
                );
                metrics_seen.insert(word.to_string());
            } else if word.starts_with("gpu_driver_") {
                // OpenMetrics: a histogram's `_bucket` and a counter's
                // `_total` are samples of the family without the suffix.
                let family = word.strip_suffix("_bucket").unwrap_or(word);
                let counter = word
                    .strip_suffix("_total")
                    .is_some_and(|c| operator_metrics.contains(&format!("# TYPE {c} counter\n")));
                assert!(
                    counter || operator_metrics.contains(&format!("# TYPE {family} ")),
                    "{where_}: {word} is not a metric of gpu-driver-operator"
                );
                metrics_seen.insert(word.to_string());
            }
        }
        // Dashboard variables, or Grafana's own ($__rate_interval, $__range).
        for var in expr.split('$').skip(1) {
            let name: String = var
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                name.starts_with("__") || variables.contains(&name),
                "{where_}: ${name} is not a variable of the dashboard"
            );
        }
    }
    for m in [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_XID_ERRORS",
        "gpu_driver_nodes",
        "gpu_driver_install_failures_total",
        "gpu_driver_cache_total",
    ] {
        assert!(metrics_seen.contains(m), "the dashboard shows no {m}");
    }
    // Per node and per pod: by DCGM's Hostname, namespace and pod labels.
    let all_exprs: String = exprs.iter().map(|(_, e)| e.as_str()).collect();
    for label in [
        "by (Hostname)",
        "by (namespace, pod)",
        "by (phase)",
        "by (reason)",
    ] {
        assert!(all_exprs.contains(label), "no query {label}");
    }
}
