//! Images are pinned or versioned; the example names a builder image for
//! every catalogued release; Helm values and the GPU path.

use super::*;

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
