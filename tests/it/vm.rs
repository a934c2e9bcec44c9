//! The assertions of `scripts/vm-test`: it boots a real Debian cloud kernel
//! under QEMU with the static installer in an initramfs (`tests/vm-init.sh`
//! is its /init) and hands the serial console log to this test as the
//! tools file's `vmLog` (support/tools.rs). Ignored in a plain `cargo test`:
//! it needs the VM. The Secure Boot VM's log and signers come the same way
//! (`sbLog`, `sbMok`, `sbOther`). The console's parser and the x86_64 VM's
//! checks are `xtask::vmlog`'s, which `cargo xtask e2e` runs too.

use crate::support::tools;
use serde_json::Value;
use xtask::vmlog::{self, Checks, Console, message, reason};

#[test]
#[ignore = "run by scripts/vm-test, which boots the VM and writes vmLog"]
fn vm_results() {
    let tools = tools::tools();
    let path = tools
        .vm_log()
        .unwrap_or_else(|| tools::missing("vmLog", "the console log"));
    let release = tools.vm_release();
    let foreign = tools.vm_foreign();
    let log = std::fs::read_to_string(&path).expect("reading the console log");
    let mut c = Checks::default();
    vmlog::x86_vm(&mut c, &Console::parse(&log), &release, &foreign);
    println!("{} passed, {} failed", c.passed, c.failed);
    assert_eq!(
        c.failed,
        0,
        "{} VM assertion(s) failed; console: {}",
        c.failed,
        path.display()
    );
}

/// The arm64 VM of `scripts/vm-test-arm64`: Debian's arm64 cloud kernel on
/// an emulated cortex-a57, the static aarch64 installer, and the arm64
/// artifact cross-built on the x86_64 machine.
#[test]
#[ignore = "run by scripts/vm-test-arm64, which boots the VM and writes vmArm64Log"]
fn vm_arm64_results() {
    let tools = tools::tools();
    let path =
        (tools.vm_arm64_log()).unwrap_or_else(|| tools::missing("vmArm64Log", "the console log"));
    let release = tools.vm_release();
    let log = std::fs::read_to_string(&path).expect("reading the console log");
    let con = Console::parse(&log);
    let mut c = Checks::default();
    let booted = con.fact("kernel");
    c.check(
        "arm64 VM booted the kernel the modules were built for",
        !booted.is_empty()
            && booted.ends_with("-arm64")
            && (release.is_empty() || booted == release),
        format!("booted {booted:?}, expected {release:?}"),
    );
    let machine = con.fact("machine");
    c.check(
        "the VM's CPU is aarch64",
        machine == "aarch64",
        format!("uname -m {machine:?}"),
    );
    c.check("init ran to the end", con.done(), "no @@DONE@@ marker");
    vmlog::nvidia_and_run(&mut c, &con);
    println!("{} passed, {} failed", c.passed, c.failed);
    assert_eq!(
        c.failed,
        0,
        "{} arm64 VM assertion(s) failed; console: {}",
        c.failed,
        path.display()
    );
}

/// The Secure Boot VM of `scripts/vm-test-secureboot`: Debian's signed
/// chain under OVMF with Secure Boot on, the test MOK enrolled, and the
/// installer installing what its own build signed (`tests/vm-init-secureboot.sh`).
#[test]
#[ignore = "run by scripts/vm-test-secureboot, which boots the VM and names its console as sbLog"]
fn vm_secure_boot_results() {
    let tools = crate::support::tools::tools();
    let path = tools
        .sb_log()
        .unwrap_or_else(|| crate::support::tools::missing("sbLog", "the Secure Boot VM's console"));
    let log = std::fs::read_to_string(&path).expect("reading the console log");
    let signer = |p: Option<std::path::PathBuf>, field: &str| -> Value {
        let p = p.unwrap_or_else(|| crate::support::tools::missing(field, "a signer document"));
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
    };
    let (mok, other) = (
        signer(tools.sb_mok(), "sbMok"),
        signer(tools.sb_other(), "sbOther"),
    );
    let con = Console::parse(&log);
    let mut c = Checks::default();
    secure_boot_platform(&mut c, &con, &mok);
    secure_boot_installs(&mut c, &con, &other);
    vmlog::nvidia_and_run(&mut c, &con);
    c.check("init ran to the end", con.done(), "no @@DONE@@");
    println!("{} passed, {} failed", c.passed, c.failed);
    assert_eq!(
        c.failed,
        0,
        "{} Secure Boot VM assertion(s) failed; console: {}",
        c.failed,
        path.display()
    );
}

/// Secure Boot on, seen by the kernel and by the installer's detect.
fn secure_boot_platform(c: &mut Checks, con: &Console, mok: &Value) {
    let release = tools::tools().vm_release();
    let booted = con.fact("kernel");
    c.check(
        "booted the signed kernel the modules were built for",
        !booted.is_empty() && (release.is_empty() || booted == release),
        format!("booted {booted:?}, expected {release:?}"),
    );
    c.check(
        "the kernel is locked down (integrity)",
        con.fact("lockdown").contains("[integrity]"),
        con.fact("lockdown"),
    );
    let subject = mok["subject"].as_str().unwrap_or("?");
    let cn = subject.trim_start_matches("CN=");
    c.check(
        "the MOK is loaded into the kernel's keyring",
        con.text("keys").contains(cn) || con.text("dmesg").contains(cn),
        format!("{cn:?} not in /proc/keys nor dmesg"),
    );
    let (rc, d) = con.doc("detect");
    let st = &d["status"];
    c.check(
        "detect: secureBoot enabled (real efivarfs), lockdown integrity, signatures required",
        st["secureBoot"] == "enabled"
            && st["lockdown"] == "integrity"
            && st["moduleSignaturesRequired"] == true,
        format!(
            "rc {rc:?}: secureBoot {}, lockdown {}, required {}",
            st["secureBoot"], st["lockdown"], st["moduleSignaturesRequired"]
        ),
    );
}

/// kmod-hello as the installer's build made it: unsigned, another key, the MOK.
fn secure_boot_installs(c: &mut Checks, con: &Console, other: &Value) {
    let (rc, v) = con.doc("hello-unsigned");
    c.check(
        "unsigned: ModuleSignatureRequired (exit 14) before any load",
        rc == Some(14)
            && reason(&v) == "ModuleSignatureRequired"
            && !con
                .modules("hello-unsigned.modules")
                .contains(&"hello".to_string())
            && v["status"]["modules"][0]["action"] == "notLoaded",
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    let (rc, v) = con.doc("hello-other");
    let fp = other["sha256"].as_str().unwrap_or("?");
    c.check(
        "another key: ModuleKeyRejected (EKEYREJECTED) naming its fingerprint and mokutil",
        rc == Some(14)
            && reason(&v) == "ModuleKeyRejected"
            && message(&v).contains("EKEYREJECTED")
            && message(&v).contains(fp)
            && v.to_string().contains("mokutil --import"),
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    let (rc, v) = con.doc("hello-mok");
    c.check(
        "signed with the MOK: Installed, hello loaded",
        rc == Some(0)
            && reason(&v) == "Installed"
            && con
                .modules("hello-mok.modules")
                .contains(&"hello".to_string()),
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    let (rc, v) = con.doc("hello-uninstall");
    c.check(
        "uninstall: hello unloaded",
        rc == Some(0)
            && !con
                .modules("hello-uninstall.modules")
                .contains(&"hello".to_string()),
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
}
