//! scripts/bench-exporter: gpu-driver-exporter against its targets:
//! resident memory under 20 MiB, a scrape of 8 GPUs under 50 ms, and under
//! 1% of a core when scraped every 15 s. No assertions: a side-by-side table
//! on stderr and one JSON line last on stdout.
//!
//! Without a GPU here, two scrape figures are reported, and named:
//! - render (8 GPUs, synthetic): examples/bench_exporter.rs renders eight
//!   GPUs' readings (three pod processes each, each GPU held by a pod)
//!   through the same metrics::render a real scrape uses; NVML's own calls
//!   are not in it;
//! - end to end (NVML down): the real binary answering GET /metrics over
//!   loopback with NVML failing (NVIDIA's real libnvidia-ml from
//!   scripts/fetch-test-data's directory when --test-data names it: "driver
//!   not loaded"; else no library) and no kubelet socket.
//!
//! Memory is the running binary's VmRSS (and VmHWM, its peak) after the
//! scrapes. CPU is the binary's utime+stime over N back-to-back scrapes
//! plus its idle use over --idle seconds, scaled to one scrape per 15 s:
//! (idle CPU per 15 s + CPU per scrape) / 15 s, as a fraction of one core.
//!
//! The last line: `{"rssMiB":…,"hwmMiB":…,"render8GpusMedianMs":…,
//! "render8GpusP99Ms":…,"e2eNvmlDownMedianMs":…,"e2eNvmlDownP99Ms":…,
//! "cpuCoreFraction":…,"cpuSecondsPerScrape":…,"idleCpuSecondsPer15s":…,
//! "profile":"release"|"debug","nvml":"real library, no driver"|"no library"}`.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::{Cleanup, median, scratch, walk};
use crate::cmd::{cmd, read, run};
use crate::pyjson::{J, py_round};

#[derive(clap::Args)]
pub struct Args {
    /// Timed scrapes (after five warm-up ones).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(10..))]
    scrapes: u32,
    /// Seconds of idle CPU measured.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    idle: u64,
    /// As an image would build it: the exporter alone, without the operator.
    #[arg(long)]
    release: bool,
    /// scripts/fetch-test-data's directory: NVIDIA's real libnvidia-ml.
    #[arg(long)]
    test_data: Option<PathBuf>,
}

/// One measurement of a running exporter.
struct Run {
    pid: u32,
    scrapes: u32,
    idle: u64,
    profile: &'static str,
    nvml: &'static str,
}

pub(super) fn bench(repo: &Path, cleanup: &Cleanup, a: &Args) -> Result<()> {
    let profile = if a.release { "release" } else { "debug" };
    eprintln!(
        "bench-exporter: building ({})",
        if a.release { "--release" } else { "debug" }
    );
    let mut b = cmd("cargo");
    b.current_dir(repo)
        .args(["build", "--locked"])
        .args(a.release.then_some("--release"))
        .args(["-p", "gpu-driver-exporter", "--bin", "gpu-driver-exporter"])
        .args(["--example", "bench_exporter"]);
    run(&mut b)?;
    let dir = crate::static_build::target_dir(repo)?.join(profile);
    let render =
        read(cmd(dir.join("examples/bench_exporter")).args(["--gpus", "8", "--runs", "2000"]))?;
    let work = scratch(cleanup, &std::env::temp_dir(), "tmp.")?;
    std::fs::create_dir_all(work.join("host"))?;
    std::fs::create_dir_all(work.join("nvml"))?;
    let nvml = nvml_library(a.test_data.as_deref(), &work.join("nvml"))?;
    let log = work.join("log");
    let child = cmd(dir.join("gpu-driver-exporter"))
        .env("RUST_LOG", "warn")
        .args(["--listen", "127.0.0.1:0", "--host-root"])
        .arg(work.join("host"))
        .arg("--nvml")
        .arg(work.join("nvml/libnvidia-ml.so.1"))
        .arg("--kubelet-socket")
        .arg(work.join("kubelet.sock"))
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting gpu-driver-exporter")?;
    let pid = cleanup.stop(child);
    let r = Run {
        pid,
        scrapes: a.scrapes,
        idle: a.idle,
        profile,
        nvml,
    };
    // RUST_LOG=warn hides the address: the port is found from the pid.
    exporter(&r, &render).map_err(|e| {
        e.context(format!(
            "measuring the exporter failed; its log:\n{}",
            super::tail(&log, 200)
        ))
    })
}

