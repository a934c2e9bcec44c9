//! Writable host roots for install tests that must never reach the kernel
//! of the machine running them. Included with `#[path]` by the tests that
//! use it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn t4_fixture() -> PathBuf {
    crate::support::repo_root().join("tests/fixtures/hosts/debian-12-t4-headers")
}

/// A copy (at `dir/host`) of the T4 fixture host root (one GPU on its PCI
/// bus) that install can complete in: `/dev`, this machine's own static
/// ldconfig, an `ld.so.conf` that includes `ld.so.conf.d`, and this
/// machine's dynamic loader and glibc (for verify's CUDA check).
pub fn installable_host(dir: &Path) -> PathBuf {
    let host = dir.join("host");
    let st = Command::new("cp")
        .arg("-a")
        .arg(t4_fixture())
        .arg(&host)
        .status()
        .unwrap();
    assert!(st.success());
    for d in ["dev", "sbin", "etc/ld.so.conf.d"] {
        fs::create_dir_all(host.join(d)).unwrap();
    }
    fs::copy("/sbin/ldconfig", host.join("sbin/ldconfig")).unwrap();
    fs::write(
        host.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    add_glibc(&host);
    host
}

/// Copies this machine's dynamic loader and the glibc libraries libcuda
/// needs (libc, libm, libdl, libpthread, librt) into `host` in Debian's
/// layout: `usr/lib/<triplet>/`, `lib -> usr/lib` (unless the root has a
/// `lib` already), and `lib64/ld-linux-x86-64.so.2` as an absolute link
/// (resolved inside the root, as on a real host). verify's CUDA check runs its helper with
/// these, never with the files of the machine's own `/lib`.
pub fn add_glibc(host: &Path) {
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    let lib = host.join("usr/lib").join(&triplet);
    fs::create_dir_all(&lib).unwrap();
    let loader = if std::env::consts::ARCH == "aarch64" {
        "ld-linux-aarch64.so.1"
    } else {
        "ld-linux-x86-64.so.2"
    };
    let names = [
        loader,
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
    ];
    for name in names {
        let src = Path::new("/lib").join(&triplet).join(name);
        fs::copy(&src, lib.join(name)).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    }
    if !host.join("lib").exists() {
        std::os::unix::fs::symlink("usr/lib", host.join("lib")).unwrap();
    }
    if std::env::consts::ARCH != "aarch64" {
        fs::create_dir_all(host.join("lib64")).unwrap();
        let _ = fs::remove_file(host.join("lib64").join(loader));
        std::os::unix::fs::symlink(
            format!("/usr/lib/{triplet}/{loader}"),
            host.join("lib64").join(loader),
        )
        .unwrap();
    }
}

/// Compiles the CUDA double `tests/gpu-double/libcuda.c` into
/// `dir/libcuda.so.1` (its SONAME) with the given `-D` definitions (see its
/// header); without `STUB_DEVICES` among them it is built with one device,
/// the fault tests' fixed count, not reading a profile.
#[allow(dead_code)]
pub fn stub_libcuda(dir: &Path, defines: &[&str]) -> PathBuf {
    let mut defines = defines.to_vec();
    if !defines.iter().any(|d| d.starts_with("STUB_DEVICES=")) {
        defines.push("STUB_DEVICES=1");
    }
    stub_library(dir, "libcuda.c", "libcuda.so.1", &defines)
}

/// Two H100s for the GPU double: GPU0 (held by the kubelet double's
/// `ml/train-0` in the exporter tests) with readings and a compute process,
/// GPU1 idle. The exporter and device plugin tests read it.
#[allow(dead_code)]
pub const TWO_H100_PROFILE: &str = "driver_version = 535.261.03
nvml_version = 12.535.261.03
cuda_version = 12020
gpus = 2
gpu0.name = NVIDIA H100 80GB HBM3
gpu0.uuid = GPU-6f3c2a1e-0b7d-4c5e-9a21-3d4e5f607182
gpu0.pci_bus_id = 00000000:3B:00.0
gpu0.pci_device_id = 0x233010DE
gpu0.minor = 0
gpu0.memory_total = 85520809984
gpu0.memory_used = 1073741824
gpu0.utilization_gpu = 37
gpu0.utilization_memory = 12
gpu0.mig = 0
gpu0.compute_capability = 9.0
gpu0.process = 4242:1073741824
gpu1.name = NVIDIA H100 80GB HBM3
gpu1.uuid = GPU-5b6a9c1e-8f3a-2b7d-41c0-9e2f7a6d3b11
gpu1.pci_bus_id = 00000000:86:00.0
gpu1.pci_device_id = 0x233010DE
gpu1.minor = 1
gpu1.memory_total = 85520809984
gpu1.mig = 0
gpu1.compute_capability = 9.0
";

/// The GPU double (`tests/gpu-double/`): its NVML and CUDA libraries and
/// its nvidia-smi compiled into `dir` (`libnvidia-ml.so.1`, `libcuda.so.1`,
/// `nvidia-smi`) with `profile` beside them as `gpu-double.profile`, where
/// the libraries read it.
#[allow(dead_code)]
pub fn gpu_double(dir: &Path, profile: &str) -> PathBuf {
    stub_library(dir, "libnvidia-ml.c", "libnvidia-ml.so.1", &[]);
    stub_library(dir, "libcuda.c", "libcuda.so.1", &[]);
    let src = crate::support::repo_root().join("tests/gpu-double/nvidia-smi.c");
    let st = Command::new("gcc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(dir.join("nvidia-smi"))
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "compiling {}", src.display());
    fs::write(dir.join("gpu-double.profile"), profile).unwrap();
    dir.to_path_buf()
}

/// Compiles the hardware double `tests/gpu-double/<source>` into
/// `dir/<soname>` (with that SONAME) and the given `-D` definitions.
pub fn stub_library(dir: &Path, source: &str, soname: &str, defines: &[&str]) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let out = dir.join(soname);
    let src = crate::support::repo_root()
        .join("tests/gpu-double")
        .join(source);
    let st = Command::new("gcc")
        .args(["-shared", "-fPIC", "-Wall", "-Werror"])
        .arg(format!("-Wl,-soname,{soname}"))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "compiling {}", src.display());
    out
}

