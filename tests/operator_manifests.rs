//! deploy/ without a cluster: the generated files have not drifted from the
//! Rust types, every manifest parses into its Kubernetes type, and the RBAC
//! is what docs/operator.md promises (tests/operator.rs also has the real
//! apiserver accept them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Deserialize;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn operator(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-driver-operator"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("running gpu-driver-operator");
    assert!(
        out.status.success(),
        "gpu-driver-operator {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn read(p: &str) -> String {
    std::fs::read_to_string(repo().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

#[test]
fn crd_and_job_template_match_the_rust_types() {
    let crd = operator(&["crd"]);
    assert_eq!(
        crd,
        read("deploy/crd.yaml"),
        "deploy/crd.yaml drifted: run `gpu-driver-operator crd > deploy/crd.yaml`"
    );
    let job = operator(&[
        "job-template",
        "--gpudriver",
        "deploy/examples/gpudriver.yaml",
    ]);
    assert_eq!(
        job,
        read("deploy/job-template.yaml"),
        "deploy/job-template.yaml drifted: run `gpu-driver-operator job-template --gpudriver deploy/examples/gpudriver.yaml > deploy/job-template.yaml`"
    );
}

fn documents(p: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(&read(p))
        .map(|d| serde_yaml::Value::deserialize(d).unwrap_or_else(|e| panic!("{p}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(v: &serde_yaml::Value) -> T {
    serde_yaml::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v:?}"))
}

#[test]
fn manifests_parse_and_rbac_is_least_privilege() {
    let kustomization = documents("deploy/kustomization.yaml");
    let resources: Vec<String> = kustomization[0]["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    for r in &resources {
        assert!(Path::new(&repo().join("deploy").join(r)).is_file(), "{r}");
    }
    let mut kinds = BTreeSet::new();
    let mut operator_rules = Vec::new();
    let mut bound_accounts = BTreeSet::new();
    for r in &resources {
        for doc in documents(&format!("deploy/{r}")) {
            let kind = doc["kind"].as_str().unwrap().to_string();
            match kind.as_str() {
                "Deployment" => {
                    let d: Deployment = typed(&doc);
                    let pod = d.spec.unwrap().template.spec.unwrap();
                    assert_eq!(
                        pod.service_account_name.as_deref(),
                        Some("gpu-driver-operator")
                    );
                    let c = &pod.containers[0];
                    let sc = c.security_context.as_ref().unwrap();
                    assert_eq!(sc.privileged, None, "the operator is not privileged");
                    assert_eq!(sc.read_only_root_filesystem, Some(true));
                }
                "ServiceAccount" => {
                    let sa: ServiceAccount = typed(&doc);
                    if sa.metadata.name.as_deref() == Some("gpu-driver-installer") {
                        assert_eq!(sa.automount_service_account_token, Some(false));
                    }
                }
                "ClusterRole" => {
                    let cr: ClusterRole = typed(&doc);
                    operator_rules.extend(cr.rules.unwrap_or_default());
                }
                "Role" => {
                    let r: Role = typed(&doc);
                    operator_rules.extend(r.rules.unwrap_or_default());
                }
                "RoleBinding" => {
                    let b: RoleBinding = typed(&doc);
                    for s in b.subjects.unwrap_or_default() {
                        bound_accounts.insert(s.name);
                    }
                }
                "ClusterRoleBinding" => {
                    let b: ClusterRoleBinding = typed(&doc);
                    for s in b.subjects.unwrap_or_default() {
                        bound_accounts.insert(s.name);
                    }
                }
                _ => {}
            }
            kinds.insert(kind);
        }
    }
    for k in [
        "CustomResourceDefinition",
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "Deployment",
    ] {
        assert!(kinds.contains(k), "{k} missing: {kinds:?}");
    }
    // The installer's account is bound to nothing.
    assert_eq!(
        bound_accounts,
        BTreeSet::from(["gpu-driver-operator".to_string()])
    );
    // No wildcards, no secrets, and writes only where the operator writes.
    for rule in &operator_rules {
        let resources = rule.resources.clone().unwrap_or_default();
        assert!(
            !resources.iter().any(|r| r == "*" || r == "secrets"),
            "{rule:?}"
        );
        assert!(!rule.verbs.iter().any(|v| v == "*"), "{rule:?}");
        for v in &rule.verbs {
            if ["create", "update", "patch", "delete"].contains(&v.as_str()) {
                assert!(
                    resources.iter().all(|r| [
                        "nodes",
                        "jobs",
                        "events",
                        "leases",
                        "gpudrivers/status"
                    ]
                    .contains(&r.as_str())),
                    "write {v} on {resources:?}"
                );
            }
        }
    }
    // The example GpuDriver parses into the CRD's type.
    let gd: gpu_driver::operator::crd::GpuDriver =
        typed(&documents("deploy/examples/gpudriver.yaml")[0]);
    assert!(!gd.spec.builder_images.is_empty());
}
