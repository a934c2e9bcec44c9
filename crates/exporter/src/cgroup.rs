//! Which pod and container a process runs in, from `/proc/<pid>/cgroup`:
//! the kubelet puts each pod in a cgroup named after its UID and the
//! runtime puts each container in one named after its ID, under both
//! cgroup drivers and both cgroup versions:
//!
//! - systemd driver: `…/kubepods-burstable-pod<uid, '-' as '_'>.slice/cri-containerd-<id>.scope`
//!   (also `crio-<id>.scope`, `docker-<id>.scope`, and containerd's
//!   `<slice>:cri-containerd:<id>` under cgroup v1);
//! - cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`.
//!
//! Static pods' UIDs are 32 hex digits (their config hash) rather than a
//! UUID. Paths read from inside another cgroup namespace start with `/..`;
//! only the names matter. Parsing is pure ([`parse`]); [`read`] only reads.

use std::path::Path;

use gpu_driver_contract::host_root::HostRoot;

/// A process's pod UID and, when it is in a container's cgroup, the
/// container ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainer {
    pub pod_uid: String,
    pub container_id: Option<String>,
}

/// A pod UID as the kubelet writes it: a UUID (`-` or, in systemd slice
/// names, `_`), or a static pod's 32 hex digits. Returned with dashes.
fn pod_uid(candidate: &str) -> Option<String> {
    let uid = candidate.replace('_', "-");
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    let parts: Vec<&str> = uid.split('-').collect();
    let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    let is_uuid = lens == [8, 4, 4, 4, 12] && parts.iter().all(|p| hex(p));
    let is_hash = uid.len() == 32 && hex(&uid);
    (is_uuid || is_hash).then_some(uid)
}

/// The pod UID in one path component: `pod<uid>` (cgroupfs) or
/// `…-pod<uid>.slice` (systemd).
fn pod_component(c: &str) -> Option<String> {
    let c = c.strip_suffix(".slice").unwrap_or(c);
    let rest = match c.rfind("-pod") {
        Some(i) => &c[i + 4..],
        None => c.strip_prefix("pod")?,
    };
    pod_uid(rest)
}

/// A container ID in one path component: `<id>`, `<runtime>-<id>.scope`.
fn container_component(c: &str) -> Option<String> {
    let c = c.strip_suffix(".scope").unwrap_or(c);
    let id = c.rsplit(['-', ':']).next().unwrap_or(c);
    let ok = (12..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| id.to_ascii_lowercase())
}

/// The pod and container of one cgroup path.
pub fn parse_path(path: &str) -> Option<PodContainer> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        // containerd's systemd notation under cgroup v1: slice:prefix:id.
        let (slice, inline) = match part.split_once(':') {
            Some((slice, rest)) => (slice, Some(rest)),
            None => (*part, None),
        };
        let Some(pod_uid) = pod_component(slice) else {
            continue;
        };
        let next = inline.or_else(|| parts.get(i + 1).copied());
        return Some(PodContainer {
            pod_uid,
            container_id: next.and_then(container_component),
        });
    }
    None
}

/// The pod and container in a `/proc/<pid>/cgroup` text
/// (`hierarchy:controllers:path` lines; cgroup v2 has one, `0::path`).
pub fn parse(text: &str) -> Option<PodContainer> {
    let mut best: Option<PodContainer> = None;
    for line in text.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        if let Some(found) = parse_path(path) {
            if found.container_id.is_some() {
                return Some(found);
            }
            best.get_or_insert(found);
        }
    }
    best
}

/// `<host-root>/proc/<pid>/cgroup`: the host's /proc, since NVML reports
/// PIDs of the host's PID namespace.
pub fn cgroup_file(root: &HostRoot, pid: u32) -> std::path::PathBuf {
    root.join(Path::new("/proc").join(pid.to_string()).join("cgroup"))
}

