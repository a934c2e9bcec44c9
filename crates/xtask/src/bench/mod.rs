//! `cargo xtask bench …`: the measuring and reporting halves of the
//! benchmark scripts (scripts/bench-*), which keep the setup (builder roots,
//! servers, clusters) in shell.

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{cmd, read};
use crate::pyjson::{J, py_round};

mod exporter;

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// scripts/bench-exporter's measurement of a running exporter: finds
    /// its port, scrapes it, reads its CPU and memory; a table on stderr,
    /// one JSON line on stdout.
    Exporter(ExporterArgs),
    /// scripts/bench-operator's table (stderr) and JSON line (stdout) from
    /// the operator's and the baseline's results.
    OperatorSummary { operator: String, baseline: String },
    /// scripts/bench-cache's Markdown table.
    CacheSummary(CacheArgs),
    /// scripts/bench-build's Markdown table.
    BuildSummary(BuildArgs),
    /// scripts/bench-fetch's runs: serves the payload on loopback, runs
    /// curl and the installer's fetch alternately, prints the medians.
    Fetch(FetchArgs),
}

#[derive(clap::Args)]
pub struct ExporterArgs {
    #[arg(long)]
    pid: u32,
    #[arg(long)]
    scrapes: u32,
    #[arg(long)]
    idle: u64,
    /// The JSON line examples/bench_exporter printed.
    #[arg(long)]
    render: String,
    #[arg(long)]
    profile: String,
    #[arg(long)]
    nvml: String,
}

// The builder root and the build that bench-cache and bench-build describe.
#[derive(clap::Args)]
pub struct Target {
    #[arg(long)]
    root: PathBuf,
    #[arg(long)]
    suite: String,
    #[arg(long)]
    flavor: String,
    #[arg(long)]
    kernel: String,
}

#[derive(clap::Args)]
pub struct CacheArgs {
    #[command(flatten)]
    t: Target,
    #[arg(long)]
    driver: String,
    #[arg(long)]
    jobs: String,
    /// Wall times in ms, space-separated.
    #[arg(long)]
    miss_ms: String,
    #[arg(long)]
    hit_ms: String,
    #[arg(long)]
    hitx_ms: String,
}

#[derive(clap::Args)]
pub struct BuildArgs {
    #[command(flatten)]
    t: Target,
    #[arg(long)]
    jobs: String,
    #[arg(long)]
    unstripped: u64,
    #[arg(long)]
    stripped: u64,
    /// Wall times in ms, space-separated.
    #[arg(long)]
    extract_ms: String,
    #[arg(long)]
    make_ms: String,
    #[arg(long)]
    build_ms: String,
}

