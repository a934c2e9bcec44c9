//! Running external tools (make, strip, cc, ldconfig, modprobe, nvidia-smi):
//! always `Command` with arguments, never a shell string; stdin closed; a
//! failure names the command line and quotes the tail of its stderr.
//! Parsing what a tool printed is the caller's job, in separate functions
//! tested on captured output.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};

use crate::error::{Error, Failure, Result};

/// Lines of stderr quoted in a failure message.
pub const STDERR_TAIL_LINES: usize = 5;

/// Byte bound of the quoted stderr tail.
const STDERR_TAIL_BYTES: usize = 2000;

/// The C locale, so that compiler and tool messages are in the English the
/// parsers expect.
pub const C_LOCALE: &[(&str, &str)] = &[
    ("LC_ALL", "C"),
    ("LANG", "C"),
    ("LC_CTYPE", "C"),
    ("LC_MESSAGES", "C"),
];

/// Variables a child inherits; everything else (cache credentials such as
/// `AWS_*`, `GOOGLE_*`, `AZURE_*`, proxy URLs with passwords, the Job's
/// whole environment) stays with the installer. PATH finds the tools and
/// TMPDIR is where the compiler writes its temporaries.
pub const INHERITED_ENV: &[&str] = &["PATH", "TMPDIR"];

/// PATH when the installer itself has none (an empty Job environment).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A command for `program` with an explicit, minimal environment: the
/// [`INHERITED_ENV`] variables and the C locale, nothing else. Every
/// external tool the installer runs is made here.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
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
pub fn command_line(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// The last lines of a tool's stderr, bounded, on one line.
pub fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let tail = crate::text::tail_lines(&text, STDERR_TAIL_LINES);
    let cut = tail.len().saturating_sub(STDERR_TAIL_BYTES);
    let mut start = cut;
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_string()
}

/// Runs `cmd` to completion (stdin closed) and returns what it printed,
/// whatever its exit status. Failing to start it is `reason`, naming the
/// command line.
pub fn output(cmd: &mut Command, reason: Failure) -> Result<Output> {
    cmd.stdin(Stdio::null()).output().map_err(|e| {
        Error::new(reason, format!("running {}: {e}", command_line(cmd))).with_source(e)
    })
}

/// Like [`output`], and an unsuccessful exit is `reason` too, quoting the
/// command line, the status and the tail of stderr.
pub fn run(cmd: &mut Command, reason: Failure) -> Result<Output> {
    let out = output(cmd, reason)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(exit_error(cmd, &out, reason))
    }
}

/// The error for a finished, unsuccessful command: the tail of its stderr,
/// and of its stdout too when it printed there (nvidia-smi reports its
/// failures on stdout).
pub fn exit_error(cmd: &Command, out: &Output, reason: Failure) -> Error {
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
/// (a compile's failure is read from the log).
pub fn run_logged(
    program: &str,
    args: &[OsString],
    log: &Path,
    spawn_reason: Failure,
) -> Result<ExitStatus> {
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
        .spawn()
        .map_err(|e| Error::new(spawn_reason, format!("running {program}: {e}")).with_source(e))?;
    // The Command held the only copies of the write end; with it dropped,
    // the reader sees EOF when the child (and its children) exit.
    drop(cmd);
    let mut lines = BufReader::new(File::from(reader));
    let mut line = Vec::new();
    let mut write_err = None;
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                if write_err.is_none() {
                    if let Err(e) = file.write_all(&line) {
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
    let status = child
        .wait()
        .map_err(|e| Error::new(LOCAL_IO, format!("waiting for {program}: {e}")))?;
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
        let status = run_logged("sh", &args, &log, Failure::CompilerMissing).unwrap();
        assert_eq!(status.code(), Some(2));
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text, "$ sh -c echo a; echo b >&2; exit 2\na\nb\n");
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
