//! The cluster's processes: starting a component in a process group of its
//! own, telling whether a pid file's process is really ours, stopping it,
//! and the signals that make a failing `up` clean up after itself.

use std::fs::File;
use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::Pid;

use super::Layout;
use crate::cmd::show;

/// What /proc/PID/stat says after the command name: (state, ppid).
fn parse_stat(stat: &str) -> Option<(char, u32)> {
    // The command name may hold ") ": the fields start after the last one.
    let rest = &stat[stat.rfind(") ")? + 2..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

/// The first NUL-terminated field of /proc/PID/cmdline.
fn parse_argv0(cmdline: &[u8]) -> String {
    let end = cmdline
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(cmdline.len());
    String::from_utf8_lossy(&cmdline[..end]).into_owned()
}

/// Reads at most `max` bytes of `path` (pid files and /proc entries are
/// small; a larger one is not ours anyway).
fn read_bounded(path: &Path, max: u64) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    File::open(path)
        .ok()?
        .take(max)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

/// The pid in `path`, if it holds one.
pub fn read_pid(path: &Path) -> Option<u32> {
    let text = read_bounded(path, 64)?;
    let t = String::from_utf8_lossy(&text);
    let t = t.trim();
    (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .then(|| t.parse().ok())
        .flatten()
}

/// The arguments of a running process (NUL-separated /proc/PID/cmdline).
pub fn cmdline(pid: u32) -> Vec<String> {
    read_bounded(Path::new(&format!("/proc/{pid}/cmdline")), 64 << 10)
        .map(|c| {
            c.split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the process in run/NAME.pid is ours and running.
pub fn alive(l: &Layout, name: &str) -> bool {
    let Some(pid) = read_pid(&l.pid_file(name)) else {
        return false;
    };
    let Some(stat) = read_bounded(Path::new(&format!("/proc/{pid}/stat")), 4096) else {
        return false;
    };
    let Some((state, ppid)) = parse_stat(&String::from_utf8_lossy(&stat)) else {
        return false;
    };
    // Exited, not reaped yet.
    if state == 'Z' {
        return false;
    }
    // Our own child, even between fork and exec (its cmdline is still ours).
    if ppid == std::process::id() {
        return true;
    }
    // Anyone else's view (a later `down`): a recycled pid runs another
    // program, so only trust our binary (or, from a cluster the shell
    // script started, setsid in its exec window).
    let Some(raw) = read_bounded(Path::new(&format!("/proc/{pid}/cmdline")), 64 << 10) else {
        return false;
    };
    let argv0 = parse_argv0(&raw);
    !argv0.is_empty()
        && (argv0.ends_with(&format!("/{name}")) || argv0 == "setsid" || argv0.ends_with("/setsid"))
}

/// SIGTERM to `pid`, ignoring a process that has gone.
pub fn term(pid: u32) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = signal::kill(Pid::from_raw(p), Signal::SIGTERM);
    }
}

/// Whether `pid` exists and we may signal it (`kill -0`).
pub fn exists(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|p| signal::kill(Pid::from_raw(p), None).is_ok())
}

/// Stops the component NAME: SIGTERM, up to 10 s for it to go, then
/// SIGKILL; its pid file goes either way.
pub fn stop(l: &Layout, name: &str) {
    let pid_file = l.pid_file(name);
    if let Some(pid) = read_pid(&pid_file).filter(|_| alive(l, name)) {
        term(pid);
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(l, name) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        if alive(l, name) {
            if let Ok(p) = i32::try_from(pid) {
                let _ = signal::kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let _ = std::fs::remove_file(&pid_file);
}

/// Starts `c` in a process group of its own (a Ctrl-C in the terminal of
/// `up` does not reach it), stdin from /dev/null, stdout and stderr into
/// `log` (or nowhere); returns its pid. The child is never waited for: it
/// outlives this process.
pub fn spawn_detached(c: &mut Command, log: Option<&Path>) -> Result<u32> {
    let (out, err) = match log {
        Some(p) => {
            let f = File::create(p).with_context(|| format!("creating {}", p.display()))?;
            (Stdio::from(f.try_clone()?), Stdio::from(f))
        }
        None => (Stdio::null(), Stdio::null()),
    };
    let child = c
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", show(c)))?;
    Ok(child.id())
}

/// Runs `c` to completion within `limit`, capturing stdout; a failure
/// carries the tail of its stderr.
pub fn output(c: &mut Command, limit: Duration) -> Result<String> {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", show(c)))?;
    let deadline = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{} still running after {limit:?}; killed", show(c));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Exited: its pipes hold what it wrote (short for these programs).
    let out = child.wait_with_output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("{} failed ({}):\n{}", show(c), out.status, tail.join("\n"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: std::ffi::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// From now on SIGINT, SIGTERM and SIGHUP only set a flag that `up`'s
/// waits check, so an interrupted `up` still stops what it started.
pub fn catch_signals() -> Result<()> {
    let act = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; exec resets it to the default in children.
        unsafe { signal::sigaction(s, &act) }.with_context(|| format!("catching {s}"))?;
    }
    Ok(())
}

/// Fails once a signal has asked `up` to stop.
pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted by a signal");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat() {
        let s = "4242 (kube-apiserver) S 1 4242 4242 0 -1 4194560 12345 0 0 0 \
                 10 5 0 0 20 0 12 0 123456 1234567 890 18446744073709551615";
        assert_eq!(parse_stat(s), Some(('S', 1)));
        // A name with ") " and spaces in it.
        let s = "77 (a) b (c) Z 55 77 77 0 -1 4194560";
        assert_eq!(parse_stat(s), Some(('Z', 55)));
        assert_eq!(parse_stat("77 (x"), None);
    }

    #[test]
    fn parses_argv0() {
        assert_eq!(
            parse_argv0(b"/cache/k8s/abc/etcd\0--name\0local\0"),
            "/cache/k8s/abc/etcd"
        );
        assert_eq!(parse_argv0(b""), "");
        assert_eq!(parse_argv0(b"setsid"), "setsid");
    }

    #[test]
    fn reads_pid_files() {
        let d = std::env::temp_dir().join(format!("xtask-pid-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("x.pid");
        std::fs::write(&p, "1234\n").unwrap();
        assert_eq!(read_pid(&p), Some(1234));
        std::fs::write(&p, "12a\n").unwrap();
        assert_eq!(read_pid(&p), None);
        std::fs::write(&p, "").unwrap();
        assert_eq!(read_pid(&p), None);
        assert_eq!(read_pid(&d.join("none")), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
