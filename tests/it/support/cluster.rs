//! A private, real Kubernetes control plane for integration tests: etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler and KWOK, started
//! by `scripts/local-cluster up` in a temporary directory on free loopback
//! ports, and stopped (`down`) when the [`Cluster`] is dropped. A watchdog
//! started by the script also stops it once the test process has exited, so
//! a panicking or killed test leaves nothing running; that is what makes
//! [`Cluster::shared`] (never dropped) safe.
//!
//! Binaries: the tools file's `k8sBin` (from `cargo xtask tool k8s`), else the
//! cached build of the current wrapper modules if there is one. Without
//! either the tests fail; a developer may skip them with "cluster" in the
//! file's `skip`, except under `CI=true`.
//!
//! KWOK manages every Node: create a Node object and it turns Ready (any
//! `status.nodeInfo` given at creation is kept). Pods bound to a node
//! (`spec.nodeName`, or through the scheduler) run; a Job's pods complete,
//! with the exit code and termination message of the pod annotations
//! [`EXIT_CODE`] and [`TERMINATION_MESSAGE`] (see tools/k8s/stages).

#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Pod annotation: the exit code of every container of a completing Job pod
/// (default "0"; non-zero makes the pod Failed).
pub const EXIT_CODE: &str = "sim.gpu-driver.gardenlinux.io/exit-code";
/// Pod annotation: `state.terminated.message` of every container.
pub const TERMINATION_MESSAGE: &str = "sim.gpu-driver.gardenlinux.io/termination-message";
/// Pod annotation: "true" keeps a Job pod Running until it changes.
pub const HOLD: &str = "sim.gpu-driver.gardenlinux.io/hold";

/// How the simulated Job pods finish.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JobPods {
    /// Complete shortly after they run (unless [`HOLD`] is "true").
    #[default]
    Auto,
    /// Complete only once they carry [`EXIT_CODE`]: the test plays the
    /// installer and patches the result in when it has seen the pod.
    Manual,
}

/// What a cluster is started with.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub job_pods: JobPods,
    /// Log every API write to an audit log ([`Cluster::writes`]).
    pub audit: bool,
    /// Run the DaemonSet controller (KWOK's nodes get DaemonSet pods).
    pub daemonsets: bool,
}

/// One write request, from the apiserver's audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiWrite {
    pub user_agent: String,
    /// create, update, patch, delete, deletecollection
    pub verb: String,
    /// e.g. "nodes", "jobs", "events"
    pub resource: String,
    /// e.g. "status", or empty
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The HTTP status code of the answer.
    pub code: u16,
}

