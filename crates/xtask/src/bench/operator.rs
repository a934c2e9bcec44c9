//! scripts/bench-operator: N simulated Garden Linux GPU nodes from nothing
//! to all ready (annotated and labelled) on a real control plane
//! (scripts/local-cluster, KWOK completing the Job pods with an installer
//! RunResult). Runs the watch-based operator, then the naive baseline
//! (examples/bench_operator/naive.rs: polls every node each second), each
//! on a fresh cluster, and reports convergence time, API writes and reads
//! per node (the apiserver's apiserver_request_total deltas) and the peak
//! RSS (VmHWM, reset when the phase starts) of the process the operator ran
//! in.
//!
//! Then (operator only; --no-upgrade leaves it out) a rolling upgrade of
//! the same nodes from 550.163.01 to 580.95.05 with maxUnavailable "10%":
//! timed until every node is Installed again for its new key, with that
//! phase's writes per node and the most nodes upgrading or cordoned at once
//! (a WARNING if more than maxUnavailable). Each phase has its own
//! --timeout; the upgrade also stops after 120 s without a change.
//!
//! A table on stderr; the last line on stdout:
//! `{"nodes":N,"convergeSeconds":…,"writesPerNode":…,"readsPerNode":…,
//! "peakRssMiB":…,"baseline":{"convergeSeconds":…,"writesPerNode":…,
//! "readsPerNode":…,"peakRssMiB":…},"upgrade":{"nodes":N,
//! "maxUnavailable":M,"seconds":…,"writesPerNode":…,"readsPerNode":…,
//! "maxConcurrent":K,"peakRssMiB":…}}` (null values where a case did not
//! run or did not converge; maxUnavailable is the node count the operator
//! allows, 10% of N, at least 1). Targets: 1000 nodes in ≤ 60 s with ≤ 5
//! writes per node.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};

use super::{Cleanup, Stage, free_port, scratch};
use crate::cmd::{cmd, read_last_line, run};
use crate::pyjson::J;

#[derive(clap::Args)]
pub struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    nodes: u32,
    /// Seconds each phase may take.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Leave out the naive baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Leave out the rolling upgrade.
    #[arg(long)]
    no_upgrade: bool,
    /// A release build of the benchmark (and the operator in it).
    #[arg(long)]
    release: bool,
}

/// The baseline's figures where it did not run.
const NO_BASELINE: &str =
    r#"{"convergeSeconds":null,"writesPerNode":null,"readsPerNode":null,"peakRssMiB":null}"#;

/// One phase's cluster and benchmark.
struct Phases<'a> {
    repo: &'a Path,
    a: &'a Args,
    bench: PathBuf,
    k8s_bin: PathBuf,
    cluster: PathBuf,
}

pub(super) fn bench(repo: &Path, cleanup: &Cleanup, stage: &mut Stage, a: &Args) -> Result<()> {
    stage.start("build");
    let mut b = cmd("cargo");
    b.current_dir(repo)
        .args(["build", "--locked"])
        .args(a.release.then_some("--release"))
        .args(["-p", "gpu-driver-operator", "--example", "bench_operator"]);
    run(&mut b)?;
    let dir = if a.release { "release" } else { "debug" };
    let target = crate::static_build::target_dir(repo)?;
    let k8s_bin = crate::tools::k8s(repo, &crate::cache::Cache::resolve()?, false)?;
    let state = scratch(cleanup, &std::env::temp_dir(), "tmp.")?;
    let p = Phases {
        repo,
        a,
        bench: target.join(dir).join("examples/bench_operator"),
        k8s_bin,
        cluster: state.join("cluster"),
    };
    cleanup.run(p.down());
    let op = if a.no_upgrade {
        stage.start(&format!("operator, {} nodes", a.nodes));
        p.one(&["--no-upgrade"])?
    } else {
        stage.start(&format!("operator, {} nodes, then the upgrade", a.nodes));
        p.one(&[])?
    };
    eprintln!("operator: {op}");
    let mut base = NO_BASELINE.to_string();
    if !a.no_baseline {
        stage.start(&format!("naive baseline, {} nodes", a.nodes));
        base = p.one(&["--naive"])?;
        eprintln!("baseline: {base}");
    }
    stage.end();
    operator_summary(&J::parse(&op)?, &J::parse(&base)?)
}

impl Phases<'_> {
    fn down(&self) -> std::process::Command {
        let mut c = cmd(self.repo.join("scripts/local-cluster"));
        c.arg("down").arg("--dir").arg(&self.cluster);
        c
    }

    /// A fresh cluster and one run of the benchmark with `flags`; its
    /// last line on stdout.
    fn one(&self, flags: &[&str]) -> Result<String> {
        let mut down = self.down();
        let null = std::process::Stdio::null;
        if let Ok(mut c) = down.stdout(null()).stderr(null()).spawn() {
            super::guard::wait_or_kill(&mut c, Duration::from_secs(120))?;
        }
        crate::cache::remove(&self.cluster)?;
        let port = free_port(6)?;
        let mut up = cmd(self.repo.join("scripts/local-cluster"));
        up.arg("up")
            .arg("--dir")
            .arg(&self.cluster)
            .args(["--port-base", &port.to_string(), "--k8s-bin"])
            .arg(&self.k8s_bin)
            .args(["--watch-pid", &std::process::id().to_string()]);
        let kubeconfig = read_last_line(&mut up).unwrap_or_default();
        if !Path::new(&kubeconfig).is_file() {
            bail!("scripts/local-cluster up failed");
        }
        read_last_line(
            cmd(&self.bench)
                .args(["--kubeconfig", &kubeconfig])
                .args(["--nodes", &self.a.nodes.to_string()])
                .args(["--timeout", &self.a.timeout.to_string()])
                .args(flags),
        )
    }
}

