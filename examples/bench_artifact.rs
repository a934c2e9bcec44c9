//! Part of `scripts/bench-artifact`, not of the installer: stores a
//! synthetic artifact in a cache (the build Job's path: lookup, lease,
//! pack, publish) and reads it back as a node does on a hit (the install
//! Job's path: `Session::lookup` with `--cache-read-only`), printing one
//! JSON line per step.
//!
//!   bench_artifact make URL SIZE_MIB DIR   store an artifact of about SIZE_MIB MiB (compressed)
//!   bench_artifact read URL DIR            look it up; DIR/artifact.tar.zst on a hit
//!
//! The store's endpoint and credentials come from AWS_* variables, as in
//! the installer.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use gpu_driver_installer::artifact::{self, Manifest, ManifestFile, ManifestModule, PackFile};
use gpu_driver_installer::cache::{CacheConfig, CacheKey, Session};
use gpu_driver_installer::node::{CpuArch, ModuleFlavor};

const KERNEL: &str = "6.1.0-50-cloud-amd64";
const DRIVER: &str = "580.95.05";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["make", url, size, dir] => make(url, size.parse()?, Path::new(dir)),
        ["read", url, dir] => read(url, Path::new(dir)),
        _ => Err("usage: bench_artifact make URL SIZE_MIB DIR | read URL DIR".into()),
    }
}

fn key() -> CacheKey {
    CacheKey::new(
        CpuArch::X86_64,
        KERNEL,
        DRIVER,
        ModuleFlavor::Open,
        "gcc (bench) 12.2.0",
    )
}

fn config(url: &str, read_only: bool) -> CacheConfig {
    let mut cfg = CacheConfig::new(url, true);
    cfg.read_only = read_only;
    cfg
}

/// Files that compress about 1.3:1 at zstd's level 3: half of each MiB
/// random, half drawn from 16 byte values.
fn write_payload(path: &Path, mib: u64, seed: u64) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x = seed | 1;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..mib {
        for (i, b) in block.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = if i < (1 << 19) {
                x as u8
            } else {
                (x as u8) & 0x0f
            };
        }
        out.write_all(&block)?;
    }
    out.flush()
}

fn make(url: &str, size_mib: u64, dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir.join("src/modules"))?;
    std::fs::create_dir_all(dir.join("src/firmware"))?;
    // About 1.3:1 at zstd's level 3, so the artifact comes out near SIZE_MIB.
    let files = [
        ("modules/nvidia.ko", size_mib * 26 / 100),
        ("firmware/gsp.bin", size_mib * 13 / 10 - size_mib * 26 / 100),
    ];
    let mut manifest = Manifest {
        schema_version: artifact::MANIFEST_VERSION,
        generator: "bench_artifact".into(),
        driver_version: DRIVER.into(),
        flavor: ModuleFlavor::Open,
        kernel_release: KERNEL.into(),
        compiler: "gcc (bench) 12.2.0".into(),
        kernel_compiler: None,
        arch: Some(CpuArch::X86_64),
        built_at: "2026-12-06T00:00:00Z".into(),
        modules: Vec::new(),
        firmware: Vec::new(),
        firmware_note: None,
        user_space: Vec::new(),
        links: Vec::new(),
        signer: None,
    };
    let mut pack = Vec::new();
    for (i, (name, mib)) in files.iter().enumerate() {
        let path = dir.join("src").join(name);
        write_payload(&path, *mib, 0x9e37_79b9 + i as u64)?;
        let (sha256, size) = gpu_driver_installer::digest::sha256_file(
            &path,
            gpu_driver_installer::Failure::Internal,
        )?;
        if name.starts_with("modules/") {
            manifest.modules.push(ManifestModule {
                name: "nvidia".into(),
                file: (*name).into(),
                vermagic: format!("{KERNEL} SMP preempt mod_unload modversions "),
                depends: Vec::new(),
                version: Some(DRIVER.into()),
                size_bytes: size,
                sha256,
            });
        } else {
            manifest.firmware.push(ManifestFile {
                file: (*name).into(),
                size_bytes: size,
                sha256,
            });
        }
        pack.push(PackFile {
            name: (*name).into(),
            path,
            mode: 0o644,
        });
    }
    let out = dir.join("artifact.tar.zst");
    let sha = artifact::pack(&out, &manifest, &pack)?;
    let mut session = Session::start(&config(url, false));
    if session
        .lookup(key(), &dir.join("looked-up.tar.zst"))
        .is_some()
    {
        return Err("the store already holds the key; use a fresh prefix".into());
    }
    session.publish(&out, &sha, &manifest);
    let status = session.finish();
    let bytes = std::fs::metadata(&out)?.len();
    println!(
        "{}",
        serde_json::json!({"step": "make", "artifactBytes": bytes, "sha256": sha,
            "entry": status.key, "outcome": status.outcome, "warnings": status.warnings})
    );
    Ok(())
}

fn read(url: &str, dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let dest = dir.join("artifact.tar.zst");
    let t = Instant::now();
    let mut session = Session::start(&config(url, true));
    let hit = session.lookup(key(), &dest).is_some();
    let seconds = t.elapsed().as_secs_f64();
    let status = session.finish();
    if !hit {
        return Err(format!("no hit: {:?} {:?}", status.outcome, status.warnings).into());
    }
    println!(
        "{}",
        serde_json::json!({"step": "read", "seconds": seconds,
            "bytesDownloaded": status.bytes_downloaded, "peakRssKiB": peak_rss_kib()})
    );
    Ok(())
}

/// VmHWM of this process, in KiB.
fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
