//! Running external tools (make, strip, cc, ldconfig, modprobe, nvidia-smi):
//! always `Command` with arguments, never a shell string; stdin closed; a
//! failure names the command line and quotes the tail of its stderr.
//! Parsing what a tool printed is the caller's job, in separate functions
//! tested on captured output.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::error::{Error, Failure, Result};

/// Lines of stderr quoted in a failure message.
pub(crate) const STDERR_TAIL_LINES: usize = 5;

/// Byte bound of the quoted stderr tail.
const STDERR_TAIL_BYTES: usize = 2000;

/// The C locale, so that compiler and tool messages are in the English the
/// parsers expect.
pub(crate) const C_LOCALE: &[(&str, &str)] = &[
    ("LC_ALL", "C"),
    ("LANG", "C"),
    ("LC_CTYPE", "C"),
    ("LC_MESSAGES", "C"),
];

/// Variables a child inherits; everything else (cache credentials such as
/// `AWS_*`, `GOOGLE_*`, `AZURE_*`, proxy URLs with passwords, the Job's
/// whole environment) stays with the installer. PATH finds the tools and
/// TMPDIR is where the compiler writes its temporaries.
pub(crate) const INHERITED_ENV: &[&str] = &["PATH", "TMPDIR"];

/// PATH when the installer itself has none (an empty Job environment).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A command for `program` with an explicit, minimal environment: the
/// [`INHERITED_ENV`] variables and the C locale, nothing else. Every
/// external tool the installer runs is made here.
pub(crate) fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear();
    for var in INHERITED_ENV {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    if std::env::var_os("PATH").is_none() {
        cmd.env("PATH", DEFAULT_PATH);
    }
    cmd.envs(C_LOCALE.iter().copied());
    cmd
}

/// `program arg1 arg2 …` as it would be typed, for messages and logs.
pub(crate) fn command_line(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// The last lines of a tool's stderr, bounded, on one line.
pub(crate) fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let tail = crate::text::tail_lines(&text, STDERR_TAIL_LINES);
    let cut = tail.len().saturating_sub(STDERR_TAIL_BYTES);
    let mut start = cut;
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_string()
}

/// The longest any tool may run unless its caller says otherwise: far
/// above what modprobe, ldconfig, strip or systemctl need, so that only a
/// hung one meets it.
pub(crate) const TOOL_DEADLINE: Duration = Duration::from_secs(600);

/// The most a tool may print on either stream: nvidia-smi's longest report
/// is a few hundred KiB. Past it the tool is killed, not buffered.
pub(crate) const MAX_TOOL_OUTPUT: usize = 16 << 20;

/// Runs `cmd` to completion (stdin closed) and returns what it printed,
/// whatever its exit status, within [`TOOL_DEADLINE`] ([`output_within`]).
pub(crate) fn output(cmd: &mut Command, reason: Failure) -> Result<Output> {
    output_within(cmd, reason, TOOL_DEADLINE)
}

/// Runs `cmd` in a process group of its own, stdin closed, and returns
/// what it printed, whatever its exit status. Failing to start it, running
/// past `deadline`, or printing more than [`MAX_TOOL_OUTPUT`] on a stream
/// is `reason`, naming the command line, except that running past the
/// deadline is `TimedOut`; in the last two cases the whole group (the tool
/// and whatever it started) is killed first.
pub(crate) fn output_within(
    cmd: &mut Command,
    reason: Failure,
    deadline: Duration,
) -> Result<Output> {
    use std::os::unix::process::CommandExt;
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| {
            Error::new(reason, format!("running {}: {e}", command_line(cmd))).with_source(e)
        })?;
    let overflow = Arc::new(AtomicBool::new(false));
    let streams = read_streams(&mut child, &overflow);
    let watched = wait_within(&mut child, started, deadline, &overflow).and_then(|status| {
        collect_streams(&streams, started, deadline, &overflow).map(|s| (status, s))
    });
    match watched {
        Ok((status, [stdout, stderr])) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        Err(why) => {
            kill_group(&mut child);
            Err(Error::new(
                why.reason(reason),
                format!("{} {why}; killed", command_line(cmd)),
            ))
        }
    }
}

