//! Stages that time themselves. Each finished stage is appended to a JSON
//! file (`target/xtask/stages.json`) at once, so a run that dies still says
//! how far it got, and the whole run ends with a table of the stages.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result};
use serde::Serialize;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    name: String,
    outcome: &'static str,
    seconds: u64,
    /// What the stage left free on the checkout's file system: a run that
    /// fills the disk says where.
    free_mib: Option<u64>,
}

pub struct Stages {
    out: PathBuf,
    records: Vec<Record>,
    started: Instant,
}

impl Stages {
    pub fn new(out: &Path) -> Result<Self> {
        if let Some(d) = out.parent() {
            std::fs::create_dir_all(d)?;
        }
        let s = Self {
            out: out.to_path_buf(),
            records: Vec::new(),
            started: Instant::now(),
        };
        s.write()?;
        Ok(s)
    }

    pub fn run<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        eprintln!("==> {name}");
        let t = Instant::now();
        let r = f();
        let seconds = t.elapsed().as_secs();
        let free_mib = free_mib(Path::new("."));
        let outcome = if r.is_ok() { "passed" } else { "failed" };
        eprintln!(
            "<== {name}: {seconds}s{}",
            free_mib
                .map(|f| format!(" ({f} MiB free)"))
                .unwrap_or_default()
        );
        self.records.push(Record {
            name: name.to_string(),
            outcome,
            seconds,
            free_mib,
        });
        self.write()?;
        r.with_context(|| format!("stage \"{name}\" failed"))
    }

    pub fn skip(&mut self, name: &str, why: &str) -> Result<()> {
        eprintln!("==> {name}: skipped ({why})");
        self.records.push(Record {
            name: name.to_string(),
            outcome: "skipped",
            seconds: 0,
            free_mib: None,
        });
        self.write()
    }

    fn write(&self) -> Result<()> {
        let doc = serde_json::json!({
            "totalSeconds": self.started.elapsed().as_secs(),
            "stages": self.records,
        });
        let tmp = self.out.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&doc)?)?;
        std::fs::rename(&tmp, &self.out).with_context(|| format!("writing {}", self.out.display()))
    }

    /// The table printed at the end of a run, passed or failed.
    pub fn table(&self) -> String {
        let w = self
            .records
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let mut t = format!("{:<w$}  {:>7}  {}\n", "stage", "seconds", "outcome");
        for r in &self.records {
            t.push_str(&format!(
                "{:<w$}  {:>7}  {}\n",
                r.name, r.seconds, r.outcome
            ));
        }
        t.push_str(&format!(
            "{:<w$}  {:>7}  (stage timings in {})\n",
            "total",
            self.started.elapsed().as_secs(),
            self.out.display()
        ));
        t
    }
}

pub fn free_mib(dir: &Path) -> Option<u64> {
    let out = std::process::Command::new("df")
        .arg("-Pm")
        .arg(dir)
        .output()
        .ok()?;
    parse_df_free(&String::from_utf8_lossy(&out.stdout))
}

/// The "Available" column of `df -Pm`'s one data line.
fn parse_df_free(out: &str) -> Option<u64> {
    out.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()
}

/// Progress on stderr for a command's stages: `==> name` when one starts,
/// `<== name: Ns (M MiB free)` when the next starts or `end` is called
/// (the free space of `dir`'s file system: a run that fills the disk says
/// at which stage).
pub struct Stage {
    dir: PathBuf,
    current: Option<(String, Instant)>,
}

impl Stage {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            current: None,
        }
    }

    pub fn start(&mut self, name: &str) {
        self.end();
        eprintln!("==> {name}");
        self.current = Some((name.to_string(), Instant::now()));
    }

    pub fn end(&mut self) {
        if let Some((name, t)) = self.current.take() {
            let free = free_mib(&self.dir)
                .map(|f| f.to_string())
                .unwrap_or_default();
            eprintln!("<== {name}: {}s ({free} MiB free)", t.elapsed().as_secs());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_df_available() {
        let out = "Filesystem     1048576-blocks  Used Available Capacity Mounted on\n\
                   /dev/vda               257000 12000     81234      13% /\n";
        assert_eq!(super::parse_df_free(out), Some(81234));
        assert_eq!(super::parse_df_free("header only\n"), None);
    }
}
