//! scripts/bench-cache: wall time of the installer's `build` on an
//! artifact-cache hit against a compile of the same key, side by side, in
//! the same builder root, against a real S3 server on loopback (s3s-fs from
//! `cargo xtask tool s3-server`). Not a test: prints a Markdown table on
//! stdout. Target: a hit at least 10× faster. Needs root (chroot, mount).
//!
//! Each run uses a fresh prefix in the store: first `build` compiles
//! (cache Miss; the artifact and manifest are uploaded), then `build` of
//! the same key in a fresh output directory is a Hit, once with
//! --driver-version (as `run` does: no extraction) and once without (the
//! source is extracted to learn the version, the compile is skipped).
//!
//! Each `build` runs in a memory cgroup of its own (v2, or v1's memory
//! controller), so the table also gives its memory: the peak of anonymous
//! memory (sampled 10 times a second; what a Job's memory limit must hold,
//! page cache is reclaimed at the limit) and the cgroup's own peak with
//! page cache. docs/operator.md sizes the Jobs' memory from these figures.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::root::{self, Root, RootArgs};
use super::{Cleanup, S3_KEY_ID, S3_SECRET, Stage, failed, median_of, median_s, met, ms_since};
use super::{s3_server, scratch, steps};
use crate::cmd::cmd;
use crate::pyjson::J;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    root: RootArgs,
}

/// A cgroup hierarchy with a memory controller, and its version.
#[derive(Debug, PartialEq)]
struct CgBase {
    dir: PathBuf,
    v2: bool,
}

/// This process's memory cgroup: v2 when the unified hierarchy is
/// mounted, else v1's memory controller; `None` where neither is.
fn cg_base() -> Option<CgBase> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").is_file();
    if !v2 && !Path::new("/sys/fs/cgroup/memory").is_dir() {
        return None;
    }
    cg_path(&own, v2)
}

/// The cgroup directory of a process from its /proc/PID/cgroup.
fn cg_path(proc_cgroup: &str, v2: bool) -> Option<CgBase> {
    let rel = proc_cgroup.lines().find_map(|l| {
        let (id, rest) = l.split_once(':')?;
        let (ctrl, path) = rest.split_once(':')?;
        let ok = if v2 {
            id == "0" && ctrl.is_empty()
        } else {
            ctrl == "memory" && id.bytes().all(|b| b.is_ascii_digit())
        };
        ok.then(|| path.trim_start_matches('/').to_string())
    })?;
    let top = if v2 {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/memory"
    };
    Some(CgBase {
        dir: Path::new(top).join(rel),
        v2,
    })
}

/// Anonymous bytes charged to a cgroup, from its memory.stat.
fn anon_bytes(stat: &str, v2: bool) -> u64 {
    stat.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| {
            if v2 {
                *k == "anon"
            } else {
                *k == "rss" || *k == "rss_huge"
            }
        })
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

/// The cgroup's own peak with page cache, as its file says it.
fn cg_peak(cg: &Path, v2: bool) -> Result<String> {
    if v2 {
        Ok(std::fs::read_to_string(cg.join("memory.peak")).unwrap_or_else(|_| "0\n".into()))
    } else {
        let f = cg.join("memory.max_usage_in_bytes");
        std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))
    }
}

