//! Local file primitives every module shares: publishing a file atomically
//! (temp file, fsync, rename), hashing a file, and exclusive locks. Writes
//! under the host root go through `hostfs` instead, which confines
//! path resolution to the root.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};

use crate::error::{Error, Failure, Result};

/// Reads and hashes in chunks of this size.
const CHUNK: usize = 1 << 20;

/// Writes `bytes` to `path` through a temporary file in the same directory
/// (created with O_EXCL by tempfile), fsyncs it, gives it `mode` and renames
/// it over `path`, then syncs the directory: a reader sees the old file or
/// the new one, never half of one. The directory is created if missing.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32, reason: Failure) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(|e| Error::io(reason, "creating", dir, e))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".gpu-driver-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| Error::io(reason, "creating a temporary file in", dir, e))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .and_then(|()| std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode)))
        .map_err(|e| Error::io(reason, "writing", tmp.path(), e))?;
    tmp.persist(path)
        .map_err(|e| Error::io(reason, "renaming into place", path, e.error))?;
    sync_dir(dir);
    Ok(())
}

/// Makes a rename or creation in `dir` durable. Best effort: a directory
/// that cannot be opened or synced only loses durability, not data.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// How a file that someone else names (a flag, a store, a package, the
/// host) may be read: what it is, for messages; its size cap; the reason a
/// refusal carries; and what to do about it.
#[derive(Clone, Copy, Debug)]
pub struct Named {
    pub what: &'static str,
    pub max: u64,
    pub reason: Failure,
    pub hint: &'static str,
}

impl Named {
    /// Reads the file: a regular file only (a FIFO would block and a device
    /// such as `/dev/zero` never end), at most `max` bytes. The open is
    /// non-blocking, so even a FIFO without a writer cannot hang it. A
    /// missing file is an error naming it.
    pub fn read(&self, path: &Path) -> Result<Vec<u8>> {
        match self.read_optional(path)? {
            Some(bytes) => Ok(bytes),
            None => Err(Error::new(
                self.reason,
                format!("{} {} does not exist", self.what, path.display()),
            )
            .with_hint_if(self.hint)),
        }
    }

    /// [`Named::read`], with `Ok(None)` when the file does not exist.
    pub fn read_optional(&self, path: &Path) -> Result<Option<Vec<u8>>> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io("opening", path, e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| self.io("inspecting", path, e))?;
        if !meta.file_type().is_file() {
            return Err(Error::new(
                self.reason,
                format!(
                    "{} {} is not a regular file ({}); refusing to read it",
                    self.what,
                    path.display(),
                    describe_file_type(&meta.file_type())
                ),
            )
            .with_hint_if(self.hint));
        }
        let mut bytes = Vec::new();
        (&file)
            .take(self.max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.io("reading", path, e))?;
        if bytes.len() as u64 > self.max {
            return Err(Error::new(
                self.reason,
                format!(
                    "{} {} is larger than {} KiB, too large for what it should be; refusing to read it",
                    self.what,
                    path.display(),
                    self.max >> 10
                ),
            )
            .with_hint_if(self.hint));
        }
        Ok(Some(bytes))
    }

    /// [`Named::read`] as UTF-8 text. A file that is not text is named,
    /// never quoted.
    pub fn read_text(&self, path: &Path) -> Result<String> {
        String::from_utf8(self.read(path)?).map_err(|e| {
            Error::new(
                self.reason,
                format!(
                    "{} {} is not UTF-8 text (byte {})",
                    self.what,
                    path.display(),
                    e.utf8_error().valid_up_to()
                ),
            )
            .with_hint_if(self.hint)
        })
    }

    fn io(&self, doing: &str, path: &Path, e: std::io::Error) -> Error {
        Error::io(self.reason, &format!("{doing} {}", self.what), path, e).with_hint_if(self.hint)
    }
}

fn describe_file_type(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The sha256 (lowercase hex) and size of a file, streamed.
pub fn sha256_file(path: &Path, reason: Failure) -> Result<(String, u64)> {
    let mut f = File::open(path).map_err(|e| Error::io(reason, "opening", path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(reason, "reading", path, e)),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), size))
}

/// The sha256 (lowercase hex) of bytes in memory.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Deletes a file; one that is already gone is fine.
pub fn remove_file_if_present(path: &Path, reason: Failure) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(reason, "deleting", path, e)),
    }
}

/// The longest wait for a lock another process holds: longer than any
/// holder should need (a download ends within its deadline, a compile in
/// minutes); past it the holder is hung, and saying so beats waiting
/// forever.
pub const LOCK_WAIT: Duration = Duration::from_secs(3600);

/// How often a waiter tries the lock again.
const LOCK_POLL: Duration = Duration::from_millis(250);

/// An exclusive flock on `file`, held until dropped. When another process
/// holds it, says so on stderr (naming `path`) and waits, at most
/// [`LOCK_WAIT`].
pub fn lock_file(file: File, path: &Path, reason: Failure) -> Result<Flock<File>> {
    lock_file_within(file, path, reason, LOCK_WAIT)
}