/// Both of the child's streams read on threads of their own, each to at
/// most [`MAX_TOOL_OUTPUT`]; the results arrive tagged 0 (stdout), 1.
fn read_streams(
    child: &mut std::process::Child,
    overflow: &Arc<AtomicBool>,
) -> mpsc::Receiver<(usize, Vec<u8>)> {
    let (tx, rx) = mpsc::channel();
    for (which, pipe) in [
        (
            0,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
        (
            1,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
    ] {
        let (tx, overflow) = (tx.clone(), overflow.clone());
        std::thread::spawn(move || {
            let bytes = pipe.map(|p| read_capped(p, &overflow)).unwrap_or_default();
            let _ = tx.send((which, bytes));
        });
    }
    rx
}

/// Waits for the child's exit; why not, when it runs past the deadline or
/// prints past the cap.
fn wait_within(
    child: &mut std::process::Child,
    started: Instant,
    deadline: Duration,
    overflow: &AtomicBool,
) -> std::result::Result<ExitStatus, Killed> {
    loop {
        if overflow.load(Ordering::Relaxed) {
            return Err(Killed::Overflow);
        }
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(e) => return Err(Killed::Unwaitable(e)),
        }
        if started.elapsed() >= deadline {
            return Err(Killed::Deadline(deadline));
        }
        std::thread::sleep(POLL);
    }
}

/// Both streams, once the tool and everything it started have closed
/// them; something it left running must not hold us past the deadline.
fn collect_streams(
    streams: &mpsc::Receiver<(usize, Vec<u8>)>,
    started: Instant,
    deadline: Duration,
    overflow: &AtomicBool,
) -> std::result::Result<[Vec<u8>; 2], Killed> {
    let mut out = [Vec::new(), Vec::new()];
    for _ in 0..2 {
        let left = deadline.saturating_sub(started.elapsed()).max(POLL);
        let (which, bytes) = streams
            .recv_timeout(left)
            .map_err(|_| Killed::HeldOutput(deadline))?;
        out[which] = bytes;
    }
    if overflow.load(Ordering::Relaxed) {
        return Err(Killed::Overflow);
    }
    Ok(out)
}

/// Why a tool was killed.
#[derive(Debug)]
enum Killed {
    Deadline(Duration),
    Overflow,
    Unwaitable(std::io::Error),
    HeldOutput(Duration),
}

impl Killed {
    /// A deadline is `TimedOut` whatever the step; the rest are the
    /// caller's `reason` (the tool misbehaved in a way the step owns).
    fn reason(&self, reason: Failure) -> Failure {
        match self {
            Killed::Deadline(_) | Killed::HeldOutput(_) => Failure::TimedOut,
            Killed::Overflow | Killed::Unwaitable(_) => reason,
        }
    }
}

impl std::fmt::Display for Killed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Killed::Deadline(d) => write!(f, "did not finish within {} s", d.as_secs()),
            Killed::Overflow => write!(f, "printed more than {} MiB", MAX_TOOL_OUTPUT >> 20),
            Killed::Unwaitable(e) => write!(f, "could not be waited for: {e}"),
            Killed::HeldOutput(d) => {
                write!(
                    f,
                    "left a process holding its output past {} s",
                    d.as_secs()
                )
            }
        }
    }
}

/// Kills the child's process group at the deadline unless told first that
/// its output ended (killing it ends the output). The thread answers
/// whether it killed.
fn watchdog(
    child: &std::process::Child,
    deadline: Duration,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<bool>) {
    let (done, wait_done) = mpsc::channel::<()>();
    let pid = i32::try_from(child.id()).unwrap_or(0);
    let thread = std::thread::spawn(move || {
        let timed_out = matches!(
            wait_done.recv_timeout(deadline),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        if timed_out {
            kill_pg(pid);
        }
        timed_out
    });
    (done, thread)
}

/// Copies `reader`'s lines into `log` and to tracing (debug) until the end;
/// the first write error, if any (reading goes on, so the child never
/// blocks on a full pipe).
fn copy_lines(reader: File, log: &mut File) -> Option<std::io::Error> {
    let mut lines = BufReader::new(reader);
    let mut line = Vec::new();
    let mut write_err = None;
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                if write_err.is_none() {
                    if let Err(e) = log.write_all(&line) {
                        write_err = Some(e);
                    }
                }
                tracing::debug!(target: "make", "{}", String::from_utf8_lossy(&line).trim_end());
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                write_err.get_or_insert(e);
                break;
            }
        }
    }
    write_err
}

/// How often a running tool is looked at.
const POLL: Duration = Duration::from_millis(10);

/// Reads a stream to its end, keeping at most [`MAX_TOOL_OUTPUT`] bytes;
/// past that it sets `overflow` and stops reading.
fn read_capped(mut r: impl Read, overflow: &AtomicBool) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if kept.len() + n > MAX_TOOL_OUTPUT {
                    overflow.store(true, Ordering::Relaxed);
                    break;
                }
                kept.extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    kept
}

