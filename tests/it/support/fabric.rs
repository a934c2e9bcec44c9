//! A Fabric Manager archive in the layout of NVIDIA's redistributable
//! (`fabricmanager-linux-<platform>-<version>-archive/` holding `bin/`,
//! `etc/fabricmanager.cfg`, `share/nvidia/nvswitch/`, `systemd/`, `lib/`,
//! `include/`), made here as a real `.tar.xz`: small scripts stand in for
//! NVIDIA's binaries.

use std::path::{Path, PathBuf};

/// The `fabricmanager.cfg` keys this project edits or reads, as NVIDIA
/// ships them (defaults from the Fabric Manager user guide).
pub const SHIPPED_CFG: &str = "# NVIDIA Fabric Manager configuration file.\nLOG_LEVEL=4\nLOG_FILE_NAME=/var/log/fabricmanager.log\nLOG_APPEND_TO_LOG=1\nDAEMONIZE=1\nBIND_INTERFACE_IP=127.0.0.1\nSTARTING_TCP_PORT=16000\nFABRIC_MODE=0\nTOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch\nDATABASE_PATH=/usr/share/nvidia/nvswitch\n";

/// Writes `fabricmanager-linux-x86_64-<version>-archive.tar.xz` into
/// `dir` and returns its path.
pub fn archive(dir: &Path, version: &str) -> PathBuf {
    let top = format!("fabricmanager-linux-x86_64-{version}-archive");
    let path = dir.join(format!("{top}.tar.xz"));
    let file = std::fs::File::create(&path).unwrap();
    let xz = liblzma::write::XzEncoder::new(file, 6);
    let mut tar = tar::Builder::new(xz);
    let fm = format!("#!/bin/sh\necho 'Fabric Manager version is : {version}'\n");
    let entries: Vec<(String, Vec<u8>, u32)> = vec![
        ("bin/nv-fabricmanager".into(), fm.into_bytes(), 0o755),
        (
            "bin/nvswitch-audit".into(),
            b"#!/bin/sh\necho audit\n".to_vec(),
            0o755,
        ),
        ("etc/fabricmanager.cfg".into(), SHIPPED_CFG.into(), 0o644),
        (
            "share/nvidia/nvswitch/dgxh100_hgxh100_topology".into(),
            vec![7u8; 512],
            0o644,
        ),
        (
            "share/nvidia/nvswitch/dgxa100_hgxa100_topology".into(),
            vec![8u8; 512],
            0o644,
        ),
        (
            "systemd/nvidia-fabricmanager.service".into(),
            b"[Service]\nExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg\n".to_vec(),
            0o644,
        ),
        ("lib/libnvfm.so.1".into(), vec![0u8; 64], 0o755),
        ("include/nv_fm_agent.h".into(), b"/* SDK */\n".to_vec(), 0o644),
        ("LICENSE".into(), b"NVIDIA license\n".to_vec(), 0o644),
    ];
    for (name, body, mode) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(mode);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        tar.append_data(&mut h, format!("{top}/{name}"), body.as_slice())
            .unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap();
    path
}