/// A module install must find loaded already: its name and the identity
/// the kernel shows in `/sys/module/<name>/`.
pub struct Loaded<'a> {
    pub name: &'a str,
    pub version: Option<&'a str>,
    pub srcversion: Option<&'a str>,
}

/// Lists `modules` as loaded in the host root's `/proc/modules` (after
/// the fixture's own) with their `version`/`srcversion`, so that install
/// finds them loaded (`AlreadyInstalled`) and never calls finit_module.
pub fn mark_loaded(host: &Path, modules: &[Loaded]) {
    let mut text = fs::read_to_string(t4_fixture().join("proc/modules")).unwrap();
    for m in modules {
        // Without an identity install would try a real load: never here.
        assert!(
            m.version.is_some() || m.srcversion.is_some(),
            "{} has no version or srcversion",
            m.name
        );
        let dir = host.join("sys/module").join(m.name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        if let Some(v) = m.version {
            fs::write(dir.join("version"), format!("{v}\n")).unwrap();
        }
        if let Some(v) = m.srcversion {
            fs::write(dir.join("srcversion"), format!("{v}\n")).unwrap();
        }
        text.push_str(&format!("{} 16384 0 - Live 0x0000000000000000\n", m.name));
    }
    fs::write(host.join("proc/modules"), text).unwrap();
}

/// The host root's `ld.so.cache` as `ldconfig -p` lists it.
pub fn ld_cache(host: &Path) -> String {
    let out = Command::new("/sbin/ldconfig")
        .arg("-C")
        .arg(host.join("etc/ld.so.cache"))
        .arg("-p")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