/// [`lock_file`] with an explicit bound on the wait.
pub fn lock_file_within(
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
pub fn lock(path: &Path, reason: Failure) -> Result<Flock<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(reason, "opening lock", path, e))?;
    lock_file(file, path, reason)
}

/// Copies the running binary to `dest` (atomically, mode 0755): the
/// operator's init container hands the installer from the scratch image to
/// the builder image this way (no `cp` in scratch).
pub fn copy_self(dest: &Path) -> Result<()> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::new(Failure::Internal, format!("finding this binary: {e}")))?;
    let bytes =
        std::fs::read(&exe).map_err(|e| Error::io(Failure::Internal, "reading", &exe, e))?;
    write_atomic(dest, &bytes, 0o755, Failure::InvalidArgument)
}

/// Files no reader should take whole or quote, for the tests of every
/// reader of a file someone else names.
#[cfg(test)]
pub(crate) mod hostile {
    use std::fmt::Debug;
    use std::path::{Path, PathBuf};

    /// The secret that [`secret_file`] holds; no message may show it.
    pub const SECRET: &str = "hunter2-do-not-print";

    /// A FIFO without a writer: a blocking open would wait forever.
    pub fn fifo(dir: &Path) -> PathBuf {
        let p = dir.join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        p
    }

    /// A link to `/dev/zero`: a read to the end never ends.
    pub fn zero(dir: &Path) -> PathBuf {
        let p = dir.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        p
    }

    /// A sparse regular file one byte over `max`.
    pub fn oversized(dir: &Path, max: u64) -> PathBuf {
        let p = dir.join("big");
        std::fs::File::create(&p).unwrap().set_len(max + 1).unwrap();
        p
    }

    /// A file that is not what the reader expects and holds a secret, as
    /// `/proc/self/environ` or a credentials file would.
    pub fn secret_file(dir: &Path) -> PathBuf {
        let p = dir.join("environ");
        std::fs::write(
            &p,
            format!("AWS_SECRET_ACCESS_KEY={SECRET}\0PATH=/bin\nkey = \"{SECRET}\"\n{SECRET}\n"),
        )
        .unwrap();
        p
    }

    /// `read` refuses each hostile file at once, says why, names it, and
    /// never shows the secret.
    pub fn assert_refused<T: Debug>(max: u64, read: impl Fn(&Path) -> crate::error::Result<T>) {
        let dir = tempfile::tempdir().unwrap();
        for (file, why) in [
            (fifo(dir.path()), Some("a FIFO")),
            (zero(dir.path()), Some("a character device")),
            (oversized(dir.path(), max), Some("larger than")),
            (secret_file(dir.path()), None),
        ] {
            let e = read(&file).expect_err("a hostile file was accepted");
            let shown = format!("{e} {:?}", e.hint);
            assert!(shown.contains(&file.display().to_string()), "{shown}");
            if let Some(why) = why {
                assert!(shown.contains(why), "{file:?}: {shown}");
            }
            assert!(!shown.contains(SECRET), "{file:?}: {shown}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

    #[test]
    fn named_files_are_read_bounded_regular_and_unquoted() {
        let named = Named {
            what: "the test file",
            max: 1 << 10,
            reason: Failure::InvalidArgument,
            hint: "pass a real one",
        };
        hostile::assert_refused(named.max, |p| {
            // The secret file is valid UTF-8 and small: refuse it the way a
            // parser would, by its path alone.
            let text = named.read_text(p)?;
            Err::<String, _>(Error::new(
                Failure::InvalidArgument,
                format!("{} is not a test file ({} bytes)", p.display(), text.len()),
            ))
        });
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok");
        std::fs::write(&ok, "fine").unwrap();
        assert_eq!(named.read_text(&ok).unwrap(), "fine");
        let e = named.read(&dir.path().join("absent")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert_eq!(
            named.read_optional(&dir.path().join("absent")).unwrap(),
            None
        );
        std::fs::write(&ok, b"\xff\xfe").unwrap();
        assert!(
            named
                .read_text(&ok)
                .unwrap_err()
                .to_string()
                .contains("not UTF-8")
        );
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/result.json");
        write_atomic(&p, b"one", 0o600, Failure::Internal).unwrap();
        write_atomic(&p, b"two", 0o644, Failure::Internal).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("result.json")]);
    }

    #[test]
    fn write_atomic_into_a_missing_parent_that_cannot_be_made_names_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        let e = write_atomic(
            &dir.path().join("file/x"),
            b"y",
            0o644,
            Failure::InvalidArgument,
        )
        .unwrap_err();
        assert_eq!(e.reason, Reason::InvalidArgument);
        assert!(e.to_string().contains("/file"), "{e}");
    }

    #[test]
    fn hashes_files_and_bytes_alike() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        let (sum, size) = sha256_file(&p, Failure::Internal).unwrap();
        assert_eq!(size, 3);
        assert_eq!(
            sum,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(sha256_bytes(b"abc"), sum);
        let e = sha256_file(&dir.path().join("missing"), Failure::ArtifactInvalid).unwrap_err();
        assert_eq!(e.reason, Reason::ArtifactInvalid);
        assert!(e.to_string().starts_with("opening "), "{e}");
    }

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
}

#[cfg(test)]
mod lock_tests {
    use super::*;

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
