//! The GPU double's package and the S3 store. The package a build Job on
//! the node compiles (the store starts empty: the first join is the cold
//! one): the kmod stand-in's tree and the double's user space as a
//! tarball (the installer takes a .run or a tar of its tree alike), in the
//! store's package mirror under the name NVIDIA's URL has. A catalog in a
//! ConfigMap gives its sha256 for the plan's version, so the build Job
//! verifies it as it would NVIDIA's .run, and never reaches out.

use std::fs;
use std::io::Read as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

use super::vm::GPU_PCI;
use super::{Live, log};
use crate::cache::{self, Cache};
use crate::cmd::{cmd, read_last_line, run, show};
use crate::static_build::{self, Arch};

/// The store's one key pair (the build Job writes, install Jobs read).
pub(super) const ACCESS_KEY: &str = "real-node";
pub(super) const SECRET_KEY: &str = "real-node-secret";

pub(super) struct Package {
    /// The S3 store's port on the host's loopback (pods: 10.0.2.2).
    pub(super) s3_port: u16,
}

/// Builds the package, starts the store (into `live`) and writes the
/// catalog, in a fresh `out`.
pub(super) fn prepare(
    repo: &Path,
    cache: &Cache,
    out: &Path,
    release: &str,
    live: &mut Live,
) -> Result<Package> {
    let bins = static_build::build(
        repo,
        &["gpu-driver-installer", "gpu-driver-operator"],
        Arch::X86_64,
    )?;
    let installer = fs::canonicalize(&bins[0])?;
    let broot = PathBuf::from(read_last_line(
        cmd(repo.join("scripts/builder-root")).arg("bookworm"),
    )?);
    if !broot
        .join(format!("usr/src/linux-headers-{release}"))
        .is_dir()
    {
        log(&format!(
            "error: the bookworm builder root has no headers for the node's kernel {release}"
        ));
        log(
            "       (the archive moved between the two): scripts/builder-root --rebuild bookworm; scripts/node-root --rebuild",
        );
        bail!("no linux-headers-{release} in {}", broot.display());
    }
    cache::remove(out)?;
    let hello = out.join("hello");
    for d in ["cfg/images", "hello/kernel-open", "store/gpu-cache"] {
        fs::create_dir_all(out.join(d))?;
    }
    let driver = resolve_driver(&installer, out, release)?;
    stand_in_tree(repo, &hello)?;
    fs::write(hello.join("gpu-double.profile"), profile(&driver))?;
    fs::write(hello.join(".manifest"), manifest(&driver))?;
    let s3_port = start_store(cache, out, live)?;
    compile_double(repo, &broot, &hello, &driver)?;

    let tarball = out.join("package.tar.gz");
    let mut parts: Vec<String> = fs::read_dir(&hello)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    parts.sort();
    run(cmd("tar")
        .arg("-C")
        .arg(&hello)
        .arg("-czf")
        .arg(&tarball)
        .args(&parts))?;
    let sha = sha256_file(&tarball)?;
    let mirror = out.join("store/gpu-cache/real-node/packages");
    fs::create_dir_all(&mirror)?;
    fs::copy(
        &tarball,
        mirror.join(format!("NVIDIA-Linux-x86_64-{driver}.run")),
    )?;
    let catalog = with_digest(
        &fs::read_to_string(repo.join("catalog/catalog.toml"))?,
        &driver,
        &sha,
    );
    if !catalog.contains(&format!("x86_64 = \"{sha}\"")) {
        bail!("catalog/catalog.toml has no x86_64 digest line for {driver} to replace");
    }
    let catalog_path = out.join("catalog.toml");
    fs::write(&catalog_path, catalog)?;
    let st = cmd(&installer)
        .arg("--catalog")
        .arg(&catalog_path)
        .arg("catalog-check")
        .stdout(Stdio::null())
        .status()?;
    if !st.success() {
        bail!("the real node's catalog fails catalog-check");
    }
    Ok(Package { s3_port })
}

/// The driver version resolve picks for the node (Garden Linux 1877.3, its
/// kernel, open modules): the artifact must be the plan's. prebuild stops
/// at the download it cannot make; its plan is logged first.
fn resolve_driver(installer: &Path, out: &Path, release: &str) -> Result<String> {
    let mut c = cmd(installer);
    c.arg("--host-root")
        .arg(out)
        .args(["--log-level", "info", "prebuild", "--os-id", "gardenlinux"])
        .args(["--os-version", "1877.3", "--kernel-release", release])
        .args([
            "--arch",
            "amd64",
            "--flavor",
            "open",
            "--offline",
            "--cache-url",
        ])
        .arg(format!("file://{}/no-store", out.display()));
    let o = c
        .stdout(Stdio::null())
        .output()
        .with_context(|| format!("starting {}", show(&c)))?;
    plan_driver(&String::from_utf8_lossy(&o.stderr))
        .context("no driver version resolved for the node")
}

