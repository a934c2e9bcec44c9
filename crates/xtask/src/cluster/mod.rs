//! A real, local Kubernetes control plane for trying the operator by hand
//! and for the integration tests (`tests/it/support/cluster.rs` runs
//! `scripts/local-cluster`, the thin entry into this module): etcd,
//! kube-apiserver, kube-controller-manager (job, TTL-after-finished, garbage
//! collector, namespace, service account, deployment/replicaset,
//! disruption: PodDisruptionBudgets for evictions), kube-scheduler, and KWOK,
//! which simulates every Node and the pods bound to them (stages in
//! tools/k8s/stages). Binaries: `--k8s-bin DIR`, else `cargo xtask tool k8s`
//! (built and cached on first use). See docs/local-cluster.md.
//!
//! The state directory holds everything: `kubeconfig` (an admin, group
//! system:masters), `token`, `pki/`, `logs/NAME.log`, `run/NAME.pid` (and
//! `run/watchdog.pid`), `cluster.env` (KEY=VALUE for scripts to source),
//! `kubelet-NAME.token` with `--kubelet`, `audit.log` with `--audit`, and
//! `.gpu-driver-cluster`, the marker that it is one of ours. A relative
//! `--dir` or `--k8s-bin` is taken from the repository's root.
//!
//! Each component runs in a process group of its own and outlives `up`;
//! `down` stops them in reverse order, and only processes that are really
//! ours: the pid file's process is our child, or runs the component's
//! binary (a recycled pid runs something else).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};

mod config;
mod process;
mod up;

#[derive(Subcommand)]
pub enum Cmd {
    /// Starts the cluster (or finds it up) and prints the kubeconfig's path
    /// as the last line on stdout; progress goes to stderr. A failed `up`
    /// leaves nothing running (unless --keep-failed).
    Up(Opts),
    /// Stops the components in reverse order and removes the directory.
    Down(Opts),
    /// Lists the components; exits 1 unless all run.
    Status(Opts),
    /// The watchdog that `up --watch-pid` starts: waits for PID to exit,
    /// then runs `down`.
    #[command(hide = true)]
    Watch {
        #[arg(long)]
        pid: u32,
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(Args)]
pub struct Opts {
    /// The state directory [default: ${XDG_RUNTIME_DIR:-/tmp}/gpu-driver-cluster]
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Ports N..N+5: apiserver, etcd client, etcd peer, controller-manager,
    /// scheduler, KWOK.
    #[arg(long, value_name = "N", default_value_t = 16443,
          value_parser = clap::value_parser!(u16).range(1024..=65530))]
    port_base: u16,
    /// manual: Job pods complete only once they carry the annotation
    /// sim.gpu-driver.gardenlinux.io/exit-code (a test patches it in).
    #[arg(long, value_enum, default_value = "auto")]
    job_pods: JobPods,
    /// Runs `down` by itself once that process has exited (the test
    /// harness passes its own pid).
    #[arg(long, value_name = "PID")]
    watch_pid: Option<u32>,
    /// The apiserver logs every write (create, update, patch, delete) as one
    /// JSON line in DIR/audit.log, with user agent, verb and object: what a
    /// benchmark counts as API writes.
    #[arg(long)]
    audit: bool,
    /// For a real kubelet instead of KWOK (scripts/real-node): no KWOK; a
    /// token for system:node:NAME (group system:nodes) in
    /// DIR/kubelet-NAME.token, authorized by the Node authorizer;
    /// ServiceAccount admission on, so pods get their API tokens.
    #[arg(long, value_name = "NAME", value_parser = node_name)]
    kubelet: Option<String>,
    /// The DaemonSet controller runs (always with --kubelet): a test of
    /// DaemonSets on KWOK's nodes (the GPU Operator's operands).
    #[arg(long)]
    daemonsets: bool,
    /// The directory of the k8s binaries [default: cargo xtask tool k8s].
    #[arg(long, value_name = "DIR")]
    k8s_bin: Option<PathBuf>,
    /// A failed up leaves what it started (and its logs) for a look.
    #[arg(long)]
    keep_failed: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum JobPods {
    Auto,
    Manual,
}

impl JobPods {
    fn as_str(self) -> &'static str {
        match self {
            JobPods::Auto => "auto",
            JobPods::Manual => "manual",
        }
    }
}

/// A node name: lowercase letters, digits and inner dashes.
fn node_name(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let valid =
        !b.is_empty() && ok(&b[0]) && ok(&b[b.len() - 1]) && b.iter().all(|c| ok(c) || *c == b'-');
    if valid {
        Ok(s.to_string())
    } else {
        Err("--kubelet needs a node name (lowercase letters, digits, -)".into())
    }
}

