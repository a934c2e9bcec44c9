//! The VM tests' serial console, as `tests/vm-step.sh` and the VM's /init
//! print it: `@@VM key=value@@` facts, blocks between
//! `@@BEGIN name[ rc=N]@@` and `@@END name@@` (a step's result document,
//! its stderr, /proc/modules after it), and `@@DONE@@` when /init got to
//! the end. One parser and one set of checks for `cargo xtask e2e` and the
//! integration tests (tests/it/vm.rs).

use serde_json::Value;

/// One `@@BEGIN name[ rc=N]@@ … @@END name@@` block.
#[derive(Debug)]
pub struct Block {
    pub name: String,
    /// The step's exit code (steps only; `name.stderr`, `name.modules`,
    /// `dmesg` have none).
    pub rc: Option<i32>,
    pub text: String,
}

/// A parsed console log.
#[derive(Debug)]
pub struct Console {
    log: String,
    blocks: Vec<Block>,
}

impl Console {
    pub fn parse(log: &str) -> Self {
        let mut blocks = Vec::new();
        let mut current: Option<Block> = None;
        for line in log.lines().map(marker_line) {
            if let Some(head) = line
                .strip_prefix("@@BEGIN ")
                .and_then(|l| l.strip_suffix("@@"))
            {
                let (name, rc) = match head.split_once(" rc=") {
                    Some((n, rc)) => (n, rc.parse().ok()),
                    None => (head, None),
                };
                current = Some(Block {
                    name: name.to_string(),
                    rc,
                    text: String::new(),
                });
            } else if line.starts_with("@@END ") {
                blocks.extend(current.take());
            } else if let Some(b) = current.as_mut() {
                b.text.push_str(line);
                b.text.push('\n');
            }
        }
        Self {
            log: log.to_string(),
            blocks,
        }
    }

    /// The blocks in the order the VM printed them.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The block `name` (the last one, should a name repeat).
    pub fn block(&self, name: &str) -> Option<&Block> {
        self.blocks.iter().rev().find(|b| b.name == name)
    }

    /// A block's text; empty if the VM never printed it.
    pub fn text(&self, name: &str) -> &str {
        self.block(name).map_or("", |b| b.text.as_str())
    }

    /// A step's exit code and result document (`Null` if it printed none).
    pub fn doc(&self, name: &str) -> (Option<i32>, Value) {
        match self.block(name) {
            Some(b) => (b.rc, serde_json::from_str(&b.text).unwrap_or(Value::Null)),
            None => (None, Value::Null),
        }
    }

    /// The module names of a `/proc/modules` block, sorted.
    pub fn modules(&self, name: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .text(name)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
        names.sort();
        names
    }

    /// The value of `@@VM key=value@@`; empty if absent.
    pub fn fact(&self, key: &str) -> String {
        let marker = format!("@@VM {key}=");
        self.log
            .lines()
            .find_map(|l| l.trim_end_matches('\r').split_once(marker.as_str()))
            .map(|(_, v)| v.trim_end_matches("@@").to_string())
            .unwrap_or_default()
    }

    /// Whether /init ran to its end.
    pub fn done(&self) -> bool {
        self.log.contains("@@DONE@@")
    }
}

/// A console line with its carriage return dropped and, before a marker,
/// the terminal escapes the serial console may print.
fn marker_line(l: &str) -> &str {
    let l = l.trim_end_matches('\r');
    match l.find("@@") {
        Some(i) if l[i..].starts_with("@@BEGIN ") || l[i..].starts_with("@@END ") => &l[i..],
        _ => l,
    }
}

/// `status.reason` of a result document.
pub fn reason(v: &Value) -> &str {
    v["status"]["reason"].as_str().unwrap_or("")
}

/// `status.message` of a result document.
pub fn message(v: &Value) -> &str {
    v["status"]["message"].as_str().unwrap_or("")
}

/// Counts and prints one `PASS name` or `FAIL name: detail` line per fact.
#[derive(Debug, Default)]
pub struct Checks {
    pub passed: usize,
    pub failed: usize,
}

impl Checks {
    pub fn check(&mut self, name: &str, ok: bool, detail: impl std::fmt::Display) {
        if ok {
            self.passed += 1;
            println!("PASS {name}");
        } else {
            self.failed += 1;
            println!("FAIL {name}: {detail}");
        }
    }

