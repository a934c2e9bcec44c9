//! Reading makeself self-extracting archives (NVIDIA's `.run`) without ever
//! running them: the shell header is parsed as text for the payload offset,
//! the decompress command and the embedded checksums.
//!
//! Two header families exist:
//!
//! - makeself 2.x (2.1 to 2.5, Debian's `makeself`): the header is the first
//!   `N` lines, given as `skip="N"` used by `head -n "$skip"`, or (2.1.x) as
//!   a literal `head -n N "$0"`. The payload is one or more chunks whose
//!   sizes are `filesizes="a b …"`; `MD5`, `SHA` (sha256) and `CRCsum` (POSIX
//!   cksum) hold one value per chunk.
//! - NVIDIA's makeself 1.6.0-nv2 (the driver `.run` files): `skip=N` used by
//!   `tail -n +$skip`, so the payload starts at line `N`, after an optional
//!   embedded decompressor, and runs to the end of the file. `CRCsum` and
//!   `MD5` cover everything from line 4 (`tail -n +4`) to the end.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use md5::Md5;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Failure, Result};

/// How a payload is compressed. Detected from magic bytes, never from the
/// file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Gzip,
    Bzip2,
    Xz,
    Zstd,
    /// A plain tar.
    None,
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
            Compression::None => "uncompressed tar",
        })
    }
}

/// A checksum from a makeself header that was verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Checksum {
    Md5,
    Sha256,
    /// POSIX `cksum` CRC (makeself's `CRCsum`).
    Cksum,
}

/// Text before the first NUL byte is read as header; a header larger than
/// this is not a makeself header.
const MAX_HEADER_TEXT: u64 = 8 << 20;
/// NVIDIA embeds a decompressor binary of a few hundred KB between the text
/// and the payload; the payload line must come within this many bytes.
const MAX_HEADER_BYTES: u64 = 64 << 20;

/// One compressed tar stream inside the file, with the checksums the header
/// gives for it (a checksum range may be wider than the chunk: NVIDIA's
/// cover the header from line 4 too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub offset: u64,
    /// `None`: to the end of the file.
    pub len: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Expected {
    pub md5: Option<String>,
    pub sha256: Option<String>,
    pub crc: Option<u32>,
}

/// A byte range of the file and what its checksums must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checked {
    pub offset: u64,
    pub len: Option<u64>,
    pub expected: Expected,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Makeself {
    pub chunks: Vec<Chunk>,
    pub checked: Vec<Checked>,
    /// The compression the header's decompress command names, if any.
    pub compression: Option<Compression>,
    /// The decompress command as written, for messages.
    pub decompress_cmd: Option<String>,
}

/// Does this look like a makeself header? Only the first bytes are needed.
pub(crate) fn looks_like_makeself(head: &[u8]) -> bool {
    if !head.starts_with(b"#!") {
        return false;
    }
    let text = String::from_utf8_lossy(head);
    text.contains("Makeself")
        || text.contains("makeself")
        || (text.contains("CRCsum=") && text.lines().any(|l| l.starts_with("skip=")))
}

/// Parses the header of the makeself archive `path` and locates its payload.
pub(crate) fn parse(path: &Path, file: &mut File) -> Result<Makeself> {
    let invalid = |what: &str| {
        Error::new(
            Failure::ArchiveInvalid,
            format!("{}: {what}", path.display()),
        )
    };
    let file_len = file
        .metadata()
        .map_err(|e| Error::io(Failure::Internal, "reading metadata of", path, e))?
        .len();
    let (lines, text_to_eof) = header_lines(path, file, file_len)?;
    let text: Vec<&str> = lines.iter().map(String::as_str).collect();

    let offset = find_offset(&text).map_err(|m| {
        if text_to_eof {
            // All text and no payload: most likely a download cut short.
            invalid(&format!(
                "truncated: the file ends inside its makeself header ({})",
                m.message
            ))
        } else {
            invalid(&m.message)
        }
    })?;
    // Only lines before the payload are header; a value found after it would
    // come from the payload's bytes.
    let header_line_count = match offset {
        Offset::Head(n) => n,
        Offset::Tail(n) => n.saturating_sub(1),
    };
    let header: Vec<&str> = text.iter().take(header_line_count).copied().collect();
    let payload_start = match offset {
        Offset::Head(n) => line_offset(path, file, n)?,
        Offset::Tail(n) => line_offset(path, file, n.saturating_sub(1))?,
    }
    .ok_or_else(|| invalid("truncated: the file ends inside the makeself header"))?;

    let cmd = decompress_cmd(&header);
    let compression = match &cmd {
        Some(c) => Some(compression_of_cmd(c).ok_or_else(|| {
            invalid(&format!(
                "payload is compressed with '{c}', which is not supported (gzip, bzip2, xz, zstd or none)"
            ))
        })?),
        None => None,
    };
    let (chunks, checked) = payload_chunks(path, file, offset, &header, payload_start, file_len)?;
    if payload_start >= file_len {
        return Err(invalid("truncated: no payload after the makeself header"));
    }

    Ok(Makeself {
        chunks,
        checked,
        compression,
        decompress_cmd: cmd,
    })
}

