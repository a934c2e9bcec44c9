//! `up`: the files, then each component started and polled until it
//! answers, then the watchdog; a failure stops what was started.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::config::{self, write_file};
use super::process::{self, alive, check_interrupted, output, spawn_detached};
use super::{JobPods, Layout, Opts, down, status};
use crate::cmd::{cmd, is_executable};
use crate::stages::Stage;

/// The controllers a simulated cluster needs (no node lifecycle: simulated
/// nodes are never tainted or evicted).
const CONTROLLERS: &str = "job-controller,ttl-after-finished-controller,\
garbage-collector-controller,namespace-controller,serviceaccount-controller,\
serviceaccount-token-controller,deployment-controller,replicaset-controller,\
pod-garbage-collector-controller,root-ca-certificate-publisher-controller,\
disruption-controller";

struct Ports {
    api: u16,
    etcd: u16,
    peer: u16,
    kcm: u16,
    sched: u16,
    kwok: u16,
}

impl Ports {
    fn new(base: u16) -> Self {
        Self {
            api: base,
            etcd: base + 1,
            peer: base + 2,
            kcm: base + 3,
            sched: base + 4,
            kwok: base + 5,
        }
    }
}

pub fn up(repo: &Path, l: &Layout, o: &Opts) -> Result<()> {
    let dir = l.dir.display();
    if l.marker().is_file() {
        if status(l, false) {
            eprintln!("cluster already up in {dir}");
            println!("{}", l.kubeconfig().display());
            return Ok(());
        }
        bail!(
            "a stopped or broken cluster is in {dir}; run: scripts/local-cluster down --dir {dir}"
        );
    }
    if std::fs::read_dir(&l.dir)?.next().is_some() {
        bail!("{dir} is not empty and holds no cluster; refusing to use it");
    }
    crate::apt::ensure(&[&[("openssl", "openssl"), ("curl", "curl")]])?;
    std::fs::write(l.marker(), "")?;
    if let Some(node) = &o.kubelet {
        std::fs::write(l.dir.join("kubelet.node"), format!("{node}\n"))?;
    }
    std::fs::set_permissions(&l.dir, std::fs::Permissions::from_mode(0o700))?;
    for d in [l.run(), l.pki(), l.logs(), l.dir.join("etcd")] {
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    // A failed up leaves nothing running, even when interrupted.
    process::catch_signals()?;
    let mut stage = Stage::new(repo);
    match start_all(repo, l, o, &mut stage) {
        Ok((server, bin)) => {
            stage.end();
            eprintln!(
                "cluster up: {server} (logs in {dir}/logs; stop with: scripts/local-cluster down --dir {dir})"
            );
            let kc = l.kubeconfig();
            eprintln!(
                "try: KUBECONFIG={} {}/kubectl get nodes",
                kc.display(),
                bin.display()
            );
            println!("{}", kc.display());
            Ok(())
        }
        Err(e) => {
            eprintln!("error: up failed ({e:#}); stopping what was started");
            print_log_tails(l);
            if !o.keep_failed {
                down(l)?;
            }
            Err(e.context("up failed"))
        }
    }
}

fn print_log_tails(l: &Layout) {
    let Ok(rd) = std::fs::read_dir(l.logs()) else {
        return;
    };
    let mut logs: Vec<PathBuf> = rd.filter_map(|e| Some(e.ok()?.path())).collect();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
    logs.sort();
    for p in logs {
        if p.metadata().is_ok_and(|m| m.len() > 0) {
            eprintln!("--- last lines of {}", p.display());
            eprintln!("{}", tail(&p, 20));
        }
    }
}

/// The last `n` lines of the file at `path` (from its last 64 KiB).
fn tail(path: &Path, n: usize) -> String {
    let mut buf = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)));
        let _ = f.take(64 << 10).read_to_end(&mut buf);
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Everything after the directory is set up; returns the server's URL and
/// the binaries' directory.
fn start_all(repo: &Path, l: &Layout, o: &Opts, stage: &mut Stage) -> Result<(String, PathBuf)> {
    let bin = binaries(repo, l, o, stage)?;
    let ports = Ports::new(o.port_base);
    let server = format!("https://127.0.0.1:{}", ports.api);
    stage.start("certificates and keys (openssl)");
    config::certificates(l)?;
    let token = config::tokens(l, o.kubelet.as_deref())?;
    let ca_file = l.pki().join("ca.crt");
    let ca = std::fs::read(&ca_file).with_context(|| format!("reading {}", ca_file.display()))?;
    let kc = config::kubeconfig(&server, &ca, &token);
    write_file(&l.kubeconfig(), kc.as_bytes(), 0o600)?;
    // KWOK's stages: tools/k8s/stages, with the manual Job-pod completion
    // if asked.
    let kwok = config::kwok_config(
        &repo.join("tools/k8s/stages"),
        o.job_pods == JobPods::Manual,
    )?;
    write_file(&l.dir.join("kwok.yaml"), kwok.as_bytes(), 0o644)?;

    stage.start(&format!("etcd (127.0.0.1:{})", ports.etcd));
    start(l, &bin, "etcd", etcd_args(l, &ports))?;
    let health = format!("http://127.0.0.1:{}/health", ports.etcd);
    wait_for(l, "etcd", 60, &health, &[], etcd_healthy)?;

    if o.audit {
        let policy = l.dir.join("audit-policy.yaml");
        write_file(&policy, config::AUDIT_POLICY.as_bytes(), 0o644)?;
    }
    stage.start(&format!("kube-apiserver ({server})"));
    start(l, &bin, "kube-apiserver", apiserver_args(l, o, &ports))?;
    let pki = l.pki();
    let cacert = ca_file.to_string_lossy().into_owned();
    let header = format!("@{}", pki.join("auth-header").display());
    let readyz = format!("{server}/readyz");
    let auth = ["--cacert", cacert.as_str(), "-H", header.as_str()];
    wait_for(l, "kube-apiserver", 120, &readyz, &auth, answers_ok)?;

    stage.start("kube-controller-manager, kube-scheduler, kwok");
    let kubeconfig = l.kubeconfig();
    start(l, &bin, "kube-controller-manager", kcm_args(l, o, &ports))?;
    start(
        l,
        &bin,
        "kube-scheduler",
        scheduler_args(&kubeconfig, &ports),
    )?;
    if o.kubelet.is_none() {
        #[rustfmt::skip]
        let args = vec![format!("--kubeconfig={}", kubeconfig.display()),
            format!("--config={}", l.dir.join("kwok.yaml").display()),
            format!("--server-address=127.0.0.1:{}", ports.kwok)];
        start(l, &bin, "kwok", args)?;
    }
    let healthz = |p: u16| format!("https://127.0.0.1:{p}/healthz");
    wait_for(
        l,
        "kube-controller-manager",
        60,
        &healthz(ports.kcm),
        &["-k"],
        answers_ok,
    )?;
    wait_for(
        l,
        "kube-scheduler",
        60,
        &healthz(ports.sched),
        &["-k"],
        answers_ok,
    )?;
    if o.kubelet.is_none() {
        let url = format!("http://127.0.0.1:{}/healthz", ports.kwok);
        wait_for(l, "kwok", 60, &url, &[], answers_ok)?;
    }
    if let Some(pid) = o.watch_pid {
        watchdog(l, pid)?;
    }
    write_env(l, o, &server, &bin, ports.api)?;
    Ok((server, bin))
}

