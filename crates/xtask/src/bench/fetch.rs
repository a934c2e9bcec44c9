//! scripts/bench-fetch: `gpu-driver-installer fetch` against curl,
//! downloading the same random file from the same loopback HTTP server
//! (served here, with sendfile), alternating. Prints the median wall time
//! and the peak RSS of each side and their ratios. Targets: fetch ≤ 1.2×
//! curl's wall time, peak RSS ≤ 64 MiB whatever the size.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result};
use sha2::{Digest as _, Sha256};

use super::{Cleanup, Stage, median, met, scratch, timed, under_time};
use crate::apt::{self, Need};

const TOOLS: &[Need] = &[("/usr/bin/time", "time"), ("curl", "curl")];

#[derive(clap::Args)]
pub struct Args {
    /// Runs of each side (the first curl run, which warms the page cache
    /// and the server, is not counted).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// The payload's size.
    #[arg(value_name = "SIZE_MIB", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    size_mib: u64,
}

pub(super) fn bench(repo: &Path, cleanup: &Cleanup, stage: &mut Stage, a: &Args) -> Result<()> {
    apt::ensure(&[TOOLS])?;
    let work = scratch(cleanup, Path::new("/var/tmp"), "bench-fetch.")?;
    let installer = super::root::installer(repo, stage, None)?;
    stage.start(&format!("payload ({} MiB)", a.size_mib));
    let payload = work.join("payload.run");
    let sha256 = random_file(&payload, a.size_mib * 1024 * 1024)?;
    stage.end();
    fetch(&installer, &work, &sha256, a.runs as usize)
}

/// `size` bytes of /dev/urandom in `path`; their sha256.
fn random_file(path: &Path, size: u64) -> Result<String> {
    let mut src = std::fs::File::open("/dev/urandom")?.take(size);
    let mut out =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(hex::encode(h.finalize()))
}

/// Serves `payload` to every connection (std's copy sends a file to a
/// socket with sendfile).
fn serve(listener: TcpListener, payload: PathBuf) {
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { continue };
        let payload = payload.clone();
        std::thread::spawn(move || -> std::io::Result<()> {
            s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
            // The request head: curl and the installer send no body.
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 && s.read(&mut byte)? == 1
            {
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

/// The two commands against the loopback server, each under GNU time.
struct FetchRuns<'a> {
    binary: &'a Path,
    sha256: &'a str,
    url: String,
    rss_file: PathBuf,
    out: PathBuf,
    cache: PathBuf,
}

impl FetchRuns<'_> {
    fn measure(&self, c: &mut std::process::Command) -> Result<Timed> {
        let start = Instant::now();
        let kib = timed(
            c.stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
            &self.rss_file,
        )?;
        Ok((start.elapsed().as_secs_f64(), kib as f64 / 1024.0))
    }

    fn curl(&self) -> Result<Timed> {
        let mut c = under_time(&self.rss_file, "curl");
        c.args(["-sS", "-o"]).arg(&self.out).arg(&self.url);
        let r = self.measure(&mut c)?;
        std::fs::remove_file(&self.out)?;
        Ok(r)
    }

    fn installer(&self) -> Result<Timed> {
        let mut c = under_time(&self.rss_file, self.binary);
        c.args(["--termination-log", "/nonexistent", "--log-level", "warn"])
            .args(["fetch", "--url", &self.url, "--sha256", self.sha256])
            .args(["--allow-http", "--cache-dir"])
            .arg(&self.cache);
        let r = self.measure(&mut c)?;
        std::fs::remove_dir_all(&self.cache)?;
        Ok(r)
    }
}

/// Serves `work/payload.run` on loopback, runs curl and the installer's
/// fetch alternately, prints the medians.
fn fetch(binary: &Path, work: &Path, sha256: &str, runs: usize) -> Result<()> {
    let payload = work.join("payload.run");
    let size = payload
        .metadata()
        .with_context(|| format!("reading {}", payload.display()))?
        .len();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/payload.run", listener.local_addr()?);
    std::thread::spawn(move || serve(listener, payload));
    let r = FetchRuns {
        binary,
        sha256,
        url,
        rss_file: work.join("rss"),
        out: work.join("curl.out"),
        cache: work.join("cache"),
    };
    // Warms the page cache and the server.
    r.curl()?;
    let (mut c, mut f) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        c.push(r.curl()?);
        f.push(r.installer()?);
    }
    print!("{}", fetch_report(size, runs, &c, &f));
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

fn fetch_report(size: u64, runs: usize, c: &[Timed], f: &[Timed]) -> String {
    let mib = size as f64 / (1024.0 * 1024.0);
    let mut out =
        format!("payload: {mib:.0} MiB, {runs} runs each, median wall time, max peak RSS\n");
    out += &format!(
        "{:8}{:>10}{:>10}{:>15}\n",
        "", "wall s", "MiB/s", "peak RSS MiB"
    );
    let (cw, _) = wall_and_rss(c);
    let (fw, frss) = wall_and_rss(f);
    for (k, v) in [("curl", c), ("fetch", f)] {
        let (w, rss) = wall_and_rss(v);
        out += &format!("{k:8}{w:10.2}{:10.0}{rss:15.1}\n", mib / w);
    }
    let ratio = fw / cw;
    out += &format!(
        "ratio fetch/curl wall time: {ratio:.2} (target <= 1.20: {})\n",
        met(ratio <= 1.2)
    );
    out += &format!(
        "fetch peak RSS: {frss:.1} MiB (target <= 64: {})\n",
        met(frss <= 64.0)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_medians_and_ratios() {
        let c = [(2.0, 10.0), (2.2, 11.0), (2.1, 10.5)];
        let f = [(2.1, 11.0), (2.3, 12.5), (2.2, 11.5)];
        let r = fetch_report(1024 * 1024 * 1024, 3, &c, &f);
        assert_eq!(
            r,
            "payload: 1024 MiB, 3 runs each, median wall time, max peak RSS\n\
             \x20           wall s     MiB/s   peak RSS MiB\n\
             curl          2.10       488           11.0\n\
             fetch         2.20       465           12.5\n\
             ratio fetch/curl wall time: 1.05 (target <= 1.20: met)\n\
             fetch peak RSS: 12.5 MiB (target <= 64: met)\n"
        );
    }

    #[test]
    fn random_file_and_its_sum() -> Result<()> {
        let d = tempfile::tempdir()?;
        let p = d.path().join("p");
        let sum = random_file(&p, 3 << 20)?;
        assert_eq!(std::fs::metadata(&p)?.len(), 3 << 20);
        assert_eq!(sum, hex::encode(Sha256::digest(std::fs::read(&p)?)));
        Ok(())
    }
}