/// The payload's chunks and the checksums to verify them with: `head -n`
/// headers list their chunks' sizes; `tail -n +N` ones have one chunk to
/// the end of the file.
fn payload_chunks(
    path: &Path,
    file: &mut File,
    offset: Offset,
    header: &[&str],
    payload_start: u64,
    file_len: u64,
) -> Result<(Vec<Chunk>, Vec<Checked>)> {
    let invalid = |what: &str| {
        Error::new(
            Failure::ArchiveInvalid,
            format!("{}: {what}", path.display()),
        )
    };
    let sums = HeaderSums {
        md5: values(header, "MD5"),
        sha: values(header, "SHA"),
        crc: values(header, "CRCsum"),
    };
    match offset {
        Offset::Head(_) => {
            let have = file_len.saturating_sub(payload_start);
            head_chunks(header, &sums, payload_start, have).map_err(|m| invalid(&m.message))
        }
        Offset::Tail(_) => {
            // `tail -n +4 $0`: from line 4 to the end of the file.
            let from = line_offset(path, file, 3)?.ok_or_else(|| invalid("truncated header"))?;
            let chunks = vec![Chunk {
                offset: payload_start,
                len: None,
            }];
            let checked = vec![Checked {
                offset: from,
                len: None,
                expected: sums.expected(0),
            }];
            Ok((chunks, checked))
        }
    }
}

/// Verifies every checksum the header gives; returns which kinds were
/// checked. A mismatch names the file and the checksum.
pub(crate) fn verify(path: &Path, file: &mut File, checked: &[Checked]) -> Result<Vec<Checksum>> {
    let mut kinds = Vec::new();
    for (i, c) in checked.iter().enumerate() {
        let e = &c.expected;
        if e.md5.is_none() && e.sha256.is_none() && e.crc.is_none() {
            continue;
        }
        file.seek(SeekFrom::Start(c.offset))
            .map_err(|err| Error::io(Failure::Internal, "seeking in", path, err))?;
        let mut md5 = e.md5.as_ref().map(|_| Md5::new());
        let mut sha = e.sha256.as_ref().map(|_| Sha256::new());
        let mut crc = e.crc.map(|_| Cksum::new());
        let mut reader: Box<dyn Read> = match c.len {
            Some(n) => Box::new((&mut *file).take(n)),
            None => Box::new(&mut *file),
        };
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = reader
                .read(&mut buf)
                .map_err(|err| Error::io(Failure::Internal, "reading", path, err))?;
            if n == 0 {
                break;
            }
            let data = &buf[..n];
            if let Some(h) = md5.as_mut() {
                h.update(data);
            }
            if let Some(h) = sha.as_mut() {
                h.update(data);
            }
            if let Some(h) = crc.as_mut() {
                h.update(data);
            }
        }
        let chunk = if checked.len() > 1 {
            format!(" of payload chunk {}", i + 1)
        } else {
            String::new()
        };
        let mismatch = |name: &str, got: &str, want: &str| {
            Error::new(
                Failure::ArchiveInvalid,
                format!(
                    "{}: {name} checksum{chunk} does not match its makeself header: computed {got}, header says {want}",
                    path.display()
                ),
            )
        };
        // SHA256 first: the strongest check is the one worth naming.
        if let (Some(h), Some(want)) = (sha, e.sha256.as_ref()) {
            let got = hex(&h.finalize());
            if &got != want {
                return Err(mismatch("SHA256", &got, want));
            }
            push_once(&mut kinds, Checksum::Sha256);
        }
        if let (Some(h), Some(want)) = (md5, e.md5.as_ref()) {
            let got = hex(&h.finalize());
            if &got != want {
                return Err(mismatch("MD5", &got, want));
            }
            push_once(&mut kinds, Checksum::Md5);
        }
        if let (Some(h), Some(want)) = (crc, e.crc) {
            let got = h.finish();
            if got != want {
                return Err(mismatch("CRC (cksum)", &got.to_string(), &want.to_string()));
            }
            push_once(&mut kinds, Checksum::Cksum);
        }
    }
    Ok(kinds)
}

