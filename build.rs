//! Compiles the CUDA check helper (`src/cuda-check.c`) with the system C
//! compiler into `$OUT_DIR/gpu-driver-cuda-check`; `src/cuda.rs` embeds it
//! with `include_bytes!`. It is a dynamically linked program on purpose:
//! the static installer runs it with the host's dynamic loader so that
//! libcuda meets the host's glibc (docs/install.md, "The CUDA check").
//!
//! The compiler: `CC_<target>` / `CC` when set, else `cc` for a native
//! build and `<arch>-linux-gnu-gcc` for a cross build. The helper must run
//! on every supported host: it may not need a glibc symbol version newer
//! than [`MAX_GLIBC`], which this script checks in the binary it built.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/cuda-check.c";

/// The oldest glibc among the supported hosts' (Debian 12: 2.36; Garden
/// Linux 1443 and later are newer) is above this; dlopen and
/// `__libc_start_main` of any glibc ≥ 2.34 carry `GLIBC_2.34`.
const MAX_GLIBC: (u32, u32) = (2, 34);

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed=build.rs");
    let target = env::var("TARGET").unwrap_or_default();
    let host = env::var("HOST").unwrap_or_default();
    let target_var = format!("CC_{}", target.replace('-', "_"));
    for var in [target_var.as_str(), "CC"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("gpu-driver-cuda-check");
    let arch = target.split('-').next().unwrap_or("x86_64");
    let cc = env::var(&target_var)
        .ok()
        .or_else(|| (target == host).then(|| env::var("CC").ok()).flatten())
        .unwrap_or_else(|| {
            if target == host {
                "cc".into()
            } else {
                format!("{arch}-linux-gnu-gcc")
            }
        });
    let status = Command::new(&cc)
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-s", "-o"])
        .arg(&out)
        .arg(SOURCE)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{cc} failed to compile {SOURCE} ({s})"),
        Err(e) => panic!(
            "cannot run the C compiler {cc:?} to build the CUDA check helper {SOURCE}: {e}; \
             install one (apt-get install gcc) or set CC"
        ),
    }
    let bytes = std::fs::read(&out).expect("reading the helper just built");
    if let Some(v) = newest_glibc(&bytes).filter(|v| *v > MAX_GLIBC) {
        panic!(
            "{SOURCE} built with {cc} needs GLIBC_{}.{}, newer than the {}.{} every supported \
             host has: use only dlopen/dlsym/dlerror/dlinfo, stdio and string functions, or \
             build on an older distribution (Debian 12)",
            v.0, v.1, MAX_GLIBC.0, MAX_GLIBC.1
        );
    }
}

/// The newest `GLIBC_<major>.<minor>` version string in an ELF file (its
/// version-needed strings; `GLIBC_PRIVATE` and the like are not versions).
fn newest_glibc(bytes: &[u8]) -> Option<(u32, u32)> {
    const TAG: &[u8] = b"GLIBC_";
    let mut best = None;
    for i in 0..bytes.len().saturating_sub(TAG.len()) {
        if &bytes[i..i + TAG.len()] != TAG {
            continue;
        }
        let rest = &bytes[i + TAG.len()..];
        let end = rest
            .iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'.'))
            .unwrap_or(rest.len());
        let text = String::from_utf8_lossy(&rest[..end]);
        let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
        if let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) {
            best = best.max(Some((major, minor)));
        }
    }
    best
}