#[derive(clap::Args)]
pub struct FetchArgs {
    #[arg(long)]
    binary: PathBuf,
    /// Holds payload.run; the runs' scratch files go here too.
    #[arg(long)]
    work: PathBuf,
    #[arg(long)]
    sha256: String,
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

pub fn run(c: Cmd) -> Result<()> {
    match c {
        Cmd::Exporter(a) => exporter::exporter(&a),
        Cmd::OperatorSummary { operator, baseline } => {
            operator_summary(&J::parse(&operator)?, &J::parse(&baseline)?)
        }
        Cmd::CacheSummary(a) => cache_summary(&a),
        Cmd::BuildSummary(a) => build_summary(&a),
        Cmd::Fetch(a) => fetch(&a),
    }
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

fn ms_list(s: &str) -> Result<Vec<f64>> {
    s.split_whitespace()
        .map(|x| {
            x.parse::<f64>()
                .with_context(|| format!("not a number of ms: {x}"))
        })
        .collect()
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

fn cache_summary(a: &CacheArgs) -> Result<()> {
    let dir = a.t.root.join("bench-cache");
    let docs = cache_docs(&dir)?;
    let miss = ms_list(&a.miss_ms)?;
    let secs = [
        median(&miss) / 1000.0,
        median(&ms_list(&a.hit_ms)?) / 1000.0,
        median(&ms_list(&a.hitx_ms)?) / 1000.0,
    ];
    println!(
        "### bench-cache: {}/{}, driver {}, kernel {}, -j{}, S3 (s3s-fs) on loopback{}",
        a.t.suite,
        a.t.flavor,
        a.driver,
        a.t.kernel,
        a.jobs,
        median_of(miss.len())
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
            cache_mem(&dir, r.stem),
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

/// Files under `dir` (symlinks left out), or the file's own size.
fn size_of(path: &Path) -> u64 {
    if !path.is_dir() {
        return path.metadata().map(|m| m.len()).unwrap_or(0);
    }
    let mut total = 0;
    walk(path, &mut |p| {
        if let Ok(m) = p.symlink_metadata()
            && m.is_file()
        {
            total += m.len();
        }
    });
    total
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

/// The size of the last `nvidia.ko` under `dir`.
fn ko_under(dir: &Path) -> Option<u64> {
    let mut found = None;
    walk(dir, &mut |p| {
        if p.file_name().is_some_and(|n| n == "nvidia.ko") {
            found = p.metadata().ok().map(|m| m.len());
        }
    });
    found
}

/// The size of `nvidia.ko` in a tarball, from `tar -tvf`.
fn ko_in_tar(path: &Path) -> Option<u64> {
    let list = read(cmd("tar").arg("-tvf").arg(path)).ok()?;
    list.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let name = f.last()?;
        (Path::new(name).file_name()? == "nvidia.ko")
            .then(|| f.get(2)?.parse().ok())
            .flatten()
    })
}

/// The artifact's size and that of the `nvidia.ko` in it: the result's
/// module list, else the artifact itself (a directory, or a tarball's
/// listing), else the last one under bench/out.
fn artifact_sizes(root: &Path, status: &J, art: &str) -> (Option<u64>, Option<u64>) {
    let host_art = (!art.is_empty()).then(|| root.join(art.trim_start_matches('/')));
    let mut ko_in_art: Option<u64> = match status.get("modules") {
        J::Arr(ms) => ms
            .iter()
            .find(|m| m.get("name").as_str() == Some("nvidia"))
            .and_then(|m| m.get("sizeBytes").as_f64().map(|v| v as u64)),
        _ => None,
    };
    let mut art_size = None;
    if let Some(h) = host_art.as_ref().filter(|h| h.exists()) {
        art_size = Some(size_of(h));
        if h.is_dir() {
            if let Some(k) = ko_under(h) {
                ko_in_art = Some(k);
            }
        } else if ko_in_art.is_none()
            && [".tar", ".tar.gz", ".tar.xz"]
                .iter()
                .any(|e| art.ends_with(e))
        {
            ko_in_art = ko_in_tar(h);
        }
    }
    if ko_in_art.is_none() {
        ko_in_art = ko_under(&root.join("bench/out"));
    }
    (art_size, ko_in_art)
}

fn build_summary(a: &BuildArgs) -> Result<()> {
    let res = J::read(&a.t.root.join("bench/result.json"))?;
    let (status, spec) = (res.get("status"), res.get("spec"));
    let art = status.get("artifact").as_str().unwrap_or("").to_string();
    let (art_size, ko_in_art) = artifact_sizes(&a.t.root, status, &art);
    let bd = ms_list(&a.build_ms)?;
    let (e, m, b) = (
        median(&ms_list(&a.extract_ms)?) / 1000.0,
        median(&ms_list(&a.make_ms)?) / 1000.0,
        median(&bd) / 1000.0,
    );
    let mb = |n: Option<u64>| n.map_or("–".to_string(), |n| format!("{:.1} MB", n as f64 / 1e6));
    let driver = status
        .get("driverVersion")
        .or(spec.get("driverVersion"))
        .or(&J::str("?"))
        .py_str();
    println!(
        "### bench-build: {}/{}, driver {driver}, kernel {}, -j{}{}",
        a.t.suite,
        a.t.flavor,
        a.t.kernel,
        a.jobs,
        median_of(bd.len())
    );
    println!();
    println!("| what | value |");
    println!("|---|---|");
    println!("| extract (`tar -xJf`) | {e:.1} s |");
    println!("| bare `make -j{} modules` | {m:.1} s |", a.jobs);
    println!("| extract + make | {:.1} s |", e + m);
    println!("| `gpu-driver-installer build` | {b:.1} s |");
    println!(
        "| build / make | **{:.3}×** (target ≤ 1.10×: {}) |",
        b / m,
        met(b / m <= 1.10)
    );
    println!("| build / (extract + make) | {:.3}× |", b / (e + m));
    let t = status.get("timings");
    if t.truthy() {
        println!("| build's own steps | {} |", steps(t));
    }
    println!("| artifact | `{art}` {} |", mb(art_size));
    println!(
        "| nvidia.ko from make (unstripped) | {} |",
        mb(Some(a.unstripped))
    );
    println!(
        "| nvidia.ko `strip --strip-debug` | {} |",
        mb(Some(a.stripped))
    );
    println!("| nvidia.ko in the artifact | {} |", mb(ko_in_art));
    Ok(())
}

/// Serves `payload` to every connection (std's copy sends a file to a
/// socket with sendfile).
fn serve(listener: TcpListener, payload: PathBuf) {
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { continue };
        let payload = payload.clone();
        std::thread::spawn(move || -> std::io::Result<()> {
            // The request head: curl and the installer send no body.
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte)? == 1 {
                head.push(byte[0]);
            }
            let mut f = std::fs::File::open(&payload)?;
            let len = f.metadata()?.len();
            write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n")?;
            std::io::copy(&mut f, &mut s)?;
            Ok(())
        });
    }
}

/// One timed command's wall time (s) and peak RSS (MiB).
type Timed = (f64, f64);

/// bench-fetch's two commands against the loopback server, each under GNU
/// time, which reports the command's own peak RSS (Linux carries ru_maxrss
/// across exec, so a child of this process would report this one's).
struct FetchRuns<'a> {
    a: &'a FetchArgs,
    url: String,
    rss_file: PathBuf,
    out: PathBuf,
    cache: PathBuf,
}

impl FetchRuns<'_> {
    fn measure(&self, argv: &[OsString]) -> Result<Timed> {
        let start = Instant::now();
        let st = cmd("/usr/bin/time")
            .args(["-f", "%M", "-o"])
            .arg(&self.rss_file)
            .args(argv)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?;
        let wall = start.elapsed().as_secs_f64();
        if !st.success() {
            bail!("failed: {argv:?}");
        }
        let text = std::fs::read_to_string(&self.rss_file)?;
        let kib: f64 = text.trim().lines().last().unwrap_or("").parse()?;
        Ok((wall, kib / 1024.0))
    }

