//! `cargo xtask bench …`: the benchmarks behind scripts/bench-*. Not tests:
//! each measures one part of the project against its target and prints the
//! figures side by side with their ratios (docs/benchmarks.md).
//!
//! This module holds what they share: stage lines, loopback ports, the S3
//! server, timing under GNU time, medians and the tables' words.

use std::ffi::OsStr;
use std::fs::File;
use std::hash::{BuildHasher as _, Hasher as _};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{cmd, show};
use crate::pyjson::J;
use crate::stages::Stage;

mod artifact;
mod build;
mod cache;
mod exporter;
mod fetch;
mod guard;
mod operator;
mod root;

use guard::Cleanup;

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// The installer's `build` against a bare `make modules` of the same
    /// tree in a builder root (scripts/bench-build).
    Build(build::Args),
    /// `build` on an artifact-cache hit against a compile of the same key,
    /// S3 on loopback (scripts/bench-cache).
    Cache(cache::Args),
    /// A node's read of a cached artifact against curl + sha256sum + zstd
    /// (scripts/bench-artifact).
    Artifact(artifact::Args),
    /// The operator on a local control plane with simulated nodes, its
    /// rolling upgrade and a naive baseline (scripts/bench-operator).
    Operator(operator::Args),
    /// The exporter's memory, scrape time and CPU (scripts/bench-exporter).
    Exporter(exporter::Args),
    /// The installer's `fetch` against curl (scripts/bench-fetch).
    Fetch(fetch::Args),
}

pub fn run(repo: &Path, c: Cmd) -> Result<()> {
    let cleanup = Cleanup::new()?;
    let mut stage = Stage::new(repo);
    match c {
        Cmd::Build(a) => build::bench(repo, &cleanup, &mut stage, &a),
        Cmd::Cache(a) => cache::bench(repo, &cleanup, &mut stage, &a),
        Cmd::Artifact(a) => artifact::bench(repo, &cleanup, &mut stage, &a),
        Cmd::Operator(a) => operator::bench(repo, &cleanup, &mut stage, &a),
        Cmd::Exporter(a) => exporter::bench(repo, &cleanup, &a),
        Cmd::Fetch(a) => fetch::bench(repo, &cleanup, &mut stage, &a),
    }
}

/// Whether something listens on loopback `port`.
fn in_use(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
}

/// The first of `n` consecutive loopback ports nobody listens on now
/// (others may run servers and clusters here too).
fn free_port(n: u16) -> Result<u16> {
    for _ in 0..200 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let base = 20000 + (h.finish() % 32000) as u16;
        if !(base..base + n).any(in_use) {
            return Ok(base);
        }
    }
    bail!("no {n} free loopback port(s) found")
}

/// Waits until `what` listens on loopback `port` (10 s at the most).
fn wait_listening(port: u16, what: &str) -> Result<()> {
    for _ in 0..100 {
        if in_use(port) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{what} did not listen on 127.0.0.1:{port} within 10 s")
}

/// The S3 test server's credentials.
const S3_KEY_ID: &str = "bench";
const S3_SECRET: &str = "bench-secret-key";

/// s3s-fs (`cargo xtask tool s3-server`) serving `store` on a free
/// loopback port, stopped at the end; returns the port.
fn s3_server(cleanup: &Cleanup, store: &Path) -> Result<u16> {
    let s3 = crate::tools::s3_server(&crate::cache::Cache::resolve()?)?;
    let port = free_port(1)?;
    let child = cmd(&s3)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", S3_KEY_ID, "--secret-key", S3_SECRET])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", s3.display()))?;
    cleanup.stop(child);
    wait_listening(port, "the S3 server")?;
    Ok(port)
}

/// A fresh directory `<dir>/<prefix>XXXXXX`, removed at the end.
fn scratch(cleanup: &Cleanup, dir: &Path, prefix: &str) -> Result<PathBuf> {
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(dir)
        .with_context(|| format!("making a directory in {}", dir.display()))?
        .keep();
    cleanup.remove(&d);
    Ok(d)
}