    /// Checks, as `name`, that the step `block` exited `rc` with the
    /// reason `want`; its result document, for the checks that follow.
    pub fn step(&mut self, con: &Console, block: &str, name: &str, rc: i32, want: &str) -> Value {
        let (got, v) = con.doc(block);
        self.check(
            name,
            got == Some(rc) && reason(&v) == want,
            rc_reason(got, &v),
        );
        v
    }
}

fn rc_reason(rc: Option<i32>, v: &Value) -> String {
    format!("rc {rc:?}, reason {}: {}", reason(v), message(v))
}

const NO_GPU: &str = "NVRM: No NVIDIA GPU found.";

/// The x86_64 VM of `scripts/vm-test` (tests/vm-init.sh with every step):
/// the kernel `release` booted (empty: any), hello.ko built for the
/// `foreign` release refused, hello.ko through install and uninstall, nvidia.ko refused by
/// the kernel without a GPU, `run` skipped, and both ways onto a host.
pub fn x86_vm(c: &mut Checks, con: &Console, release: &str, foreign: &str) {
    let booted = con.fact("kernel");
    c.check(
        "VM booted the kernel the modules were built for",
        !booted.is_empty() && (release.is_empty() || booted == release),
        format!("booted {booted:?}, expected {release:?}"),
    );
    c.check("init ran to the end", con.done(), "no @@DONE@@ marker");
    foreign_module(c, con, foreign, &booted);
    hello_module(c, con, &booted);
    nvidia_and_run(c, con);
    onto_the_host(c, con);
}

/// Another kernel's module: refused before any load.
fn foreign_module(c: &mut Checks, con: &Console, foreign: &str, booted: &str) {
    let v = c.step(
        con,
        "foreign",
        "foreign vermagic: VermagicMismatch, exit 14",
        14,
        "VermagicMismatch",
    );
    c.check(
        "foreign vermagic: message names both releases",
        message(&v).contains(foreign) && message(&v).contains(booted),
        message(&v),
    );
    let untouched = v["status"]["modules"]
        .as_array()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|m| m["action"] == "notLoaded"));
    let (before, after) = (con.modules("start.modules"), con.modules("foreign.modules"));
    c.check(
        "foreign vermagic: /proc/modules unchanged, nothing attempted",
        untouched && before == after,
        format!("before {before:?}, after {after:?}"),
    );
}

/// hello.ko through the load path and back out.
fn hello_module(c: &mut Checks, con: &Console, booted: &str) {
    let hello = |block: &str| con.modules(block).iter().any(|m| m == "hello");
    let v = c.step(
        con,
        "hello-install",
        "hello: install → Installed, exit 0",
        0,
        "Installed",
    );
    c.check(
        "hello: in /proc/modules after install",
        hello("hello-install.modules"),
        con.text("hello-install.modules"),
    );
    c.check(
        "hello: driver root is versioned",
        v["status"]["driverRoot"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("/1.0-open-{booted}-"))),
        &v["status"]["driverRoot"],
    );
    c.step(
        con,
        "hello-again",
        "hello: second install → AlreadyInstalled, nothing reloaded",
        0,
        "AlreadyInstalled",
    );
    c.step(
        con,
        "hello-uninstall",
        "hello: uninstall → Uninstalled, exit 0",
        0,
        "Uninstalled",
    );
    c.check(
        "hello: gone from /proc/modules after uninstall",
        !hello("hello-uninstall.modules"),
        con.text("hello-uninstall.modules"),
    );
    let dmesg = con.text("dmesg");
    c.check(
        "hello: the kernel ran its init and exit",
        dmesg.contains("gpu-driver-hello: loaded") && dmesg.contains("gpu-driver-hello: unloaded"),
        dmesg,
    );
}

/// The ways onto a host: nsenter into PID 1's namespaces, and a pod-like
/// chroot in its own mount namespace with --host-root /proc/1/root (it
/// has no os-release of its own, so the OS it reports can only come from
/// the host's).
fn onto_the_host(c: &mut Checks, con: &Console) {
    c.step(
        con,
        "nsenter",
        "nsenter -t 1 -m -u -i -n -p -- run: Skipped NoGpu",
        3,
        "NoGpu",
    );
    let (rc, v) = con.doc("pod");
    c.check(
        "--host-root /proc/1/root from another root: the host's OS, NoGpu",
        rc == Some(3)
            && reason(&v) == "NoGpu"
            && v["spec"]["hostRoot"] == "/proc/1/root"
            && v["status"]["os"]["id"] == "debian",
        format!("rc {rc:?}: {v}"),
    );
}

