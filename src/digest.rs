//! SHA-256 of files (streamed) and of bytes, in lowercase hex.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Failure, Result};

/// Reads and hashes in chunks of this size.
const CHUNK: usize = 1 << 20;

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
#[cfg(test)]
pub(crate) fn sha256_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

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
}
