//! The Helm chart (charts/gpu-driver) with a real helm (`cargo xtask tool helm`, or
//! the tools file's `helm`): it lints, renders with default values and with every
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
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::support::cluster::Cluster;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec};
use serde::Deserialize;
use serde_json::Value as Json;
use serde_yaml::Value;

mod dashboard;
mod install;
mod render;

const NS: &str = "gpu-driver";
const CHART: &str = "charts/gpu-driver";

fn repo() -> PathBuf {
    crate::support::repo_root().to_path_buf()
}

fn read(p: &str) -> String {
    std::fs::read_to_string(repo().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

const HOW_TO_GET_HELM: &str = "\
chart tests need a real helm: run `cargo xtask test` (or `scripts/test`), which writes \
GPU_DRIVER_TOOLS with `helm` (`cargo xtask tool helm` builds helm from the Go module proxy \
once and caches it). To skip these tests on purpose \
outside CI, put \"helm\" in the tools file's `skip`.";

/// The helm binary: the tools file's `helm`, else what `cargo xtask tool helm` prints
/// (cached, or built now). `None` only when skipping was asked for outside
/// CI; panics otherwise.
fn helm_bin() -> Option<&'static Path> {
    static HELM: OnceLock<Option<PathBuf>> = OnceLock::new();
    HELM.get_or_init(|| {
        let tools = crate::support::tools::tools();
        if let Some(h) = tools.helm() {
            assert!(
                h.is_file(),
                "helm {} is no file. {HOW_TO_GET_HELM}",
                h.display()
            );
            return Some(h);
        }
        if tools.skipped(crate::support::tools::Group::Helm) {
            eprintln!("skipped: the tools file's skip holds \"helm\" and it names no helm");
            return None;
        }
        let path = crate::support::tools::xtask_tool("helm", &[])
            .unwrap_or_else(|e| panic!("{e}. {HOW_TO_GET_HELM}"));
        Some(path)
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