fn push_once(kinds: &mut Vec<Checksum>, k: Checksum) {
    if !kinds.contains(&k) {
        kinds.push(k);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offset {
    /// The header is the first N lines (`head -n N`).
    Head(usize),
    /// The payload starts at line N (`tail -n +N`).
    Tail(usize),
}

/// Reads the header's text lines: everything up to the first line holding a
/// NUL byte (the payload or an embedded binary), at most [`MAX_HEADER_TEXT`].
/// Also says whether the text ran to the end of the file.
fn header_lines(path: &Path, file: &mut File, file_len: u64) -> Result<(Vec<String>, bool)> {
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io(Failure::Internal, "seeking in", path, e))?;
    let mut reader = BufReader::new((&mut *file).take(MAX_HEADER_TEXT));
    let mut lines = Vec::new();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| Error::io(Failure::Internal, "reading", path, e))?;
        if n == 0 {
            return Ok((lines, file_len <= MAX_HEADER_TEXT));
        }
        if buf.contains(&0) {
            return Ok((lines, false));
        }
        let line = String::from_utf8_lossy(&buf);
        lines.push(line.trim_end_matches(['\n', '\r']).to_string());
    }
}

/// The byte offset just after the first `n` lines, or `None` when the file
/// has fewer lines (within [`MAX_HEADER_BYTES`]).
fn line_offset(path: &Path, file: &mut File, n: usize) -> Result<Option<u64>> {
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io(Failure::Internal, "seeking in", path, e))?;
    let mut reader = BufReader::new((&mut *file).take(MAX_HEADER_BYTES));
    let mut offset = 0u64;
    let mut seen = 0usize;
    while seen < n {
        let buf = reader
            .fill_buf()
            .map_err(|e| Error::io(Failure::Internal, "reading", path, e))?;
        if buf.is_empty() {
            return Ok(None);
        }
        let mut used = buf.len();
        for (i, b) in buf.iter().enumerate() {
            if *b == b'\n' {
                seen += 1;
                if seen == n {
                    used = i + 1;
                    break;
                }
            }
        }
        offset += used as u64;
        reader.consume(used);
    }
    Ok(Some(offset))
}

/// The checksums a header lists, one per payload chunk.
struct HeaderSums {
    md5: Vec<String>,
    sha: Vec<String>,
    crc: Vec<String>,
}

impl HeaderSums {
    /// The checksums of chunk `i` (a zero value means none).
    fn expected(&self, i: usize) -> Expected {
        let get = |v: &[String]| v.get(i).and_then(|v| nonzero(v)).map(str::to_string);
        Expected {
            md5: get(&self.md5).map(|v| v.to_ascii_lowercase()),
            sha256: get(&self.sha).map(|v| v.to_ascii_lowercase()),
            crc: get(&self.crc).and_then(|v| v.parse().ok()),
        }
    }
}

/// `head -n N` headers: the chunks `filesizes` lists, back to back from
/// `payload_start`, which must add up to the `have` bytes the file holds.
fn head_chunks(
    header: &[&str],
    sums: &HeaderSums,
    payload_start: u64,
    have: u64,
) -> Result<(Vec<Chunk>, Vec<Checked>)> {
    let bad = |m: String| Error::new(Failure::ArchiveInvalid, m);
    let sizes =
        value(header, "filesizes").ok_or_else(|| bad("makeself header has no filesizes".into()))?;
    let sizes: Vec<u64> = sizes
        .split_whitespace()
        .map(|s| s.parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| {
            bad(format!(
                "makeself header has a malformed filesizes=\"{sizes}\""
            ))
        })?;
    if sizes.is_empty() {
        return Err(bad("makeself header has an empty filesizes".into()));
    }
    let total: u64 = sizes.iter().sum();
    if have < total {
        return Err(bad(format!(
            "truncated: the header promises {total} payload bytes, the file has {have}"
        )));
    }
    if let Some(t) = value(header, "totalsize").and_then(|t| t.parse::<u64>().ok()) {
        // makeself's own check: the payload is exactly the rest of the file.
        if t != have {
            return Err(bad(format!(
                "unexpected size: the header says totalsize {t}, the file has {have} payload bytes"
            )));
        }
    }
    let mut chunks = Vec::new();
    let mut checked = Vec::new();
    let mut at = payload_start;
    for (i, size) in sizes.iter().enumerate() {
        chunks.push(Chunk {
            offset: at,
            len: Some(*size),
        });
        checked.push(Checked {
            offset: at,
            len: Some(*size),
            expected: sums.expected(i),
        });
        at += size;
    }
    Ok((chunks, checked))
}

