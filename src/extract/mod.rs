//! Unpacking a driver package into a directory, safely: NVIDIA's makeself
//! `.run` (its shell header is parsed, never run), a tarball (Debian's
//! `nvidia-*-kernel-source`, NVIDIA's redist archive) or a directory served
//! by a mirror. See `docs/extraction.md` for what is accepted and refused.
//!
//! Everything is written into a temporary directory beside the target and
//! renamed into place only when complete, so an existing target is always a
//! whole extraction.

use std::fs::{self, File, Permissions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Failure, Result};
use crate::node::ModuleFlavor;
use crate::runfile;

mod limits;
mod tree;

pub use crate::runfile::{Checksum, Compression};
pub use limits::Limits;
use limits::limits;
pub(crate) use limits::{DEFAULT_LIMITS, set_limits};
use tree::{LOCAL_IO, Tree};

/// What a package source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PackageKind {
    /// A makeself self-extracting archive (NVIDIA's `.run`).
    Makeself,
    /// A tar archive, possibly compressed.
    Tarball(Compression),
    /// An already unpacked tree; it is copied.
    Directory,
}

/// What [`extract_package`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtractReport {
    pub kind: PackageKind,
    /// The payload's compression; `None` for a directory.
    pub compression: Option<Compression>,
    /// Files, directories and links created.
    pub entries: u64,
    /// Bytes of regular file content written.
    pub bytes: u64,
    /// The package's own checksums that were verified (makeself headers
    /// only); empty when it carries none.
    pub checksums_verified: Vec<Checksum>,
}

/// The name prefix of the temporary tree an extraction into `<name>`
/// fills before renaming it into place.
fn partial_prefix(name: &str) -> String {
    format!(".{name}{PARTIAL_MARK}")
}

const PARTIAL_MARK: &str = ".partial-";

/// Whether a directory entry is an extraction's temporary tree (left
/// behind only when the process was killed): owners sweep these under
/// their lock.
pub(crate) fn is_partial_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(PARTIAL_MARK)
}

/// Unpacks `src` (a makeself `.run`, a tarball or a directory, told apart by
/// content) into `dest`, which must not exist yet. Nothing is executed.
///
/// Entries that would land outside `dest` (absolute paths, `..`, links
/// leading out) and device nodes, fifos and sockets fail the whole
/// extraction with [`Reason::UnsafeArchive`]; a malformed, truncated or
/// checksum-failing package with [`Reason::ArchiveInvalid`]. On any error
/// nothing is left at `dest`.
pub fn extract_package(src: &Path, dest: &Path) -> Result<ExtractReport> {
    extract_package_with(src, dest, limits())
}

/// [`extract_package`] within explicit [`Limits`] instead of the process's.
pub fn extract_package_with(src: &Path, dest: &Path, limits: Limits) -> Result<ExtractReport> {
    let kind = sniff(src)?;
    if fs::symlink_metadata(dest).is_ok() {
        return Err(Error::new(
            LOCAL_IO,
            format!(
                "extracting {}: {} already exists; remove it first",
                src.display(),
                dest.display()
            ),
        ));
    }
    let name = dest.file_name().ok_or_else(|| {
        Error::new(
            Failure::InvalidArgument,
            format!("extraction target {} has no file name", dest.display()),
        )
    })?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(parent).map_err(|e| Error::io(LOCAL_IO, "creating", parent, e))?;
    // Beside the target, so the final rename stays on one filesystem; the
    // TempDir removes itself if anything below fails.
    let tmp = tempfile::Builder::new()
        .prefix(&partial_prefix(&name.to_string_lossy()))
        .tempdir_in(parent)
        .map_err(|e| Error::io(LOCAL_IO, "creating a temporary directory in", parent, e))?;

    let mut tree = Tree::new(tmp.path(), src);
    tree.limits = limits;
    let (compression, checksums_verified) = match kind {
        PackageKind::Makeself => {
            let (c, sums) = extract_makeself(src, &mut tree)?;
            (Some(c), sums)
        }
        PackageKind::Tarball(c) => {
            let file = File::open(src).map_err(|e| Error::io(LOCAL_IO, "opening", src, e))?;
            tree.unpack_tar(decoder(c, BufReader::new(file), true))?;
            (Some(c), Vec::new())
        }
        PackageKind::Directory => {
            tree.copy_dir(src, Path::new(""))?;
            (None, Vec::new())
        }
    };
    tree.finish()?;
    let report = ExtractReport {
        kind,
        compression,
        entries: tree.entries,
        bytes: tree.bytes,
        checksums_verified,
    };

    fs::set_permissions(tmp.path(), Permissions::from_mode(0o755))
        .map_err(|e| Error::io(LOCAL_IO, "setting permissions of", tmp.path(), e))?;
    let done = tmp.keep();
    if let Err(e) = fs::rename(&done, dest) {
        let _ = fs::remove_dir_all(&done);
        return Err(Error::io(
            LOCAL_IO,
            &format!("renaming {} to", done.display()),
            dest,
            e,
        ));
    }
    Ok(report)
}

