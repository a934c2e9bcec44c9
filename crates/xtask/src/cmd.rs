//! Running external programs: arguments are never joined into a shell
//! string, stderr goes to the terminal, and a failure names the program.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

pub fn cmd(program: impl AsRef<OsStr>) -> Command {
    Command::new(program)
}

/// Runs `c` with stdout going to our stderr (stdout of the xtask is data).
pub fn run(c: &mut Command) -> Result<()> {
    let st = c
        .stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?))
        .status()
        .with_context(|| format!("starting {}", show(c)))?;
    if !st.success() {
        bail!("{} failed ({st})", show(c));
    }
    Ok(())
}

/// Runs `c` and returns its stdout, trimmed.
pub fn read(c: &mut Command) -> Result<String> {
    let out = c
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting {}", show(c)))?;
    if !out.status.success() {
        bail!("{} failed ({})", show(c), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The last line a script prints on stdout: by convention the path it made.
pub fn read_last_line(c: &mut Command) -> Result<String> {
    let out = read(c)?;
    let last = out.lines().last().unwrap_or_default().trim().to_string();
    if last.is_empty() {
        bail!("{} printed nothing", show(c));
    }
    Ok(last)
}

pub fn show(c: &Command) -> String {
    let mut s = c.get_program().to_string_lossy().into_owned();
    for a in c.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Whether `name` is a program on PATH.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| is_executable(&d.join(name))))
        .unwrap_or(false)
}

pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

use std::os::fd::AsFd as _;
