//! Device nodes: the `/dev/nvidia*` nodes NVIDIA's user space expects,
//! from the majors the modules registered in `/proc/devices`; and the
//! sysfs settings written before a load (the GPUs' IOMMU groups, kernel
//! parameters).

use std::collections::BTreeMap;
use std::fs;

use crate::confined_fs::{HostFs, HostRootFs};
use crate::error::{Error, Failure, Result};
use crate::host_root::HostRoot;
use crate::node::{self, PciRole};

/// NVIDIA's fixed character major (`NV_MAJOR_DEVICE_NUMBER`).
const NVIDIA_MAJOR: u32 = 195;
const NVIDIACTL_MINOR: u32 = 255;
const NVIDIA_MODESET_MINOR: u32 = 254;

/// A device node: host path, major, minor.
pub(super) type Node = (String, u32, u32);

/// Every node the loaded modules call for (`modeset`: nvidia-modeset is
/// among them), with notes on what is missing.
pub(super) fn wanted_nodes(root: &HostRoot, modeset: bool) -> Result<(Vec<Node>, Vec<String>)> {
    let devices = root.kernel_path("/proc/devices");
    let majors = match node::read_optional(&devices)? {
        Some(t) => parse_char_majors(&t)?,
        None => BTreeMap::new(),
    };
    let (mut nodes, notes) = device_nodes(&majors, gpu_count(root)?, modeset);
    nodes.extend(extra_device_nodes(
        &majors,
        nvswitch_count(root)?,
        &mig_cap_minors(root)?,
    ));
    Ok((nodes, notes))
}

/// Character majors by name from `/proc/devices`.
fn parse_char_majors(text: &str) -> Result<BTreeMap<String, u32>> {
    use procfs::FromBufRead;
    let devices = procfs::Devices::from_buf_read(text.as_bytes()).map_err(|e| {
        Error::new(
            Failure::HostReadFailed,
            format!("parsing /proc/devices: {e}"),
        )
    })?;
    Ok(devices
        .char_devices
        .into_iter()
        .map(|d| (d.name, d.major))
        .collect())
}

/// The device nodes NVIDIA's user space expects (what `nvidia-modprobe`
/// would create): `/dev/nvidiactl`, `/dev/nvidia<N>` per GPU,
/// `/dev/nvidia-modeset`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`.
fn device_nodes(
    majors: &BTreeMap<String, u32>,
    gpus: usize,
    modeset: bool,
) -> (Vec<(String, u32, u32)>, Vec<String>) {
    let mut notes = Vec::new();
    let nvidia = ["nvidia-frontend", "nvidia"]
        .iter()
        .find_map(|n| majors.get(*n).copied());
    let nvidia = nvidia.unwrap_or_else(|| {
        notes.push(format!(
            "/proc/devices lists no nvidia major; using NVIDIA's fixed {NVIDIA_MAJOR}"
        ));
        NVIDIA_MAJOR
    });
    let mut nodes = vec![("/dev/nvidiactl".to_string(), nvidia, NVIDIACTL_MINOR)];
    for i in 0..gpus {
        nodes.push((format!("/dev/nvidia{i}"), nvidia, i as u32));
    }
    if modeset {
        nodes.push((
            "/dev/nvidia-modeset".to_string(),
            nvidia,
            NVIDIA_MODESET_MINOR,
        ));
    }
    match majors.get("nvidia-uvm") {
        Some(&uvm) => {
            nodes.push(("/dev/nvidia-uvm".to_string(), uvm, 0));
            nodes.push(("/dev/nvidia-uvm-tools".to_string(), uvm, 1));
        }
        None => notes.push("/proc/devices lists no nvidia-uvm major: no UVM nodes".into()),
    }
    (nodes, notes)
}