/// The state directory's paths, and which components it runs.
pub struct Layout {
    dir: PathBuf,
    components: Vec<&'static str>,
}

impl Layout {
    fn new(dir: PathBuf, kubelet: bool) -> Self {
        // A cluster for a real kubelet runs no KWOK (it would take over that
        // node). Start order; down stops them in reverse.
        let kubelet = kubelet || dir.join("kubelet.node").is_file();
        let mut components = vec![
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ];
        if !kubelet {
            components.push("kwok");
        }
        Self { dir, components }
    }
    fn run(&self) -> PathBuf {
        self.dir.join("run")
    }
    fn pid_file(&self, name: &str) -> PathBuf {
        self.run().join(format!("{name}.pid"))
    }
    fn marker(&self) -> PathBuf {
        self.dir.join(".gpu-driver-cluster")
    }
    fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }
    fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }
    fn log(&self, name: &str) -> PathBuf {
        self.logs().join(format!("{name}.log"))
    }
    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
    fn kubelet_token(&self, node: &str) -> PathBuf {
        self.dir.join(format!("kubelet-{node}.token"))
    }
}

/// `--dir` as an absolute path: from the repository's root when relative,
/// symlinks resolved where it exists (`up` creates it first).
fn resolve_dir(repo: &Path, given: Option<&Path>, create: bool) -> Result<PathBuf> {
    let dir = match given {
        Some(d) => repo.join(d),
        None => {
            let base = std::env::var_os("XDG_RUNTIME_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/tmp"));
            base.join("gpu-driver-cluster")
        }
    };
    if create {
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    }
    match std::fs::canonicalize(&dir) {
        Ok(d) => Ok(d),
        Err(_) => Ok(std::path::absolute(&dir)?),
    }
}

fn layout(repo: &Path, o: &Opts, create: bool) -> Result<Layout> {
    let dir = resolve_dir(repo, o.dir.as_deref(), create)?;
    Ok(Layout::new(dir, o.kubelet.is_some()))
}

pub fn run(repo: &Path, cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Up(o) => up::up(repo, &layout(repo, &o, true)?, &o),
        Cmd::Down(o) => down(&layout(repo, &o, false)?),
        Cmd::Status(o) => {
            if !status(&layout(repo, &o, false)?, true) {
                use std::io::Write as _;
                std::io::stdout().flush()?;
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Watch { pid, dir } => {
            // Waits as long as the watched process lives: that is the point.
            while process::exists(pid) {
                std::thread::sleep(Duration::from_secs(1));
            }
            down(&Layout::new(dir, false))
        }
    }
}

/// Prints each component's state (when `print`); whether all run.
fn status(l: &Layout, print: bool) -> bool {
    let mut all = true;
    for c in &l.components {
        let pid = process::read_pid(&l.pid_file(c)).filter(|_| process::alive(l, c));
        match pid {
            Some(pid) if print => println!("{c}: running (pid {pid})"),
            Some(_) => {}
            None => {
                all = false;
                if print {
                    println!("{c}: stopped");
                }
            }
        }
    }
    if print && l.kubeconfig().is_file() {
        println!("kubeconfig: {}", l.kubeconfig().display());
    }
    all
}

/// Stops the watchdog and the components (reverse order), then removes
/// the directory; a directory without our marker is left alone.
fn down(l: &Layout) -> Result<()> {
    if !l.marker().is_file() {
        eprintln!("no cluster in {}", l.dir.display());
        return Ok(());
    }
    // The watchdog, unless it is the process running this down; only a
    // process that still runs our watch (a recycled pid runs another).
    let wd = l.run().join("watchdog.pid");
    if let Some(pid) = process::read_pid(&wd) {
        let me = std::process::id();
        let ours = process::cmdline(pid)
            .windows(2)
            .any(|w| w[0] == "cluster" && w[1] == "watch");
        if pid != me && pid != std::os::unix::process::parent_id() && ours {
            process::term(pid);
        }
    }
    let _ = std::fs::remove_file(&wd);
    for c in l.components.iter().rev() {
        process::stop(l, c);
    }
    std::fs::remove_dir_all(&l.dir)
        .map_err(|e| anyhow::anyhow!("removing {}: {e}", l.dir.display()))?;
    eprintln!("cluster in {} stopped and removed", l.dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        assert!(node_name("gpu-node-1").is_ok());
        assert!(node_name("a").is_ok());
        for bad in ["", "-a", "a-", "A", "a_b", "a.b"] {
            assert!(node_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kubelet_clusters_run_no_kwok() {
        let l = Layout::new(PathBuf::from("/nonexistent"), true);
        assert!(!l.components.contains(&"kwok"));
        let l = Layout::new(PathBuf::from("/nonexistent"), false);
        assert_eq!(l.components.last(), Some(&"kwok"));
    }
}