/// SIGKILL to the process group `pid` leads (none for 0).
fn kill_pg(pid: i32) {
    if pid > 0 {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// SIGKILL to the tool's process group (it leads one of its own), then
/// reaps the tool.
fn kill_group(child: &mut std::process::Child) {
    kill_pg(i32::try_from(child.id()).unwrap_or(0));
    let _ = child.kill();
    let _ = child.wait();
}

/// Like [`output`], and an unsuccessful exit is `reason` too, quoting the
/// command line, the status and the tail of stderr.
pub(crate) fn run(cmd: &mut Command, reason: Failure) -> Result<Output> {
    run_within(cmd, reason, TOOL_DEADLINE)
}

/// [`run`] with an explicit deadline ([`output_within`]).
pub(crate) fn run_within(cmd: &mut Command, reason: Failure, deadline: Duration) -> Result<Output> {
    let out = output_within(cmd, reason, deadline)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(exit_error(cmd, &out, reason))
    }
}

/// The error for a finished, unsuccessful command: the tail of its stderr,
/// and of its stdout too when it printed there (nvidia-smi reports its
/// failures on stdout).
pub(crate) fn exit_error(cmd: &Command, out: &Output, reason: Failure) -> Error {
    let mut message = format!("{} exited with {}", command_line(cmd), out.status);
    let quoted: Vec<String> = [&out.stderr, &out.stdout]
        .into_iter()
        .map(|b| stderr_tail(b))
        .filter(|t| !t.is_empty())
        .collect();
    if !quoted.is_empty() {
        message.push_str(": ");
        message.push_str(&quoted.join(" | "));
    }
    Error::new(reason, message)
}

/// Runs `program args` in the C locale with its stdout and stderr
/// interleaved (one pipe for both, as a terminal would show them) into
/// `log` and to tracing at debug level. Failing to start it is
/// `spawn_reason`; its exit status is returned for the caller to judge
/// (a compile's failure is read from the log). Past `deadline` its process
/// group (make and every compiler it started) is killed: `TimedOut`,
/// naming the deadline and the log.
pub(crate) fn run_logged(
    program: &str,
    args: &[OsString],
    log: &Path,
    spawn_reason: Failure,
    deadline: Duration,
) -> Result<ExitStatus> {
    use std::os::unix::process::CommandExt;
    const LOCAL_IO: Failure = Failure::Internal;
    let mut file = File::create(log).map_err(|e| Error::io(LOCAL_IO, "creating", log, e))?;
    let mut cmd = command(program);
    cmd.args(args).stdin(Stdio::null());
    let header = format!("$ {}\n", command_line(&cmd));
    file.write_all(header.as_bytes())
        .map_err(|e| Error::io(LOCAL_IO, "writing", log, e))?;
    tracing::info!("running {}", header.trim_start_matches("$ ").trim_end());

    let (reader, writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::new(LOCAL_IO, format!("creating a pipe for {program}: {e}")))?;
    let writer2 = writer
        .try_clone()
        .map_err(|e| Error::new(LOCAL_IO, format!("duplicating a pipe for {program}: {e}")))?;
    let mut child = cmd
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(writer2))
        .process_group(0)
        .spawn()
        .map_err(|e| Error::new(spawn_reason, format!("running {program}: {e}")).with_source(e))?;
    // The Command held the only copies of the write end; with it dropped,
    // the reader sees EOF when the child (and its children) exit.
    drop(cmd);
    let (done, watchdog) = watchdog(&child, deadline);
    let write_err = copy_lines(File::from(reader), &mut file);
    let _ = done.send(());
    let timed_out = watchdog.join().unwrap_or(false);
    let status = child
        .wait()
        .map_err(|e| Error::new(LOCAL_IO, format!("waiting for {program}: {e}")))?;
    if timed_out {
        return Err(Error::new(
            Failure::TimedOut,
            format!(
                "{program} did not finish within {} s; killed (its output is in {})",
                deadline.as_secs(),
                log.display()
            ),
        ));
    }
    if let Some(e) = write_err {
        return Err(Error::io(LOCAL_IO, "writing", log, e));
    }
    file.sync_all()
        .map_err(|e| Error::io(LOCAL_IO, "writing", log, e))?;
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

    #[test]
    fn a_failing_tool_is_named_with_its_stderr_tail() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo one >&2; echo two >&2; exit 3"]);
        let e = run(&mut cmd, Failure::BuildFailed).unwrap_err();
        assert_eq!(e.reason, Reason::BuildFailed);
        assert!(e.to_string().starts_with("sh -c echo one"), "{e}");
        assert!(e.to_string().contains("exit status: 3"), "{e}");
        assert!(e.to_string().ends_with("one | two"), "{e}");
    }

    #[test]
    fn a_failure_printed_on_stdout_is_quoted_too() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo on-stdout; exit 9"]);
        let e = run(&mut cmd, Failure::VerifyFailed).unwrap_err();
        assert!(e.to_string().ends_with("exit status: 9: on-stdout"), "{e}");
    }

    #[test]
    fn a_missing_tool_is_named() {
        let mut cmd = Command::new("/nonexistent/tool");
        cmd.arg("--version");
        let e = output(&mut cmd, Failure::CompilerMissing).unwrap_err();
        assert_eq!(e.reason, Reason::CompilerMissing);
        assert!(
            e.to_string()
                .starts_with("running /nonexistent/tool --version: "),
            "{e}"
        );
    }

    #[test]
    fn success_returns_stdout() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out"]);
        let out = run(&mut cmd, Failure::Internal).unwrap();
        assert_eq!(out.stdout, b"out\n");
    }

    #[test]
    fn logged_runs_interleave_both_streams_into_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let args: Vec<OsString> = ["-c", "echo a; echo b >&2; exit 2"]
            .iter()
            .map(OsString::from)
            .collect();
        let status =
            run_logged("sh", &args, &log, Failure::CompilerMissing, TOOL_DEADLINE).unwrap();
        assert_eq!(status.code(), Some(2));
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text, "$ sh -c echo a; echo b >&2; exit 2\na\nb\n");
    }

    /// A tool that hangs (a cuInit that never returns, an nvidia-smi stuck
    /// in the kernel) is killed at its deadline, with whatever it started,
    /// and the failure is `TimedOut`, whatever the step.
    #[test]
    fn a_hung_tool_and_its_children_are_killed_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"sleep 300 & echo $! > "$1"; wait"#)
            .arg("sh")
            .arg(&pidfile);
        let e = output_within(&mut cmd, Failure::VerifyFailed, Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.reason, Reason::TimedOut);
        assert_eq!(e.reason.exit_code(), 16);
        assert!(
            e.to_string().contains("did not finish within 1 s; killed"),
            "{e}"
        );
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild got the SIGKILL too: gone (reaped by init) or a
        // zombie, once the signal is delivered.
        let gone = || {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            state.is_empty() || state.split(' ').nth(2) == Some("Z")
        };
        let until = Instant::now() + Duration::from_secs(30);
        while !gone() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(), "sleep {pid} still runs");
    }

    /// A tool that prints without end is killed past the cap, not buffered
    /// until memory runs out.
    #[test]
    fn a_tool_that_prints_without_end_is_killed_at_the_cap() {
        let mut cmd = Command::new("cat");
        cmd.arg("/dev/zero");
        let e = output(&mut cmd, Failure::VerifyFailed).unwrap_err();
        assert_eq!(e.reason, Reason::VerifyFailed);
        assert!(
            e.to_string().contains("printed more than 16 MiB; killed"),
            "{e}"
        );
    }

    /// A compile that hangs is killed at its deadline, with everything it
    /// started, and what it printed stays in the log.
    #[test]
    fn a_logged_run_past_its_deadline_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let args: Vec<OsString> = ["-c", "echo started; sleep 300 & wait"]
            .iter()
            .map(OsString::from)
            .collect();
        let e = run_logged(
            "sh",
            &args,
            &log,
            Failure::BuildFailed,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert_eq!(e.reason, Reason::TimedOut);
        assert!(
            e.to_string().contains("did not finish within 1 s; killed"),
            "{e}"
        );
        assert!(std::fs::read_to_string(&log).unwrap().contains("started"));
    }

    #[test]
    fn stderr_tail_is_bounded() {
        let long = "x".repeat(10_000);
        assert!(stderr_tail(long.as_bytes()).len() <= STDERR_TAIL_BYTES);
    }
}

#[cfg(test)]
mod env_tests {
    use super::*;

    /// The test harness runs with CARGO_* and whatever the shell had; a
    /// child made by `command` sees none of it.
    #[test]
    fn children_get_only_the_minimal_environment() {
        let mut cmd = command("env");
        let out = run(&mut cmd, Failure::Internal).unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let names: Vec<&str> = text.lines().filter_map(|l| l.split('=').next()).collect();
        assert!(names.contains(&"PATH"), "{text}");
        for name in &names {
            assert!(
                INHERITED_ENV.contains(name) || C_LOCALE.iter().any(|(k, _)| k == name),
                "{name} leaked into a child: {text}"
            );
        }
        assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
    }
}