/// Finds how the header computes the payload offset. Errors are
/// ArchiveInvalid; the caller adds the file and whether it was cut short.
fn find_offset(lines: &[&str]) -> Result<Offset> {
    let skip = skip_value(lines)?;
    let uses = offset_uses(lines);
    if uses.head_literals.len() > 1 {
        return Err(bad(format!(
            "makeself header gives conflicting header sizes: head -n {:?}",
            uses.head_literals
        )));
    }
    let offset = offset_of(&uses, skip)?;
    let (n, min) = match offset {
        Offset::Head(n) => (n, 1),
        Offset::Tail(n) => (n, 2),
    };
    if n < min {
        return Err(bad(format!(
            "makeself header gives an impossible header size {n}"
        )));
    }
    if let Some((i, _)) = skip {
        // The line holding skip= must itself be header, not payload.
        let header_lines = match offset {
            Offset::Head(n) => n,
            Offset::Tail(n) => n - 1,
        };
        if i >= header_lines && (uses.head_var || uses.tail_var) {
            return Err(bad("skip= lies outside the header it describes".into()));
        }
    }
    Ok(offset)
}

fn bad(m: String) -> Error {
    Error::new(Failure::ArchiveInvalid, m)
}

/// The first `skip=` assignment: its line index and value.
fn skip_value(lines: &[&str]) -> Result<Option<(usize, usize)>> {
    let Some(i) = lines.iter().position(|l| var_value(l, "skip").is_some()) else {
        return Ok(None);
    };
    let v = var_value(lines[i], "skip").unwrap_or_default();
    let n = v
        .parse::<usize>()
        .map_err(|_| bad(format!("makeself header has a malformed skip=\"{v}\"")))?;
    Ok(Some((i, n)))
}

/// How the header's `head -n` and `tail -n +` commands use the offset.
struct OffsetUses {
    /// `head -n $skip`
    head_var: bool,
    /// `tail -n +$skip`
    tail_var: bool,
    /// `head -n 714 "$0"`, sorted and deduplicated.
    head_literals: Vec<usize>,
}

fn offset_uses(lines: &[&str]) -> OffsetUses {
    let mut uses = OffsetUses {
        head_var: false,
        tail_var: false,
        head_literals: Vec::new(),
    };
    for line in lines {
        for rest in after_all(line, "head -n ") {
            let rest = rest.trim_start_matches('"');
            if uses_var(rest, "skip") {
                uses.head_var = true;
            } else if let Some((n, len)) = leading_number(rest) {
                // 2.1.x: `head -n 714 "$0"`; only when the archive itself
                // is the argument (`| head -n 1` is something else).
                let after = rest[len..].trim_start();
                if after.starts_with("\"$0\"")
                    || after.starts_with("\"$1\"")
                    || after.starts_with("$0")
                {
                    uses.head_literals.push(n);
                }
            }
        }
        for rest in after_all(line, "tail -n +") {
            if uses_var(rest, "skip") {
                uses.tail_var = true;
            }
        }
    }
    uses.head_literals.sort_unstable();
    uses.head_literals.dedup();
    uses
}

/// The offset the uses and `skip=` agree on.
fn offset_of(uses: &OffsetUses, skip: Option<(usize, usize)>) -> Result<Offset> {
    match (uses.head_var, uses.tail_var, skip, uses.head_literals.first()) {
        (true, true, _, _) => Err(bad(
            "makeself header uses skip both as a line count and a start line".into(),
        )),
        (true, false, Some((_, n)), lit) => {
            if let Some(l) = lit
                && *l != n
            {
                return Err(bad(format!(
                    "makeself header gives skip={n} but head -n {l}"
                )));
            }
            Ok(Offset::Head(n))
        }
        (false, true, Some((_, n)), _) => Ok(Offset::Tail(n)),
        (false, _, _, Some(l)) => Ok(Offset::Head(*l)),
        _ => Err(bad(
            "no payload offset found: not a makeself header this installer knows (skip= with head -n or tail -n +)"
                .into(),
        )),
    }
}