/// The process's pod and container, `Ok(None)` when it is in no pod;
/// an error when its cgroup cannot be read (the host's /proc is not
/// mounted, or the process exited between NVML's list and this read).
pub fn read(root: &HostRoot, pid: u32) -> std::io::Result<Option<PodContainer>> {
    Ok(parse(&std::fs::read_to_string(cgroup_file(root, pid))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured `/proc/<pid>/cgroup` texts (tests/fixtures/exporter/cgroup,
    /// sources in its README.md) and what they hold.
    const FIXTURES: &[(&str, &str, Option<&str>)] = &[
        (
            include_str!("../../../tests/fixtures/exporter/cgroup/v1-cgroupfs.cgroup"),
            "d7874f44-eee0-423c-83c9-f246075bdde1",
            Some("fbaa59723cd1f05d310e6f48b5d49a9d9e9552b7fde2205d0a2e2b5f60ec21ba"),
        ),
        (
            include_str!(
                "../../../tests/fixtures/exporter/cgroup/v1-systemd-containerd-colon.cgroup"
            ),
            "b96a7488-3ee1-4bdc-9c98-155cc887b417",
            Some("6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294"),
        ),
        (
            include_str!("../../../tests/fixtures/exporter/cgroup/v1-systemd-crio.cgroup"),
            "a5c1f8d5-1919-434d-add7-4afaafdaef89",
            Some("5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c"),
        ),
        (
            include_str!("../../../tests/fixtures/exporter/cgroup/v1-systemd-docker.cgroup"),
            "7d4424e6-bb13-42f4-a47a-45a4828bf54d",
            Some("d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98"),
        ),
        (
            include_str!(
                "../../../tests/fixtures/exporter/cgroup/v2-systemd-containerd-kind.cgroup"
            ),
            "1e597579-417e-482f-bf65-5fe170c3aebd",
            Some("a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e"),
        ),
        (
            include_str!("../../../tests/fixtures/exporter/cgroup/v2-systemd-static-pod.cgroup"),
            "187bff14cccb94f179e943eacce55bb3",
            Some("c203a2647ef1ad78e990157c50331f3b6ef0b03336cf08535d6bf7faa5421415"),
        ),
        (
            include_str!("../../../tests/fixtures/exporter/cgroup/v2-cgroupns-relative.cgroup"),
            "03f3f104-3215-44f2-9686-d4dd1f05a7ed",
            Some("09d185410c4e25236cc24717f881589bb0978b24eafd101624e627a4dd8d3439"),
        ),
    ];

    #[test]
    fn captured_cgroup_files() {
        for (text, uid, id) in FIXTURES {
            let got = parse(text).unwrap_or_else(|| panic!("no pod in:\n{text}"));
            assert_eq!(got.pod_uid, *uid, "{text}");
            assert_eq!(got.container_id.as_deref(), *id, "{text}");
        }
    }

    #[test]
    fn processes_outside_pods_have_none() {
        let host = include_str!("../../../tests/fixtures/exporter/cgroup/host-system-slice.cgroup");
        assert_eq!(parse(host), None);
        assert_eq!(parse("0::/\n"), None);
        assert_eq!(parse(""), None);
        assert_eq!(
            parse("0::/kubepods.slice/kubepods-podnotauid.slice\n"),
            None
        );
    }

    #[test]
    fn a_pod_level_cgroup_has_no_container() {
        let got = parse_path("/kubepods/besteffort/pod18d34ce4-50c7-452c-9df8-53c4a3fdf363");
        assert_eq!(
            got,
            Some(PodContainer {
                pod_uid: "18d34ce4-50c7-452c-9df8-53c4a3fdf363".into(),
                container_id: None
            })
        );
    }

    #[test]
    fn reads_under_the_host_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(
            dir.path(),
            gpu_driver_contract::host_root::HostRootSource::Flag,
        );
        std::fs::create_dir_all(dir.path().join("proc/4242")).unwrap();
        std::fs::write(cgroup_file(&root, 4242), FIXTURES[0].0).unwrap();
        let got = read(&root, 4242).ok().flatten().map(|p| p.pod_uid);
        assert_eq!(got, Some(FIXTURES[0].1.to_string()));
        assert!(read(&root, 4243).is_err(), "no such process");
        std::fs::create_dir_all(dir.path().join("proc/1")).unwrap();
        std::fs::write(cgroup_file(&root, 1), "0::/init.scope\n").unwrap();
        assert!(matches!(read(&root, 1), Ok(None)), "a host process");
    }
}