    fn curl(&self) -> Result<Timed> {
        let mut argv = os(&["curl", "-sS", "-o"]);
        argv.extend([self.out.clone().into_os_string(), self.url.clone().into()]);
        let r = self.measure(&argv)?;
        std::fs::remove_file(&self.out)?;
        Ok(r)
    }

    fn installer(&self) -> Result<Timed> {
        let mut argv = vec![self.a.binary.clone().into_os_string()];
        argv.extend(os(&[
            "--termination-log",
            "/nonexistent",
            "--log-level",
            "warn",
            "fetch",
            "--url",
            &self.url,
            "--sha256",
            &self.a.sha256,
            "--allow-http",
            "--cache-dir",
        ]));
        argv.push(self.cache.clone().into_os_string());
        let r = self.measure(&argv)?;
        std::fs::remove_dir_all(&self.cache)?;
        Ok(r)
    }
}

fn os(items: &[&str]) -> Vec<OsString> {
    items.iter().map(OsString::from).collect()
}

fn fetch(a: &FetchArgs) -> Result<()> {
    let payload = a.work.join("payload.run");
    let size = payload
        .metadata()
        .with_context(|| format!("reading {}", payload.display()))?
        .len();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/payload.run", listener.local_addr()?);
    std::thread::spawn(move || serve(listener, payload));
    let runs = FetchRuns {
        a,
        url,
        rss_file: a.work.join("rss"),
        out: a.work.join("curl.out"),
        cache: a.work.join("cache"),
    };
    // Warms the page cache and the server.
    runs.curl()?;
    let (mut c, mut f) = (Vec::new(), Vec::new());
    for _ in 0..a.runs {
        c.push(runs.curl()?);
        f.push(runs.installer()?);
    }
    fetch_report(size, a.runs, &c, &f);
    Ok(())
}

/// The median wall time and the largest peak RSS of some runs.
fn wall_and_rss(v: &[Timed]) -> Timed {
    let walls: Vec<f64> = v.iter().map(|r| r.0).collect();
    (
        median(&walls),
        v.iter().map(|r| r.1).fold(f64::NAN, f64::max),
    )
}

fn fetch_report(size: u64, runs: usize, c: &[Timed], f: &[Timed]) {
    let mib = size as f64 / (1024.0 * 1024.0);
    println!("payload: {mib:.0} MiB, {runs} runs each, median wall time, max peak RSS");
    println!(
        "{:8}{:>10}{:>10}{:>15}",
        "", "wall s", "MiB/s", "peak RSS MiB"
    );
    let (cw, _) = wall_and_rss(c);
    let (fw, frss) = wall_and_rss(f);
    for (k, v) in [("curl", c), ("fetch", f)] {
        let (w, rss) = wall_and_rss(v);
        println!("{k:8}{w:10.2}{:10.0}{rss:15.1}", mib / w);
    }
    let ratio = fw / cw;
    println!(
        "ratio fetch/curl wall time: {ratio:.2} (target <= 1.20: {})",
        met(ratio <= 1.2)
    );
    println!(
        "fetch peak RSS: {frss:.1} MiB (target <= 64: {})",
        met(frss <= 64.0)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_as_python() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn timings_as_steps() -> Result<()> {
        let t = J::parse(r#"{"extractSeconds": 1.25, "compileSeconds": 130, "note": "x"}"#)?;
        assert_eq!(steps(&t), "extract 1.2 s, compile 130.0 s");
        Ok(())
    }
}