/// The kernel module sources of `flavor` inside an extracted package:
/// `kernel-open/` or `kernel/` (NVIDIA's `.run` and redist archive),
/// `modules/nvidia-open-kernel/` or `modules/nvidia-kernel/` (Debian's
/// `*-kernel-source` tarballs), at the top or one directory down. The
/// directory must hold a `Kbuild` or `Makefile`.
pub fn module_source_dir(extracted: &Path, flavor: ModuleFlavor) -> Result<PathBuf> {
    let candidates: &[&str] = match flavor {
        ModuleFlavor::Open => &["kernel-open", "modules/nvidia-open-kernel"],
        ModuleFlavor::Proprietary => &["kernel", "modules/nvidia-kernel"],
    };
    let is_tree = |p: &Path| {
        fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
            && (p.join("Kbuild").is_file() || p.join("Makefile").is_file())
    };
    for c in candidates {
        let p = extracted.join(c);
        if is_tree(&p) {
            return Ok(p);
        }
    }
    let mut subdirs = Vec::new();
    for entry in
        fs::read_dir(extracted).map_err(|e| Error::io(LOCAL_IO, "reading", extracted, e))?
    {
        let entry = entry.map_err(|e| Error::io(LOCAL_IO, "reading", extracted, e))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            subdirs.push(entry.path());
        }
    }
    subdirs.sort();
    let found: Vec<PathBuf> = subdirs
        .iter()
        .flat_map(|d| candidates.iter().map(move |c| d.join(c)))
        .filter(|p| is_tree(p))
        .collect();
    let looked_for = candidates
        .iter()
        .map(|c| format!("{c}/"))
        .collect::<Vec<_>>()
        .join(" or ");
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Error::new(
            Failure::ArchiveInvalid,
            format!(
                "no {flavor} kernel module sources in {}: looked for {looked_for} with a Kbuild or Makefile, at the top and one directory down",
                extracted.display()
            ),
        )),
        many => Err(Error::new(
            Failure::ArchiveInvalid,
            format!(
                "{} holds more than one {flavor} kernel module source tree: {}",
                extracted.display(),
                many.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Unpacks one tar stream (compressed with `compression`) that is an image
/// of a root filesystem, a `.deb`'s `data.tar`, into the existing directory
/// `root`, merging with what earlier streams put there (later entries
/// replace files, never directories). `origin` names the stream in messages
/// (e.g. `pkg.deb:data.tar.xz`).
///
/// The safety rules of [`extract_package`] apply, with one difference: an
/// absolute symlink target means the same path inside `root` (dpkg would
/// create it on `/`), so it is rewritten relative to the link, e.g.
/// `lib/modules/R/build -> ../../../usr/src/linux-headers-R`. Afterwards
/// every symlink under `root`, not only this stream's, must resolve inside
/// it: a new link can change where an earlier one leads.
///
/// Unlike [`extract_package`] this is not atomic: on an error `root` holds
/// part of the stream. Callers unpack into a directory of their own and
/// rename it into place once everything succeeded.
pub(crate) fn unpack_tar_stream<R: Read>(
    reader: R,
    compression: Compression,
    root: &Path,
    origin: &Path,
) -> Result<ExtractReport> {
    let meta = fs::symlink_metadata(root).map_err(|e| Error::io(LOCAL_IO, "reading", root, e))?;
    if !meta.is_dir() {
        return Err(Error::new(
            LOCAL_IO,
            format!(
                "unpacking {}: {} is not a directory",
                origin.display(),
                root.display()
            ),
        ));
    }
    let mut tree = Tree::new(root, origin);
    tree.root_image = true;
    tree.unpack_tar(decoder(compression, BufReader::new(reader), true))?;
    tree.symlinks = symlinks_under(root)?;
    tree.finish()?;
    Ok(ExtractReport {
        kind: PackageKind::Tarball(compression),
        compression: Some(compression),
        entries: tree.entries,
        bytes: tree.bytes,
        checksums_verified: Vec::new(),
    })
}

/// Every symlink under `root`, relative to it; symlinks are not followed.
fn symlinks_under(root: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let dir = root.join(&rel);
        for entry in fs::read_dir(&dir).map_err(|e| Error::io(LOCAL_IO, "reading", &dir, e))? {
            let entry = entry.map_err(|e| Error::io(LOCAL_IO, "reading", &dir, e))?;
            let ft = entry
                .file_type()
                .map_err(|e| Error::io(LOCAL_IO, "reading", &entry.path(), e))?;
            if ft.is_symlink() {
                found.push(rel.join(entry.file_name()));
            } else if ft.is_dir() {
                pending.push(rel.join(entry.file_name()));
            }
        }
    }
    Ok(found)
}

/// Tells the package kind from the content.
fn sniff(src: &Path) -> Result<PackageKind> {
    let meta = fs::metadata(src).map_err(|e| Error::io(LOCAL_IO, "reading", src, e))?;
    if meta.is_dir() {
        return Ok(PackageKind::Directory);
    }
    let file = File::open(src).map_err(|e| Error::io(LOCAL_IO, "opening", src, e))?;
    let head = read_head(src, &file, 0, 4096)?;
    if runfile::looks_like_makeself(&head) {
        return Ok(PackageKind::Makeself);
    }
    match compression_of_magic(&head) {
        Some(c) => Ok(PackageKind::Tarball(c)),
        None => Err(Error::new(
            Failure::ArchiveInvalid,
            format!(
                "{}: not a makeself .run, a tar archive (plain, gzip, bzip2, xz or zstd) or a directory",
                src.display()
            ),
        )),
    }
}

/// Up to `len` bytes at `offset` (fewer at the end of the file).
fn read_head(path: &Path, file: &File, offset: u64, len: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = file
            .read_at(&mut buf[got..], offset + got as u64)
            .map_err(|e| Error::io(LOCAL_IO, "reading", path, e))?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    Ok(buf)
}

fn compression_of_magic(b: &[u8]) -> Option<Compression> {
    if b.starts_with(&[0x1f, 0x8b]) {
        Some(Compression::Gzip)
    } else if b.len() >= 4 && b.starts_with(b"BZh") && (b'1'..=b'9').contains(&b[3]) {
        Some(Compression::Bzip2)
    } else if b.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        Some(Compression::Xz)
    } else if b.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some(Compression::Zstd)
    } else if b.len() >= 262 && &b[257..262] == b"ustar" {
        Some(Compression::None)
    } else {
        None
    }
}

