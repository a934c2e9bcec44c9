//! Container IDs to pod, namespace and container names, from the links the
//! kubelet keeps in `/var/log/containers` for log shippers:
//! `<pod>_<namespace>_<container>-<container id>.log` (kubelet's
//! `legacyLogSymlink` in pkg/kubelet/kuberuntime/legacy.go, names cut to
//! 255 bytes). Only the names are read, never the links' targets or logs.
//! Pod names, namespaces and container names cannot hold `_`, so the
//! split is unambiguous.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::metrics::ContainerRef;
use gpu_driver_contract::host_root::HostRoot;

/// The kubelet's link directory, relative to the host root.
pub const LOG_LINKS_DIR: &str = "/var/log/containers";

/// The container ID and names in one link name; `None` for anything else
/// (and for names cut short, whose ID is incomplete).
pub fn parse_link(name: &str) -> Option<(String, ContainerRef)> {
    let stem = name.strip_suffix(".log")?;
    let mut parts = stem.splitn(3, '_');
    let (pod, namespace, rest) = (parts.next()?, parts.next()?, parts.next()?);
    let (container, id) = rest.rsplit_once('-')?;
    let full_id = id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
    if pod.is_empty() || namespace.is_empty() || container.is_empty() || !full_id {
        return None;
    }
    Some((
        id.to_ascii_lowercase(),
        ContainerRef {
            namespace: namespace.into(),
            pod: pod.into(),
            container: container.into(),
        },
    ))
}

pub fn links_dir(root: &HostRoot) -> PathBuf {
    root.join(LOG_LINKS_DIR)
}

/// Container ID → names, from the directory's entries; empty when the
/// directory is not mounted or not readable.
pub fn read_names(dir: &Path) -> BTreeMap<String, ContainerRef> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| parse_link(&e.file_name().to_string_lossy()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "fbaa59723cd1f05d310e6f48b5d49a9d9e9552b7fde2205d0a2e2b5f60ec21ba";

    #[test]
    fn link_names() {
        let (id, c) = parse_link(&format!("trainer-7d9f-x2x_ml-team_cuda-worker-{ID}.log"))
            .unwrap_or_else(|| panic!("not parsed"));
        assert_eq!(id, ID);
        assert_eq!(
            c,
            ContainerRef {
                namespace: "ml-team".into(),
                pod: "trainer-7d9f-x2x".into(),
                container: "cuda-worker".into()
            }
        );
        assert_eq!(
            parse_link(&format!("a_b_c-{}.log", &ID[..40])),
            None,
            "cut short"
        );
        assert_eq!(parse_link(&format!("a_b_c-{ID}.log.1")), None);
        assert_eq!(parse_link(&format!("a_b-{ID}.log")), None);
        assert_eq!(parse_link("README"), None);
    }

    #[test]
    fn a_missing_directory_is_empty() {
        assert!(read_names(Path::new("/nonexistent/var/log/containers")).is_empty());
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            "/var/log/pods/x/0.log",
            dir.path().join(format!("p_ns_c-{ID}.log")),
        )
        .unwrap();
        std::fs::write(dir.path().join("other.txt"), b"").unwrap();
        let names = read_names(dir.path());
        assert_eq!(names.len(), 1);
        assert_eq!(names[ID].pod, "p");
    }
}
