//! deploy/ without a cluster: the generated files have not drifted from the
//! Rust types, every manifest parses into its Kubernetes type, and the RBAC
//! is what docs/operator.md promises (tests/it/operator.rs also has the real
//! apiserver accept them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};

use crate::support::deploy::yaml_files;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Deserialize;

mod admission;
mod images;
mod rbac;

fn repo() -> PathBuf {
    crate::support::repo_root().to_path_buf()
}

fn operator(args: &[&str]) -> String {
    let out = Command::new(crate::support::bin::operator())
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

fn documents(p: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(&read(p))
        .map(|d| serde_yaml::Value::deserialize(d).unwrap_or_else(|e| panic!("{p}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(v: &serde_yaml::Value) -> T {
    serde_yaml::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v:?}"))
}

/// The two policies, each with its binding: the GpuDriver policy on
/// creates and updates of gpudrivers (not their status), the owner's lists
/// first, where docs/operator.md's patch paths point; the Job policy on
/// creates of the operator's Jobs (its labels), whatever their namespace.
fn admission_policy_is_bound_and_fails_closed(
    policies: &[ValidatingAdmissionPolicy],
    bindings: &[ValidatingAdmissionPolicyBinding],
) {
    assert_eq!((policies.len(), bindings.len()), (2, 2), "{policies:?}");
    let jobs = bound_policy(
        "gpu-driver-jobs.gpu-driver.gardenlinux.io",
        policies,
        bindings,
    );
    let constraints = jobs.match_constraints.unwrap();
    let rules = constraints.resource_rules.unwrap();
    let [rule] = rules.as_slice() else {
        panic!("{rules:?}")
    };
    assert_eq!(rule.api_groups, Some(vec!["batch".to_string()]));
    assert_eq!(rule.resources, Some(vec!["jobs".to_string()]));
    assert_eq!(rule.operations, Some(vec!["CREATE".to_string()]));
    assert_eq!(constraints.namespace_selector, None);
    let selector = constraints.object_selector.unwrap().match_labels.unwrap();
    assert_eq!(
        selector,
        BTreeMap::from([(
            gpu_driver_operator::keys::MANAGED_BY_LABEL.to_string(),
            gpu_driver_operator::keys::MANAGED_BY.to_string()
        )])
    );
    let spec = bound_policy(
        "gpudriver-sources.gpu-driver.gardenlinux.io",
        policies,
        bindings,
    );
    let rules = spec.match_constraints.unwrap().resource_rules.unwrap();
    let [rule] = rules.as_slice() else {
        panic!("{rules:?}")
    };
    assert_eq!(
        rule.api_groups,
        Some(vec!["gpu-driver.gardenlinux.io".to_string()])
    );
    assert_eq!(rule.resources, Some(vec!["gpudrivers".to_string()]));
    assert_eq!(
        rule.operations,
        Some(vec!["CREATE".to_string(), "UPDATE".to_string()])
    );
    let variables: Vec<String> = spec
        .variables
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(
        variables[..7],
        [
            "allowedRegistries",
            "allowedCacheUrls",
            "allowedCacheSecrets",
            "allowHttpCache",
            "allowedCacheWriteSecrets",
            "allowedCatalogConfigMaps",
            "allowedSigningSecrets"
        ]
    );
}

/// The policy named `name` and the binding that names it: bound with
/// Deny to everything the policy matches, failing closed, every rule
/// with a reason.
fn bound_policy(
    name: &str,
    policies: &[ValidatingAdmissionPolicy],
    bindings: &[ValidatingAdmissionPolicyBinding],
) -> k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicySpec {
    let policy = policies
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no ValidatingAdmissionPolicy {name}: {policies:?}"));
    let bound: Vec<_> = bindings
        .iter()
        .filter_map(|b| b.spec.clone())
        .filter(|b| b.policy_name.as_deref() == Some(name))
        .collect();
    let [bspec] = bound.as_slice() else {
        panic!("one binding of {name}: {bindings:?}")
    };
    assert_eq!(bspec.validation_actions, Some(vec!["Deny".to_string()]));
    assert_eq!(
        bspec.match_resources, None,
        "{name}: bound to all it matches"
    );
    let spec = policy.spec.clone().unwrap();
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    for v in spec.validations.clone().unwrap() {
        assert!(v.message.is_some(), "{v:?}");
        assert_eq!(v.reason.as_deref(), Some("Forbidden"));
    }
    spec
}