/// `program` under GNU time, which reports the command's own peak RSS
/// (Linux carries ru_maxrss across exec, so a child of this process would
/// report this one's) in the file `rss`. Add the arguments, run it with
/// [`timed`].
fn under_time(rss: &Path, program: impl AsRef<OsStr>) -> Command {
    let mut t = cmd("/usr/bin/time");
    t.args(["-f", "%M", "-o"]).arg(rss).arg(program);
    t
}

/// Runs a command of [`under_time`]; its peak RSS in KiB.
fn timed(c: &mut Command, rss: &Path) -> Result<u64> {
    let st = c
        .status()
        .with_context(|| format!("starting {}", show(c)))?;
    if !st.success() {
        bail!("{} failed ({st})", show(c));
    }
    let mut text = String::new();
    File::open(rss)
        .and_then(|f| f.take(4096).read_to_string(&mut text))
        .with_context(|| format!("reading {}", rss.display()))?;
    parse_rss(&text)
}

/// The peak RSS (KiB) in GNU time's `-f %M` output: its last line (a
/// failed command's status line comes before it).
fn parse_rss(text: &str) -> Result<u64> {
    let last = text.trim().lines().last().unwrap_or_default().trim();
    last.parse()
        .with_context(|| format!("no peak RSS in GNU time's output {text:?}"))
}

/// At most the last `n` lines of a log (its last 64 KiB read).
fn tail(path: &Path, n: usize) -> String {
    let mut buf = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let _ = f.take(64 * 1024).read_to_end(&mut buf);
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `statistics.median`.
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median of wall times in ms, in seconds.
fn median_s(ms: &[u64]) -> f64 {
    median(&ms.iter().map(|&m| m as f64).collect::<Vec<_>>()) / 1000.0
}

/// Milliseconds since `t`, as the scripts counted them.
fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

/// ` (median of N)` where more than one run was timed.
fn median_of(runs: usize) -> String {
    if runs > 1 {
        format!(" (median of {runs})")
    } else {
        String::new()
    }
}

/// Whether a target was met, as the tables say it.
fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

/// `k.removesuffix('Seconds') v:.1f s, …` of a result's timings.
fn steps(timings: &J) -> String {
    match timings {
        J::Obj(kv) => kv
            .iter()
            .filter_map(|(k, v)| {
                let v = v.as_f64()?;
                Some(format!(
                    "{} {v:.1} s",
                    k.strip_suffix("Seconds").unwrap_or(k)
                ))
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => String::new(),
    }
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, f);
        } else {
            f(&p);
        }
    }
}

/// A failed command's error: what ran, how it ended, its log's tail.
fn failed(c: &Command, st: std::process::ExitStatus, log: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{} failed ({st}); the end of {}:\n{}",
        show(c),
        log.display(),
        tail(log, 30)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_as_python() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median_s(&[1500, 2500]), 2.0);
    }

    #[test]
    fn timings_as_steps() -> Result<()> {
        let t = J::parse(r#"{"extractSeconds": 1.25, "compileSeconds": 130, "note": "x"}"#)?;
        assert_eq!(steps(&t), "extract 1.2 s, compile 130.0 s");
        Ok(())
    }

    #[test]
    fn peak_rss_from_gnu_time() -> Result<()> {
        assert_eq!(parse_rss("11264\n")?, 11264);
        assert_eq!(
            parse_rss("Command exited with non-zero status 1\n4096\n")?,
            4096
        );
        assert!(parse_rss("").is_err());
        Ok(())
    }

    #[test]
    fn tails_a_log() -> Result<()> {
        let d = tempfile::tempdir()?;
        let p = d.path().join("log");
        std::fs::write(&p, "a\nb\nc\n")?;
        assert_eq!(tail(&p, 2), "b\nc");
        assert_eq!(tail(&d.path().join("none"), 2), "");
        Ok(())
    }
}
