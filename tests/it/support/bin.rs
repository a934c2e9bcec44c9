//! The workspace's binaries: the installer, the operator and the exporter.
//! Cargo hands a test only its own package's binaries (`CARGO_BIN_EXE_*`),
//! and the tests are a package of their own, so each is built once per
//! test run with the same cargo and profile.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

pub fn installer() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("gpu-driver-installer")).clone()
}

pub fn operator() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("gpu-driver-operator")).clone()
}

pub fn exporter() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("gpu-driver-exporter")).clone()
}

/// `cargo build -p NAME --bin NAME`, the path from cargo's own JSON
/// messages. The test's own target directory is used (cargo releases its
/// lock before running tests), so a warm one builds nothing.
fn build(name: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--locked",
            "--message-format=json",
            "-p",
            name,
            "--bin",
            name,
        ])
        .current_dir(super::repo_root())
        .output()
        .unwrap_or_else(|e| panic!("running cargo build -p {name}: {e}"));
    assert!(
        out.status.success(),
        "cargo build -p {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == name)
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo build -p {name} named no executable"))
}