/// `.status.driverVersion` of the first `InstallPlan: {…}` in a log.
fn plan_driver(log: &str) -> Option<String> {
    log.lines().find_map(|l| {
        let (_, doc) = l.split_once("InstallPlan: ")?;
        let v = serde_json::Deserializer::from_str(doc)
            .into_iter::<serde_json::Value>()
            .next()?
            .ok()?;
        v.pointer("/status/driverVersion")?
            .as_str()
            .map(String::from)
    })
}

/// The kmod stand-in under the driver's name: a cache entry must hold
/// modules/nvidia.ko, and the installer loads and verifies `nvidia`.
fn stand_in_tree(repo: &Path, hello: &Path) -> Result<()> {
    let src = repo.join("tests/fixtures/kmod-hello");
    let dst = hello.join("kernel-open");
    fs::copy(src.join("hello.c"), dst.join("nvidia.c"))?;
    fs::copy(src.join("Makefile"), dst.join("Makefile"))?;
    let kbuild: String = fs::read_to_string(src.join("Kbuild"))?
        .lines()
        .map(|l| {
            if l == "obj-m := hello.o" {
                "obj-m := nvidia.o\n".to_string()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    if !kbuild.lines().any(|l| l == "obj-m := nvidia.o") {
        bail!("tests/fixtures/kmod-hello/Kbuild changed");
    }
    fs::write(dst.join("Kbuild"), kbuild)?;
    Ok(())
}

/// The double's profile (tests/gpu-double, docs/gpu-double.md): one H100
/// at the PCI address node-init shows.
fn profile(driver: &str) -> String {
    format!(
        "driver_version = {driver}\nnvml_version = 12.{driver}\ncuda_version = 12080\ngpus = 1\n\
         kernel_module = nvidia\ngpu0.name = NVIDIA H100 80GB HBM3\n\
         gpu0.uuid = GPU-6f3c2a1e-0b7d-4c5e-9a21-3d4e5f607182\ngpu0.pci_bus_id = 0000{GPU_PCI}\n\
         gpu0.pci_device_id = 0x233010DE\ngpu0.minor = 0\ngpu0.memory_total = 85520809984\n\
         gpu0.memory_used = 1073741824\ngpu0.utilization_gpu = 37\ngpu0.utilization_memory = 12\n\
         gpu0.compute_capability = 9.0\n"
    )
}

/// The package's `.manifest`, in NVIDIA's format.
fn manifest(driver: &str) -> String {
    format!(
        "1.0\nhello module with the GPU double's user space (scripts/real-node)\n\
         nvidia-smi 0755 UTILITY_BINARY\nlibnvidia-ml.so.{driver} 0755 UTILITY_LIB NATIVE\n\
         libcuda.so.{driver} 0755 CUDA_LIB NATIVE\ngpu-double.profile 0644 UTILITY_LIB NATIVE\n"
    )
}

/// The S3 store on the host's loopback, serving `<out>/store`; returns its
/// port once it accepts connections (or after 10 s).
fn start_store(cache: &Cache, out: &Path, live: &mut Live) -> Result<u16> {
    let s3 = crate::tools::s3_server(cache)?;
    let port = free_port()?;
    let logf = fs::File::create(out.join("s3.log"))?;
    let child = cmd(&s3)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg(out.join("store"))
        .stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .spawn()
        .with_context(|| format!("starting {}", s3.display()))?;
    live.s3 = Some(child);
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(port)
}

/// A loopback port nobody listens on now (others may run servers here too).
fn free_port() -> Result<u16> {
    let mut seed = u64::from(std::process::id()) ^ super::now().to_bits();
    for _ in 0..200 {
        // xorshift: no randomness crate for one port.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let port = 20000 + (seed % 32000) as u16;
        if TcpStream::connect(("127.0.0.1", port)).is_err() {
            return Ok(port);
        }
    }
    bail!("no free loopback port found")
}

/// The double's user space, compiled in the builder root (chroot, /proc in
/// a private mount namespace, like tests/it/build.rs): the node's Debian
/// bookworm glibc.
fn compile_double(repo: &Path, broot: &Path, hello: &Path, driver: &str) -> Result<()> {
    let job = format!("build-dev/real-node-{}", std::process::id());
    let dir = broot.join(&job);
    cache::remove(&dir)?;
    fs::create_dir_all(dir.join("hello"))?;
    for f in ["libnvidia-ml.c", "libcuda.c", "nvidia-smi.c", "profile.h"] {
        fs::copy(repo.join("tests/gpu-double").join(f), dir.join(f))?;
    }
    let lock = format!("{}.lock", broot.display());
    let proc_opt = format!("--mount-proc={}", broot.join("proc").display());
    let gcc = |args: &[String]| {
        run(cmd("flock")
            .args(["-s", &lock, "unshare", &proc_opt, "--", "chroot"])
            .arg(broot)
            .arg("gcc")
            .args(args))
    };
    let (src, outd) = (format!("/{job}"), format!("/{job}/hello"));
    for (lib, c) in [("libnvidia-ml", "libnvidia-ml.c"), ("libcuda", "libcuda.c")] {
        gcc(&[
            "-shared".into(),
            "-fPIC".into(),
            "-Wall".into(),
            "-Werror".into(),
            format!("-Wl,-soname,{lib}.so.1"),
            "-o".into(),
            format!("{outd}/{lib}.so.{driver}"),
            format!("{src}/{c}"),
        ])?;
    }
    gcc(&[
        "-Wall".into(),
        "-Werror".into(),
        "-o".into(),
        format!("{outd}/nvidia-smi"),
        format!("{src}/nvidia-smi.c"),
    ])?;
    for e in fs::read_dir(dir.join("hello"))? {
        let e = e?;
        fs::copy(e.path(), hello.join(e.file_name()))?;
    }
    cache::remove(&dir)
}

fn sha256_file(p: &Path) -> Result<String> {
    let mut f = fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// The catalog with `driver`'s x86_64 digest replaced by the package's,
/// and its digestSource saying so: from the `version = "<driver>"` line to
/// the next `digestSource = ` line.
fn with_digest(catalog: &str, driver: &str, sha: &str) -> String {
    let mut out = String::with_capacity(catalog.len());
    let mut inside = false;
    for l in catalog.lines() {
        if !inside && l == format!("version = \"{driver}\"") {
            inside = true;
        }
        let mut line = l.to_string();
        if inside {
            if let Some(i) = line.find("x86_64 = \"") {
                let start = i + "x86_64 = \"".len();
                let hexlen = line[start..]
                    .bytes()
                    .take_while(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                    .count();
                if line[start + hexlen..].starts_with('"') {
                    line.replace_range(start..start + hexlen, sha);
                }
            }
            if line.starts_with("digestSource = ") {
                line = "digestSource = \"scripts/real-node: the stand-in package (kmod-hello and the GPU double), not NVIDIA's\"".into();
                inside = false;
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_plans_driver() {
        let log = "2026-12-07T20:30:01.123Z  INFO gpu_driver_installer::run: detected host\n\
                   2026-12-07T20:30:01.456Z  INFO gpu_driver_installer::run::prebuild: InstallPlan: \
                   {\"apiVersion\":\"gpu-driver.gardenlinux.io/v1alpha1\",\"kind\":\"InstallPlan\",\
                   \"status\":{\"driverVersion\":\"580.178.04\",\"flavor\":\"open\"}}\n\
                   2026-12-07T20:30:01.789Z ERROR offline: cannot download\n";
        assert_eq!(super::plan_driver(log).as_deref(), Some("580.178.04"));
        assert_eq!(super::plan_driver("nothing planned\n"), None);
    }

    #[test]
    fn replaces_one_drivers_digest() {
        let cat = "[[drivers]]\nbranch = \"570\"\nversion = \"570.1\"\nsha256 = { x86_64 = \"aa11\", aarch64 = \"bb\" }\n\
                   digestSource = \"x\"\n\n[[drivers]]\nbranch = \"580\"\nversion = \"580.178.04\"\n\
                   channel = \"datacenter\"\nsha256 = { x86_64 = \"5975a8\", aarch64 = \"ef59ec\" }\n\
                   digestSource = \"Kiskae/nixpkgs\"\n\n[[drivers]]\nversion = \"590.1\"\n\
                   sha256 = { x86_64 = \"cc22\" }\ndigestSource = \"y\"\n";
        let got = super::with_digest(cat, "580.178.04", "feed");
        assert!(
            got.contains(
                "sha256 = { x86_64 = \"aa11\", aarch64 = \"bb\" }\ndigestSource = \"x\"\n"
            )
        );
        assert!(got.contains("sha256 = { x86_64 = \"feed\", aarch64 = \"ef59ec\" }\ndigestSource = \"scripts/real-node: the stand-in"));
        assert!(got.contains("sha256 = { x86_64 = \"cc22\" }\ndigestSource = \"y\"\n"));
    }

    #[test]
    fn writes_the_profile_and_manifest() {
        let p = super::profile("580.178.04");
        assert!(p.contains("nvml_version = 12.580.178.04\n"));
        assert!(p.contains("gpu0.pci_bus_id = 00000000:3b:00.0\n"));
        assert!(
            super::manifest("580.178.04").contains("libcuda.so.580.178.04 0755 CUDA_LIB NATIVE\n")
        );
    }
}
