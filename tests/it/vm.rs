//! The assertions of `scripts/vm-test`: it boots a real Debian cloud kernel
//! under QEMU with the static installer in an initramfs (`tests/vm-init.sh`
//! is its /init) and hands the serial console log to this test as the
//! tools file's `vmLog` (support/tools.rs). Ignored in a plain `cargo test`:
//! it needs the VM. The Secure Boot VM's log and signers still come in
//! `GPU_DRIVER_SB_*` variables.

use std::collections::BTreeMap;

use crate::support::tools;
use serde_json::Value;

/// A block printed by vm-init.sh between `@@BEGIN name[ rc=N]@@` and
/// `@@END name@@`.
struct Block {
    rc: Option<i32>,
    text: String,
}

fn blocks(log: &str) -> BTreeMap<String, Block> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, Block)> = None;
    // The serial console may put terminal escapes before a marker.
    let markers = log.lines().map(|l| {
        let l = l.trim_end_matches('\r');
        l.find("@@").map_or(l, |i| {
            if l[i..].starts_with("@@BEGIN ") || l[i..].starts_with("@@END ") {
                &l[i..]
            } else {
                l
            }
        })
    });
    for line in markers {
        if let Some(head) = line
            .strip_prefix("@@BEGIN ")
            .and_then(|l| l.strip_suffix("@@"))
        {
            let (name, rc) = match head.split_once(" rc=") {
                Some((n, rc)) => (n.to_string(), rc.parse().ok()),
                None => (head.to_string(), None),
            };
            current = Some((
                name,
                Block {
                    rc,
                    text: String::new(),
                },
            ));
        } else if line.starts_with("@@END ") {
            if let Some((name, block)) = current.take() {
                out.insert(name, block);
            }
        } else if let Some((_, block)) = current.as_mut() {
            block.text.push_str(line);
            block.text.push('\n');
        }
    }
    out
}

struct Checks {
    passed: usize,
    failed: usize,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool, detail: impl std::fmt::Display) {
        if ok {
            self.passed += 1;
            println!("PASS {name}");
        } else {
            self.failed += 1;
            println!("FAIL {name}: {detail}");
        }
    }
}

