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
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Deserialize;

use crate::support::deploy::yaml_files;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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
    let mut policies = Vec::new();
    let mut policy_bindings = Vec::new();
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

/// The policy's `deniedFlags` list.
fn denied_flags() -> BTreeSet<String> {
    let policy = &documents("deploy/admission-policy.yaml")[0];
    let vars = policy["spec"]["variables"].as_sequence().unwrap();
    let expr = vars
        .iter()
        .find(|v| v["name"] == "deniedFlags")
        .expect("variable deniedFlags")["expression"]
        .as_str()
        .unwrap();
    // A CEL list of single-quoted strings: the odd pieces between quotes.
    expr.split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Every long flag `gpu-driver-installer run` takes (its own and the
/// global ones) is either refused in extraArgs by the policy or known to be
/// harmless there: a new flag fails this test until someone decides.
#[test]
fn admission_policy_refuses_every_installer_flag_that_moves_sources_or_trust() {
    use clap::CommandFactory;
    let mut cli = gpu_driver_installer::cli::Cli::command();
    cli.build();
    let run = cli.find_subcommand("run").expect("run subcommand");
    let flags: BTreeSet<String> = run
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|l| format!("--{l}"))
        .collect();
    // Neither where bytes come from, nor how they are trusted, nor which
    // paths are written or run.
    let harmless: BTreeSet<String> = [
        "--help",
        "--log-level",
        "--kernel-release",
        "--driver-version",
        "--flavor",
        "--peermem",
        "--drm",
        "--force",
        "--offline",
        "--retries",
        "--backoff-ms",
        "--connect-timeout",
        "--read-timeout",
        "--cache-wait",
        "--cache-lease-ttl",
        "--cache-poll-ms",
        // Bounds of a download or an extraction: the worst a GpuDriver
        // writer can do with them is let a verified package take more
        // disk or time on the node.
        "--download-timeout",
        "--max-download-size",
        "--max-unpacked-size",
        "--max-unpacked-entries",
        // The package for another CPU is still digest-verified; the node
        // then refuses its modules (vermagic).
        "--arch",
        // Only narrow what the node accepts: never write the cache, never
        // compile.
        "--cache-read-only",
        "--no-compile",
    ]
    .map(String::from)
    .into();
    let denied = denied_flags();
    for f in [
        "--url",
        "--mirror",
        "--sha256",
        "--allow-http",
        "--ca-bundle",
        "--apt-keyring",
        "--catalog",
        "--cache-url",
        "--artifact-sha256",
        "--module-params",
        // The signing key is the build Jobs' alone.
        "--signing-key",
        "--signing-cert",
    ] {
        assert!(denied.contains(f), "the policy must refuse {f}: {denied:?}");
    }
    let unknown: Vec<_> = denied.difference(&flags).collect();
    assert!(unknown.is_empty(), "not installer flags: {unknown:?}");
    let both: Vec<_> = denied.intersection(&harmless).collect();
    assert!(both.is_empty(), "denied and harmless: {both:?}");
    let undecided: Vec<_> = flags
        .iter()
        .filter(|f| !denied.contains(*f) && !harmless.contains(*f))
        .collect();
    assert!(
        undecided.is_empty(),
        "installer flags neither refused by deploy/admission-policy.yaml (deniedFlags) \
         nor listed as harmless here: {undecided:?}"
    );
}

/// Pinned (`@sha256:` and 64 hex digits) or tagged with something other
/// than `latest`. A registry port (`host:5000/name`) is no tag.
fn pinned_or_versioned(image: &str) -> Result<(), String> {
    if let Some((name, digest)) = image.split_once("@sha256:") {
        let hex = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
        return if hex && !name.is_empty() {
            Ok(())
        } else {
            Err(format!("{image}: bad digest"))
        };
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        None | Some((_, "")) => Err(format!("{image}: untagged (means :latest)")),
        Some((_, "latest")) => Err(format!("{image}: :latest")),
        Some(_) => Ok(()),
    }
}

/// Every string under a key `image` or `installerImage`, at any depth.
fn image_refs(v: &serde_yaml::Value, out: &mut Vec<String>) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            for (k, v) in m {
                if let (Some("image" | "installerImage"), Some(s)) = (k.as_str(), v.as_str()) {
                    out.push(s.to_string());
                }
                image_refs(v, out);
            }
        }
        serde_yaml::Value::Sequence(s) => s.iter().for_each(|v| image_refs(v, out)),
        _ => {}
    }
}