/// `$name`, `${name}` or `"$name"` at the start of `s` (with an optional
/// escaping backslash), not followed by more identifier characters.
fn uses_var(s: &str, name: &str) -> bool {
    let s = s.trim_start_matches(['"', '\\']);
    let Some(s) = s.strip_prefix('$') else {
        return false;
    };
    if let Some(s) = s.strip_prefix('{') {
        return s.strip_prefix(name).is_some_and(|r| r.starts_with('}'));
    }
    s.strip_prefix(name)
        .is_some_and(|r| !r.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
}

/// The decimal number starting `s` and how many bytes it takes.
fn leading_number(s: &str) -> Option<(usize, usize)> {
    let len = s.bytes().take_while(u8::is_ascii_digit).count();
    s[..len].parse().ok().map(|n| (n, len))
}

fn after_all<'a>(line: &'a str, pat: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    line.match_indices(pat)
        .map(move |(i, _)| &line[i + pat.len()..])
}

/// `name=value` or `name="value"` starting a line (top-level assignments
/// only: makeself writes them unindented).
fn var_value<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(name)?.strip_prefix('=')?;
    let rest = rest.trim_end();
    let v = if let Some(q) = rest.strip_prefix('"') {
        q.split('"').next().unwrap_or("")
    } else {
        rest.split_whitespace().next().unwrap_or("")
    };
    Some(v)
}

fn value<'a>(lines: &[&'a str], name: &str) -> Option<&'a str> {
    lines.iter().find_map(|l| var_value(l, name))
}