fn operator_summary(op: &J, base: &J) -> Result<()> {
    let up = op.get("upgrade");
    operator_table(op, base, up);
    if up.truthy() {
        upgrade_lines(up);
    }
    println!("{}", operator_json(op, base, up)?.dump_line(true));
    Ok(())
}

/// The table on stderr: the operator, its upgrade (if it ran one), the
/// baseline.
fn operator_table(op: &J, base: &J, up: &J) {
    eprintln!(
        "{:<10}{:>12}{:>13}{:>12}{:>10}{:>14}",
        "", "converge s", "writes/node", "reads/node", "at once", "peak RSS MiB"
    );
    let mut rows = vec![("operator", op.get("convergeSeconds"), op)];
    if up.truthy() {
        rows.push(("upgrade", up.get("seconds"), up));
    }
    rows.push(("baseline", base.get("convergeSeconds"), base));
    for (name, secs, r) in rows {
        let at_once = if name == "upgrade" {
            format!(
                "{}/{}",
                r.get("maxConcurrent").py_str(),
                r.get("maxUnavailable").py_str()
            )
        } else {
            String::new()
        };
        eprintln!(
            "{name:<10}{:>12}{:>13}{:>12}{at_once:>10}{:>14}",
            secs.py_str(),
            r.get("writesPerNode").py_str(),
            r.get("readsPerNode").py_str(),
            r.get("peakRssMiB").py_str()
        );
    }
}

/// The upgrade's own lines, and a warning where more nodes went at once
/// than maxUnavailable allows.
fn upgrade_lines(up: &J) {
    eprintln!(
        "upgrade: {}/{} nodes to driver {}; at once: {} upgrading or cordoned \
         (maxUnavailable {}), {} without the ready label",
        up.get("upgradedNodes").py_str(),
        up.get("nodes").py_str(),
        up.get("toVersion").py_str(),
        up.get("maxConcurrent").py_str(),
        up.get("maxUnavailable").py_str(),
        up.get("maxUnready").py_str()
    );
    let n = |k: &str| up.get(k).as_f64().unwrap_or(0.0);
    if n("maxConcurrent") > n("maxUnavailable") {
        eprintln!(
            "WARNING: {} nodes upgrading at once, more than maxUnavailable {}",
            up.get("maxConcurrent").py_str(),
            up.get("maxUnavailable").py_str()
        );
    }
}

/// `keys` of `from`, in that order (`None` where missing).
fn pick(from: &J, keys: &[&str]) -> Vec<(String, J)> {
    keys.iter()
        .map(|k| (k.to_string(), from.get(k).clone()))
        .collect()
}

/// The operator's result's `k`, which it must have.
fn required(op: &J, k: &str) -> Result<J> {
    if op.has(k) {
        Ok(op.get(k).clone())
    } else {
        bail!("the operator's result has no {k}")
    }
}

/// The JSON line on stdout.
fn operator_json(op: &J, base: &J, up: &J) -> Result<J> {
    let mut upgrade = vec![("nodes".to_string(), required(op, "nodes")?)];
    upgrade.extend(pick(
        up,
        &[
            "maxUnavailable",
            "seconds",
            "writesPerNode",
            "readsPerNode",
            "maxConcurrent",
            "peakRssMiB",
        ],
    ));
    let baseline = pick(
        base,
        &[
            "convergeSeconds",
            "writesPerNode",
            "readsPerNode",
            "peakRssMiB",
        ],
    );
    Ok(J::Obj(vec![
        ("nodes".into(), required(op, "nodes")?),
        ("convergeSeconds".into(), required(op, "convergeSeconds")?),
        ("writesPerNode".into(), required(op, "writesPerNode")?),
        ("readsPerNode".into(), op.get("readsPerNode").clone()),
        ("peakRssMiB".into(), op.get("peakRssMiB").clone()),
        ("baseline".into(), J::Obj(baseline)),
        ("upgrade".into(), J::Obj(upgrade)),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_line_keeps_the_keys_and_the_empty_baseline() -> Result<()> {
        let op = J::parse(
            r#"{"nodes":10,"convergeSeconds":3.5,"writesPerNode":3.0,"readsPerNode":1.2,
               "peakRssMiB":40.1,"upgrade":{"nodes":10,"maxUnavailable":1,"seconds":9.5,
               "writesPerNode":5.0,"readsPerNode":2.0,"maxConcurrent":1,"maxUnready":1,
               "upgradedNodes":10,"toVersion":"580.95.05","peakRssMiB":45.0}}"#,
        )?;
        let base = J::parse(NO_BASELINE)?;
        let j = operator_json(&op, &base, op.get("upgrade"))?;
        assert_eq!(
            j.dump_line(true),
            r#"{"nodes":10,"convergeSeconds":3.5,"writesPerNode":3.0,"readsPerNode":1.2,"peakRssMiB":40.1,"baseline":{"convergeSeconds":null,"writesPerNode":null,"readsPerNode":null,"peakRssMiB":null},"upgrade":{"nodes":10,"maxUnavailable":1,"seconds":9.5,"writesPerNode":5.0,"readsPerNode":2.0,"maxConcurrent":1,"peakRssMiB":45.0}}"#
        );
        Ok(())
    }
}