#[test]
fn images_in_deploy_are_pinned_or_versioned_never_latest() {
    for bad in [
        "x",
        "x:latest",
        "host:5000/x",
        "x@sha256:abc",
        "ghcr.io/a/b:",
    ] {
        assert!(pinned_or_versioned(bad).is_err(), "{bad}");
    }
    for good in [
        "host:5000/x:1.2",
        "ghcr.io/a/kmodbuild:{gardenLinuxVersion}",
        &format!("x:1@sha256:{}", "ab".repeat(32)),
    ] {
        assert!(pinned_or_versioned(good).is_ok(), "{good}");
    }
    let files = yaml_files(&repo().join("deploy"));
    let version = env!("CARGO_PKG_VERSION");
    let mut seen = 0;
    let mut bad = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(repo())
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let mut refs = Vec::new();
        for doc in documents(&rel) {
            image_refs(&doc, &mut refs);
            // kustomize's image overrides.
            if doc["kind"] == "Kustomization" {
                for i in doc["images"].as_sequence().into_iter().flatten() {
                    let name = i["newName"].as_str().or(i["name"].as_str()).unwrap();
                    let tag = i["newTag"].as_str().map(|t| format!(":{t}"));
                    let digest = i["digest"].as_str().map(|d| format!("@{d}"));
                    refs.push(format!(
                        "{name}{}{}",
                        tag.unwrap_or_default(),
                        digest.unwrap_or_default()
                    ));
                }
            }
        }
        for r in refs {
            seen += 1;
            if let Err(e) = pinned_or_versioned(&r) {
                bad.push(format!("{rel}: {e}"));
            }
            // This project's own images carry its version (or a digest).
            let own = [
                "/gpu-driver-operator",
                "/gpu-driver-installer",
                "/gpu-driver-exporter",
            ];
            let name = r.split(['@']).next().unwrap();
            if let Some((repo_name, tag)) = name.rsplit_once(':') {
                if own.iter().any(|o| repo_name.ends_with(o)) && !r.contains('@') {
                    if tag != version {
                        bad.push(format!(
                            "{rel}: {r}: tag is not the crate version {version}"
                        ));
                    }
                }
            }
        }
    }
    assert!(seen >= 5, "found only {seen} image references in deploy/");
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The example GpuDriver names a builder image for every release the
/// catalog serves, on both CPUs, with the tag Garden Linux publishes
/// (`kmodbuild:<arch>-<full version>`).
#[test]
fn the_example_has_a_builder_image_for_every_catalogued_release() {
    use gpu_driver_operator::crd::GpuDriver;
    use gpu_driver_operator::decide::{NodeFacts, builder_image};
    let docs = documents("deploy/examples/gpudriver.yaml");
    let gd: GpuDriver = typed(&docs[0]);
    let catalog = gpu_driver_installer::catalog::Catalog::embedded().unwrap();
    let mut checked = 0;
    for os in &catalog.os {
        for rel in &os.releases {
            // A point release of each: the image tag carries it whole.
            let (os_image, tag_version) = match os.id.as_str() {
                "gardenlinux" if rel.version == "2150" => {
                    ("Garden Linux 2150.8.0".to_string(), Some("2150.8.0"))
                }
                "gardenlinux" => (format!("Garden Linux {}.4", rel.version), None),
                "debian" => (
                    format!(
                        "Debian GNU/Linux {} ({})",
                        rel.version,
                        rel.codename.as_deref().unwrap_or("")
                    ),
                    None,
                ),
                other => panic!("no builder image rule for {other}"),
            };
            for arch in ["amd64", "arm64"] {
                let node = NodeFacts {
                    os_image: os_image.clone(),
                    kernel: "6.12.57-cloud-amd64".into(),
                    arch: arch.into(),
                    ..NodeFacts::default()
                };
                let image = builder_image(&gd.spec.builder_images, &node)
                    .unwrap_or_else(|| panic!("{os_image} ({arch}): no builder image"));
                if os.id == "gardenlinux" {
                    let v = tag_version
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("{}.4", rel.version));
                    assert_eq!(
                        image,
                        format!("ghcr.io/gardenlinux/gardenlinux/kmodbuild:{arch}-{v}"),
                        "{os_image}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 14, "{checked}");
}

/// The Helm values files under deploy/ and the chart snapshots they are
/// written against (tests/fixtures/upstream/README.md): the chart's
/// values.yaml, and templates that read keys values.yaml does not list.
const HELM_VALUES: &[(&str, &str, &[&str])] = &[
    (
        "deploy/nvidia/gpu-operator-values.yaml",
        "tests/fixtures/upstream/gpu-operator-v26.7.0/values.yaml",
        &[],
    ),
    (
        "deploy/nvidia/device-plugin-values.yaml",
        "tests/fixtures/upstream/nvidia-device-plugin-v0.20.0/values.yaml",
        &[
            "tests/fixtures/upstream/nvidia-device-plugin-v0.20.0/templates/daemonset-device-plugin.yml",
        ],
    ),
];

/// Every path of mapping keys down to a value that is not a mapping (or an
/// empty one): `driver.enabled`, `affinity.nodeAffinity....`.
fn key_paths(v: &serde_yaml::Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        serde_yaml::Value::Mapping(m) if !m.is_empty() => {
            for (k, v) in m {
                prefix.push(k.as_str().expect("string keys").to_string());
                key_paths(v, prefix, out);
                prefix.pop();
            }
        }
        _ => out.push(prefix.clone()),
    }
}

/// Does the chart know `path`? It is in values.yaml (walking down until
/// values.yaml has a non-mapping there: what the chart takes whole, such as
/// a toleration list), or a template reads `.Values.<path>`.
fn chart_knows(values: &serde_yaml::Value, templates: &[String], path: &[String]) -> bool {
    let mut at = values;
    let mut found = true;
    for k in path {
        match at {
            serde_yaml::Value::Mapping(m) => match m.get(k.as_str()) {
                Some(v) => at = v,
                None => {
                    found = false;
                    break;
                }
            },
            _ => break,
        }
    }
    found
        || templates
            .iter()
            .any(|t| t.contains(&format!(".Values.{}", path.join("."))))
}

#[test]
fn helm_values_set_only_keys_the_cited_charts_have() {
    assert!(!chart_knows(
        &serde_yaml::from_str("driver: {enabled: true}").unwrap(),
        &[],
        &["driver".into(), "enabeld".into()]
    ));
    // Every values file under deploy/ is in the table, so none escapes.
    let files = yaml_files(&repo().join("deploy"));
    for f in &files {
        let rel = f.strip_prefix(repo()).unwrap().to_str().unwrap();
        if rel.ends_with("-values.yaml") {
            assert!(
                HELM_VALUES.iter().any(|(v, ..)| *v == rel),
                "{rel}: Helm values without a chart snapshot in HELM_VALUES"
            );
        }
    }
    for (file, chart_values, templates) in HELM_VALUES {
        let ours: serde_yaml::Value = serde_yaml::from_str(&read(file)).unwrap();
        let theirs: serde_yaml::Value = serde_yaml::from_str(&read(chart_values)).unwrap();
        let templates: Vec<String> = templates.iter().map(|t| read(t)).collect();
        let mut paths = Vec::new();
        key_paths(&ours, &mut Vec::new(), &mut paths);
        assert!(paths.len() >= 5, "{file}: {paths:?}");
        let unknown: Vec<String> = paths
            .iter()
            .filter(|p| !chart_knows(&theirs, &templates, p))
            .map(|p| p.join("."))
            .collect();
        assert!(
            unknown.is_empty(),
            "{file}: keys {chart_values} does not have: {unknown:?}"
        );
    }
}

/// The path from a GPU node to a CUDA pod (docs/workloads.md) keeps to
/// gpu-driver-operator's readiness: NVIDIA's operands use the installer's
/// driver root and wait for the startup taint to go, the device plugin for
/// the ready label, NFD tolerates the taint (it must label a waiting node),
/// and the CUDA pod wants the ready label and a GPU.
#[test]
fn the_gpu_path_waits_for_the_ready_label_and_uses_our_driver_root() {
    use gpu_driver_operator::crd::GpuDriver;
    use gpu_driver_operator::keys::READY_LABEL;
    let gd: GpuDriver = typed(&documents("deploy/examples/gpudriver.yaml")[0]);
    let taint = gd
        .spec
        .startup_taint
        .expect("the example sets startupTaint");
    let driver_root = format!("{}/current", gpu_driver_installer::install::DRIVERS_DIR);
    let keys_of = |v: &serde_yaml::Value| -> Vec<String> {
        v.as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|t| t["key"].as_str().map(str::to_string))
            .collect()
    };

    let op: serde_yaml::Value =
        serde_yaml::from_str(&read("deploy/nvidia/gpu-operator-values.yaml")).unwrap();
    assert_eq!(op["driver"]["enabled"], false);
    assert_eq!(
        op["hostPaths"]["driverInstallDir"].as_str(),
        Some(driver_root.as_str())
    );
    assert_eq!(op["toolkit"]["enabled"], true);
    assert_eq!(op["devicePlugin"]["enabled"], false);
    assert!(!keys_of(&op["daemonsets"]["tolerations"]).contains(&taint));
    assert!(keys_of(&op["node-feature-discovery"]["worker"]["tolerations"]).contains(&taint));

    let dp: serde_yaml::Value =
        serde_yaml::from_str(&read("deploy/nvidia/device-plugin-values.yaml")).unwrap();
    let terms = &dp["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let terms = terms.as_sequence().unwrap();
    // One term: every node must match it (several terms are ORed).
    assert_eq!(terms.len(), 1, "{terms:?}");
    let exprs = terms[0]["matchExpressions"].as_sequence().unwrap();
    assert!(
        exprs.iter().any(|e| e["key"] == READY_LABEL
            && e["operator"] == "In"
            && e["values"]
                .as_sequence()
                .is_some_and(|v| v.len() == 1 && v[0] == "true")),
        "{exprs:?}"
    );
    assert_eq!(dp["nvidiaDriverRoot"].as_str(), Some(driver_root.as_str()));
    assert_eq!(dp["nvidiaDevRoot"], "/");
    assert!(!keys_of(&dp["tolerations"]).contains(&taint));

    let pod: k8s_openapi::api::core::v1::Pod =
        typed(&documents("deploy/examples/cuda-vectoradd.yaml")[0]);
    let spec = pod.spec.unwrap();
    assert_eq!(
        spec.node_selector
            .unwrap_or_default()
            .get(READY_LABEL)
            .map(String::as_str),
        Some("true")
    );
    let limits = spec.containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "1");
    assert!(
        spec.tolerations
            .unwrap_or_default()
            .iter()
            .all(|t| t.key.as_deref() != Some(taint.as_str()))
    );
}
