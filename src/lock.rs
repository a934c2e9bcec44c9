//! Exclusive file locks (flock) between installer processes, waited for
//! within a bound.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Failure, Result};

/// The longest wait for a lock another process holds: longer than any
/// holder should need (a download ends within its deadline, a compile in
/// minutes); past it the holder is hung, and saying so beats waiting
/// forever.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(3600);

/// How often a waiter tries the lock again.
const LOCK_POLL: Duration = Duration::from_millis(250);

/// An exclusive flock on `file`, held until dropped. When another process
/// holds it, says so on stderr (naming `path`) and waits, at most
/// [`LOCK_WAIT`].
pub(crate) fn lock_file(file: File, path: &Path, reason: Failure) -> Result<Flock<File>> {
    lock_file_within(file, path, reason, LOCK_WAIT)
}

/// [`lock_file`] with an explicit bound on the wait.
pub(crate) fn lock_file_within(
    file: File,
    path: &Path,
    reason: Failure,
    wait: Duration,
) -> Result<Flock<File>> {
    let failed = |errno: Errno| {
        Error::new(reason, format!("locking {}: {errno}", path.display())).with_source(errno)
    };
    let start = Instant::now();
    let mut file = file;
    let mut told = false;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, Errno::EWOULDBLOCK)) => {
                if start.elapsed() >= wait {
                    return Err(Error::new(
                        reason,
                        format!(
                            "{} has been held by another process for over {} s; giving up",
                            path.display(),
                            wait.as_secs()
                        ),
                    )
                    .with_hint("another gpu-driver-installer is still running (or hung) on this node; find it with `fuser` on the lock file"));
                }
                if !told {
                    tracing::info!("another process holds {}; waiting for it", path.display());
                    told = true;
                }
                std::thread::sleep(LOCK_POLL.min(wait.saturating_sub(start.elapsed())));
                file = f;
            }
            Err((_, errno)) => return Err(failed(errno)),
        }
    }
}

/// Opens (creating it if needed, never truncating) and locks `path`.
pub(crate) fn lock(path: &Path, reason: Failure) -> Result<Flock<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(reason, "opening lock", path, e))?;
    lock_file(file, path, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        let first = lock(&p, Failure::Internal).unwrap();
        let p2 = p.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let _second = lock(&p2, Failure::Internal).unwrap();
            tx.send(()).unwrap();
        });
        // The second holder cannot have the lock while the first is held.
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(200))
                .is_err()
        );
        drop(first);
        rx.recv().unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_lock_held_elsewhere_is_waited_for_within_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let held = lock(&path, Failure::Internal).unwrap();
        // Another open file description: flock conflicts as between
        // processes.
        let file = File::open(&path).unwrap();
        let e = lock_file_within(file, &path, Failure::Internal, Duration::from_millis(300))
            .unwrap_err();
        assert!(e.to_string().contains("held by another process"), "{e}");
        drop(held);
        let file = File::open(&path).unwrap();
        lock_file_within(file, &path, Failure::Internal, Duration::from_millis(300)).unwrap();
    }
}
