//! Runs the built `gpu-driver-installer` against fixture host roots and
//! checks documents, reasons and exit codes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod catalog;
mod io;
mod plan;
mod resolve;

fn bin() -> Command {
    let mut c = Command::new(crate::support::bin::installer());
    // Never touch a real /dev/termination-log from tests.
    c.args(["--termination-log", "/nonexistent/termination-log"]);
    c.env_remove("RUST_LOG");
    c
}

fn fixtures() -> PathBuf {
    crate::support::repo_root().join("tests/fixtures/hosts")
}

fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

struct Run {
    code: i32,
    doc: Value,
    stderr: String,
}

impl Run {
    fn message(&self) -> &str {
        self.doc["status"]["message"].as_str().unwrap()
    }
}

fn run(args: &[&str]) -> Run {
    let out: Output = bin().args(args).output().expect("run binary");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"));
    Run {
        code: out.status.code().unwrap(),
        doc,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn run_on(fixture_name: &str, args: &[&str]) -> Run {
    let root = fixture(fixture_name);
    let mut all = vec!["--host-root", root.to_str().unwrap()];
    all.extend_from_slice(args);
    run(&all)
}

fn exit_code_for(phase: &str, reason: &str) -> i32 {
    match (phase, reason) {
        ("Succeeded", _) => 0,
        ("Skipped", _) => 3,
        (_, "InvalidArgument" | "CatalogInvalid") => 4,
        (_, "UnsupportedOs" | "HostReadFailed") => 10,
        (_, "FlavorNotSupported" | "GpuNotSupported" | "IncompatibleKernel") => 11,
        _ => 1,
    }
}

/// The document's phase and reason are the fixture's, and the exit code
/// is the one they map to.
fn assert_outcome(r: &Run, phase: &Value, reason: &Value, name: &str) {
    let s = &r.doc["status"];
    assert_eq!(&s["phase"], phase, "{name}: {s}");
    assert_eq!(&s["reason"], reason, "{name}: {s}");
    assert_eq!(
        r.code,
        exit_code_for(phase.as_str().unwrap(), reason.as_str().unwrap()),
        "{name}"
    );
}

fn all_fixtures() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        let expected = path.join("expected.json");
        if expected.is_file() {
            let v = serde_json::from_str(&fs::read_to_string(expected).unwrap()).unwrap();
            out.push((path.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 12, "fixtures missing: {}", out.len());
    out
}

/// Address, device id and architecture of each GPU in `gpus`.
fn gpu_ids(gpus: &Value) -> Vec<(Value, Value, Value)> {
    gpus.as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["pciAddress"].clone(),
                g["deviceId"].clone(),
                g["architecture"].clone(),
            )
        })
        .collect()
}

/// Writes a minimal host root with the given NVIDIA device ids.
fn synthetic_root(dir: &Path, devices: &[u16]) {
    fs::create_dir_all(dir.join("etc")).unwrap();
    fs::write(
        dir.join("etc/os-release"),
        // 1877.8: past 6.12.56, where the open modules work again.
        "ID=gardenlinux\nGARDENLINUX_VERSION=1877.8\n",
    )
    .unwrap();
    fs::create_dir_all(dir.join("proc/sys/kernel/random")).unwrap();
    fs::write(
        dir.join("proc/sys/kernel/osrelease"),
        "6.12.57-cloud-amd64\n",
    )
    .unwrap();
    fs::write(
        dir.join("proc/sys/kernel/random/boot_id"),
        "00000000-0000-4000-8000-000000000001\n",
    )
    .unwrap();
    fs::write(dir.join("proc/modules"), "").unwrap();
    fs::create_dir_all(dir.join("sys/bus/pci/devices")).unwrap();
    for (i, id) in devices.iter().enumerate() {
        let addr = format!("0000:00:{:02x}.0", i + 4);
        let real = dir.join("sys/devices/pci0000:00").join(&addr);
        fs::create_dir_all(&real).unwrap();
        fs::write(real.join("vendor"), "0x10de\n").unwrap();
        fs::write(real.join("device"), format!("0x{id:04x}\n")).unwrap();
        fs::write(real.join("class"), "0x030200\n").unwrap();
        std::os::unix::fs::symlink(
            format!("../../../devices/pci0000:00/{addr}"),
            dir.join("sys/bus/pci/devices").join(&addr),
        )
        .unwrap();
    }
}