fn module_names(modules: &str) -> Vec<String> {
    let mut names: Vec<String> = modules
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

/// A block's exit code and result document.
fn doc(b: &BTreeMap<String, Block>, name: &str) -> (Option<i32>, Value) {
    match b.get(name) {
        Some(block) => (
            block.rc,
            serde_json::from_str(&block.text).unwrap_or(Value::Null),
        ),
        None => (None, Value::Null),
    }
}

fn text(b: &BTreeMap<String, Block>, name: &str) -> String {
    b.get(name).map(|x| x.text.clone()).unwrap_or_default()
}

fn reason(v: &Value) -> String {
    v["status"]["reason"].as_str().unwrap_or("").to_string()
}

fn message(v: &Value) -> String {
    v["status"]["message"].as_str().unwrap_or("").to_string()
}

/// `@@VM <key>=<value>@@` of the console.
fn vm_fact(log: &str, key: &str) -> String {
    let marker = format!("@@VM {key}=");
    log.lines()
        .find_map(|l| {
            l.trim_end_matches('\r')
                .split_once(marker.as_str())
                .map(|(_, k)| k)
        })
        .map(|l| l.trim_end_matches("@@").to_string())
        .unwrap_or_default()
}

/// (2) nvidia.ko without a GPU: the kernel's own refusal, quoted; (3) run
/// on a node without a GPU. The same on both architectures.
fn nvidia_and_run(c: &mut Checks, b: &BTreeMap<String, Block>) {
    let doc = |name: &str| doc(b, name);
    let text = |name: &str| text(b, name);
    let (rc, v) = doc("nvidia");
    c.check(
        "nvidia: ModuleLoadFailed, exit 14",
        rc == Some(14) && reason(&v) == "ModuleLoadFailed",
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    c.check(
        "nvidia: errno ENODEV",
        message(&v).contains("ENODEV")
            && v["status"]["modules"].as_array().is_some_and(|m| {
                m.iter()
                    .any(|m| m["name"] == "nvidia" && m["errno"] == "ENODEV")
            }),
        message(&v),
    );
    c.check(
        "nvidia: quotes the kernel's \"NVRM: No NVIDIA GPU found.\"",
        message(&v).contains("NVRM: No NVIDIA GPU found.")
            && v["status"]["kernelLog"].as_array().is_some_and(|l| {
                l.iter().any(|x| {
                    x.as_str()
                        .is_some_and(|s| s.contains("NVRM: No NVIDIA GPU found."))
                })
            }),
        message(&v),
    );
    c.check(
        "nvidia: nothing NVIDIA stays loaded",
        !module_names(&text("nvidia.modules"))
            .iter()
            .any(|m| m.starts_with("nvidia")),
        text("nvidia.modules"),
    );

    // (3) run on a node without a GPU.
    let (rc, v) = doc("run");
    c.check(
        "run: Skipped NoGpu, exit 3",
        rc == Some(3) && reason(&v) == "NoGpu" && v["status"]["phase"] == "Skipped",
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    c.check(
        "run: stopped after detect",
        v["status"]["steps"]
            .as_array()
            .is_some_and(|s| s.len() == 1),
        &v["status"]["steps"],
    );
}

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
    let b = blocks(&log);
    let mut c = Checks {
        passed: 0,
        failed: 0,
    };
    let doc = |name: &str| doc(&b, name);
    let text = |name: &str| text(&b, name);
    let booted = vm_fact(&log, "kernel");
    c.check(
        "VM booted the kernel the modules were built for",
        !booted.is_empty() && (release.is_empty() || booted == release),
        format!("booted {booted:?}, expected {release:?}"),
    );
    c.check(
        "init ran to the end",
        log.contains("@@DONE@@"),
        "no @@DONE@@ marker",
    );

    // (4) Another kernel's module: refused before any load.
    let (rc, v) = doc("foreign");
    c.check(
        "foreign vermagic: VermagicMismatch, exit 14",
        rc == Some(14) && reason(&v) == "VermagicMismatch",
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    c.check(
        "foreign vermagic: message names both releases",
        message(&v).contains(&foreign) && message(&v).contains(&booted),
        message(&v),
    );
    let untouched = v["status"]["modules"]
        .as_array()
        .is_some_and(|m| m.iter().all(|m| m["action"] == "notLoaded"));
    c.check(
        "foreign vermagic: /proc/modules unchanged, nothing attempted",
        untouched && module_names(&text("foreign.modules")) == module_names(&text("start.modules")),
        format!(
            "before {:?}, after {:?}",
            module_names(&text("start.modules")),
            module_names(&text("foreign.modules"))
        ),
    );

    // (1) hello.ko through the load path and back out.
    let (rc, v) = doc("hello-install");
    c.check(
        "hello: install → Installed, exit 0",
        rc == Some(0) && reason(&v) == "Installed",
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    c.check(
        "hello: in /proc/modules after install",
        module_names(&text("hello-install.modules")).contains(&"hello".to_string()),
        text("hello-install.modules"),
    );
    c.check(
        "hello: driver root is versioned",
        v["status"]["driverRoot"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("/1.0-open-{booted}-"))),
        &v["status"]["driverRoot"],
    );
    let (rc, v) = doc("hello-again");
    c.check(
        "hello: second install → AlreadyInstalled, nothing reloaded",
        rc == Some(0) && reason(&v) == "AlreadyInstalled",
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    let (rc, v) = doc("hello-uninstall");
    c.check(
        "hello: uninstall → Uninstalled, exit 0",
        rc == Some(0) && reason(&v) == "Uninstalled",
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    c.check(
        "hello: gone from /proc/modules after uninstall",
        !module_names(&text("hello-uninstall.modules")).contains(&"hello".to_string()),
        text("hello-uninstall.modules"),
    );
    let dmesg = text("dmesg");
    c.check(
        "hello: the kernel ran its init and exit",
        dmesg.contains("gpu-driver-hello: loaded") && dmesg.contains("gpu-driver-hello: unloaded"),
        &dmesg,
    );

    nvidia_and_run(&mut c, &b);

    // (5) the ways onto a host: nsenter into PID 1's namespaces, and a
    // pod-like chroot in its own mount namespace with --host-root
    // /proc/1/root (it has no os-release of its own, so the OS it reports
    // can only come from the host's).
    let (rc, v) = doc("nsenter");
    c.check(
        "nsenter -t 1 -m -u -i -n -p -- run: Skipped NoGpu",
        rc == Some(3) && reason(&v) == "NoGpu",
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    let (rc, v) = doc("pod");
    c.check(
        "--host-root /proc/1/root from another root: the host's OS, NoGpu",
        rc == Some(3)
            && reason(&v) == "NoGpu"
            && v["spec"]["hostRoot"] == "/proc/1/root"
            && v["status"]["os"]["id"] == "debian",
        format!("rc {rc:?}: {v}"),
    );

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
    let b = blocks(&log);
    let mut c = Checks {
        passed: 0,
        failed: 0,
    };
    let booted = vm_fact(&log, "kernel");
    c.check(
        "arm64 VM booted the kernel the modules were built for",
        !booted.is_empty()
            && booted.ends_with("-arm64")
            && (release.is_empty() || booted == release),
        format!("booted {booted:?}, expected {release:?}"),
    );
    let machine = vm_fact(&log, "machine");
    c.check(
        "the VM's CPU is aarch64",
        machine == "aarch64",
        format!("uname -m {machine:?}"),
    );
    c.check(
        "init ran to the end",
        log.contains("@@DONE@@"),
        "no @@DONE@@ marker",
    );
    nvidia_and_run(&mut c, &b);
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
#[ignore = "run by scripts/vm-test-secureboot, which boots the VM and sets GPU_DRIVER_SB_LOG"]
fn vm_secure_boot_results() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let path = var("GPU_DRIVER_SB_LOG");
    let log = std::fs::read_to_string(&path).expect("reading the console log");
    let signer = |k: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(var(k)).unwrap()).unwrap()
    };
    let (mok, other) = (signer("GPU_DRIVER_SB_MOK"), signer("GPU_DRIVER_SB_OTHER"));
    let b = blocks(&log);
    let mut c = Checks {
        passed: 0,
        failed: 0,
    };
    secure_boot_platform(&mut c, &log, &b, &mok);
    secure_boot_installs(&mut c, &b, &other);
    nvidia_and_run(&mut c, &b);
    c.check(
        "init ran to the end",
        log.contains("@@DONE@@"),
        "no @@DONE@@",
    );
    println!("{} passed, {} failed", c.passed, c.failed);
    assert_eq!(
        c.failed, 0,
        "{} Secure Boot VM assertion(s) failed; console: {path}",
        c.failed
    );
}

/// Secure Boot on, seen by the kernel and by the installer's detect.
fn secure_boot_platform(c: &mut Checks, log: &str, b: &BTreeMap<String, Block>, mok: &Value) {
    let release = tools::tools().vm_release();
    let booted = vm_fact(log, "kernel");
    c.check(
        "booted the signed kernel the modules were built for",
        !booted.is_empty() && (release.is_empty() || booted == release),
        format!("booted {booted:?}, expected {release:?}"),
    );
    c.check(
        "the kernel is locked down (integrity)",
        vm_fact(log, "lockdown").contains("[integrity]"),
        vm_fact(log, "lockdown"),
    );
    let subject = mok["subject"].as_str().unwrap_or("?");
    let cn = subject.trim_start_matches("CN=");
    c.check(
        "the MOK is loaded into the kernel's keyring",
        text(b, "keys").contains(cn) || text(b, "dmesg").contains(cn),
        format!("{cn:?} not in /proc/keys nor dmesg"),
    );
    let (rc, d) = doc(b, "detect");
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
fn secure_boot_installs(c: &mut Checks, b: &BTreeMap<String, Block>, other: &Value) {
    let (rc, v) = doc(b, "hello-unsigned");
    c.check(
        "unsigned: ModuleSignatureRequired (exit 14) before any load",
        rc == Some(14)
            && reason(&v) == "ModuleSignatureRequired"
            && !module_names(&text(b, "hello-unsigned.modules")).contains(&"hello".to_string())
            && v["status"]["modules"][0]["action"] == "notLoaded",
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    let (rc, v) = doc(b, "hello-other");
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
    let (rc, v) = doc(b, "hello-mok");
    c.check(
        "signed with the MOK: Installed, hello loaded",
        rc == Some(0)
            && reason(&v) == "Installed"
            && module_names(&text(b, "hello-mok.modules")).contains(&"hello".to_string()),
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
    let (rc, v) = doc(b, "hello-uninstall");
    c.check(
        "uninstall: hello unloaded",
        rc == Some(0)
            && !module_names(&text(b, "hello-uninstall.modules")).contains(&"hello".to_string()),
        format!("rc {rc:?}, reason {}: {}", reason(&v), message(&v)),
    );
}
