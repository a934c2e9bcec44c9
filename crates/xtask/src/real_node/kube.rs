//! The cluster side: kubectl as a child process (argv, JSON read with
//! serde_json), the waits with their deadline, and the state dump after a
//! timeout.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::vm::{self, Console};
use super::{Live, NODE, NS, check_interrupted, log};
use crate::cmd::{cmd, read, run};

/// kubectl with the cluster's admin kubeconfig.
pub(super) struct Kube {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Kube {
    pub(super) fn new(bin: &Path, kubeconfig: PathBuf) -> Self {
        Self {
            kubectl: bin.join("kubectl"),
            kubeconfig,
        }
    }

    pub(super) fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub(super) fn cmd(&self, args: &[&str]) -> Command {
        let mut c = cmd(&self.kubectl);
        c.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        c
    }

    /// Runs kubectl, its stdout on our stderr.
    pub(super) fn run(&self, args: &[&str]) -> Result<()> {
        run(&mut self.cmd(args))
    }

    /// kubectl's stdout; a failure is an error.
    pub(super) fn read(&self, args: &[&str]) -> Result<String> {
        read(&mut self.cmd(args))
    }

    /// `args` printed as JSON (`-o json` is added), parsed.
    pub(super) fn json(&self, args: &[&str]) -> Result<Value> {
        let out = self.read(&[args, &["-o", "json"]].concat())?;
        serde_json::from_str(&out)
            .with_context(|| format!("parsing kubectl {}'s JSON", args.join(" ")))
    }

    /// Like `json`, and the text saved to `file` too.
    pub(super) fn json_to(&self, args: &[&str], file: &Path) -> Result<Value> {
        let out = self.read(&[args, &["-o", "json"]].concat())?;
        fs::write(file, format!("{out}\n"))
            .with_context(|| format!("writing {}", file.display()))?;
        serde_json::from_str(&out).with_context(|| format!("parsing {}", file.display()))
    }

    /// A poll's read: nothing on stderr, any failure is `None`.
    pub(super) fn poll(&self, args: &[&str]) -> Option<Value> {
        let out = self
            .cmd(&[args, &["-o", "json"]].concat())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Whether the command succeeds (its output discarded).
    pub(super) fn succeeds(&self, args: &[&str]) -> bool {
        self.cmd(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The node's object, if it can be read now.
    pub(super) fn node(&self) -> Option<Value> {
        self.poll(&["get", "node", NODE])
    }

    /// stdout and stderr into `file`, failure ignored (the state dump).
    fn to_file(&self, args: &[&str], file: &Path) {
        let Ok(f) = fs::File::create(file) else {
            return;
        };
        let Ok(f2) = f.try_clone() else { return };
        let _ = self.cmd(args).stdout(f).stderr(f2).status();
    }
}

/// The control plane's cluster.env (scripts/local-cluster).
pub(super) struct ClusterEnv {
    pub(super) kubeconfig: PathBuf,
    pub(super) ca_file: PathBuf,
    pub(super) kubelet_token_file: PathBuf,
    pub(super) api_port: String,
}

impl ClusterEnv {
    pub(super) fn read(p: &Path) -> Result<Self> {
        let text = vm::read_small(p)?;
        parse_env(&text).with_context(|| format!("{} lacks a variable", p.display()))
    }
}

fn parse_env(text: &str) -> Result<ClusterEnv> {
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .filter(|v| !v.is_empty())
            .map(String::from)
            .with_context(|| format!("no {k}"))
    };
    Ok(ClusterEnv {
        kubeconfig: get("KUBECONFIG")?.into(),
        ca_file: get("CA_FILE")?.into(),
        kubelet_token_file: get("KUBELET_TOKEN_FILE")?.into(),
        api_port: get("API_PORT")?,
    })
}

/// What the waits need: the cluster, the VM's console and the deadline.
pub(super) struct Ctx<'a> {
    pub(super) kube: Kube,
    pub(super) env: ClusterEnv,
    pub(super) out: PathBuf,
    pub(super) cluster: PathBuf,
    bin: PathBuf,
    timeout: Duration,
    deadline: Instant,
    /// How many boots the run has asked for so far.
    boots: usize,
    pub(super) console: Console,
    pub(super) live: &'a mut Live,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(
        env: ClusterEnv,
        out: &Path,
        bin: &Path,
        timeout: u64,
        live: &'a mut Live,
    ) -> Self {
        Self {
            kube: Kube::new(bin, env.kubeconfig.clone()),
            env,
            out: out.to_path_buf(),
            cluster: out.join("cluster"),
            bin: bin.to_path_buf(),
            timeout: Duration::from_secs(timeout),
            deadline: Instant::now() + Duration::from_secs(timeout),
            boots: 1,
            console: Console::new(out.join("console.log")),
            live,
        }
    }

