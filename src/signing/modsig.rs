//! The signature a signed module carries at its end, as the kernel reads
//! it (`include/linux/module_signature.h`): the PKCS#7 message, a 12-byte
//! `struct module_signature` (its last field the message's length,
//! big-endian) and the magic string.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{Error, Failure, Result};

/// What ends every signed module.
pub(crate) const MAGIC: &[u8] = b"~Module signature appended~\n";

/// `struct module_signature`'s size.
const INFO_LEN: usize = 12;

/// `id_type` of a PKCS#7 signature, the only kind the kernel accepts.
const PKEY_ID_PKCS7: u8 = 2;

/// A module's appended signature, from its trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ModSig {
    /// The PKCS#7 message's length in bytes.
    pub sig_len: u32,
}

/// The trailer of a file of `file_len` bytes whose last bytes are `tail`
/// (at least [`INFO_LEN`] + [`MAGIC`] of them): `None` when it carries no
/// PKCS#7 module signature the kernel would read.
pub(crate) fn parse_modsig(tail: &[u8], file_len: u64) -> Option<ModSig> {
    let body = tail.strip_suffix(MAGIC)?;
    let info = body.get(body.len().checked_sub(INFO_LEN)?..)?;
    if info[2] != PKEY_ID_PKCS7 {
        return None;
    }
    let sig_len = u32::from_be_bytes([info[8], info[9], info[10], info[11]]);
    let trailer = u64::from(sig_len) + (INFO_LEN + MAGIC.len()) as u64;
    (sig_len > 0 && trailer < file_len).then_some(ModSig { sig_len })
}

/// Whether the module at `path` ends with a PKCS#7 module signature.
pub(crate) fn is_signed_file(path: &Path, reason: Failure) -> Result<bool> {
    let io = |action: &str, e| Error::io(reason, action, path, e);
    let mut f = File::open(path).map_err(|e| io("opening", e))?;
    let len = f.metadata().map_err(|e| io("inspecting", e))?.len();
    let want = (INFO_LEN + MAGIC.len()) as u64;
    if len < want {
        return Ok(false);
    }
    f.seek(SeekFrom::Start(len - want))
        .map_err(|e| io("reading", e))?;
    let mut tail = Vec::with_capacity(want as usize);
    f.take(want)
        .read_to_end(&mut tail)
        .map_err(|e| io("reading", e))?;
    Ok(parse_modsig(&tail, len).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trailer(id_type: u8, sig_len: u32) -> Vec<u8> {
        let mut t = vec![0, 0, id_type, 0, 0, 0, 0, 0];
        t.extend(sig_len.to_be_bytes());
        t.extend(MAGIC);
        t
    }

    #[test]
    fn a_pkcs7_trailer_is_a_signature() {
        let t = trailer(2, 700);
        assert_eq!(parse_modsig(&t, 10_000), Some(ModSig { sig_len: 700 }));
    }

    #[test]
    fn no_magic_other_id_types_and_impossible_lengths_are_not() {
        assert_eq!(parse_modsig(b"\x7fELF plain module", 10_000), None);
        // PKEY_ID_PGP (0) and X509 (1) are not what the kernel verifies.
        assert_eq!(parse_modsig(&trailer(0, 700), 10_000), None);
        assert_eq!(parse_modsig(&trailer(2, 0), 10_000), None);
        // A signature longer than the file.
        assert_eq!(parse_modsig(&trailer(2, 9_990), 10_000), None);
        assert_eq!(parse_modsig(&MAGIC[4..], 10_000), None);
    }
}