/// The space-separated values of `name` (one per payload chunk).
fn values(lines: &[&str], name: &str) -> Vec<String> {
    value(lines, name)
        .map(|v| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// makeself writes zeros (or nothing) where a checksum was not computed.
fn nonzero(v: &str) -> Option<&str> {
    if v.is_empty() || v.chars().all(|c| c == '0') {
        None
    } else {
        Some(v)
    }
}

/// The decompress command: `eval "gzip -cd"` (makeself 2.x) or the stage
/// after `tail -n +$skip $0 |` (NVIDIA's 1.6.0-nv2).
fn decompress_cmd(lines: &[&str]) -> Option<String> {
    for line in lines {
        for rest in after_all(line, "eval \"") {
            let Some(end) = rest.find('"') else { continue };
            let cmd = &rest[..end];
            // `eval "$decrypt_cmd"`, `eval "\"$script\" …"`: not commands we want.
            if cmd.is_empty() || cmd.contains('$') || cmd.contains('\\') {
                continue;
            }
            return Some(cmd.trim().to_string());
        }
    }
    for line in lines {
        for rest in after_all(line, "tail -n +") {
            if !uses_var(rest, "skip") {
                continue;
            }
            // `$skip $0 | xz -d | UnTAR`
            let mut stages = rest.split('|');
            stages.next();
            if let Some(cmd) = stages.next() {
                let cmd = cmd.trim();
                if !cmd.is_empty() && !cmd.contains('$') {
                    return Some(cmd.to_string());
                }
            }
        }
    }
    None
}

fn compression_of_cmd(cmd: &str) -> Option<Compression> {
    let prog = cmd.split_whitespace().next()?;
    let prog = prog.rsplit('/').next().unwrap_or(prog);
    match prog {
        "gzip" | "gunzip" | "pigz" | "zcat" => Some(Compression::Gzip),
        "bzip2" | "pbzip2" | "bunzip2" => Some(Compression::Bzip2),
        "xz" | "unxz" | "xzcat" => Some(Compression::Xz),
        "zstd" | "unzstd" | "zstdcat" => Some(Compression::Zstd),
        "cat" => Some(Compression::None),
        _ => None,
    }
}

/// POSIX `cksum`: CRC-32 (polynomial 0x04C11DB7, MSB first) over the data
/// and then its length, complemented. makeself's `CRCsum` is this.
pub(crate) struct Cksum {
    crc: u32,
    len: u64,
}

const fn cksum_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u32) << 24;
        let mut k = 0;
        while k < 8 {
            c = if c & 0x8000_0000 != 0 {
                (c << 1) ^ 0x04C1_1DB7
            } else {
                c << 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static CKSUM_TABLE: [u32; 256] = cksum_table();

impl Cksum {
    pub(crate) fn new() -> Self {
        Cksum { crc: 0, len: 0 }
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        for b in data {
            self.byte(*b);
        }
        self.len += data.len() as u64;
    }

    fn byte(&mut self, b: u8) {
        self.crc = (self.crc << 8) ^ CKSUM_TABLE[(((self.crc >> 24) as u8) ^ b) as usize];
    }

    pub(crate) fn finish(mut self) -> u32 {
        let mut n = self.len;
        while n != 0 {
            self.byte((n & 0xff) as u8);
            n >>= 8;
        }
        !self.crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<&str> {
        s.lines().collect()
    }

    #[test]
    fn cksum_matches_posix_known_values() {
        // `printf '' | cksum` and `printf 'hello\n' | cksum`.
        assert_eq!(Cksum::new().finish(), 4294967295);
        let mut c = Cksum::new();
        c.update(b"hello\n");
        assert_eq!(c.finish(), 3015617425);
    }

    #[test]
    fn offset_forms() {
        // makeself 2.2+
        let h = lines(
            "#!/bin/sh\nskip=\"715\"\noffset=`head -n \"$skip\" \"$0\" | wc -c | tr -d \" \"`\n",
        );
        assert_eq!(find_offset(&h), Ok(Offset::Head(715)));
        // makeself 2.1.x: a literal, repeated
        let h = lines(
            "#!/bin/sh\n\toffset=`head -n 402 \"$1\" | wc -c | tr -d \" \"`\noffset=`head -n 402 \"$0\" | wc -c | tr -d \" \"`\npatch=`which patch | head -n 1`\n",
        );
        assert_eq!(find_offset(&h), Ok(Offset::Head(402)));
        // NVIDIA 1.6.0-nv2
        let h = lines(
            "#! /bin/sh\nCRCsum=1\nMD5=0\nskip=537\nsum1=`tail -n +4 $0 | cksum`\n    tail -n +$skip $0 | xz -d | tar tvf - 2> /dev/null\n",
        );
        assert_eq!(find_offset(&h), Ok(Offset::Tail(537)));
        // conflicting literals
        let h = lines("x=`head -n 3 \"$0\"`\ny=`head -n 4 \"$0\"`\n");
        assert!(find_offset(&h).is_err());
        // nothing
        assert!(find_offset(&lines("#!/bin/sh\necho hi\n")).is_err());
    }

    #[test]
    fn decompress_commands() {
        let h = lines(
            "        { eval \"$decrypt_cmd\" || echo x; } | eval \"xz -d\"\n        eval \"xz -d\"\n",
        );
        assert_eq!(decompress_cmd(&h).as_deref(), Some("xz -d"));
        let h = lines(
            "if MS_dd \"$0\" $offset $s | eval \"gzip -cd\" | ( cd \"$tmpdir\"; UnTAR x ) 1>/dev/null; then\n",
        );
        assert_eq!(decompress_cmd(&h).as_deref(), Some("gzip -cd"));
        let h = lines("    tail -n +$skip $0  | xz -d | tar tvf - 2> /dev/null\n");
        assert_eq!(decompress_cmd(&h).as_deref(), Some("xz -d"));
        assert_eq!(compression_of_cmd("zstd -cd"), Some(Compression::Zstd));
        assert_eq!(compression_of_cmd("cat"), Some(Compression::None));
        assert_eq!(compression_of_cmd("base64 -d -i"), None);
    }

    #[test]
    fn variables() {
        assert_eq!(var_value("MD5=\"abc def\"", "MD5"), Some("abc def"));
        assert_eq!(var_value("MD5=abc", "MD5"), Some("abc"));
        assert_eq!(var_value("MD5sum=abc", "MD5"), None);
        assert_eq!(var_value("  skip=3", "skip"), None);
        assert!(uses_var("\"$skip\" \"$0\"", "skip"));
        assert!(uses_var("${skip} $0", "skip"));
        assert!(uses_var("\\$skip \\$0", "skip"));
        assert!(!uses_var("$skip_decompress", "skip"));
        assert_eq!(nonzero("00000000000000000000000000000000"), None);
        assert_eq!(nonzero(""), None);
    }
}