/// The device nodes beyond the GPUs' own that the hardware needs, from
/// the majors the modules registered (`/proc/devices`):
/// `/dev/nvidia-nvswitchctl` and `/dev/nvidia-nvswitch<N>` per NVSwitch
/// (Fabric Manager opens them), `/dev/nvidia-nvlink`, and the MIG
/// capability nodes `/dev/nvidia-caps/nvidia-cap<M>` whose minors
/// `/proc/driver/nvidia/capabilities/mig/{config,monitor}` give. A major
/// the kernel did not register means that part is absent: no node.
fn extra_device_nodes(
    majors: &BTreeMap<String, u32>,
    nvswitches: usize,
    caps: &[u32],
) -> Vec<(String, u32, u32)> {
    let mut nodes = Vec::new();
    if let Some(&m) = majors.get("nvidia-nvswitch") {
        if nvswitches > 0 {
            nodes.push(("/dev/nvidia-nvswitchctl".to_string(), m, NVIDIACTL_MINOR));
            for i in 0..nvswitches {
                nodes.push((format!("/dev/nvidia-nvswitch{i}"), m, i as u32));
            }
        }
    }
    if let Some(&m) = majors.get("nvidia-nvlink") {
        nodes.push(("/dev/nvidia-nvlink".to_string(), m, 0));
    }
    if let Some(&m) = majors.get("nvidia-caps") {
        for &minor in caps {
            nodes.push((format!("/dev/nvidia-caps/nvidia-cap{minor}"), m, minor));
        }
    }
    nodes
}

/// `DeviceFileMinor: N` of a `/proc/driver/nvidia/capabilities/…` file.
fn parse_cap_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|l| {
        l.strip_prefix("DeviceFileMinor:")
            .and_then(|v| v.trim().parse().ok())
    })
}

/// The MIG capabilities' minors, where the driver publishes them.
fn mig_cap_minors(root: &HostRoot) -> Result<Vec<u32>> {
    let mut minors = Vec::new();
    for cap in ["config", "monitor"] {
        let path = root.kernel_path(&format!("/proc/driver/nvidia/capabilities/mig/{cap}"));
        if let Some(minor) = node::read_optional(&path)?
            .as_deref()
            .and_then(parse_cap_minor)
        {
            minors.push(minor);
        }
    }
    Ok(minors)
}

fn nvswitch_count(root: &HostRoot) -> Result<usize> {
    Ok(node::read_pci_devices(&node::pci_devices_dir(root))?
        .iter()
        .filter(|d| d.role() == PciRole::NvSwitch)
        .count())
}

fn gpu_count(root: &HostRoot) -> Result<usize> {
    Ok(node::read_pci_devices(&node::pci_devices_dir(root))?
        .iter()
        .filter(|d| d.role() == PciRole::Gpu)
        .count())
}

/// Switches each NVIDIA GPU's IOMMU group to passthrough (`identity`)
/// before `nvidia` binds, where it is not already; returns what it did.
/// A group that refuses is noted, not fatal: the load then says whether it
/// mattered.
pub(super) fn iommu_passthrough(root: &HostRoot) -> Result<Vec<String>> {
    let fs = root.fs()?;
    let mut notes = Vec::new();
    for dev in node::read_pci_devices(&node::pci_devices_dir(root))? {
        if dev.role() != PciRole::Gpu {
            continue;
        }
        let rel = format!("/sys/bus/pci/devices/{}/iommu_group/type", dev.address);
        let path = root.kernel_path(&rel);
        let Some(current) = node::read_optional(&path)? else {
            continue; // no IOMMU, or no group: nothing to switch
        };
        let current = current.trim().to_string();
        if current == "identity" {
            continue;
        }
        notes.push(match write_kernel_param(root, &fs, &rel, "identity") {
            Ok(()) => format!("IOMMU group of {}: {current} -> identity", dev.address),
            Err(e) => format!("IOMMU group of {} stays {current}: {}", dev.address, e),
        });
    }
    Ok(notes)
}