/// A decompressing reader. `multi`: decode concatenated members/streams
/// (right when the input ends where the payload ends); otherwise stop after
/// the first, ignoring what follows (NVIDIA's payload runs to the end of the
/// file, which may carry a trailing newline).
fn decoder<'a, R: BufRead + 'a>(c: Compression, r: R, multi: bool) -> Box<dyn Read + 'a> {
    match (c, multi) {
        (Compression::Gzip, true) => Box::new(flate2::bufread::MultiGzDecoder::new(r)),
        (Compression::Gzip, false) => Box::new(flate2::bufread::GzDecoder::new(r)),
        (Compression::Bzip2, true) => Box::new(bzip2::bufread::MultiBzDecoder::new(r)),
        (Compression::Bzip2, false) => Box::new(bzip2::bufread::BzDecoder::new(r)),
        (Compression::Xz, true) => Box::new(liblzma::bufread::XzDecoder::new_multi_decoder(r)),
        (Compression::Xz, false) => Box::new(liblzma::bufread::XzDecoder::new(r)),
        (Compression::Zstd, multi) => match zstd::stream::read::Decoder::with_buffer(r) {
            Ok(d) if multi => Box::new(d),
            Ok(d) => Box::new(d.single_frame()),
            // Only fails when zstd cannot allocate its context; surface
            // that as a read error of the stream.
            Err(e) => Box::new(FailingReader(Some(e))),
        },
        (Compression::None, _) => Box::new(r),
    }
}

