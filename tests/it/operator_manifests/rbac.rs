//! The operator's manifests: the CRD and the Job template match the Rust
//! types, RBAC is least privilege, the exporter is unprivileged.

use super::*;

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
    let cached = operator(&[
        "job-template",
        "--cached",
        "--gpudriver",
        "deploy/examples/gpudriver.yaml",
    ]);
    assert_eq!(
        cached,
        read("deploy/cached-job-template.yaml"),
        "deploy/cached-job-template.yaml drifted: run `gpu-driver-operator job-template --cached --gpudriver deploy/examples/gpudriver.yaml > deploy/cached-job-template.yaml`"
    );
    let build = operator(&[
        "job-template",
        "--kind",
        "build",
        "--gpudriver",
        "deploy/examples/gpudriver.yaml",
    ]);
    assert_eq!(
        build,
        read("deploy/build-job-template.yaml"),
        "deploy/build-job-template.yaml drifted: run `gpu-driver-operator job-template --kind build --gpudriver deploy/examples/gpudriver.yaml > deploy/build-job-template.yaml`"
    );
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
    let mut policies = Vec::new();
    let mut policy_bindings = Vec::new();
    for r in &resources {
        for doc in documents(&format!("deploy/{r}")) {
            let kind = doc["kind"].as_str().unwrap().to_string();
            match kind.as_str() {
                "Deployment" => operator_is_unprivileged(&doc),
                "ServiceAccount" => {
                    let sa: ServiceAccount = typed(&doc);
                    if matches!(
                        sa.metadata.name.as_deref(),
                        Some("gpu-driver-installer" | "gpu-driver-exporter")
                    ) {
                        assert_eq!(sa.automount_service_account_token, Some(false));
                    }
                }
                "DaemonSet" => exporter_is_unprivileged(&typed(&doc)),
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
                "ValidatingAdmissionPolicy" => {
                    policies.push(typed::<ValidatingAdmissionPolicy>(&doc));
                }
                "ValidatingAdmissionPolicyBinding" => {
                    policy_bindings.push(typed::<ValidatingAdmissionPolicyBinding>(&doc));
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
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DaemonSet",
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
                        "gpudrivers/status",
                        // Draining GPU pods for a driver upgrade: through
                        // the Eviction API, so PodDisruptionBudgets hold.
                        "pods/eviction"
                    ]
                    .contains(&r.as_str())),
                    "write {v} on {resources:?}"
                );
            }
        }
    }
    admission_policy_is_bound_and_fails_closed(&policies, &policy_bindings);
    // The example GpuDriver parses into the CRD's type.
    let gd: gpu_driver_operator::crd::GpuDriver =
        typed(&documents("deploy/examples/gpudriver.yaml")[0]);
    assert!(!gd.spec.builder_images.is_empty());
}

/// The operator's Deployment: its own account, unprivileged, a read-only
/// root.
fn operator_is_unprivileged(doc: &serde_yaml::Value) {
    let d: Deployment = typed(doc);
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

/// The exporter's DaemonSet (deploy/exporter.yaml; the chart renders the
/// same, tests/it/chart.rs): only on nodes with a verified driver, not
/// privileged, no host namespaces, no API token, no capabilities, a
/// read-only root, and the host only through the NVIDIA runtime class and
/// two read-only mounts (docs/chart.md, "The exporter").
fn exporter_is_unprivileged(ds: &DaemonSet) {
    use gpu_driver_operator::keys::READY_LABEL;
    assert_eq!(ds.metadata.name.as_deref(), Some("gpu-driver-exporter"));
    let pod = ds.spec.clone().unwrap().template.spec.unwrap();
    assert_eq!(
        pod.node_selector
            .clone()
            .unwrap_or_default()
            .get(READY_LABEL)
            .map(String::as_str),
        Some("true"),
        "the exporter runs only where the driver is verified"
    );
    assert!(
        pod.tolerations.clone().unwrap_or_default().iter().any(|t| {
            t.key.as_deref() == Some("nvidia.com/gpu") && t.operator.as_deref() == Some("Exists")
        }),
        "the exporter tolerates the GPU taint"
    );
    assert_eq!(pod.runtime_class_name.as_deref(), Some("nvidia"));
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("gpu-driver-exporter")
    );
    for host in [
        pod.host_pid,
        pod.host_network,
        pod.host_ipc,
        pod.host_users.map(|u| !u),
    ] {
        assert_ne!(host, Some(true), "no host namespace");
    }
    assert!(pod.init_containers.is_none() && pod.containers.len() == 1);
    let c = &pod.containers[0];
    let sc = c.security_context.clone().unwrap();
    assert_ne!(sc.privileged, Some(true), "not privileged");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(caps.add, None, "no capability added");
    let env: Vec<(String, Option<String>)> = c
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    for want in [
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        // NVML only, not CUDA.
        ("NVIDIA_DRIVER_CAPABILITIES", "utility"),
    ] {
        assert!(
            env.contains(&(want.0.to_string(), Some(want.1.to_string()))),
            "{want:?} not in {env:?}"
        );
    }
    // Exactly these host paths, each read-only under /host at its own path
    // (--host-root /host).
    let volumes: BTreeMap<String, String> = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| {
            let hp = v
                .host_path
                .unwrap_or_else(|| panic!("volume {} is no hostPath", v.name));
            (v.name, hp.path)
        })
        .collect();
    assert_eq!(
        volumes
            .values()
            .map(String::as_str)
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([
            "/proc",
            "/var/lib/kubelet/pod-resources",
            "/var/log/containers"
        ])
    );
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    assert_eq!(mounts.len(), volumes.len());
    for m in &mounts {
        assert_eq!(m.read_only, Some(true), "{} not read-only", m.name);
        assert_eq!(m.mount_propagation, None, "{}", m.name);
        assert_eq!(m.sub_path, None, "{}", m.name);
        assert_eq!(m.mount_path, format!("/host{}", volumes[&m.name]));
    }
    let args = c.args.clone().unwrap_or_default().join(" ");
    assert!(args.contains("--host-root /host"), "{args}");
}