/// The binaries' directory: --k8s-bin, else the cached build (built now if
/// there is none); every component must be there.
fn binaries(repo: &Path, l: &Layout, o: &Opts, stage: &mut Stage) -> Result<PathBuf> {
    let bin = match &o.k8s_bin {
        Some(d) => {
            let d = repo.join(d);
            std::fs::canonicalize(&d).with_context(|| format!("--k8s-bin {}", d.display()))?
        }
        None => {
            stage.start("binaries (cargo xtask tool k8s)");
            crate::tools::k8s(repo, &crate::cache::Cache::resolve()?, false)?
        }
    };
    for c in &l.components {
        if !is_executable(&bin.join(c)) {
            let b = bin.display();
            bail!("{b}/{c} missing (--k8s-bin {b})");
        }
    }
    Ok(bin)
}

/// Starts bin/NAME in its own process group, logging to logs/NAME.log, and
/// records its pid in run/NAME.pid.
fn start(l: &Layout, bin: &Path, name: &str, args: Vec<String>) -> Result<()> {
    let pid = spawn_detached(cmd(bin.join(name)).args(args), Some(&l.log(name)))?;
    write_file(&l.pid_file(name), format!("{pid}\n").as_bytes(), 0o644)
}

/// What a component's health endpoint says when it is ready.
fn answers_ok(body: &str) -> bool {
    body.starts_with("ok")
}

