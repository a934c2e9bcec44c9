//! What building and checking the images share: stage timings, locks and
//! child processes with deadlines, bounded reads, and trees that may still
//! hold mounts.

use std::fs::{self, File, TryLockError};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{cmd, show};

/// Stage timings on stderr, as the test pipeline prints them.
#[derive(Default)]
pub struct Timer {
    current: Option<(String, Instant)>,
}

impl Timer {
    pub fn stage(&mut self, name: impl Into<String>) {
        self.end();
        let name = name.into();
        eprintln!("==> {name}");
        self.current = Some((name, Instant::now()));
    }

    pub fn end(&mut self) {
        if let Some((name, t)) = self.current.take() {
            let free = crate::stages::free_mib(Path::new("."))
                .map(|f| format!(" ({f} MiB free)"))
                .unwrap_or_default();
            eprintln!("<== {name}: {}s{free}", t.elapsed().as_secs());
        }
    }
}

/// How long a lock is waited for.
pub const LOCK_WAIT: Duration = Duration::from_secs(3600);

/// The lock file `path`, opened (created if missing), not yet locked.
pub fn lock_file(path: &Path) -> Result<File> {
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening the lock {}", path.display()))
}

/// Waits for a shared or exclusive flock on `f` (the file `path`) and
/// marks the lock file used (its mtime is what pruning looks at).
pub fn wait_lock(f: &File, path: &Path, shared: bool) -> Result<()> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        let r = if shared {
            f.try_lock_shared()
        } else {
            f.try_lock()
        };
        match r {
            Ok(()) => return touch(path),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(TryLockError::WouldBlock) => bail!("timed out waiting for {}", path.display()),
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
    }
}

/// Whether an exclusive lock on `f` was free (and is now held).
pub fn try_lock(f: &File, path: &Path) -> Result<bool> {
    match f.try_lock() {
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

pub fn touch(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.set_modified(SystemTime::now()))
        .with_context(|| format!("marking {} used", path.display()))
}

/// `GPU_DRIVER_CACHE_GRACE_MIN` (default 60): how long another key's
/// entry stays after its last use, so that a second checkout (or a run of
/// the previous version) beside this one keeps its own.
pub fn grace() -> Duration {
    let min = std::env::var("GPU_DRIVER_CACHE_GRACE_MIN")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(60);
    Duration::from_secs(min * 60)
}

/// Whether any of `paths` that exists was modified within `grace`.
pub fn used_within(paths: &[PathBuf], grace: Duration) -> bool {
    let now = SystemTime::now();
    paths.iter().any(|p| {
        fs::symlink_metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .is_some_and(|m| now.duration_since(m).map_or(true, |age| age <= grace))
    })
}

/// Waits for `child` until `timeout`; kills it past that.
pub fn wait_child(child: &mut Child, what: &str, timeout: Duration) -> Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child
            .try_wait()
            .with_context(|| format!("waiting for {what}"))?
        {
            return Ok(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not finish within {} s", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `c` with its stdout going to our stderr (our stdout is data).
pub fn run(c: &mut Command, timeout: Duration) -> Result<()> {
    let stderr = Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?);
    run_with(c, stderr, timeout)
}

/// Runs `c` with its stdout (an ID nobody reads) thrown away.
pub fn run_quiet(c: &mut Command, timeout: Duration) -> Result<()> {
    run_with(c, Stdio::null(), timeout)
}

fn run_with(c: &mut Command, stdout: Stdio, timeout: Duration) -> Result<()> {
    let what = show(c);
    let mut child = c
        .stdin(Stdio::null())
        .stdout(stdout)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let st = wait_child(&mut child, &what, timeout)?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

/// Runs `c` with stdout and stderr in `log`; a failure carries the log's
/// last `tail` lines.
pub fn run_logged(c: &mut Command, log: &Path, tail: usize, timeout: Duration) -> Result<()> {
    let what = show(c);
    let f = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut child = c
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let res = wait_child(&mut child, &what, timeout).and_then(|st| {
        if st.success() {
            Ok(())
        } else {
            bail!("{what} failed ({st})")
        }
    });
    res.with_context(|| format!("the end of {}:\n{}", log.display(), tail_of(log, tail)))
}

/// The last `n` lines of the file `path` (its last 64 KiB read).
pub fn tail_of(path: &Path, n: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut buf = Vec::new();
    use std::io::Seek as _;
    let _ = f.seek(std::io::SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let _ = f.take(64 * 1024).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `c` and returns its stdout, at most `max` bytes of it.
pub fn output(c: &mut Command, max: u64, timeout: Duration) -> Result<Vec<u8>> {
    let what = show(c);
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let out = child.stdout.take().context("no stdout pipe")?;
    // Reading stops at the limit and closes the pipe, so a child that
    // prints too much fails instead of blocking until the deadline.
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        out.take(max + 1).read_to_end(&mut buf).map(|_| buf)
    });
    let st = wait_child(&mut child, &what, timeout)?;
    let buf = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reading {what}'s output"))??;
    if buf.len() as u64 > max {
        bail!("{what} printed more than {max} bytes");
    }
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(buf)
}

/// The file `path`, at most `max` bytes of it.
pub fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>> {
    let f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut buf = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {}", path.display()))?;
    if buf.len() as u64 > max {
        bail!("{} is larger than {max} bytes", path.display());
    }
    Ok(buf)
}

/// `rm -rf` of a tree that may still hold mounts (a killed debootstrap
/// leaves /proc mounted in its root): unmounted first, deepest first.
pub fn remove_tree(path: &Path) -> Result<()> {
    if fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let dir = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mounts = fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    for m in mounts_below(&mounts, &dir) {
        let lazy = !cmd("umount")
            .arg(&m)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if lazy {
            crate::cmd::run(cmd("umount").arg("-l").arg(&m))?;
        }
    }
    crate::cache::remove(path)
}

/// The mount points in `mounts` (/proc/self/mounts) at or below `dir`,
/// deepest first.
fn mounts_below(mounts: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .map(|m| PathBuf::from(unescape_mount(m)))
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort();
    found.reverse();
    found
}

/// The kernel writes space, tab, newline and backslash in mount points as
/// octal escapes.
fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

use std::os::fd::AsFd as _;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_mounts_below_a_dir_deepest_first() {
        let mounts = "\
/dev/vda1 / ext4 rw,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
proc /c/images/base/x.tar.root/proc proc rw,relatime 0 0
sysfs /c/images/base/x.tar.root/sys sysfs rw,relatime 0 0
tmpfs /c/images/base/x.tar.root2 tmpfs rw 0 0
tmpfs /c/images/a\\040b tmpfs rw 0 0
";
        let dir = Path::new("/c/images/base/x.tar.root");
        assert_eq!(
            mounts_below(mounts, dir),
            vec![dir.join("sys"), dir.join("proc")]
        );
        assert_eq!(
            mounts_below(mounts, Path::new("/c/images/a b")),
            vec![PathBuf::from("/c/images/a b")]
        );
    }
}
