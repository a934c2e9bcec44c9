//! Reading a Debian binary package (`.deb`) without dpkg: an `ar` archive
//! holding `debian-binary` (format "2.x"), `control.tar.*` and
//! `data.tar.{xz,zst,gz,bz2}` or an uncompressed `data.tar`, in that order
//! (members starting with `_` may come between and are skipped, as dpkg
//! does). The data tarball is streamed into a directory with the safe
//! extractor's rules ([`crate::extract::unpack_tar_stream`]); nothing in the
//! package (maintainer scripts, triggers) is run.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{Error, Failure, Result};
use crate::extract::{self, Compression, ExtractReport};

const AR_MAGIC: &[u8; 8] = b"!<arch>\n";
const AR_HEADER_LEN: usize = 60;

/// What [`unpack_data`] did.
#[derive(Debug, Clone)]
pub struct DebReport {
    /// The data member's name, e.g. `data.tar.xz`.
    pub data_member: String,
    pub extract: ExtractReport,
}

/// One member header of an ar archive.
struct Member {
    name: String,
    size: u64,
}

fn invalid(deb: &Path, what: impl std::fmt::Display) -> Error {
    Error::new(
        Failure::ArchiveInvalid,
        format!("{}: not a valid Debian package: {what}", deb.display()),
    )
}

/// Reads the next member header; `None` at a clean end of the archive.
fn next_member(deb: &Path, r: &mut impl Read) -> Result<Option<Member>> {
    let mut head = [0u8; AR_HEADER_LEN];
    let mut got = 0;
    while got < AR_HEADER_LEN {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(invalid(deb, "truncated ar member header")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(Failure::Internal, "reading", deb, e)),
        }
    }
    if &head[58..60] != b"`\n" {
        return Err(invalid(
            deb,
            "ar member header without its '`\\n' terminator",
        ));
    }
    let text = |range: std::ops::Range<usize>| String::from_utf8_lossy(&head[range]).into_owned();
    // GNU ar ends names with '/', BSD/dpkg pads them with spaces.
    let name = text(0..16).trim_end().trim_end_matches('/').to_string();
    let size_text = text(48..58);
    let size = size_text.trim().parse::<u64>().map_err(|_| {
        invalid(
            deb,
            format_args!("ar member {name:?} has a bad size {size_text:?}"),
        )
    })?;
    if name.is_empty() || name.contains('/') {
        return Err(invalid(deb, format_args!("ar member name {name:?}")));
    }
    Ok(Some(Member { name, size }))
}

/// Reads and discards a member's content and its padding byte (members are
/// aligned to 2 bytes).
fn skip(deb: &Path, r: &mut impl Read, m: &Member) -> Result<()> {
    let want = m.size + m.size % 2;
    let n = io::copy(&mut r.take(want), &mut io::sink())
        .map_err(|e| Error::io(Failure::Internal, "reading", deb, e))?;
    // The last member's padding byte is sometimes missing; tolerate that.
    if n < m.size {
        return Err(invalid(
            deb,
            format_args!("member {} is truncated ({n} of {} bytes)", m.name, m.size),
        ));
    }
    Ok(())
}

fn compression_of(name: &str) -> Option<Compression> {
    match name.strip_prefix("data.tar")? {
        "" => Some(Compression::None),
        ".gz" => Some(Compression::Gzip),
        ".xz" => Some(Compression::Xz),
        ".zst" => Some(Compression::Zstd),
        ".bz2" => Some(Compression::Bzip2),
        _ => None,
    }
}

/// Unpacks the `.deb` at `deb`'s data tarball into the existing directory
/// `root`, merging with what is there (several packages go into one scratch
/// root). Absolute symlinks are rewritten to stay inside `root`; see
/// [`extract::unpack_tar_stream`], which is also not atomic. A malformed
/// ar archive, wrong member order or unsupported compression is
/// `ArchiveInvalid`; unsafe entries are `UnsafeArchive`.
pub fn unpack_data(deb: &Path, root: &Path) -> Result<DebReport> {
    let file = File::open(deb).map_err(|e| Error::io(Failure::Internal, "opening", deb, e))?;
    let mut r = BufReader::new(file);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)
        .map_err(|_| invalid(deb, "shorter than the ar magic"))?;
    if &magic != AR_MAGIC {
        return Err(invalid(deb, "no ar magic '!<arch>'"));
    }
    read_format_version(deb, &mut r)?;
    let mut seen_control = false;
    loop {
        let m = next_member(deb, &mut r)?.ok_or_else(|| {
            invalid(
                deb,
                if seen_control {
                    "no data.tar member"
                } else {
                    "no control.tar member"
                },
            )
        })?;
        if m.name.starts_with('_') {
            skip(deb, &mut r, &m)?;
        } else if !seen_control && m.name.starts_with("control.tar") {
            seen_control = true;
            skip(deb, &mut r, &m)?;
        } else if seen_control && m.name.starts_with("data.tar") {
            return unpack_member(deb, &mut r, m, root);
        } else {
            return Err(invalid(
                deb,
                format_args!(
                    "unexpected member {:?} (expected {})",
                    m.name,
                    if seen_control {
                        "data.tar.*"
                    } else {
                        "control.tar.*"
                    }
                ),
            ));
        }
    }
}

/// The first member, `debian-binary`: the package format, which must be
/// 2.x.
fn read_format_version(deb: &Path, r: &mut impl Read) -> Result<()> {
    let member = next_member(deb, r)?.ok_or_else(|| invalid(deb, "empty ar archive"))?;
    if member.name != "debian-binary" {
        return Err(invalid(
            deb,
            format_args!("first member is {:?}, not debian-binary", member.name),
        ));
    }
    if member.size > 64 {
        return Err(invalid(deb, "debian-binary is implausibly large"));
    }
    let mut version = Vec::new();
    r.take(member.size)
        .read_to_end(&mut version)
        .map_err(|e| Error::io(Failure::Internal, "reading", deb, e))?;
    if version.len() as u64 != member.size {
        return Err(invalid(deb, "debian-binary is truncated"));
    }
    if member.size % 2 == 1 {
        let _ = r.take(1).read_to_end(&mut Vec::new());
    }
    let version = String::from_utf8_lossy(&version);
    if !version.trim().starts_with("2.") {
        return Err(invalid(
            deb,
            format_args!("package format {:?}, only 2.x is supported", version.trim()),
        ));
    }
    Ok(())
}

/// Unpacks the data member `m`, whose bytes `r` is at, into `root`.
fn unpack_member(deb: &Path, r: &mut impl Read, m: Member, root: &Path) -> Result<DebReport> {
    let compression = compression_of(&m.name)
        .ok_or_else(|| invalid(deb, format_args!("unsupported data member {:?}", m.name)))?;
    let origin = PathBuf::from(format!("{}:{}", deb.display(), m.name));
    let mut data = r.take(m.size);
    let report = extract::unpack_tar_stream(&mut data, compression, root, &origin)?;
    // The compressed stream may end before the member does (padding);
    // what follows the data member is not needed.
    let _ = io::copy(&mut data, &mut io::sink());
    if data.limit() > 0 {
        return Err(invalid(deb, format_args!("member {} is truncated", m.name)));
    }
    Ok(DebReport {
        data_member: m.name,
        extract: report,
    })
}
