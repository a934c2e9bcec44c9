//! The operator's manifests on a real apiserver, and its leader lease.

use super::*;

/// Every manifest shipped under deploy/ (examples and NVIDIA's side
/// included), and the kustomization's rendering, pass a server-side dry run
/// on a real apiserver: its schemas, defaulting and admission. The CRD and
/// RBAC are applied first, so the GpuDriver example meets its CRD. Helm
/// values files are not manifests (tests/it/operator_manifests.rs checks them
/// against the charts they are for).
#[test]
fn manifests_are_accepted_by_the_apiserver() {
    let Some(c) = Cluster::start() else { return };
    install_base(&c);
    let root = crate::support::repo_root();
    let files = yaml_files(&root.join("deploy"));
    let mut checked = Vec::new();
    for path in &files {
        let f = path.strip_prefix(root).unwrap().to_str().unwrap();
        if f.ends_with("-values.yaml") || f == "deploy/kustomization.yaml" {
            continue;
        }
        let out = c.kubectl_output(
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&repo_file(f)),
        );
        assert!(
            out.status.success(),
            "{f}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        checked.push(f.to_string());
    }
    for want in [
        "deploy/operator.yaml",
        "deploy/job-template.yaml",
        "deploy/cached-job-template.yaml",
        "deploy/build-job-template.yaml",
        "deploy/examples/gpudriver.yaml",
        "deploy/examples/cuda-vectoradd.yaml",
    ] {
        assert!(
            checked.iter().any(|f| f == want),
            "{want} not checked: {checked:?}"
        );
    }
    // The kustomization renders, and what it renders is accepted.
    let rendered = c.kubectl(&[
        "kustomize",
        crate::support::repo_root().join("deploy").to_str().unwrap(),
    ]);
    let out = c.kubectl_output(&["apply", "--dry-run=server", "-f", "-"], Some(&rendered));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The installer's account may do nothing.
    let can = c.kubectl_output(
        &[
            "auth",
            "can-i",
            "--list",
            "--as=system:serviceaccount:gpu-driver:gpu-driver-installer",
        ],
        None,
    );
    let list = String::from_utf8_lossy(&can.stdout);
    for line in list.lines().skip(1) {
        // Lines starting blank are non-resource URLs (discovery, health):
        // open to every authenticated user.
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let res = line.split_whitespace().next().unwrap_or("");
        // What every authenticated user may do (discovery, self reviews).
        assert!(
            res.ends_with(".authorization.k8s.io")
                || res.ends_with(".authentication.k8s.io")
                || res.is_empty(),
            "installer account can: {line}"
        );
    }
}

#[test]
fn leader_lease_has_one_holder() {
    let Some(c) = Cluster::start() else { return };
    install_base(&c);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = client(&c.kubeconfig).await;
        let m = Metrics::default();
        let a = leader::LeaseConfig::new(NS, "a");
        let b = leader::LeaseConfig::new(NS, "b");
        assert!(leader::try_acquire(&client, &a, &m).await.unwrap());
        assert!(!leader::try_acquire(&client, &b, &m).await.unwrap());
        // The holder renews.
        assert!(leader::try_acquire(&client, &a, &m).await.unwrap());
        assert!(!leader::try_acquire(&client, &b, &m).await.unwrap());
    });
    let lease = get_json(&c, &["lease", "gpu-driver-operator", "-n", NS]);
    assert_eq!(lease["spec"]["holderIdentity"], "a");
}