    /// A new deadline for the waits from now on, with `boots` the number
    /// of boots the VM may have had by then.
    pub(super) fn restart_deadline(&mut self, boots: usize) {
        self.boots = boots;
        self.deadline = Instant::now() + self.timeout;
    }

    /// Polls `check` every second until it says done, the VM dies, reboots
    /// unasked or the deadline passes. An error of `check` ends the wait
    /// with the state dumped.
    pub(super) fn wait_for(
        &mut self,
        what: &str,
        mut check: impl FnMut(&Kube) -> Result<bool>,
    ) -> Result<()> {
        loop {
            match check(&self.kube) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.dump_state();
                    return Err(e);
                }
            }
            check_interrupted()?;
            self.console.poll()?;
            vm::check_alive(self, what)?;
            // The guest reboots only when told to (a panic reboots it too: panic=-1).
            if self.console.boots > self.boots {
                self.dump_state();
                bail!("the VM rebooted unasked (a panic?) while waiting for {what}");
            }
            if Instant::now() >= self.deadline {
                self.dump_state();
                bail!("timed out waiting for {what}");
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// What the cluster holds, into `<out>/state/`, to read after a
    /// timeout; the gist on stderr too (a CI log is often all there is).
    pub(super) fn dump_state(&self) {
        let state = self.out.join("state");
        let _ = fs::create_dir_all(&state);
        let k = &self.kube;
        k.to_file(&["get", "nodes", "-o", "yaml"], &state.join("nodes.yaml"));
        k.to_file(
            &["get", "gpudrivers", "-o", "yaml"],
            &state.join("gpudrivers.yaml"),
        );
        k.to_file(
            &["get", "pods", "-A", "-o", "wide"],
            &state.join("pods.txt"),
        );
        k.to_file(
            &["-n", NS, "get", "jobs,pods", "-o", "yaml"],
            &state.join("jobs-pods.yaml"),
        );
        let events = ["get", "events", "-A", "--sort-by=.lastTimestamp"];
        k.to_file(&events, &state.join("events.txt"));
        let op_log = ["-n", NS, "logs", "deploy/gpu-driver-operator", "--tail=300"];
        k.to_file(&op_log, &state.join("operator.log"));
        log(&format!("the cluster's state: {}/", state.display()));
        if let Some(n) = k.node() {
            eprint!("{}", node_gist(&n));
        }
        if let Some(p) = k.poll(&["get", "pods", "-A"]) {
            eprint!("{}", pods_gist(&p));
        }
        if let Ok(ev) = fs::read_to_string(state.join("events.txt")) {
            let lines: Vec<&str> = ev.lines().collect();
            for l in &lines[lines.len().saturating_sub(15)..] {
                eprintln!("{l}");
            }
        }
        self.control_plane_gist(&state);
    }

    /// Is each control plane component still running, and what did the
    /// scheduler say last (a pod never bound leaves no trace on the node).
    fn control_plane_gist(&self, state: &Path) {
        let logs = self.cluster.join("logs");
        for c in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ] {
            let pattern = format!("{}/{c} ", self.bin.display());
            if !process_running(&pattern) {
                log(&format!("control plane: no {c} process is running"));
            }
            let _ = fs::copy(
                logs.join(format!("{c}.log")),
                state.join(format!("{c}.log")),
            );
        }
        if let Ok(text) = vm::read_tail(&logs.join("kube-scheduler.log"), 4 << 20) {
            for l in scheduler_problems(&text, 8) {
                eprintln!("kube-scheduler: {l}");
            }
        }
    }
}

/// Whether a process's command line contains `pattern` (`pgrep -f`).
fn process_running(pattern: &str) -> bool {
    let Ok(dir) = fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        fs::read(e.path().join("cmdline")).is_ok_and(|b| {
            let line: Vec<u8> = b.iter().map(|c| if *c == 0 { b' ' } else { *c }).collect();
            String::from_utf8_lossy(&line).contains(pattern)
        })
    })
}

