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
use crate::pyjson::J;

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

#[derive(clap::Args)]
pub struct CacheArgs {
    #[arg(long)]
    root: PathBuf,
    #[arg(long)]
    suite: String,
    #[arg(long)]
    flavor: String,
    #[arg(long)]
    kernel: String,
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
    #[arg(long)]
    root: PathBuf,
    #[arg(long)]
    suite: String,
    #[arg(long)]
    flavor: String,
    #[arg(long)]
    kernel: String,
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
        Cmd::Exporter(a) => exporter(&a),
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

/// Python's `round(x, n)`.
fn round_to(x: f64, n: usize) -> f64 {
    format!("{x:.n$}").parse().unwrap_or(x)
}

fn read_json(path: &Path) -> Result<J> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    J::parse(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The loopback port `pid` listens on, from its socket inodes and
/// /proc/net/tcp (the exporter logs its address only at info).
fn listening_port(pid: u32) -> Option<u16> {
    let mut inodes = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()? {
        let Ok(t) = std::fs::read_link(e.ok()?.path()) else {
            continue;
        };
        let t = t.to_string_lossy().into_owned();
        if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
            inodes.push(i.to_string());
        }
    }
    let tcp = std::fs::read_to_string("/proc/net/tcp").ok()?;
    tcp.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
            u16::from_str_radix(f[1].split(':').nth(1)?, 16).ok()
        } else {
            None
        }
    })
}

fn exporter(a: &ExporterArgs) -> Result<()> {
    let mut port = None;
    for _ in 0..100 {
        port = listening_port(a.pid);
        if port.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let port = port.context("the exporter did not listen")?;
    let render = J::parse(&a.render).context("the render benchmark's JSON")?;
    let tick: f64 = read(cmd("getconf").arg("CLK_TCK"))?.parse()?;
    let pid = a.pid;
    let cpu_seconds = || -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime.
        let (u, s): (f64, f64) = (
            f.get(11).context("utime")?.parse()?,
            f.get(12).context("stime")?.parse()?,
        );
        Ok((u + s) / tick)
    };
    let status_kib = |key: &str| -> f64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(&format!("{key}:")))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0.0)
    };
    let scrape = || -> Result<()> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")?;
        let mut data = Vec::new();
        s.read_to_end(&mut data)?;
        if !data.starts_with(b"HTTP/1.1 200") {
            let head = &data[..data.len().min(200)];
            bail!("bad answer: {}", String::from_utf8_lossy(head));
        }
        Ok(())
    };
    for _ in 0..5 {
        scrape()?;
    }
    let n = a.scrapes as usize;
    let c0 = cpu_seconds()?;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        scrape()?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let per_scrape = (cpu_seconds()? - c0) / n as f64;
    let c1 = cpu_seconds()?;
    std::thread::sleep(Duration::from_secs(a.idle));
    let idle_per_15 = (cpu_seconds()? - c1) / a.idle as f64 * 15.0;
    let (rss, hwm) = (status_kib("VmRSS") / 1024.0, status_kib("VmHWM") / 1024.0);
    times.sort_by(f64::total_cmp);
    let e2e_med = median(&times);
    let e2e_p99 = times[((times.len() - 1) as f64 * 0.99).round_ties_even() as usize];
    let core = (idle_per_15 + per_scrape) / 15.0;
    let micros = |k: &str| render.get(k).as_f64().unwrap_or(f64::NAN) / 1000.0;
    let (r_med, r_p99) = (micros("renderMedianMicros"), micros("renderP99Micros"));
    let rows = [
        (
            "resident memory (VmRSS)",
            format!("{rss:.1} MiB"),
            "20 MiB",
            rss / 20.0,
        ),
        (
            "peak resident memory (VmHWM)",
            format!("{hwm:.1} MiB"),
            "20 MiB",
            hwm / 20.0,
        ),
        (
            "render, 8 GPUs synthetic (median)",
            format!("{r_med:.3} ms"),
            "50 ms",
            r_med / 50.0,
        ),
        (
            "render, 8 GPUs synthetic (p99)",
            format!("{r_p99:.3} ms"),
            "50 ms",
            r_p99 / 50.0,
        ),
        (
            "end-to-end scrape, NVML down (median)",
            format!("{e2e_med:.3} ms"),
            "50 ms",
            e2e_med / 50.0,
        ),
        (
            "end-to-end scrape, NVML down (p99)",
            format!("{e2e_p99:.3} ms"),
            "50 ms",
            e2e_p99 / 50.0,
        ),
        (
            "CPU at one scrape per 15 s",
            format!("{:.4} % of a core", core * 100.0),
            "1 %",
            core / 0.01,
        ),
    ];
    eprintln!(
        "gpu-driver-exporter ({} build, NVML: {}, {n} scrapes, {} s idle)",
        a.profile, a.nvml, a.idle
    );
    eprintln!(
        "{:<40} {:>22} {:>8} {:>8}",
        "measure", "measured", "target", "ratio"
    );
    for (name, got, target, ratio) in rows {
        eprintln!("{name:<40} {got:>22} {target:>8} {ratio:8.3}");
    }
    eprintln!(
        "render body for 8 GPUs: {} bytes; CPU per scrape {:.3} ms, idle CPU per 15 s {:.3} ms",
        render.get("bytes").py_str(),
        per_scrape * 1000.0,
        idle_per_15 * 1000.0
    );
    let f = |x: f64, n: usize| J::Float(round_to(x, n));
    let out = J::Obj(vec![
        ("rssMiB".into(), f(rss, 2)),
        ("hwmMiB".into(), f(hwm, 2)),
        ("render8GpusMedianMs".into(), f(r_med, 4)),
        ("render8GpusP99Ms".into(), f(r_p99, 4)),
        ("e2eNvmlDownMedianMs".into(), f(e2e_med, 4)),
        ("e2eNvmlDownP99Ms".into(), f(e2e_p99, 4)),
        ("cpuCoreFraction".into(), f(core, 6)),
        ("cpuSecondsPerScrape".into(), f(per_scrape, 6)),
        ("idleCpuSecondsPer15s".into(), f(idle_per_15, 6)),
        ("profile".into(), J::str(a.profile.clone())),
        ("nvml".into(), J::str(a.nvml.clone())),
    ]);
    println!("{}", out.dump_line(false));
    Ok(())
}

