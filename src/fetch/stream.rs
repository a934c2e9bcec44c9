//! A response body into the partial file: written, hashed on a second
//! thread, bounded in size and time, with progress shown.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::attempt::{Deadline, Transient, fatal, too_large, transient};
use super::client::describe;
use crate::error::{Error, Failure, Result};

/// Read and hash in chunks of this size: large enough that syscalls do not
/// dominate, small enough that memory stays flat whatever the file size.
const CHUNK: usize = 256 * 1024;

/// Start writeback of what was written every this many bytes, so that the
/// final fsync does not wait for the whole file at once.
const WRITEBACK_EVERY: u64 = 16 * 1024 * 1024;

/// How often a non-TTY download logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
pub(super) struct StreamBounds {
    /// Bytes already in the partial file.
    pub(super) start: u64,
    /// The most the whole file may have.
    pub(super) max: u64,
    pub(super) deadline: Deadline,
}

/// Opens the partial file for appending (resume) or from scratch, and the
/// hash of what it keeps: a resumed download hashes its prefix once, so
/// the file is read back at most once, and only that part.
pub(super) fn open_partial(
    partial: &Path,
    resume: bool,
    have: u64,
) -> std::result::Result<(File, Sha256), Transient> {
    let io = |action: &str, e| fatal(Error::io(Failure::DownloadFailed, action, partial, e));
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(!resume)
        .open(partial)
        .map_err(|e| io("opening", e))?;
    let mut hasher = Sha256::new();
    if resume {
        file.seek(SeekFrom::End(0)).map_err(|e| io("seeking", e))?;
        hash_prefix(partial, have, &mut hasher).map_err(fatal)?;
    }
    Ok((file, hasher))
}

/// Streams the body into the file while hashing it on a second thread;
/// returns the hash and the bytes received, or the error and the bytes
/// received before it.
pub(super) fn stream(
    mut reader: reqwest::blocking::Response,
    file: &mut File,
    hasher: Sha256,
    url: &str,
    partial: &Path,
    bounds: StreamBounds,
    progress: &mut Progress,
) -> std::result::Result<(Sha256, u64), (Transient, u64)> {
    let start = bounds.start;
    let mut hashing = ParallelHasher::new(hasher);
    let mut got = 0u64;
    let mut flushed = 0u64;
    loop {
        let mut buf = hashing.buffer();
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {
                hashing.give_back(buf);
                continue;
            }
            Err(e) => {
                let msg = format!("{url}: connection lost after {got} bytes: {}", describe(&e));
                return Err((transient(msg, true), got));
            }
        };
        if start + got + n as u64 > bounds.max {
            let what = format!("sent more than {} bytes", bounds.max);
            return Err((fatal(too_large(url, &what, bounds.max)), got));
        }
        if let Err(e) = file.write_all(&buf[..n]) {
            let err = Error::io(Failure::DownloadFailed, "writing", partial, e);
            return Err((fatal(err), got));
        }
        hashing.submit(buf, n);
        got += n as u64;
        if bounds.deadline.passed() {
            return Err((fatal(bounds.deadline.error(url, got)), got));
        }
        progress.update(start + got);
        if got - flushed >= WRITEBACK_EVERY {
            start_writeback(file, start + flushed, got - flushed);
            flushed = got;
        }
    }
    Ok((hashing.finish(), got))
}

/// Hashes on a second thread while the first one receives and writes, so
/// that checksumming does not add to the download's wall time. A small pool
/// of buffers bounds the memory in flight (DEPTH × CHUNK).
struct ParallelHasher {
    full: Option<std::sync::mpsc::SyncSender<(Vec<u8>, usize)>>,
    free: std::sync::mpsc::Receiver<Vec<u8>>,
    worker: Option<std::thread::JoinHandle<Sha256>>,
    allocated: usize,
}

const DEPTH: usize = 8;

impl ParallelHasher {
    fn new(mut hasher: Sha256) -> Self {
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(Vec<u8>, usize)>(DEPTH);
        let (free_tx, free_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(DEPTH);
        let worker = std::thread::spawn(move || {
            for (buf, n) in full_rx {
                hasher.update(&buf[..n]);
                // The receiver may be gone once the download ended.
                let _ = free_tx.send(buf);
            }
            hasher
        });
        ParallelHasher {
            full: Some(full_tx),
            free: free_rx,
            worker: Some(worker),
            allocated: 0,
        }
    }

    fn buffer(&mut self) -> Vec<u8> {
        if let Ok(buf) = self.free.try_recv() {
            return buf;
        }
        if self.allocated < DEPTH {
            self.allocated += 1;
            return vec![0u8; CHUNK];
        }
        // Every buffer is in flight: wait for the hasher to return one.
        self.free.recv().unwrap_or_else(|_| vec![0u8; CHUNK])
    }

    fn give_back(&mut self, buf: Vec<u8>) {
        self.allocated = self.allocated.saturating_sub(1);
        drop(buf);
    }

    fn submit(&mut self, buf: Vec<u8>, n: usize) {
        if let Some(tx) = &self.full {
            let _ = tx.send((buf, n));
        }
    }

    fn finish(mut self) -> Sha256 {
        drop(self.full.take());
        match self.worker.take().map(std::thread::JoinHandle::join) {
            Some(Ok(h)) => h,
            // The worker only hashes; it cannot fail short of a panic, which
            // must not pass for a valid digest.
            _ => Sha256::new_with_prefix(b"hasher thread panicked"),
        }
    }
}

/// Asks the kernel to start writing a written range back to disk now
/// (POSIX_FADV_DONTNEED starts asynchronous writeback on Linux and drops the
/// range from the page cache once clean, which also keeps a 300 MB package
/// from crowding out a node's cache). Advisory: errors are ignored.
fn start_writeback(file: &File, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    let _ = nix::fcntl::posix_fadvise(
        file,
        offset,
        len,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
}

/// Feeds the first `len` bytes of a file to `hasher`.
fn hash_prefix(path: &Path, len: u64, hasher: &mut Sha256) -> Result<()> {
    let f = File::open(path).map_err(|e| Error::io(Failure::DownloadFailed, "opening", path, e))?;
    let mut r = f.take(len);
    let mut buf = vec![0u8; CHUNK];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(Failure::DownloadFailed, "reading", path, e)),
        }
    }
}

/// A bar on a TTY, a log line every few seconds otherwise.
pub(super) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    url: String,
    total: Option<u64>,
    last_log: Instant,
    started: Instant,
}

impl Progress {
    pub(super) fn new(url: &str, total: Option<u64>, start: u64, want_bar: bool) -> Self {
        let bar = (want_bar && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
            let bar = match total {
                Some(t) => indicatif::ProgressBar::new(t),
                None => indicatif::ProgressBar::new_spinner(),
            };
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bytes}/{total_bytes} {bar:40} {bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style);
            }
            bar.set_position(start);
            bar
        });
        Progress {
            bar,
            url: url.to_string(),
            total,
            last_log: Instant::now(),
            started: Instant::now(),
        }
    }

    pub(super) fn update(&mut self, pos: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(pos);
        } else if self.last_log.elapsed() >= LOG_EVERY {
            self.last_log = Instant::now();
            let secs = self.started.elapsed().as_secs_f64().max(0.001);
            tracing::info!(
                "{}: {} of {} bytes ({:.1} MiB/s)",
                self.url,
                pos,
                self.total.map_or("?".to_string(), |t| t.to_string()),
                pos as f64 / secs / (1024.0 * 1024.0)
            );
        }
    }

    pub(super) fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