/// nvidia.ko without a GPU: the kernel's own refusal, quoted, nothing left
/// loaded; then `run` on a node without a GPU. The same in every VM.
pub fn nvidia_and_run(c: &mut Checks, con: &Console) {
    let v = c.step(
        con,
        "nvidia",
        "nvidia: ModuleLoadFailed, exit 14",
        14,
        "ModuleLoadFailed",
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
        &format!("nvidia: quotes the kernel's \"{NO_GPU}\""),
        message(&v).contains(NO_GPU)
            && v["status"]["kernelLog"].as_array().is_some_and(|l| {
                l.iter()
                    .any(|x| x.as_str().is_some_and(|s| s.contains(NO_GPU)))
            }),
        message(&v),
    );
    c.check(
        "nvidia: nothing NVIDIA stays loaded",
        !con.modules("nvidia.modules")
            .iter()
            .any(|m| m.starts_with("nvidia")),
        con.text("nvidia.modules"),
    );

    let (rc, v) = con.doc("run");
    c.check(
        "run: Skipped NoGpu, exit 3",
        rc == Some(3) && reason(&v) == "NoGpu" && v["status"]["phase"] == "Skipped",
        rc_reason(rc, &v),
    );
    c.check(
        "run: stopped after detect",
        v["status"]["steps"]
            .as_array()
            .is_some_and(|s| s.len() == 1),
        &v["status"]["steps"],
    );
}

#[cfg(test)]
mod tests {
    use super::{Checks, Console, x86_vm};

    /// The console of a passing `cargo xtask e2e` VM, without the steps'
    /// stderr blocks (nothing checks them).
    const LOG: &str = include_str!("../../../tests/fixtures/vm/console.log");
    const RELEASE: &str = "6.1.0-50-cloud-amd64";
    const FOREIGN: &str = "6.12.95+deb12-cloud-amd64";

    #[test]
    fn parses_blocks_facts_and_escapes() {
        // The serial console may put terminal escapes before a marker.
        let log = LOG.replacen(
            "@@BEGIN hello-install rc=0@@",
            "\x1b[0m@@BEGIN hello-install rc=0@@",
            1,
        );
        let con = Console::parse(&log);
        assert_eq!(con.fact("kernel"), RELEASE);
        assert_eq!(con.fact("machine"), "x86_64");
        assert_eq!(con.fact("absent"), "");
        assert!(con.done());
        assert_eq!(con.block("nvidia").and_then(|b| b.rc), Some(14));
        assert_eq!(con.block("nvidia.modules").map(|b| b.rc), Some(None));
        let (rc, v) = con.doc("hello-install");
        assert_eq!((rc, super::reason(&v)), (Some(0), "Installed"));
        assert_eq!(con.modules("hello-install.modules"), ["hello"]);
        assert!(con.modules("start.modules").is_empty());
        assert!(con.doc("missing").1.is_null());
        assert_eq!(con.text("missing"), "");
        let names: Vec<&str> = con.blocks().iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names.len(), 16);
        assert_eq!(names.first(), Some(&"start.modules"));
        assert_eq!(names.last(), Some(&"dmesg"));
    }

    #[test]
    fn a_good_console_passes_every_check() {
        let mut c = Checks::default();
        x86_vm(&mut c, &Console::parse(LOG), RELEASE, FOREIGN);
        assert_eq!((c.passed, c.failed), (20, 0));
    }

    #[test]
    fn each_wrong_fact_fails_its_check() {
        let cases = [
            // Another kernel booted: its release is neither the expected
            // one, nor in the foreign refusal, nor in the driver root.
            (
                LOG.replacen("@@VM kernel=6.1.0-50", "@@VM kernel=6.1.0-49", 1),
                3,
            ),
            // /init died before the end.
            (LOG.replacen("@@DONE@@", "", 1), 1),
            // The foreign module was tried after all.
            (LOG.replacen("\"notLoaded\"", "\"failed\"", 1), 1),
            // nvidia stayed loaded.
            (
                LOG.replacen(
                    "@@BEGIN nvidia.modules@@",
                    "@@BEGIN nvidia.modules@@\nnvidia 1 0 - Live 0x0",
                    1,
                ),
                1,
            ),
            // run went past detect.
            (
                LOG.replacen("\"steps\": [", "\"steps\": [{\"name\": \"x\"},", 1),
                1,
            ),
        ];
        for (i, (log, failed)) in cases.into_iter().enumerate() {
            let mut c = Checks::default();
            x86_vm(&mut c, &Console::parse(&log), RELEASE, FOREIGN);
            assert_eq!(c.failed, failed, "case {i}");
        }
    }
}