/// Writes a kernel parameter file: through the host root when it carries
/// that kernel interface (confined like every other write there), else
/// our own, which describes the same kernel (see
/// [`HostRoot::kernel_path`]).
pub(super) fn write_kernel_param(
    root: &HostRoot,
    fs: &HostFs,
    rel: &str,
    value: &str,
) -> Result<()> {
    let path = root.kernel_path(rel);
    if path == root.join(rel) {
        fs.write_existing(rel, value.as_bytes())
    } else {
        fs::write(&path, value)
            .map_err(|e| Error::io(super::options::LOCAL_IO, "writing", &path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_devices_and_nodes() {
        // Layout of /proc/devices as fs/proc/devices.c prints it; the
        // NVIDIA names are what the modules register (written here, not
        // captured from a GPU machine).
        let text = "Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia-frontend\n511 nvidia-uvm\n\nBlock devices:\n  8 sd\n";
        let majors = parse_char_majors(text).unwrap();
        assert_eq!(majors["nvidia-uvm"], 511);
        let (nodes, notes) = device_nodes(&majors, 2, true);
        assert!(notes.is_empty());
        assert_eq!(
            nodes,
            vec![
                ("/dev/nvidiactl".to_string(), 195, 255),
                ("/dev/nvidia0".to_string(), 195, 0),
                ("/dev/nvidia1".to_string(), 195, 1),
                ("/dev/nvidia-modeset".to_string(), 195, 254),
                ("/dev/nvidia-uvm".to_string(), 511, 0),
                ("/dev/nvidia-uvm-tools".to_string(), 511, 1),
            ]
        );
        let (nodes, notes) = device_nodes(&BTreeMap::new(), 1, false);
        assert_eq!(nodes.len(), 2);
        assert_eq!(notes.len(), 2);
    }

    #[test]
    fn nvswitch_nvlink_and_mig_capability_nodes() {
        // An HGX board: majors as the modules register them (names from
        // NVIDIA's open modules: nvswitch, nvlink core, caps).
        let text = "Character devices:\n195 nvidia-frontend\n234 nvidia-caps\n235 nvidia-nvswitch\n236 nvidia-nvlink\n511 nvidia-uvm\n";
        let majors = parse_char_majors(text).unwrap();
        let caps = [
            parse_cap_minor("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
                .unwrap(),
            parse_cap_minor("DeviceFileMinor: 2\nDeviceFileMode: 292\n").unwrap(),
        ];
        let nodes = extra_device_nodes(&majors, 2, &caps);
        assert_eq!(
            nodes,
            vec![
                ("/dev/nvidia-nvswitchctl".to_string(), 235, 255),
                ("/dev/nvidia-nvswitch0".to_string(), 235, 0),
                ("/dev/nvidia-nvswitch1".to_string(), 235, 1),
                ("/dev/nvidia-nvlink".to_string(), 236, 0),
                ("/dev/nvidia-caps/nvidia-cap1".to_string(), 234, 1),
                ("/dev/nvidia-caps/nvidia-cap2".to_string(), 234, 2),
            ]
        );
        // A PCIe card: no NVSwitch, no caps published, no nvlink major.
        let plain = parse_char_majors("Character devices:\n195 nvidia\n").unwrap();
        assert!(extra_device_nodes(&plain, 0, &[]).is_empty());
        assert_eq!(parse_cap_minor("garbage"), None);
    }
}

#[cfg(test)]
mod iommu_tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A host root with NVIDIA GPUs at 04.0 (group 7, DMA), 05.0 (group 8,
    /// already identity) and 06.0 (no IOMMU group), laid out as sysfs is:
    /// `iommu_group` a relative link into /sys/kernel/iommu_groups.
    fn host() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        fs::create_dir_all(r.join("sys/bus/pci/devices")).unwrap();
        for (slot, group, kind) in [
            ("04", Some(7), "DMA"),
            ("05", Some(8), "identity"),
            ("06", None, ""),
        ] {
            let addr = format!("0000:00:{slot}.0");
            let dev = r.join("sys/devices/pci0000:00").join(&addr);
            fs::create_dir_all(&dev).unwrap();
            fs::write(dev.join("vendor"), "0x10de\n").unwrap();
            fs::write(dev.join("device"), "0x2901\n").unwrap();
            fs::write(dev.join("class"), "0x030200\n").unwrap();
            symlink(
                format!("../../../devices/pci0000:00/{addr}"),
                r.join("sys/bus/pci/devices").join(&addr),
            )
            .unwrap();
            if let Some(g) = group {
                let gdir = r.join(format!("sys/kernel/iommu_groups/{g}"));
                fs::create_dir_all(&gdir).unwrap();
                fs::write(gdir.join("type"), format!("{kind}\n")).unwrap();
                symlink(
                    format!("../../../kernel/iommu_groups/{g}"),
                    dev.join("iommu_group"),
                )
                .unwrap();
            }
        }
        dir
    }

    #[test]
    fn gpu_iommu_groups_go_to_passthrough_before_the_load() {
        let dir = host();
        let root = HostRoot::new(dir.path(), crate::host_root::HostRootSource::Flag);
        let notes = iommu_passthrough(&root).unwrap();
        assert_eq!(
            notes,
            vec!["IOMMU group of 0000:00:04.0: DMA -> identity".to_string()]
        );
        let t = |g: u32| {
            fs::read_to_string(dir.path().join(format!("sys/kernel/iommu_groups/{g}/type")))
                .unwrap()
        };
        assert_eq!(t(7), "identity");
        assert_eq!(t(8).trim(), "identity");
        // Done once: nothing more to switch.
        assert!(iommu_passthrough(&root).unwrap().is_empty());
    }
}
