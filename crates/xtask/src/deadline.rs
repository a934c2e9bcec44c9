//! External programs that may hang on the network or a slow disk
//! (apt, debootstrap, mkfs), each run with a deadline: a child still
//! running at its deadline is killed and the run fails, naming it.

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::fd::AsFd as _;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cmd::show;

/// The most of a captured stdout that is read back.
const MAX_STDOUT: u64 = 16 << 20;

/// Runs `c` with its stdout on our stderr (the xtask's stdout is data).
pub fn run(c: &mut Command, limit: Duration) -> Result<()> {
    c.stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?));
    let st = wait(spawn(c)?, limit, c)?;
    if !st.success() {
        bail!("{} failed ({st})", show(c));
    }
    Ok(())
}

/// Runs `c` and returns its stdout (its stderr is left as the caller set
/// it, by default ours).
pub fn read(c: &mut Command, limit: Duration) -> Result<String> {
    let mut out = tempfile::tempfile().context("creating a file for a child's stdout")?;
    c.stdout(out.try_clone()?);
    let st = wait(spawn(c)?, limit, c)?;
    if !st.success() {
        bail!("{} failed ({st})", show(c));
    }
    out.seek(SeekFrom::Start(0))?;
    let mut buf = Vec::new();
    out.take(MAX_STDOUT).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Runs `c` with stdout and stderr in `log`; a failure carries the log's
/// last `tail` lines.
pub fn run_logged(c: &mut Command, log: &Path, limit: Duration, tail: usize) -> Result<()> {
    let f = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    c.stdout(f.try_clone()?).stderr(f);
    let res = wait(spawn(c)?, limit, c).and_then(|st| {
        if st.success() {
            Ok(())
        } else {
            bail!("{} failed ({st})", show(c))
        }
    });
    res.map_err(|e| {
        anyhow::anyhow!(
            "{e:#}; the end of {}:\n{}",
            log.display(),
            tail_of(log, tail)
        )
    })
}

/// The last `n` lines of the file at `path` (at most its last 64 KiB).
pub fn tail_of(path: &Path, n: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn spawn(c: &mut Command) -> Result<Child> {
    c.spawn().with_context(|| format!("starting {}", show(c)))
}

fn wait(mut child: Child, limit: Duration, c: &Command) -> Result<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{} ran past its {} s limit", show(c), limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stdout_and_kills_at_the_deadline() {
        let out = read(
            Command::new("sh").args(["-c", "echo one; echo two"]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(out, "one\ntwo\n");
        let t = Instant::now();
        let e = read(Command::new("sleep").arg("30"), Duration::from_millis(300)).unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_failure_carries_the_logs_tail() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let e = run_logged(
            Command::new("sh").args(["-c", "seq 1 50; exit 3"]),
            &log,
            Duration::from_secs(10),
            2,
        )
        .unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.ends_with("49\n50"), "{msg}");
    }
}
