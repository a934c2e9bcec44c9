//! Who holds the driver open: the processes with a `/dev/nvidia*` file
//! descriptor, found from `<host-root>/proc/*/fd`, each with its command
//! and, when it runs in a Kubernetes pod, the pod's UID (from its cgroup).
//! A refcount says only *that* the driver is in use; this says by whom, so
//! a `DriverInUse` message names what to stop (the operator turns the UIDs
//! into pod names).

use std::path::Path;

use crate::host_root::HostRoot;

use crate::node;

/// One process holding an NVIDIA device file open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Holder {
    pub pid: u32,
    /// `/proc/<pid>/comm`, at most 15 bytes by the kernel's rule.
    pub command: String,
    /// The pod's UID when the process runs in a Kubernetes pod.
    pub pod_uid: Option<String>,
    /// The NVIDIA device file it holds (the first by name), e.g. `/dev/nvidia0`.
    pub device: String,
}

/// A bound on the processes looked at: `/proc` of a busy node has
/// thousands; a pathological one must not stall an install's error path.
const MAX_PROCESSES: usize = 100_000;
/// A bound on the descriptors looked at per process.
const MAX_FDS: usize = 65_536;
/// How many holders a message names.
pub(super) const MAX_NAMED: usize = 20;

/// The holders on the host, by PID; empty when the host root has no
/// `/proc` of its own or it cannot be read (this is for a message only).
pub(super) fn find(root: &HostRoot) -> Vec<Holder> {
    let proc = root.kernel_path("/proc");
    let Ok(entries) = std::fs::read_dir(&proc) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .take(MAX_PROCESSES)
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter()
        .filter_map(|pid| holder(&proc.join(pid.to_string()), pid))
        .collect()
}

fn holder(dir: &Path, pid: u32) -> Option<Holder> {
    let device = std::fs::read_dir(dir.join("fd"))
        .ok()?
        .take(MAX_FDS)
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| nvidia_device(&target.to_string_lossy()))
        .min()?;
    let text = |name: &str| {
        node::read_optional(&dir.join(name))
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    Some(Holder {
        pid,
        command: text("comm").trim().to_string(),
        pod_uid: pod_uid(&text("cgroup")),
        device,
    })
}

/// A descriptor's link target when it is an NVIDIA device file
/// (`/dev/nvidia0`, `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-caps/…`).
pub(super) fn nvidia_device(target: &str) -> Option<String> {
    target
        .starts_with("/dev/nvidia")
        .then(|| target.trim_end_matches(" (deleted)").to_string())
}

/// The pod UID in a process's `/proc/<pid>/cgroup`, in either driver's
/// naming: cgroupfs (`/kubepods/burstable/pod<uid>/<container>`) or
/// systemd (`/kubepods.slice/kubepods-burstable.slice/
/// kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`).
pub(super) fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .flat_map(|path| path.split('/'))
        .find_map(|part| {
            let part = part.strip_suffix(".slice").unwrap_or(part);
            let at = part.rfind("pod")?;
            let uid = part[at + 3..].replace('_', "-");
            is_uid(&uid).then_some(uid)
        })
}

fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// `pid 4242 dcgm-exporter (pod 1f2e…) holds /dev/nvidia0; …`, for a
/// `DriverInUse` message; empty when none was found.
pub(super) fn describe(holders: &[Holder]) -> String {
    let mut parts: Vec<String> = holders
        .iter()
        .take(MAX_NAMED)
        .map(|h| {
            let pod = h
                .pod_uid
                .as_ref()
                .map(|u| format!(" (pod {u})"))
                .unwrap_or_default();
            format!("pid {} {}{pod} holds {}", h.pid, h.command, h.device)
        })
        .collect();
    if holders.len() > MAX_NAMED {
        parts.push(format!("and {} more", holders.len() - MAX_NAMED));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_root::HostRootSource;

    const UID: &str = "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9";

    #[test]
    fn pod_uids_come_from_either_cgroup_driver() {
        // Captured shapes: cgroup v2 with the systemd driver (containerd on
        // Garden Linux and Debian), and cgroup v1 with cgroupfs.
        let systemd = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_5b6a_4978_8695_a4b3c2d1e0f9.slice/cri-containerd-8a1b2c3d4e5f.scope\n";
        assert_eq!(pod_uid(systemd).as_deref(), Some(UID));
        let besteffort = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1f2e3d4c_5b6a_4978_8695_a4b3c2d1e0f9.slice/cri-containerd-8a1b.scope\n";
        assert_eq!(pod_uid(besteffort).as_deref(), Some(UID));
        let cgroupfs = "12:devices:/kubepods/burstable/pod1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9/8a1b2c3d\n11:memory:/kubepods/burstable/pod1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9/8a1b2c3d\n";
        assert_eq!(pod_uid(cgroupfs).as_deref(), Some(UID));
        // Guaranteed pods sit right under kubepods.
        let guaranteed = "0::/kubepods.slice/kubepods-pod1f2e3d4c_5b6a_4978_8695_a4b3c2d1e0f9.slice/cri-containerd-8a.scope\n";
        assert_eq!(pod_uid(guaranteed).as_deref(), Some(UID));
        // A host daemon, and text that only looks like it.
        assert_eq!(
            pod_uid("0::/system.slice/nvidia-persistenced.service\n"),
            None
        );
        assert_eq!(pod_uid("0::/user.slice/podman-pod12.slice\n"), None);
        assert_eq!(pod_uid(""), None);
    }

    #[test]
    fn only_nvidia_device_files_count() {
        assert_eq!(
            nvidia_device("/dev/nvidia0").as_deref(),
            Some("/dev/nvidia0")
        );
        assert_eq!(
            nvidia_device("/dev/nvidia-uvm (deleted)").as_deref(),
            Some("/dev/nvidia-uvm")
        );
        assert_eq!(nvidia_device("/dev/null"), None);
        assert_eq!(nvidia_device("socket:[12345]"), None);
    }

    /// A fixture host root with a `/proc` of its own: two holders (one in
    /// a pod), one process with other files open, one gone mid-scan.
    #[test]
    fn holders_are_found_from_the_host_roots_proc() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let process = |pid: &str, comm: &str, cgroup: &str, fds: &[&str]| {
            let p = proc.join(pid);
            std::fs::create_dir_all(p.join("fd")).unwrap();
            std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(p.join("cgroup"), cgroup).unwrap();
            for (i, t) in fds.iter().enumerate() {
                std::os::unix::fs::symlink(t, p.join("fd").join(i.to_string())).unwrap();
            }
        };
        let pod = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-1.scope\n",
            UID.replace('-', "_")
        );
        process(
            "4242",
            "dcgm-exporter",
            &pod,
            &["/dev/null", "/dev/nvidiactl", "/dev/nvidia0"],
        );
        process(
            "77",
            "nvidia-persiste",
            "0::/system.slice/nvidia-persistenced.service\n",
            &["/dev/nvidia0"],
        );
        process(
            "5",
            "sshd",
            "0::/system.slice/ssh.service\n",
            &["/dev/null", "socket:[1]"],
        );
        std::fs::create_dir_all(proc.join("9")).unwrap(); // no fd dir: exited
        std::fs::create_dir_all(proc.join("self")).unwrap();
        let root = HostRoot::new(dir.path(), HostRootSource::Flag);
        let found = find(&root);
        assert_eq!(
            found,
            vec![
                Holder {
                    pid: 77,
                    command: "nvidia-persiste".into(),
                    pod_uid: None,
                    device: "/dev/nvidia0".into()
                },
                Holder {
                    pid: 4242,
                    command: "dcgm-exporter".into(),
                    pod_uid: Some(UID.into()),
                    device: "/dev/nvidia0".into()
                },
            ]
        );
        assert_eq!(
            describe(&found),
            format!(
                "pid 77 nvidia-persiste holds /dev/nvidia0; pid 4242 dcgm-exporter (pod {UID}) holds /dev/nvidia0"
            )
        );
    }

    #[test]
    fn long_lists_are_cut() {
        let many: Vec<Holder> = (0..25)
            .map(|pid| Holder {
                pid,
                command: "cuda".into(),
                pod_uid: None,
                device: "/dev/nvidia0".into(),
            })
            .collect();
        assert!(describe(&many).ends_with("; and 5 more"));
        assert_eq!(describe(&[]), "");
    }
}