/// NVIDIA's real library from the test data, if there is one, as
/// `nvml/libnvidia-ml.so.1`; what the exporter's NVML is then.
fn nvml_library(test_data: Option<&Path>, nvml: &Path) -> Result<&'static str> {
    let Some(td) = test_data else {
        return Ok("no library");
    };
    let mut found = None;
    walk(&td.join("nvidia-smi/lib"), &mut |p| {
        let lib = p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("libnvidia-ml.so."));
        if lib && found.is_none() {
            found = Some(p.to_path_buf());
        }
    });
    let Some(real) = found else {
        return Ok("no library");
    };
    let name = real.file_name().context("library name")?;
    std::fs::copy(&real, nvml.join(name)).with_context(|| format!("copying {}", real.display()))?;
    std::os::unix::fs::symlink(name, nvml.join("libnvidia-ml.so.1"))?;
    Ok("real library, no driver")
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
    listening_in(&std::fs::read_to_string("/proc/net/tcp").ok()?, &inodes)
}

/// The local port of the first listening socket of `inodes` in a
/// /proc/net/tcp table.
fn listening_in(tcp: &str, inodes: &[String]) -> Option<u16> {
    tcp.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
            u16::from_str_radix(f[1].split(':').nth(1)?, 16).ok()
        } else {
            None
        }
    })
}

/// The port the exporter listens on, once it does (10 s at the most).
fn wait_for_port(pid: u32) -> Result<u16> {
    for _ in 0..100 {
        if let Some(port) = listening_port(pid) {
            return Ok(port);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the exporter did not listen")
}

/// The exporter's process as /proc shows it.
struct Proc {
    pid: u32,
    /// Clock ticks per second.
    tick: f64,
}

impl Proc {
    /// Its CPU time so far (utime and stime), in seconds.
    fn cpu_seconds(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime.
        let (u, s): (f64, f64) = (
            f.get(11).context("utime")?.parse()?,
            f.get(12).context("stime")?.parse()?,
        );
        Ok((u + s) / self.tick)
    }

    /// A `key: N kB` line of /proc/PID/status; 0 if absent.
    fn status_kib(&self, key: &str) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(&format!("{key}:")))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0.0)
    }
}

/// One `GET /metrics`; an answer other than 200 is an error.
fn scrape(port: u16) -> Result<()> {
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
}

/// What the exporter's measurement found.
struct ExporterFigures {
    /// Resident and peak resident memory, MiB.
    rss: f64,
    hwm: f64,
    /// The render benchmark's median and p99, ms.
    r_med: f64,
    r_p99: f64,
    /// End-to-end scrapes' median and p99, ms.
    e2e_med: f64,
    e2e_p99: f64,
    /// CPU seconds per scrape, and idle over 15 s.
    per_scrape: f64,
    idle_per_15: f64,
    /// The share of a core at one scrape per 15 s.
    core: f64,
}

/// Five warm-up scrapes, `scrapes` timed ones, then `idle` seconds idle;
/// the render benchmark's figures from its JSON line.
fn measure_exporter(p: &Proc, port: u16, a: &Run, render: &J) -> Result<ExporterFigures> {
    for _ in 0..5 {
        scrape(port)?;
    }
    let n = a.scrapes as usize;
    let c0 = p.cpu_seconds()?;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        scrape(port)?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let per_scrape = (p.cpu_seconds()? - c0) / n as f64;
    let c1 = p.cpu_seconds()?;
    std::thread::sleep(Duration::from_secs(a.idle));
    let idle_per_15 = (p.cpu_seconds()? - c1) / a.idle as f64 * 15.0;
    times.sort_by(f64::total_cmp);
    let micros = |k: &str| render.get(k).as_f64().unwrap_or(f64::NAN) / 1000.0;
    Ok(ExporterFigures {
        rss: p.status_kib("VmRSS") / 1024.0,
        hwm: p.status_kib("VmHWM") / 1024.0,
        r_med: micros("renderMedianMicros"),
        r_p99: micros("renderP99Micros"),
        e2e_med: median(&times),
        e2e_p99: times[((times.len() - 1) as f64 * 0.99).round_ties_even() as usize],
        per_scrape,
        idle_per_15,
        core: (idle_per_15 + per_scrape) / 15.0,
    })
}

fn exporter(a: &Run, render: &str) -> Result<()> {
    let port = wait_for_port(a.pid)?;
    let render = J::parse(render).context("the render benchmark's JSON")?;
    let tick: f64 = read(cmd("getconf").arg("CLK_TCK"))?.parse()?;
    let p = Proc { pid: a.pid, tick };
    let fig = measure_exporter(&p, port, a, &render)?;
    exporter_table(a, &fig, &render);
    println!("{}", exporter_json(a, &fig).dump_line(false));
    Ok(())
}