struct FailingReader(Option<io::Error>);

impl Read for FailingReader {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Err(self
            .0
            .take()
            .unwrap_or_else(|| io::Error::other("decoder unavailable")))
    }
}

/// Verifies the header's checksums, then unpacks each payload chunk.
fn extract_makeself(src: &Path, tree: &mut Tree) -> Result<(Compression, Vec<Checksum>)> {
    let mut file = File::open(src).map_err(|e| Error::io(LOCAL_IO, "opening", src, e))?;
    let ms = runfile::parse(src, &mut file)?;
    // Before anything is decompressed: a corrupt or tampered payload is
    // reported as such, not as whatever the decompressor trips over.
    let verified = runfile::verify(src, &mut file, &ms.checked)?;
    let mut compression = Compression::None;
    for chunk in &ms.chunks {
        let magic = read_head(src, &file, chunk.offset, 512)?;
        let found = compression_of_magic(&magic).ok_or_else(|| {
            Error::new(
                Failure::ArchiveInvalid,
                format!(
                    "{}: the payload at byte {} is neither gzip, bzip2, xz, zstd nor tar{}",
                    src.display(),
                    chunk.offset,
                    ms.decompress_cmd
                        .as_ref()
                        .map(|c| format!(" (the header decompresses it with '{c}')"))
                        .unwrap_or_default()
                ),
            )
        })?;
        if let Some(said) = ms.compression
            && said != found
        {
            return Err(Error::new(
                Failure::ArchiveInvalid,
                format!(
                    "{}: the header decompresses the payload with '{}' but it is {found}",
                    src.display(),
                    ms.decompress_cmd.as_deref().unwrap_or_default()
                ),
            ));
        }
        file.seek(SeekFrom::Start(chunk.offset))
            .map_err(|e| Error::io(LOCAL_IO, "seeking in", src, e))?;
        let (reader, multi): (Box<dyn Read>, bool) = match chunk.len {
            Some(n) => (Box::new((&mut file).take(n)), true),
            None => (Box::new(&mut file), false),
        };
        tree.unpack_tar(decoder(found, BufReader::new(reader), multi))?;
        compression = found;
    }
    Ok((compression, verified))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_bytes() {
        assert_eq!(
            compression_of_magic(&[0x1f, 0x8b, 8, 0]),
            Some(Compression::Gzip)
        );
        assert_eq!(
            compression_of_magic(b"BZh91AY&SY"),
            Some(Compression::Bzip2)
        );
        assert_eq!(compression_of_magic(b"BZhx"), None);
        assert_eq!(
            compression_of_magic(&[0xfd, b'7', b'z', b'X', b'Z', 0, 0]),
            Some(Compression::Xz)
        );
        assert_eq!(
            compression_of_magic(&[0x28, 0xb5, 0x2f, 0xfd, 0]),
            Some(Compression::Zstd)
        );
        let mut tar = vec![0u8; 512];
        tar[257..262].copy_from_slice(b"ustar");
        assert_eq!(compression_of_magic(&tar), Some(Compression::None));
        assert_eq!(compression_of_magic(b"#!/bin/sh\n"), None);
    }
}
