//! scripts/bench-artifact: a node's read of a cached artifact (the
//! installer's cache lookup on a hit: download, sha256 and the check of
//! every file inside, in one streamed pass) against curl + sha256sum +
//! zstd -d of the same object from the same loopback S3 server (s3s-fs,
//! `cargo xtask tool s3-server`). Prints a Markdown table of medians (wall
//! time, peak RSS) and their ratios. Not a test: targets are ≤ 1.0× the
//! tools' time and ≤ 64 MiB RSS.
//!
//! The artifact is synthetic (examples/bench_artifact.rs: files that
//! compress about 1.3:1, packed by the installer's own code) and stored the
//! way a build Job stores one (lease, artifact, manifest.json). The tools'
//! side is the lightest reading of "download, check, decompress": curl
//! writes the file, sha256sum reads it, `zstd -dc` decompresses it to
//! /dev/null; the installer's side also hashes every file inside against
//! the build manifest. The two alternate, --runs times each.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use super::{Cleanup, S3_KEY_ID, S3_SECRET, Stage, median_s, ms_since, s3_server, scratch};
use super::{timed, under_time};
use crate::apt::{self, Need};
use crate::cmd::{cmd, run};

const TOOLS: &[Need] = &[
    ("/usr/bin/time", "time"),
    ("curl", "curl"),
    ("zstd", "zstd"),
];

#[derive(clap::Args)]
pub struct Args {
    /// Runs of each side.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// The artifact's compressed size.
    #[arg(value_name = "SIZE_MIB", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    size_mib: u64,
}

/// What `bench_artifact make` printed.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Made {
    artifact_bytes: u64,
    sha256: String,
    entry: String,
}

impl Made {
    /// The artifact's object under the bucket.
    fn object(&self) -> String {
        let short = self.sha256.get(..16).unwrap_or(&self.sha256);
        format!("b/{}/artifact-{short}.tar.zst", self.entry)
    }
}

/// Each side's runs: wall time (ms) and peak RSS (KiB).
#[derive(Default)]
struct Side(Vec<(u64, u64)>);

impl Side {
    /// The median wall time (s) and the largest RSS (MiB).
    fn summary(&self) -> (f64, f64) {
        let walls: Vec<u64> = self.0.iter().map(|r| r.0).collect();
        let rss = self.0.iter().map(|r| r.1).max().unwrap_or(0);
        (median_s(&walls), rss as f64 / 1024.0)
    }
}

struct Bench {
    bench: PathBuf,
    work: PathBuf,
    endpoint: String,
    object: String,
}

pub(super) fn bench(repo: &Path, cleanup: &Cleanup, stage: &mut Stage, a: &Args) -> Result<()> {
    apt::ensure(&[TOOLS])?;
    let work = scratch(cleanup, Path::new("/var/tmp"), "bench-artifact.")?;
    stage.start("build");
    run(cmd("cargo").current_dir(repo).args([
        "build",
        "--locked",
        "--release",
        "--example",
        "bench_artifact",
    ]))?;
    let bench = crate::static_build::target_dir(repo)?.join("release/examples/bench_artifact");
    stage.start("S3 server");
    std::fs::create_dir_all(work.join("store/bench"))?;
    std::fs::create_dir_all(work.join("make"))?;
    let port = s3_server(cleanup, &work.join("store"))?;
    let mut b = Bench {
        bench,
        endpoint: format!("http://127.0.0.1:{port}"),
        work,
        object: String::new(),
    };
    stage.start(&format!("artifact (about {} MiB compressed)", a.size_mib));
    let made = b.make(a.size_mib)?;
    b.object = made.object();
    stage.end();
    stage.start(&format!("runs ({} each, alternating)", a.runs));
    let (mut tools, mut ours) = (Side::default(), Side::default());
    for _ in 0..a.runs {
        tools.0.push(b.one(Bench::tools)?);
        ours.0.push(b.one(Bench::ours)?);
    }
    stage.end();
    print!(
        "{}",
        table(made.artifact_bytes, tools.summary(), ours.summary())
    );
    Ok(())
}

impl Bench {
    /// The example with the store's credentials.
    fn example(&self, rss: Option<&Path>) -> Command {
        let mut c = match rss {
            Some(r) => under_time(r, &self.bench),
            None => cmd(&self.bench),
        };
        c.env("AWS_ACCESS_KEY_ID", S3_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", S3_SECRET)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", &self.endpoint);
        c
    }