/// The table's rows: measure, measured, target, measured / target.
fn exporter_rows(f: &ExporterFigures) -> [(&'static str, String, &'static str, f64); 7] {
    let mib = |name, v: f64| (name, format!("{v:.1} MiB"), "20 MiB", v / 20.0);
    let ms = |name, v: f64| (name, format!("{v:.3} ms"), "50 ms", v / 50.0);
    let core = format!("{:.4} % of a core", f.core * 100.0);
    [
        mib("resident memory (VmRSS)", f.rss),
        mib("peak resident memory (VmHWM)", f.hwm),
        ms("render, 8 GPUs synthetic (median)", f.r_med),
        ms("render, 8 GPUs synthetic (p99)", f.r_p99),
        ms("end-to-end scrape, NVML down (median)", f.e2e_med),
        ms("end-to-end scrape, NVML down (p99)", f.e2e_p99),
        ("CPU at one scrape per 15 s", core, "1 %", f.core / 0.01),
    ]
}

/// The table on stderr.
fn exporter_table(a: &Run, f: &ExporterFigures, render: &J) {
    eprintln!(
        "gpu-driver-exporter ({} build, NVML: {}, {} scrapes, {} s idle)",
        a.profile, a.nvml, a.scrapes, a.idle
    );
    eprintln!(
        "{:<40} {:>22} {:>8} {:>8}",
        "measure", "measured", "target", "ratio"
    );
    for (name, got, target, ratio) in exporter_rows(f) {
        eprintln!("{name:<40} {got:>22} {target:>8} {ratio:8.3}");
    }
    eprintln!(
        "render body for 8 GPUs: {} bytes; CPU per scrape {:.3} ms, idle CPU per 15 s {:.3} ms",
        render.get("bytes").py_str(),
        f.per_scrape * 1000.0,
        f.idle_per_15 * 1000.0
    );
}

/// The JSON line on stdout.
fn exporter_json(a: &Run, f: &ExporterFigures) -> J {
    let r = |x: f64, n: usize| J::Float(py_round(x, n));
    J::Obj(vec![
        ("rssMiB".into(), r(f.rss, 2)),
        ("hwmMiB".into(), r(f.hwm, 2)),
        ("render8GpusMedianMs".into(), r(f.r_med, 4)),
        ("render8GpusP99Ms".into(), r(f.r_p99, 4)),
        ("e2eNvmlDownMedianMs".into(), r(f.e2e_med, 4)),
        ("e2eNvmlDownP99Ms".into(), r(f.e2e_p99, 4)),
        ("cpuCoreFraction".into(), r(f.core, 6)),
        ("cpuSecondsPerScrape".into(), r(f.per_scrape, 6)),
        ("idleCpuSecondsPer15s".into(), r(f.idle_per_15, 6)),
        ("profile".into(), J::str(a.profile)),
        ("nvml".into(), J::str(a.nvml)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_port_of_a_socket() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A3C1 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 51234 1 0000000000000000 100 0 0 10 0
   1: 0100007F:9C40 0100007F:A3C1 01 00000000:00000000 00:00000000 00000000     0        0 51240 1 0000000000000000 20 4 30 10 -1
";
        assert_eq!(listening_in(tcp, &["51234".into()]), Some(0xA3C1));
        assert_eq!(listening_in(tcp, &["51240".into()]), None);
        assert_eq!(listening_in(tcp, &[]), None);
    }

    #[test]
    fn nvidias_library_from_the_test_data() -> Result<()> {
        let d = tempfile::tempdir()?;
        let nvml = d.path().join("nvml");
        std::fs::create_dir(&nvml)?;
        assert_eq!(nvml_library(None, &nvml)?, "no library");
        assert_eq!(nvml_library(Some(d.path()), &nvml)?, "no library");
        let lib = d.path().join("td/nvidia-smi/lib/x86_64");
        std::fs::create_dir_all(&lib)?;
        std::fs::write(lib.join("libnvidia-ml.so.535.261.03"), "elf")?;
        let td = d.path().join("td");
        assert_eq!(nvml_library(Some(&td), &nvml)?, "real library, no driver");
        assert_eq!(std::fs::read(nvml.join("libnvidia-ml.so.1"))?, b"elf");
        Ok(())
    }
}
