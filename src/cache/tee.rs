//! A second reader of a download as it streams past: the artifact's
//! unpacking check runs on a thread of its own, fed the same chunks that
//! are hashed and written to disk, so the file is never read a second time
//! and the check costs no wall time beyond the download's.

use std::io::Read;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::error::{Error, Failure, Result};

/// Chunks in flight between the download and the check: bounds the memory
/// the check may hold back (a chunk is the HTTP body's, tens of KiB).
const CHUNKS_IN_FLIGHT: usize = 64;

/// A check run over the downloaded bytes, in order.
pub(crate) type StreamCheck = Box<dyn FnOnce(ChunkReader) -> Result<()> + Send>;

/// The download's side: [`Tee::feed`] each chunk, then [`Tee::finish`].
pub(crate) struct Tee {
    tx: Option<SyncSender<Vec<u8>>>,
    thread: JoinHandle<Result<()>>,
}

impl Tee {
    pub(crate) fn start(check: StreamCheck) -> Result<Tee> {
        let (tx, rx) = sync_channel(CHUNKS_IN_FLIGHT);
        let thread = std::thread::Builder::new()
            .name("artifact-check".into())
            .spawn(move || check(ChunkReader::new(rx)))
            .map_err(|e| {
                Error::new(Failure::Internal, format!("starting the check thread: {e}"))
            })?;
        Ok(Tee {
            tx: Some(tx),
            thread,
        })
    }

    /// Hands a chunk to the check; blocks while it is `CHUNKS_IN_FLIGHT`
    /// behind. Once the check has ended (it read all it wanted, or failed)
    /// chunks are dropped: its result decides.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        if let Some(tx) = &self.tx {
            if tx.send(chunk.to_vec()).is_err() {
                self.tx = None;
            }
        }
    }

    /// Ends the stream (the check sees EOF) and returns its result.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.tx = None;
        self.thread
            .join()
            .map_err(|_| Error::new(Failure::Internal, "the artifact check panicked".to_string()))?
    }
}

/// The check's side: the chunks as one `Read`; EOF when the download ends.
pub(crate) struct ChunkReader {
    rx: Receiver<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
}

impl ChunkReader {
    fn new(rx: Receiver<Vec<u8>>) -> ChunkReader {
        ChunkReader {
            rx,
            cur: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.cur.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.cur = chunk;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_reads_every_chunk_in_order() {
        let mut tee = Tee::start(Box::new(|mut r: ChunkReader| {
            let mut s = String::new();
            r.read_to_string(&mut s).expect("read");
            assert_eq!(s, "abcdefgh");
            Ok(())
        }))
        .expect("start");
        for c in ["ab", "", "cde", "fgh"] {
            tee.feed(c.as_bytes());
        }
        tee.finish().expect("check");
    }

    #[test]
    fn a_check_that_ends_early_decides_and_the_feeding_goes_on() {
        let mut tee = Tee::start(Box::new(|mut r: ChunkReader| {
            let mut b = [0u8; 1];
            r.read_exact(&mut b).expect("read");
            Err(Error::new(Failure::ArtifactInvalid, "bad".to_string()))
        }))
        .expect("start");
        for _ in 0..(CHUNKS_IN_FLIGHT * 4) {
            tee.feed(b"0123456789");
        }
        let e = tee.finish().expect_err("the check failed");
        assert_eq!(e.reason, Failure::ArtifactInvalid);
    }
}