    /// The synthetic artifact, stored under s3://bench/b.
    fn make(&self, size_mib: u64) -> Result<Made> {
        let out = self
            .example(None)
            .args(["make", "s3://bench/b", &size_mib.to_string()])
            .arg(self.work.join("make"))
            .stderr(Stdio::inherit())
            .output()
            .context("running bench_artifact make")?;
        if !out.status.success() {
            bail!("bench_artifact make failed ({})", out.status);
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.trim();
        eprintln!("{line}");
        crate::cache::remove(&self.work.join("make"))?;
        serde_json::from_str(line).with_context(|| format!("bench_artifact make printed {line:?}"))
    }

    /// One timed run in a fresh `run` directory: wall ms, peak RSS KiB.
    fn one(&self, side: fn(&Self, &Path) -> Result<u64>) -> Result<(u64, u64)> {
        let dir = self.work.join("run");
        crate::cache::remove(&dir)?;
        std::fs::create_dir(&dir)?;
        let t0 = Instant::now();
        let rss = side(self, &dir)?;
        Ok((ms_since(t0), rss))
    }

    /// The installer's cache lookup.
    fn ours(&self, dir: &Path) -> Result<u64> {
        let rss = self.work.join("rss.one");
        let mut c = self.example(Some(&rss));
        c.args(["read", "s3://bench/b"])
            .arg(dir)
            .stdout(std::fs::File::create(dir.join("read.json"))?);
        timed(&mut c, &rss)
    }

    /// curl (SigV4), sha256sum, zstd -dc: the largest RSS of the three.
    fn tools(&self, dir: &Path) -> Result<u64> {
        let rss = self.work.join("rss.one");
        let file = dir.join("a.tar.zst");
        let mut curl = under_time(&rss, "curl");
        curl.args(["-sSf", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
            .arg(format!("{S3_KEY_ID}:{S3_SECRET}"))
            .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-o"])
            .arg(&file)
            .arg(format!("{}/bench/{}", self.endpoint, self.object));
        let mut m = timed(&mut curl, &rss)?;
        let mut sum = under_time(&rss, "sha256sum");
        sum.arg(&file).stdout(Stdio::null());
        m = m.max(timed(&mut sum, &rss)?);
        let mut zstd = under_time(&rss, "zstd");
        zstd.args(["-q", "-dc"]).arg(&file).stdout(Stdio::null());
        Ok(m.max(timed(&mut zstd, &rss)?))
    }
}

/// The Markdown table: (median s, peak MiB) of the tools and of ours.
fn table(size: u64, (ts, tm): (f64, f64), (os, om): (f64, f64)) -> String {
    let mib = size as f64 / 1048576.0;
    format!(
        "| {mib:.0} MiB artifact | wall (median) | MiB/s | peak RSS |\n|---|---|---|---|\n\
         | curl + sha256sum + zstd -dc | {ts:.2} s | {:.0} | {tm:.1} MiB |\n\
         | installer (cache lookup, hit) | {os:.2} s | {:.0} | {om:.1} MiB |\n\
         | ratio | {:.2}x | | {:.2}x |\n",
        mib / ts,
        mib / os,
        os / ts,
        om / tm
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_from_makes_line() -> Result<()> {
        let m: Made = serde_json::from_str(
            r#"{"artifactBytes":314572800,"entry":"6.1.0-50-cloud-amd64/535.261.03-open-0123",
               "outcome":"Miss","sha256":"0123456789abcdef0123","step":"make","warnings":[]}"#,
        )?;
        assert_eq!(
            m.object(),
            "b/6.1.0-50-cloud-amd64/535.261.03-open-0123/artifact-0123456789abcdef.tar.zst"
        );
        Ok(())
    }

    #[test]
    fn the_table() {
        let s = Side(vec![(2000, 11000), (3000, 12000), (2500, 11500)]);
        assert_eq!(s.summary(), (2.5, 12000.0 / 1024.0));
        let t = table(300 * 1048576, (2.5, 11.0), (1.5, 22.0));
        assert_eq!(
            t,
            "| 300 MiB artifact | wall (median) | MiB/s | peak RSS |\n|---|---|---|---|\n\
             | curl + sha256sum + zstd -dc | 2.50 s | 120 | 11.0 MiB |\n\
             | installer (cache lookup, hit) | 1.50 s | 200 | 22.0 MiB |\n\
             | ratio | 0.60x | | 2.00x |\n"
        );
    }
}