fn operator_summary(op: &J, base: &J) -> Result<()> {
    let up = op.get("upgrade");
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
    if up.truthy() {
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
    let pick = |from: &J, keys: &[&str]| -> Vec<(String, J)> {
        keys.iter()
            .map(|k| (k.to_string(), from.get(k).clone()))
            .collect()
    };
    let required = |k: &str| -> Result<J> {
        if op.has(k) {
            Ok(op.get(k).clone())
        } else {
            bail!("the operator's result has no {k}")
        }
    };
    let mut upgrade = vec![("nodes".to_string(), required("nodes")?)];
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
    let out = J::Obj(vec![
        ("nodes".into(), required("nodes")?),
        ("convergeSeconds".into(), required("convergeSeconds")?),
        ("writesPerNode".into(), required("writesPerNode")?),
        ("readsPerNode".into(), op.get("readsPerNode").clone()),
        ("peakRssMiB".into(), op.get("peakRssMiB").clone()),
        (
            "baseline".into(),
            J::Obj(pick(
                base,
                &[
                    "convergeSeconds",
                    "writesPerNode",
                    "readsPerNode",
                    "peakRssMiB",
                ],
            )),
        ),
        ("upgrade".into(), J::Obj(upgrade)),
    ]);
    println!("{}", out.dump_line(true));
    Ok(())
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

fn cache_summary(a: &CacheArgs) -> Result<()> {
    let dir = a.root.join("bench-cache");
    let docs = [
        ("miss", read_json(&dir.join("miss.json"))?),
        ("hit", read_json(&dir.join("hit.json"))?),
        ("hitx", read_json(&dir.join("hitx.json"))?),
    ];
    for ((n, doc), want) in docs.iter().zip(["Miss", "Hit", "Hit"]) {
        let got = doc.get("status").get("cache").get("outcome");
        if got.as_str() != Some(want) {
            bail!(
                "{n} run had cache outcome {}, not {want}: {}",
                got.py_str(),
                doc.get("status").get("message").py_str()
            );
        }
    }
    let miss = ms_list(&a.miss_ms)?;
    let (m, h, hx) = (
        median(&miss) / 1000.0,
        median(&ms_list(&a.hit_ms)?) / 1000.0,
        median(&ms_list(&a.hitx_ms)?) / 1000.0,
    );
    let status = |i: usize| docs[i].1.get("status");
    let cache_mb =
        |i: usize, k: &str| status(i).get("cache").get(k).as_f64().unwrap_or(f64::NAN) / 1e6;
    // The last run's memory (bytes -> MiB); "n/a" without a cgroup.
    let mem = |n: &str| -> String {
        let num = |ext: &str| -> Option<f64> {
            // An empty file is 0 (no sample yet); a blank line is no figure.
            let t = std::fs::read_to_string(dir.join(format!("{n}.{ext}"))).ok()?;
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
    };
    let runs = if miss.len() > 1 {
        format!(" (median of {})", miss.len())
    } else {
        String::new()
    };
    println!(
        "### bench-cache: {}/{}, driver {}, kernel {}, -j{}, S3 (s3s-fs) on loopback{runs}",
        a.suite, a.flavor, a.driver, a.kernel, a.jobs
    );
    println!();
    println!(
        "| what | wall time | cache | bytes | peak anon | peak with page cache | build's own steps |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| compile of the key (`build`, cache Miss, then upload) | {m:.1} s | Miss | {:.1} MB up | {} | {} |",
        cache_mb(0, "bytesUploaded"),
        mem("miss"),
        steps(status(0).get("timings"))
    );
    println!(
        "| cache hit, `--driver-version` given (as `run`) | {h:.2} s | Hit | {:.1} MB down | {} | {} |",
        cache_mb(1, "bytesDownloaded"),
        mem("hit"),
        steps(status(1).get("timings"))
    );
    println!(
        "| cache hit, version read from the source (extracts) | {hx:.2} s | Hit | {:.1} MB down | {} | {} |",
        cache_mb(2, "bytesDownloaded"),
        mem("hitx"),
        steps(status(2).get("timings"))
    );
    println!();
    let (r, rx) = (m / h, m / hx);
    println!(
        "compile / hit = **{r:.1}×** (target ≥ 10×: {}); compile / hit-with-extraction = {rx:.1}×",
        if r >= 10.0 { "met" } else { "NOT met" }
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

fn build_summary(a: &BuildArgs) -> Result<()> {
    let res = read_json(&a.root.join("bench/result.json"))?;
    let (status, spec) = (res.get("status"), res.get("spec"));
    let art = status.get("artifact").as_str().unwrap_or("").to_string();
    let host_art = (!art.is_empty()).then(|| a.root.join(art.trim_start_matches('/')));
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
        ko_in_art = ko_under(&a.root.join("bench/out"));
    }
    let bd = ms_list(&a.build_ms)?;
    let (e, m, b) = (
        median(&ms_list(&a.extract_ms)?) / 1000.0,
        median(&ms_list(&a.make_ms)?) / 1000.0,
        median(&bd) / 1000.0,
    );
    let mb = |n: Option<u64>| n.map_or("–".to_string(), |n| format!("{:.1} MB", n as f64 / 1e6));
    let runs = if bd.len() > 1 {
        format!(" (median of {})", bd.len())
    } else {
        String::new()
    };
    let driver = status
        .get("driverVersion")
        .or(spec.get("driverVersion"))
        .or(&J::str("?"))
        .py_str();
    println!(
        "### bench-build: {}/{}, driver {driver}, kernel {}, -j{}{runs}",
        a.suite, a.flavor, a.kernel, a.jobs
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
        if b / m <= 1.10 { "met" } else { "NOT met" }
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

fn fetch(a: &FetchArgs) -> Result<()> {
    let payload = a.work.join("payload.run");
    let size = payload
        .metadata()
        .with_context(|| format!("reading {}", payload.display()))?
        .len();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/payload.run", listener.local_addr()?);
    std::thread::spawn(move || serve(listener, payload));
    // GNU time reports the command's own peak RSS (Linux carries ru_maxrss
    // across exec, so a child of this process would report this one's).
    let rss_file = a.work.join("rss");
    let measure = |argv: &[OsString]| -> Result<(f64, f64)> {
        let start = Instant::now();
        let st = cmd("/usr/bin/time")
            .args(["-f", "%M", "-o"])
            .arg(&rss_file)
            .args(argv)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?;
        let wall = start.elapsed().as_secs_f64();
        if !st.success() {
            bail!("failed: {argv:?}");
        }
        let text = std::fs::read_to_string(&rss_file)?;
        let kib: f64 = text.trim().lines().last().unwrap_or("").parse()?;
        Ok((wall, kib / 1024.0))
    };
    let os = |items: &[&str]| -> Vec<OsString> { items.iter().map(OsString::from).collect() };
    let out = a.work.join("curl.out");
    let cache = a.work.join("cache");
    let curl = || -> Result<(f64, f64)> {
        let mut argv = os(&["curl", "-sS", "-o"]);
        argv.extend([out.clone().into_os_string(), url.clone().into()]);
        let r = measure(&argv)?;
        std::fs::remove_file(&out)?;
        Ok(r)
    };
    let installer = || -> Result<(f64, f64)> {
        let mut argv = vec![a.binary.clone().into_os_string()];
        argv.extend(os(&[
            "--termination-log",
            "/nonexistent",
            "--log-level",
            "warn",
            "fetch",
            "--url",
            &url,
            "--sha256",
            &a.sha256,
            "--allow-http",
            "--cache-dir",
        ]));
        argv.push(cache.clone().into_os_string());
        let r = measure(&argv)?;
        std::fs::remove_dir_all(&cache)?;
        Ok(r)
    };
    // Warms the page cache and the server.
    curl()?;
    let (mut c, mut f) = (Vec::new(), Vec::new());
    for _ in 0..a.runs {
        c.push(curl()?);
        f.push(installer()?);
    }
    let summary = |v: &[(f64, f64)]| {
        let walls: Vec<f64> = v.iter().map(|r| r.0).collect();
        (
            median(&walls),
            v.iter().map(|r| r.1).fold(f64::NAN, f64::max),
        )
    };
    let mib = size as f64 / (1024.0 * 1024.0);
    println!(
        "payload: {mib:.0} MiB, {} runs each, median wall time, max peak RSS",
        a.runs
    );
    println!(
        "{:8}{:>10}{:>10}{:>15}",
        "", "wall s", "MiB/s", "peak RSS MiB"
    );
    let (cw, _) = summary(&c);
    let (fw, frss) = summary(&f);
    for (k, v) in [("curl", &c), ("fetch", &f)] {
        let (w, rss) = summary(v);
        println!("{k:8}{w:10.2}{:10.0}{rss:15.1}", mib / w);
    }
    let ratio = fw / cw;
    println!(
        "ratio fetch/curl wall time: {ratio:.2} (target <= 1.20: {})",
        if ratio <= 1.2 { "met" } else { "NOT met" }
    );
    println!(
        "fetch peak RSS: {frss:.1} MiB (target <= 64: {})",
        if frss <= 64.0 { "met" } else { "NOT met" }
    );
    Ok(())
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
