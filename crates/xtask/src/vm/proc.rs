//! Child processes with a deadline: every program the VM tests start is
//! waited for at most a limit, then stopped (SIGTERM, then SIGKILL, as
//! `timeout` would), and a failure carries the tail of its stderr.

use std::io::{Read as _, Write as _};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::cmd::show;

/// How much of a failing program's stderr an error quotes.
const TAIL: usize = 2000;

/// Limits for the programs around the VM: a download, an unpack, a build
/// of the test module, the assertions' test build.
pub const SHORT: Duration = Duration::from_secs(300);
pub const NETWORK: Duration = Duration::from_secs(900);
pub const LONG: Duration = Duration::from_secs(7200);

/// Waits for `child` until `limit`; past it the child gets SIGTERM, then
/// SIGKILL 10 s later. `None`: it ran past the limit.
pub fn wait(child: &mut Child, limit: Duration) -> Result<Option<ExitStatus>> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        if start.elapsed() >= limit {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let pid = Pid::from_raw(i32::try_from(child.id())?);
    let _ = kill(pid, Signal::SIGTERM);
    let grace = Instant::now();
    while grace.elapsed() < Duration::from_secs(10) {
        if child.try_wait()?.is_some() {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    child.wait()?;
    Ok(None)
}

/// Runs `c` (stdout as the caller set it, our stderr when unset), its
/// stderr passed through to ours and its tail kept for the error.
pub fn run_limited(c: &mut Command, limit: Duration) -> Result<()> {
    c.stdin(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().with_context(|| format!("starting {}", show(c)))?;
    let mut err = child.stderr.take().context("the child's stderr")?;
    let relay = thread::spawn(move || {
        let mut tail: Vec<u8> = Vec::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            let _ = std::io::stderr().write_all(&buf[..n]);
            tail.extend_from_slice(&buf[..n]);
            if tail.len() > TAIL {
                tail.drain(..tail.len() - TAIL);
            }
        }
        tail
    });
    let st = wait(&mut child, limit)?;
    let tail = relay.join().unwrap_or_default();
    let tail = String::from_utf8_lossy(&tail).trim().to_string();
    match st {
        None => bail!(
            "{} ran past {} s and was stopped; its stderr ended: {tail}",
            show(c),
            limit.as_secs()
        ),
        Some(st) if !st.success() => bail!("{} failed ({st}); its stderr ended: {tail}", show(c)),
        Some(_) => Ok(()),
    }
}

/// Runs `c` with its stdout on our stderr (our stdout is data).
pub fn run(c: &mut Command, limit: Duration) -> Result<()> {
    c.stdout(Stdio::from(
        std::os::fd::AsFd::as_fd(&std::io::stderr()).try_clone_to_owned()?,
    ));
    run_limited(c, limit)
}

/// Runs `c` and returns its stdout (at most `max` bytes are accepted).
pub fn read(c: &mut Command, limit: Duration, max: usize) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("stdout");
    let f = std::fs::File::create(&path)?;
    c.stdout(f);
    run_limited(c, limit)?;
    let len = std::fs::metadata(&path)?.len();
    if len > max as u64 {
        bail!("{} printed {len} bytes, more than {max}", show(c));
    }
    Ok(String::from_utf8_lossy(&std::fs::read(&path)?).into_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::cmd::cmd;

    #[test]
    fn stops_a_child_past_its_limit() {
        let mut c = cmd("sleep");
        c.arg("30");
        let mut child = c.spawn().unwrap();
        let st = super::wait(&mut child, Duration::from_millis(200)).unwrap();
        assert!(st.is_none());
    }

    #[test]
    fn a_failure_quotes_stderr() {
        let mut c = cmd("sh");
        c.args(["-c", "echo broken >&2; exit 3"]);
        let e = super::run(&mut c, Duration::from_secs(10)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("broken") && msg.contains("sh -c"), "{msg}");
        let out = super::read(cmd("echo").arg("hi"), Duration::from_secs(10), 10).unwrap();
        assert_eq!(out, "hi\n");
    }
}