pub struct Cluster {
    /// The state directory (certificates, logs/, kubeconfig).
    pub dir: PathBuf,
    /// Admin kubeconfig (a bearer token in group system:masters).
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:PORT`
    pub server: String,
    /// The admin bearer token.
    pub token: String,
    /// PEM file of the CA that signed the apiserver's serving certificate.
    pub ca_file: PathBuf,
    /// The directory of the binaries (kubectl is there too).
    pub bin: PathBuf,
    /// The apiserver's audit log of writes, when started with `audit`.
    pub audit_log: Option<PathBuf>,
    _tmp: Option<tempfile::TempDir>,
}

fn repo() -> PathBuf {
    super::repo_root().to_path_buf()
}

const HOW_TO_GET_BINS: &str = "\
cluster tests need a real control plane: run `cargo xtask test` (or `scripts/test`), which \
writes GPU_DRIVER_TOOLS with `k8sBin` (`cargo xtask tool k8s` builds etcd, kube-apiserver, \
kube-controller-manager, kube-scheduler, kubectl and kwok from the Go module proxy once, \
~30 min cold on 2 cores; see docs/local-cluster.md). To skip these tests on purpose outside \
CI, put \"cluster\" in the tools file's `skip`.";

const BINARIES: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
];

fn has_binaries(dir: &Path) -> bool {
    BINARIES.iter().all(|b| dir.join(b).is_file())
}

/// The binaries' directory: the tools file's `k8sBin`, else a finished cached
/// build for the current wrapper modules. `None` when neither exists and
/// skipping was asked for outside CI; panics otherwise.
pub fn bin_dir() -> Option<PathBuf> {
    let tools = super::tools::tools();
    if let Some(d) = tools.k8s_bin() {
        assert!(
            has_binaries(&d),
            "k8sBin {} lacks one of {BINARIES:?}. {HOW_TO_GET_BINS}",
            d.display()
        );
        return Some(d);
    }
    if let Some(d) = cached_bin_dir() {
        return Some(d);
    }
    if tools.skipped(super::tools::Group::Cluster) {
        eprintln!("skipped: the tools file's skip holds \"cluster\" and no k8s binaries");
        return None;
    }
    panic!("{HOW_TO_GET_BINS}");
}

/// The cached k8s binaries of the current wrapper modules, when a build of
/// them has finished (never compiled here: that takes 20 minutes and more).
fn cached_bin_dir() -> Option<PathBuf> {
    let d = super::tools::xtask_tool("k8s", &["--cached"]).ok()?;
    has_binaries(&d).then_some(d)
}

/// A base port N with N..N+5 all free on loopback now, below Linux's
/// ephemeral range (32768 and up), where client connections can't take them.
fn free_port_base() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    for _ in 0..100 {
        // RandomState is seeded randomly per instance: a random number.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let base = 20000 + (h.finish() % 12000) as u16;
        if (base..base + 6).all(|q| TcpListener::bind(("127.0.0.1", q)).is_ok()) {
            return base;
        }
    }
    panic!("no 6 consecutive free loopback ports found in 20000..32000");
}

impl Cluster {
    /// Starts a private cluster whose Job pods complete by themselves.
    /// `None`: no binaries and skipping was asked for (see [`bin_dir`]).
    pub fn start() -> Option<Cluster> {
        Self::start_with(JobPods::Auto)
    }

    pub fn start_with(job_pods: JobPods) -> Option<Cluster> {
        Self::start_with_options(Options {
            job_pods,
            ..Options::default()
        })
    }

    pub fn start_with_options(opts: Options) -> Option<Cluster> {
        let bin = bin_dir()?;
        let mut last_err = String::new();
        // A port taken between the probe and the bind fails `up`: retry.
        for attempt in 1..=3 {
            let tmp = tempfile::Builder::new()
                .prefix("gpu-driver-cluster-")
                .tempdir()
                .expect("temp dir");
            match Self::up(&bin, tmp.path(), opts) {
                Ok(mut c) => {
                    c._tmp = Some(tmp);
                    return Some(c);
                }
                Err(e) => {
                    eprintln!("cluster start attempt {attempt} failed: {e}");
                    last_err = e;
                }
            }
        }
        panic!("could not start a local cluster: {last_err}");
    }

    /// One cluster for the whole test process, started on first use and
    /// stopped by the watchdog when the process exits. Tests sharing it must
    /// not assume they are alone (use own namespaces, node names, labels).
    pub fn shared() -> Option<&'static Cluster> {
        static SHARED: OnceLock<Option<Cluster>> = OnceLock::new();
        SHARED.get_or_init(Self::start).as_ref()
    }

    fn up(bin: &Path, dir: &Path, opts: Options) -> Result<Cluster, String> {
        let started = Instant::now();
        let mut cmd = Command::new(repo().join("scripts/local-cluster"));
        cmd.arg("up");
        if opts.audit {
            cmd.arg("--audit");
        }
        if opts.daemonsets {
            cmd.arg("--daemonsets");
        }
        let out = cmd
            .arg("--dir")
            .arg(dir)
            .arg("--port-base")
            .arg(free_port_base().to_string())
            .arg("--job-pods")
            .arg(match opts.job_pods {
                JobPods::Auto => "auto",
                JobPods::Manual => "manual",
            })
            .arg("--watch-pid")
            .arg(std::process::id().to_string())
            .arg("--k8s-bin")
            .arg(bin)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running scripts/local-cluster: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "scripts/local-cluster up failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let env = fs::read_to_string(dir.join("cluster.env"))
            .map_err(|e| format!("reading cluster.env: {e}"))?;
        let get = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .map(str::to_owned)
                .ok_or_else(|| format!("cluster.env lacks {k}"))
        };
        let c = Cluster {
            dir: dir.to_path_buf(),
            kubeconfig: PathBuf::from(get("KUBECONFIG")?),
            server: get("SERVER")?,
            token: fs::read_to_string(get("TOKEN_FILE")?).map_err(|e| e.to_string())?,
            ca_file: PathBuf::from(get("CA_FILE")?),
            bin: PathBuf::from(get("BIN")?),
            audit_log: Some(get("AUDIT_LOG")?)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            _tmp: None,
        };
        eprintln!(
            "local cluster up at {} in {:.1}s (state in {})",
            c.server,
            started.elapsed().as_secs_f64(),
            c.dir.display()
        );
        Ok(c)
    }

    /// The CA certificate (PEM), for clients that take it as data.
    pub fn ca_pem(&self) -> Vec<u8> {
        fs::read(&self.ca_file).expect("CA file")
    }

    /// An HTTPS client (rustls with ring) that trusts the cluster's CA.
    pub fn agent(&self) -> reqwest::blocking::Client {
        let mut roots = rustls::RootCertStore::empty();
        let certs = gpu_driver_installer::tls::pem_certificates(&self.ca_pem()).expect("CA PEM");
        roots.add_parsable_certificates(certs);
        let tls = gpu_driver_installer::tls::client_config(roots).expect("TLS config");
        reqwest::blocking::Client::builder()
            .tls_backend_preconfigured(tls)
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("HTTP client")
    }

    /// GET `path` on the apiserver as admin: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        let resp = self
            .agent()
            .get(format!("{}{path}", self.server))
            .header("Authorization", format!("Bearer {}", self.token))
            .send()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = resp.status().as_u16();
        let body = resp.text().unwrap_or_default();
        (status, body)
    }

    /// Runs the cluster's kubectl with this kubeconfig, optionally feeding
    /// `stdin`.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(self.bin.join("kubectl"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running kubectl");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .expect("kubectl stdin");
        }
        child.wait_with_output().expect("kubectl")
    }

    /// kubectl ARGS; panics unless it succeeds; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_in(args, None)
    }

    /// `kubectl apply -f -` of the given YAML or JSON.
    pub fn apply(&self, manifest: &str) -> String {
        self.kubectl_in(&["apply", "-f", "-"], Some(manifest))
    }

    fn kubectl_in(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_output(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("kubectl output is UTF-8")
    }

    /// Polls `kubectl get ARGS -o jsonpath=JSONPATH` until it prints
    /// `want`; panics with the last value after `timeout`.
    pub fn wait_for(&self, args: &[&str], jsonpath: &str, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let jp = format!("jsonpath={jsonpath}");
        let mut full: Vec<&str> = vec!["get"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", &jp]);
        loop {
            let out = self.kubectl_output(&full, None);
            let got = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && got == want {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out after {timeout:?}: kubectl {full:?} gave {got:?} ({}), want {want:?}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Every write the apiserver has answered so far, oldest first (needs
    /// [`Options::audit`]). Count a client's by its user agent, e.g.
    /// `c.writes().iter().filter(|w| w.user_agent.starts_with("gpu-driver-operator"))`.
    pub fn writes(&self) -> Vec<ApiWrite> {
        let path = self
            .audit_log
            .as_ref()
            .expect("writes() needs a cluster started with Options { audit: true, .. }");
        let log = fs::read_to_string(path).unwrap_or_default();
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        log.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .map(|e| ApiWrite {
                user_agent: s(&e["userAgent"]),
                verb: s(&e["verb"]),
                resource: s(&e["objectRef"]["resource"]),
                subresource: s(&e["objectRef"]["subresource"]),
                namespace: s(&e["objectRef"]["namespace"]),
                name: s(&e["objectRef"]["name"]),
                code: e["responseStatus"]["code"].as_u64().unwrap_or_default() as u16,
            })
            .collect()
    }

    /// The tail of a component's log (etcd, kube-apiserver, ...), for
    /// failure messages.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let log = fs::read_to_string(self.dir.join("logs").join(format!("{component}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let status = Command::new(repo().join("scripts/local-cluster"))
            .arg("down")
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!(
                "warning: scripts/local-cluster down --dir {} failed: {status:?}",
                self.dir.display()
            );
        }
    }
}