/// Writes the largest anonymous memory of `cg` to `out` 10 times a
/// second until `stop` or the cgroup is gone.
fn sample(cg: PathBuf, v2: bool, out: PathBuf, stop: Arc<AtomicBool>) {
    let mut max = 0;
    while cg.is_dir() && !stop.load(Ordering::Relaxed) {
        let a = std::fs::read_to_string(cg.join("memory.stat"))
            .map(|s| anon_bytes(&s, v2))
            .unwrap_or(0);
        if a > max {
            max = a;
            let _ = std::fs::write(&out, format!("{max}\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Bench<'a> {
    a: &'a RootArgs,
    root: Root,
    /// The root's /bench-cache.
    dir: PathBuf,
    port: u16,
    cg: Option<CgBase>,
}

pub(super) fn bench(repo: &Path, cleanup: &Cleanup, stage: &mut Stage, a: &Args) -> Result<()> {
    root::preflight()?;
    let binary = root::installer(repo, stage, a.root.binary.as_deref())?;
    stage.start("S3 server");
    let store = scratch(cleanup, &std::env::temp_dir(), "tmp.")?;
    std::fs::create_dir_all(store.join("bench"))?;
    let port = s3_server(cleanup, &store)?;
    let root = root::prepare(repo, cleanup, stage, &a.root, &binary, "bench-cache")?;
    let driver = root.driver(a.root.flavor)?;
    let b = Bench {
        a: &a.root,
        dir: root.path.join("bench-cache"),
        root,
        port,
        cg: cg_base(),
    };
    let (mut miss, mut hit, mut hitx) = (Vec::new(), Vec::new(), Vec::new());
    let dv = ["--driver-version", driver.as_str()];
    for i in 0..a.root.runs {
        let prefix = format!("run-{}-{i}", std::process::id());
        stage.start(&format!(
            "compile (cache miss) {}/{} -j{}",
            a.root.suite,
            a.root.flavor.name(),
            b.root.jobs
        ));
        miss.push(b.build("miss", &prefix, &dv)?);
        stage.start("cache hit (with --driver-version)");
        hit.push(b.build("hit", &prefix, &dv)?);
        stage.start("cache hit (without --driver-version: extracts)");
        hitx.push(b.build("hitx", &prefix, &[])?);
    }
    stage.end();
    cache_summary(&b, &driver, [&miss, &hit, &hitx])
}

impl Bench<'_> {
    /// A memory cgroup of its own for the run `name`, if one can be made.
    fn cgroup(&self, name: &str) -> Option<(PathBuf, bool)> {
        let base = self.cg.as_ref()?;
        let d = base
            .dir
            .join(format!("bench-cache-{}-{name}", std::process::id()));
        std::fs::create_dir(&d).ok()?;
        Some((d, base.v2))
    }

    /// One `build` with the cache, timed (ms), in its own memory cgroup
    /// where one can be made; its result stays in /bench-cache/NAME.json,
    /// its memory in NAME.anon and NAME.peak.
    fn build(&self, name: &str, prefix: &str, extra: &[&str]) -> Result<u64> {
        crate::cache::remove(&self.dir.join(name))?;
        let cg = self.cgroup(name);
        let stop = Arc::new(AtomicBool::new(false));
        let mut c = match &cg {
            // The child joins the cgroup itself before it execs chroot.
            Some((d, _)) => {
                let mut c = cmd("sh");
                c.args(["-c", r#"echo $$ >"$0/cgroup.procs" && exec "$@""#])
                    .arg(d)
                    .arg("chroot");
                c
            }
            None => cmd("chroot"),
        };
        let sampler = match &cg {
            Some((d, v2)) => {
                let anon = self.dir.join(format!("{name}.anon"));
                std::fs::write(&anon, "0\n")?;
                let (d, v2, stop) = (d.clone(), *v2, stop.clone());
                Some(std::thread::spawn(move || sample(d, v2, anon, stop)))
            }
            None => None,
        };
        let a = self.a;
        let log = self.dir.join(format!("log.{name}"));
        c.arg(&self.root.path)
            .env(
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            )
            .env("AWS_ACCESS_KEY_ID", S3_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", S3_SECRET)
            .env("AWS_REGION", "us-east-1")
            .args(["/gpu-driver-installer", "--log-level", "info", "--output"])
            .arg(format!("/bench-cache/{name}.json"))
            .args([
                "build",
                "--source",
                a.flavor.source(),
                "--kernel",
                &self.root.krel,
            ])
            .args(["--flavor", a.flavor.name(), "--out"])
            .arg(format!("/bench-cache/{name}"))
            .args(["--jobs", &self.root.jobs.to_string(), "--cache-url"])
            .arg(format!("s3://bench/{prefix}"))
            .arg("--allow-http")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        let t0 = Instant::now();
        let st = c.status();
        let ms = ms_since(t0);
        if let Some((d, v2)) = &cg {
            let peak = cg_peak(d, *v2);
            if std::fs::remove_dir(d).is_err() {
                std::thread::sleep(Duration::from_secs(1));
                let _ = std::fs::remove_dir(d);
            }
            stop.store(true, Ordering::Relaxed);
            std::fs::write(self.dir.join(format!("{name}.peak")), peak?)?;
        }
        if let Some(s) = sampler {
            let _ = s.join();
        }
        let st = st.with_context(|| format!("starting {}", crate::cmd::show(&c)))?;
        if !st.success() {
            let result = super::tail(&self.dir.join(format!("{name}.json")), 200);
            let e = failed(&c, st, &log);
            return Err(e.context(format!("build {name} failed; its result:\n{result}")));
        }
        Ok(ms)
    }
}

/// One run of bench-cache: the file stem of its result and memory figures,
/// the row's text, the cache outcome it must have, the bytes it moved
/// (status.cache's key, and which way), its wall time's decimals.
struct CacheRun {
    stem: &'static str,
    what: &'static str,
    outcome: &'static str,
    bytes: &'static str,
    way: &'static str,
    decimals: usize,
}

const CACHE_RUNS: [CacheRun; 3] = [
    CacheRun {
        stem: "miss",
        what: "compile of the key (`build`, cache Miss, then upload)",
        outcome: "Miss",
        bytes: "bytesUploaded",
        way: "up",
        decimals: 1,
    },
    CacheRun {
        stem: "hit",
        what: "cache hit, `--driver-version` given (as `run`)",
        outcome: "Hit",
        bytes: "bytesDownloaded",
        way: "down",
        decimals: 2,
    },
    CacheRun {
        stem: "hitx",
        what: "cache hit, version read from the source (extracts)",
        outcome: "Hit",
        bytes: "bytesDownloaded",
        way: "down",
        decimals: 2,
    },
];

/// The runs' result documents; an error where one's cache outcome is not
/// the run's.
fn cache_docs(dir: &Path) -> Result<Vec<J>> {
    let docs = CACHE_RUNS
        .iter()
        .map(|r| J::read(&dir.join(format!("{}.json", r.stem))))
        .collect::<Result<Vec<J>>>()?;
    for (r, doc) in CACHE_RUNS.iter().zip(&docs) {
        let got = doc.get("status").get("cache").get("outcome");
        if got.as_str() != Some(r.outcome) {
            bail!(
                "{} run had cache outcome {}, not {}: {}",
                r.stem,
                got.py_str(),
                r.outcome,
                doc.get("status").get("message").py_str()
            );
        }
    }
    Ok(docs)
}

/// The last run's memory (bytes -> MiB), anon and peak: two cells, "n/a"
/// without a cgroup.
fn cache_mem(dir: &Path, stem: &str) -> String {
    let num = |ext: &str| -> Option<f64> {
        // An empty file is 0 (no sample yet); a blank line is no figure.
        let t = std::fs::read_to_string(dir.join(format!("{stem}.{ext}"))).ok()?;
        if t.is_empty() {
            Some(0.0)
        } else {
            t.trim().parse::<i64>().ok().map(|v| v as f64)
        }
    };
    match (num("anon"), num("peak")) {
        (Some(a), Some(p)) => format!("{:.0} MiB | {:.0} MiB", a / 1048576.0, p / 1048576.0),
        _ => "n/a | n/a".into(),
    }
}

fn cache_summary(b: &Bench, driver: &str, ms: [&Vec<u64>; 3]) -> Result<()> {
    let docs = cache_docs(&b.dir)?;
    let secs = ms.map(|m| median_s(m));
    println!(
        "### bench-cache: {}/{}, driver {driver}, kernel {}, -j{}, S3 (s3s-fs) on loopback{}",
        b.a.suite,
        b.a.flavor.name(),
        b.root.krel,
        b.root.jobs,
        median_of(ms[0].len())
    );
    println!();
    println!(
        "| what | wall time | cache | bytes | peak anon | peak with page cache | build's own steps |"
    );
    println!("|---|---|---|---|---|---|---|");
    for ((r, doc), s) in CACHE_RUNS.iter().zip(&docs).zip(secs) {
        let status = doc.get("status");
        let mb = status
            .get("cache")
            .get(r.bytes)
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1e6;
        let decimals = r.decimals;
        println!(
            "| {} | {s:.decimals$} s | {} | {mb:.1} MB {} | {} | {} |",
            r.what,
            r.outcome,
            r.way,
            cache_mem(&b.dir, r.stem),
            steps(status.get("timings"))
        );
    }
    println!();
    let (r, rx) = (secs[0] / secs[1], secs[0] / secs[2]);
    println!(
        "compile / hit = **{r:.1}×** (target ≥ 10×: {}); compile / hit-with-extraction = {rx:.1}×",
        met(r >= 10.0)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_its_own_cgroup() {
        let v2 = "0::/user.slice/session-3.scope\n";
        assert_eq!(
            cg_path(v2, true),
            Some(CgBase {
                dir: PathBuf::from("/sys/fs/cgroup/user.slice/session-3.scope"),
                v2: true
            })
        );
        let v1 = "12:pids:/x\n4:memory:/docker/abc\n0::/\n";
        assert_eq!(
            cg_path(v1, false).map(|c| c.dir),
            Some(PathBuf::from("/sys/fs/cgroup/memory/docker/abc"))
        );
        assert_eq!(
            cg_path("0::/\n", true).map(|c| c.dir),
            Some(PathBuf::from("/sys/fs/cgroup/"))
        );
        assert_eq!(cg_path("3:cpu:/a\n", false), None);
    }

    #[test]
    fn anonymous_memory_from_memory_stat() {
        let v2 = "anon 348160\nfile 8192\nkernel 0\nanon_thp 0\n";
        assert_eq!(anon_bytes(v2, true), 348160);
        let v1 = "cache 4096\nrss 1000\nrss_huge 2000\ntotal_rss 9\n";
        assert_eq!(anon_bytes(v1, false), 3000);
    }
}