/// The last `n` error and warning lines of a klog file.
fn scheduler_problems(text: &str, n: usize) -> Vec<&str> {
    let all: Vec<&str> = text
        .lines()
        .filter(|l| {
            let b = l.as_bytes();
            b.len() >= 5 && matches!(b[0], b'E' | b'W') && b[1..5].iter().all(u8::is_ascii_digit)
        })
        .collect();
    all[all.len().saturating_sub(n)..].to_vec()
}

fn s<'v>(v: &'v Value, ptr: &str) -> &'v str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

/// The node's taints, conditions and GPUs in three lines.
fn node_gist(n: &Value) -> String {
    let arr = |p: &str| {
        n.pointer(p)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let taints: Vec<String> = arr("/spec/taints")
        .iter()
        .map(|t| format!("{}={}:{}", s(t, "/key"), s(t, "/value"), s(t, "/effect")))
        .collect();
    let conds: Vec<String> = arr("/status/conditions")
        .iter()
        .map(|c| format!("{}={}", s(c, "/type"), s(c, "/status")))
        .collect();
    let gpus = n
        .pointer("/status/allocatable/nvidia.com~1gpu")
        .and_then(Value::as_str)
        .unwrap_or("none");
    let unsched = n
        .pointer("/spec/unschedulable")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    format!(
        "node taints: {}\nnode conditions: {}\nnode allocatable nvidia.com/gpu: {gpus}, unschedulable: {unsched}\n",
        taints.join(" "),
        conds.join(" ")
    )
}

/// Each pod not running nor done, with its unmet conditions and waiting
/// containers.
fn pods_gist(list: &Value) -> String {
    let mut out = String::new();
    let items = list["items"].as_array().cloned().unwrap_or_default();
    for p in &items {
        let phase = s(p, "/status/phase");
        if phase == "Running" || phase == "Succeeded" {
            continue;
        }
        out += &format!(
            "pod {}/{}: {phase} {} {}\n",
            s(p, "/metadata/namespace"),
            s(p, "/metadata/name"),
            s(p, "/status/reason"),
            s(p, "/status/message")
        );
        for c in p["status"]["conditions"].as_array().into_iter().flatten() {
            if s(c, "/status") != "True" {
                out += &format!(
                    "  {}: {} {}\n",
                    s(c, "/type"),
                    s(c, "/reason"),
                    s(c, "/message")
                );
            }
        }
        for c in p["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(w) = c.pointer("/state/waiting") {
                out += &format!(
                    "  {} waiting: {} {}\n",
                    s(c, "/name"),
                    s(w, "/reason"),
                    s(w, "/message")
                );
            }
        }
    }
    out
}

/// The Node's facts the waits and checks read.
pub(super) mod node {
    use serde_json::Value;

    const STATE: &str = "/metadata/annotations/gpu-driver.gardenlinux.io~1state";
    pub(in super::super) const TAINT: &str = "gpu-driver.gardenlinux.io/driver-not-ready";

    pub(in super::super) fn ready(n: &Value) -> bool {
        n.pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    }

    /// The operator's `state` annotation ("" when absent).
    pub(in super::super) fn state(n: &Value) -> &str {
        super::s(n, STATE)
    }

    pub(in super::super) fn annotation<'v>(n: &'v Value, key: &str) -> Option<&'v str> {
        n["metadata"]["annotations"][key].as_str()
    }

    /// The ready label's value, "absent" when there is none.
    pub(in super::super) fn ready_label(n: &Value) -> &str {
        n["metadata"]["labels"]["gpu-driver.gardenlinux.io/ready"]
            .as_str()
            .unwrap_or("absent")
    }

    /// `allocatable["nvidia.com/gpu"]`, "0" when absent.
    pub(in super::super) fn gpus(n: &Value) -> &str {
        n["status"]["allocatable"]["nvidia.com/gpu"]
            .as_str()
            .unwrap_or("0")
    }

    pub(in super::super) fn taint_keys(n: &Value) -> Vec<String> {
        n["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["key"].as_str().map(String::from))
            .collect()
    }

    pub(in super::super) fn tainted(n: &Value) -> bool {
        taint_keys(n).iter().any(|k| k == TAINT)
    }

    pub(in super::super) fn boot_id(n: &Value) -> &str {
        super::s(n, "/status/nodeInfo/bootID")
    }

    pub(in super::super) fn uid(n: &Value) -> &str {
        super::s(n, "/metadata/uid")
    }
}

#[cfg(test)]
mod tests;
