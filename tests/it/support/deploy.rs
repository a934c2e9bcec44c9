//! The repository's deploy/ manifests as the cluster tests use them.

use std::path::{Path, PathBuf};

use super::cluster::Cluster;

/// A file of the repository, by its path from the root.
pub fn repo_file(p: &str) -> String {
    let path = crate::support::repo_root().join(p);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every YAML file under `dir`, recursively, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// The namespace and the GpuDriver CRD, applied and established, so that
/// GpuDrivers can be created right after.
pub fn install_crd(c: &Cluster) {
    c.apply(&repo_file("deploy/namespace.yaml"));
    c.apply(&repo_file("deploy/crd.yaml"));
    let wait = [
        "wait",
        "--for=condition=Established",
        "crd/gpudrivers.gpu-driver.gardenlinux.io",
        "--timeout=60s",
    ];
    // Right after the create, kubectl wait can find no conditions at all
    // yet ("accessor error: <nil>") and fail at once instead of waiting.
    for _ in 0..10 {
        let out = c.kubectl_output(&wait, None);
        if out.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("accessor error"), "kubectl {wait:?}: {err}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    c.kubectl(&wait);
}