/// etcd's /health: `{"health":"true",...}`.
fn etcd_healthy(body: &str) -> bool {
    body.contains(r#""health":"true""#)
}

/// The body of a GET (empty when it fails: not ready yet).
fn curl(url: &str, args: &[&str]) -> String {
    let mut c = cmd("curl");
    c.args(["-fsS", "--max-time", "2"]).args(args).arg(url);
    output(&mut c, Duration::from_secs(10)).unwrap_or_default()
}

/// Polls `url` until `ready` says so, for at most `secs`; fails early, with
/// the tail of its log, when the component has exited.
fn wait_for(
    l: &Layout,
    name: &str,
    secs: u64,
    url: &str,
    args: &[&str],
    ready: fn(&str) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ready(&curl(url, args)) {
        check_interrupted()?;
        // Looked at twice, apart: one look can land in a process's exec.
        let gone = !alive(l, name) && {
            std::thread::sleep(Duration::from_millis(500));
            !alive(l, name)
        };
        if gone {
            eprintln!("error: {name} exited; its log:");
            eprintln!("{}", tail(&l.log(name), 30));
            bail!("{name} exited");
        }
        if Instant::now() >= deadline {
            bail!("{name} not ready after {secs}s at {url}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// Runs `down` once `pid` has gone, even if it was killed: this binary
/// again, in a process group of its own, outliving `up`.
fn watchdog(l: &Layout, pid: u32) -> Result<()> {
    let exe = std::env::current_exe().context("finding the xtask binary")?;
    let mut c = cmd(exe);
    c.args(["cluster", "watch", "--pid", &pid.to_string(), "--dir"])
        .arg(&l.dir);
    let wd = spawn_detached(&mut c, None)?;
    write_file(
        &l.run().join("watchdog.pid"),
        format!("{wd}\n").as_bytes(),
        0o644,
    )
}

fn write_env(l: &Layout, o: &Opts, server: &str, bin: &Path, api_port: u16) -> Result<()> {
    let audit = l.dir.join("audit.log");
    let kubelet_token = o.kubelet.as_deref().map(|n| l.kubelet_token(n));
    let env = config::Env {
        kubeconfig: &l.kubeconfig(),
        server,
        token_file: &l.dir.join("token"),
        ca_file: &l.pki().join("ca.crt"),
        bin,
        job_pods: o.job_pods.as_str(),
        audit_log: o.audit.then_some(audit.as_path()),
        api_port,
        kubelet: o.kubelet.as_deref(),
        kubelet_token_file: kubelet_token.as_deref(),
    };
    write_file(&l.dir.join("cluster.env"), env.render().as_bytes(), 0o644)
}

fn etcd_args(l: &Layout, p: &Ports) -> Vec<String> {
    let client = format!("http://127.0.0.1:{}", p.etcd);
    let peer = format!("http://127.0.0.1:{}", p.peer);
    #[rustfmt::skip]
    let args = vec![
        "--name".into(), "local".into(),
        "--data-dir".into(), l.dir.join("etcd").display().to_string(),
        "--listen-client-urls".into(), client.clone(),
        "--advertise-client-urls".into(), client,
        "--listen-peer-urls".into(), peer.clone(),
        "--initial-advertise-peer-urls".into(), peer.clone(),
        "--initial-cluster".into(), format!("local={peer}"),
        "--unsafe-no-fsync".into(), "--quota-backend-bytes=4294967296".into(),
        "--log-level=warn".into(),
    ];
    args
}

/// TaintNodesByCondition would give every new Node a not-ready taint that
/// only a kubelet or the node-lifecycle controller removes; ServiceAccount
/// admission would make pods wait for the namespace's default
/// ServiceAccount. Neither helps simulated nodes (a real kubelet wants
/// ServiceAccount admission, and the Node authorizer). Privileged pods are
/// allowed: installer Jobs need them.
fn apiserver_args(l: &Layout, o: &Opts, p: &Ports) -> Vec<String> {
    let pki = |f: &str| l.pki().join(f).display().to_string();
    let (authz, disabled) = match o.kubelet {
        Some(_) => ("Node,RBAC", "TaintNodesByCondition"),
        None => ("RBAC", "TaintNodesByCondition,ServiceAccount"),
    };
    let mut a = vec![
        "--bind-address=127.0.0.1".to_string(),
        format!("--secure-port={}", p.api),
        "--advertise-address=127.0.0.1".into(),
        format!("--etcd-servers=http://127.0.0.1:{}", p.etcd),
        format!("--tls-cert-file={}", pki("apiserver.crt")),
        format!("--tls-private-key-file={}", pki("apiserver.key")),
        format!("--client-ca-file={}", pki("ca.crt")),
        format!("--token-auth-file={}", pki("tokens.csv")),
        format!("--authorization-mode={authz}"),
        "--anonymous-auth=true".into(),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        format!("--service-account-key-file={}", pki("sa.pub")),
        format!("--service-account-signing-key-file={}", pki("sa.key")),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
        "--endpoint-reconciler-type=none".into(),
        format!("--disable-admission-plugins={disabled}"),
        "--allow-privileged=true".into(),
        format!("--cert-dir={}", l.pki().display()),
        "--profiling=false".into(),
        "--event-ttl=1h".into(),
        "--max-requests-inflight=1000".into(),
        "--max-mutating-requests-inflight=500".into(),
    ];
    if o.audit {
        a.extend([
            format!(
                "--audit-policy-file={}",
                l.dir.join("audit-policy.yaml").display()
            ),
            format!("--audit-log-path={}", l.dir.join("audit.log").display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
            "--audit-log-maxsize=0".into(),
        ]);
    }
    a
}

/// Client rate limits are raised from the defaults (20 qps) so that 1000
/// Jobs don't queue behind the controllers' own throttling. With a real
/// kubelet, DaemonSets too (the exporter, NVIDIA's device plugin); on KWOK
/// only when asked, as the simulated nodes of every other test would
/// otherwise get the pods of the DaemonSets they apply.
fn kcm_args(l: &Layout, o: &Opts, p: &Ports) -> Vec<String> {
    let kc = l.kubeconfig().display().to_string();
    let mut controllers = CONTROLLERS.to_string();
    if o.kubelet.is_some() || o.daemonsets {
        controllers.push_str(",daemonset-controller");
    }
    vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", p.kcm),
        "--leader-elect=false".into(),
        format!("--controllers={controllers}"),
        format!(
            "--service-account-private-key-file={}",
            l.pki().join("sa.key").display()
        ),
        format!("--root-ca-file={}", l.pki().join("ca.crt").display()),
        "--use-service-account-credentials=false".into(),
        "--kube-api-qps=500".into(),
        "--kube-api-burst=1000".into(),
        "--concurrent-job-syncs=20".into(),
    ]
}

fn scheduler_args(kubeconfig: &Path, p: &Ports) -> Vec<String> {
    let kc = kubeconfig.display();
    vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", p.sched),
        "--leader-elect=false".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_answers() {
        assert!(etcd_healthy(r#"{"health":"true","reason":""}"#));
        assert!(!etcd_healthy(
            r#"{"health":"false","reason":"RAFT NO LEADER"}"#
        ));
        assert!(answers_ok("ok"));
        assert!(answers_ok("ok\n"));
        assert!(!answers_ok(""));
        assert!(!answers_ok(
            "[-]etcd failed: reason withheld\nreadyz check failed"
        ));
    }

    #[test]
    fn controllers_list() {
        assert!(!CONTROLLERS.contains(' '));
        assert_eq!(CONTROLLERS.split(',').count(), 11);
    }
}
