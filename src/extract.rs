//! Unpacking a driver package into a directory, safely: NVIDIA's makeself
//! `.run` (its shell header is parsed, never run), a tarball (Debian's
//! `nvidia-*-kernel-source`, NVIDIA's redist archive) or a directory served
//! by a mirror. See `docs/extraction.md` for what is accepted and refused.
//!
//! Everything is written into a temporary directory beside the target and
//! renamed into place only when complete, so an existing target is always a
//! whole extraction.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::host::ModuleFlavor;
use crate::report::Reason;
use crate::runfile;
pub use crate::runfile::{Checksum, Compression};

/// Failures of the local filesystem (opening the package, creating the
/// target, writing files) are not the package's fault; the closed reason
/// list has nothing closer than Internal for them (a full disk becomes
/// InsufficientDisk in `Error::io`).
const LOCAL_IO: Reason = Reason::Internal;

/// Bounds on what one extraction may write, so that a small hostile
/// archive (a sparse-file or compression bomb) cannot fill the disk or
/// exhaust the inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of file contents in the whole tree.
    pub max_bytes: u64,
    /// Files, directories and links in the whole tree.
    pub max_entries: u64,
}

/// NVIDIA's largest `.run` (x86_64, with its user space) unpacks to about
/// 1 GiB and 2,000 entries; kernel headers to about 100 MiB and 25,000
/// entries. The defaults leave room for several times that.
pub const DEFAULT_LIMITS: Limits = Limits {
    max_bytes: 8 << 30,
    max_entries: 500_000,
};

static LIMITS: std::sync::OnceLock<Limits> = std::sync::OnceLock::new();

/// Sets the limits for this process (`--max-unpacked-size`), once, before
/// any extraction; later calls are ignored.
pub fn set_limits(limits: Limits) {
    let _ = LIMITS.set(limits);
}

fn limits() -> Limits {
    LIMITS.get().copied().unwrap_or(DEFAULT_LIMITS)
}

/// Symlinks followed while checking where a link leads, as Linux's limit.
const MAX_LINK_HOPS: usize = 40;

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
pub fn is_partial_name(name: &str) -> bool {
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
            Reason::InvalidArgument,
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
            Reason::ArchiveInvalid,
            format!(
                "no {flavor} kernel module sources in {}: looked for {looked_for} with a Kbuild or Makefile, at the top and one directory down",
                extracted.display()
            ),
        )),
        many => Err(Error::new(
            Reason::ArchiveInvalid,
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
pub fn unpack_tar_stream<R: Read>(
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
            Reason::ArchiveInvalid,
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
                Reason::ArchiveInvalid,
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
                Reason::ArchiveInvalid,
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

/// `/usr/src/x` seen from the link `lib/modules/r/build` (both inside a
/// root image) → `../../../usr/src/x`: the same place, reached without
/// leaving the tree. `..` in the target is kept; the usual checks apply.
fn root_relative(link: &Path, target: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for _ in 0..link.parent().map_or(0, |p| p.components().count()) {
        out.push("..");
    }
    for c in target.components() {
        match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// The directory being filled, and the safety rules for filling it. Every
/// path is relative to `root`; nothing is ever written through a symlink.
struct Tree<'a> {
    root: &'a Path,
    src: &'a Path,
    /// Relative paths known to be real directories (created by us).
    dirs: HashSet<PathBuf>,
    dir_modes: Vec<(PathBuf, u32)>,
    symlinks: Vec<PathBuf>,
    entries: u64,
    bytes: u64,
    limits: Limits,
    /// The tree is an image of `/` (a `.deb`'s data.tar): absolute symlink
    /// targets mean "from the root of the tree" and are rewritten relative,
    /// instead of being refused.
    root_image: bool,
}

impl<'a> Tree<'a> {
    fn new(root: &'a Path, src: &'a Path) -> Self {
        let mut dirs = HashSet::new();
        dirs.insert(PathBuf::new());
        Tree {
            root,
            src,
            dirs,
            dir_modes: Vec::new(),
            symlinks: Vec::new(),
            entries: 0,
            bytes: 0,
            limits: limits(),
            root_image: false,
        }
    }

    fn unsafe_entry(&self, entry: &Path, why: impl std::fmt::Display) -> Error {
        Error::new(
            Reason::UnsafeArchive,
            format!(
                "{}: entry '{}' {why}; refused, nothing was extracted",
                self.src.display(),
                entry.display()
            ),
        )
    }

    /// Counts one more entry, refusing the archive past the limit.
    fn count_entry(&mut self, rel: &Path) -> Result<()> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(self.unsafe_entry(
                rel,
                format_args!(
                    "is one more than the {} entries an extraction may create (--max-unpacked-entries)",
                    self.limits.max_entries
                ),
            ));
        }
        Ok(())
    }

    fn invalid(&self, what: impl std::fmt::Display) -> Error {
        Error::new(
            Reason::ArchiveInvalid,
            format!("{}: {what}", self.src.display()),
        )
    }

    /// The entry's path made relative and checked: no absolute paths, no
    /// `..`. `None` for the top directory itself (`./`).
    fn rel_path(&self, raw: &Path) -> Result<Option<PathBuf>> {
        let mut rel = PathBuf::new();
        for c in raw.components() {
            match c {
                Component::Normal(n) => rel.push(n),
                Component::CurDir => {}
                Component::ParentDir => return Err(self.unsafe_entry(raw, "has a '..' component")),
                Component::RootDir | Component::Prefix(_) => {
                    return Err(self.unsafe_entry(raw, "has an absolute path"));
                }
            }
        }
        Ok((!rel.as_os_str().is_empty()).then_some(rel))
    }

    /// Makes sure `rel` is a real directory under the root, creating what is
    /// missing; a symlink on the way is refused.
    fn ensure_dir(&mut self, rel: &Path, entry: &Path) -> Result<()> {
        let mut cur = PathBuf::new();
        for c in rel.components() {
            cur.push(c);
            if self.dirs.contains(&cur) {
                continue;
            }
            let full = self.root.join(&cur);
            match fs::symlink_metadata(&full) {
                Ok(m) if m.file_type().is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.unsafe_entry(
                        entry,
                        format_args!("would be written through the symlink '{}'", cur.display()),
                    ));
                }
                Ok(_) => {
                    return Err(self.invalid(format_args!(
                        "entry '{}' needs '{}' to be a directory, but it is a file",
                        entry.display(),
                        cur.display()
                    )));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(&full).map_err(|e| Error::io(LOCAL_IO, "creating", &full, e))?;
                }
                Err(e) => return Err(Error::io(LOCAL_IO, "reading", &full, e)),
            }
            self.dirs.insert(cur.clone());
        }
        Ok(())
    }

    fn ensure_parent(&mut self, rel: &Path) -> Result<()> {
        match rel.parent() {
            Some(p) => self.ensure_dir(p, rel),
            None => Ok(()),
        }
    }

    /// Later entries replace earlier ones (as tar does), but never a
    /// directory: that would drop what is already inside it.
    fn remove_existing(&self, rel: &Path) -> Result<()> {
        let full = self.root.join(rel);
        match fs::symlink_metadata(&full) {
            Ok(m) if m.is_dir() => Err(self.invalid(format_args!(
                "entry '{}' would replace a directory",
                rel.display()
            ))),
            Ok(_) => fs::remove_file(&full).map_err(|e| Error::io(LOCAL_IO, "removing", &full, e)),
            Err(_) => Ok(()),
        }
    }

    fn add_dir(&mut self, rel: &Path, mode: u32) -> Result<()> {
        self.ensure_dir(rel, rel)?;
        self.dir_modes.push((rel.to_path_buf(), mode));
        self.count_entry(rel)?;
        Ok(())
    }

    fn add_file(
        &mut self,
        rel: &Path,
        mode: u32,
        mtime: Option<u64>,
        mut data: impl Read,
        size: Option<u64>,
    ) -> Result<()> {
        self.ensure_parent(rel)?;
        self.remove_existing(rel)?;
        let full = self.root.join(rel);
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&full)
            .map_err(|e| Error::io(LOCAL_IO, "creating", &full, e))?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut written = 0u64;
        loop {
            let n = match data.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(self.invalid(format_args!(
                        "reading entry '{}' (truncated or corrupt): {e}",
                        rel.display()
                    )));
                }
            };
            if self.bytes + written + n as u64 > self.limits.max_bytes {
                return Err(self.unsafe_entry(
                    rel,
                    format_args!(
                        "would take the tree past {} MiB, the most an extraction may write (--max-unpacked-size)",
                        self.limits.max_bytes >> 20
                    ),
                ));
            }
            out.write_all(&buf[..n])
                .map_err(|e| Error::io(LOCAL_IO, "writing", &full, e))?;
            written += n as u64;
        }
        if let Some(size) = size
            && written != size
        {
            return Err(self.invalid(format_args!(
                "truncated: entry '{}' has {written} of its {size} bytes",
                rel.display()
            )));
        }
        // Permission bits only: set-id bits make no sense without the
        // archive's ownership, which is not kept either.
        out.set_permissions(Permissions::from_mode(mode & 0o777))
            .map_err(|e| Error::io(LOCAL_IO, "setting permissions of", &full, e))?;
        if let Some(t) = mtime {
            // make decides what to rebuild by timestamps; keep the package's.
            out.set_modified(UNIX_EPOCH + Duration::from_secs(t))
                .map_err(|e| Error::io(LOCAL_IO, "setting the time of", &full, e))?;
        }
        self.bytes += written;
        self.count_entry(rel)?;
        Ok(())
    }

    /// A symlink may only point inside the tree, resolved from its own
    /// directory; absolute targets are refused.
    fn add_symlink(&mut self, rel: &Path, target: &Path) -> Result<()> {
        if target.as_os_str().is_empty() {
            return Err(self.invalid(format_args!(
                "symlink '{}' has an empty target",
                rel.display()
            )));
        }
        let rewritten;
        let target = if self.root_image && target.has_root() {
            rewritten = root_relative(rel, target);
            rewritten.as_path()
        } else {
            target
        };
        let mut depth = rel.parent().map_or(0, |p| p.components().count());
        for c in target.components() {
            match c {
                Component::RootDir | Component::Prefix(_) => {
                    return Err(self.unsafe_entry(
                        rel,
                        format_args!("is a symlink to the absolute path '{}'", target.display()),
                    ));
                }
                Component::CurDir => {}
                Component::ParentDir => {
                    if depth == 0 {
                        return Err(self.unsafe_entry(
                            rel,
                            format_args!(
                                "is a symlink to '{}', outside the target directory",
                                target.display()
                            ),
                        ));
                    }
                    depth -= 1;
                }
                Component::Normal(_) => depth += 1,
            }
        }
        self.ensure_parent(rel)?;
        self.remove_existing(rel)?;
        let full = self.root.join(rel);
        std::os::unix::fs::symlink(target, &full)
            .map_err(|e| Error::io(LOCAL_IO, "creating the symlink", &full, e))?;
        self.symlinks.push(rel.to_path_buf());
        self.count_entry(rel)?;
        Ok(())
    }

    /// A hard link to a regular file extracted earlier (tar names the target
    /// from the archive's top, not from the link's directory).
    fn add_hardlink(&mut self, rel: &Path, raw_target: &Path) -> Result<()> {
        let target = self
            .rel_path(raw_target)
            .map_err(|_| {
                self.unsafe_entry(
                    rel,
                    format_args!(
                        "is a hard link to '{}', outside the target directory",
                        raw_target.display()
                    ),
                )
            })?
            .ok_or_else(|| {
                self.invalid(format_args!("hard link '{}' has no target", rel.display()))
            })?;
        let parent_ok = target.parent().is_none_or(|p| self.dirs.contains(p));
        let target_full = self.root.join(&target);
        let is_file = parent_ok && fs::symlink_metadata(&target_full).is_ok_and(|m| m.is_file());
        if !is_file {
            return Err(self.invalid(format_args!(
                "hard link '{}' points to '{}', which is not a regular file extracted before it",
                rel.display(),
                target.display()
            )));
        }
        self.ensure_parent(rel)?;
        self.remove_existing(rel)?;
        let full = self.root.join(rel);
        fs::hard_link(&target_full, &full)
            .map_err(|e| Error::io(LOCAL_IO, "creating the hard link", &full, e))?;
        self.count_entry(rel)?;
        Ok(())
    }

    /// Unpacks one tar stream. The stream must end with tar's end-of-archive
    /// marker: a stream cut at a block boundary is otherwise indistinguishable
    /// from a complete one.
    fn unpack_tar(&mut self, reader: impl Read) -> Result<()> {
        let mut archive = tar::Archive::new(reader);
        let read_err = |tree: &Tree, e: io::Error| {
            tree.invalid(format_args!(
                "reading the tar stream (truncated or corrupt): {e}"
            ))
        };
        {
            let entries = archive.entries().map_err(|e| read_err(self, e))?;
            for entry in entries {
                let mut entry = entry.map_err(|e| read_err(self, e))?;
                let kind = entry.header().entry_type();
                if matches!(
                    kind,
                    tar::EntryType::XGlobalHeader
                        | tar::EntryType::XHeader
                        | tar::EntryType::GNULongName
                        | tar::EntryType::GNULongLink
                ) {
                    continue;
                }
                let raw = entry.path().map_err(|e| read_err(self, e))?.into_owned();
                let mode = entry.header().mode().map_err(|e| read_err(self, e))?;
                let Some(rel) = self.rel_path(&raw)? else {
                    if kind.is_dir() {
                        continue;
                    }
                    return Err(self.invalid(format_args!(
                        "entry '{}' names the top directory but is not a directory",
                        raw.display()
                    )));
                };
                match kind {
                    tar::EntryType::Directory => self.add_dir(&rel, mode)?,
                    tar::EntryType::Regular
                    | tar::EntryType::Continuous
                    | tar::EntryType::GNUSparse => {
                        let mtime = entry.header().mtime().ok();
                        let size = (!kind.is_gnu_sparse()).then(|| entry.size());
                        self.add_file(&rel, mode, mtime, &mut entry, size)?;
                    }
                    tar::EntryType::Symlink => {
                        let target = entry
                            .link_name()
                            .map_err(|e| read_err(self, e))?
                            .ok_or_else(|| {
                                self.invalid(format_args!(
                                    "symlink '{}' has no target",
                                    rel.display()
                                ))
                            })?
                            .into_owned();
                        self.add_symlink(&rel, &target)?;
                    }
                    tar::EntryType::Link => {
                        let target = entry
                            .link_name()
                            .map_err(|e| read_err(self, e))?
                            .ok_or_else(|| {
                                self.invalid(format_args!(
                                    "hard link '{}' has no target",
                                    rel.display()
                                ))
                            })?
                            .into_owned();
                        self.add_hardlink(&rel, &target)?;
                    }
                    tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                        return Err(
                            self.unsafe_entry(&rel, "is a device node or fifo; packages have none")
                        );
                    }
                    other => {
                        return Err(self.invalid(format_args!(
                            "entry '{}' has an unsupported tar type {:?}",
                            rel.display(),
                            other
                        )));
                    }
                }
            }
        }
        // The rest after the first zero block: the second one and the record
        // padding. Reading it also makes the decompressor check its trailer.
        let rest =
            io::copy(&mut archive.into_inner(), &mut io::sink()).map_err(|e| read_err(self, e))?;
        if rest == 0 {
            return Err(
                self.invalid("truncated: the tar stream ends without its end-of-archive marker")
            );
        }
        Ok(())
    }

    /// Copies the tree under `src_root/rel` with the same rules as a tar.
    fn copy_dir(&mut self, src_root: &Path, rel: &Path) -> Result<()> {
        let dir = src_root.join(rel);
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| Error::io(LOCAL_IO, "reading", &dir, e))? {
            names.push(
                entry
                    .map_err(|e| Error::io(LOCAL_IO, "reading", &dir, e))?
                    .file_name(),
            );
        }
        names.sort();
        for name in names {
            let child_rel = rel.join(&name);
            let child = src_root.join(&child_rel);
            let meta = fs::symlink_metadata(&child)
                .map_err(|e| Error::io(LOCAL_IO, "reading", &child, e))?;
            let ft = meta.file_type();
            if ft.is_dir() {
                self.add_dir(&child_rel, meta.mode())?;
                self.copy_dir(src_root, &child_rel)?;
            } else if ft.is_file() {
                let f =
                    File::open(&child).map_err(|e| Error::io(LOCAL_IO, "opening", &child, e))?;
                let mtime = u64::try_from(meta.mtime()).ok();
                self.add_file(&child_rel, meta.mode(), mtime, f, Some(meta.len()))?;
            } else if ft.is_symlink() {
                let target = fs::read_link(&child)
                    .map_err(|e| Error::io(LOCAL_IO, "reading the symlink", &child, e))?;
                self.add_symlink(&child_rel, &target)?;
            } else {
                return Err(self.unsafe_entry(
                    &child_rel,
                    "is a device node, fifo or socket; packages have none",
                ));
            }
        }
        Ok(())
    }

    /// Final checks once everything is in place: each symlink, followed
    /// through the links it meets on disk (a link to `.` makes `dir/..`
    /// leave the tree even though each link alone stays inside), must stay
    /// inside. Then directory modes, deepest first, keeping the owner's rwx
    /// so that builds can write into the tree and it can be removed.
    fn finish(&mut self) -> Result<()> {
        for link in &self.symlinks {
            self.check_resolves_inside(link)?;
        }
        self.dir_modes
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
        for (rel, mode) in &self.dir_modes {
            let full = self.root.join(rel);
            fs::set_permissions(&full, Permissions::from_mode((mode & 0o777) | 0o700))
                .map_err(|e| Error::io(LOCAL_IO, "setting permissions of", &full, e))?;
        }
        Ok(())
    }

    fn check_resolves_inside(&self, link: &Path) -> Result<()> {
        let mut resolved: Vec<std::ffi::OsString> = Vec::new();
        let mut pending: Vec<std::ffi::OsString> = Vec::new();
        let push_rev = |pending: &mut Vec<std::ffi::OsString>, p: &Path| -> bool {
            for c in p.components().rev() {
                match c {
                    Component::RootDir | Component::Prefix(_) => return false,
                    other => pending.push(other.as_os_str().to_os_string()),
                }
            }
            true
        };
        push_rev(&mut pending, link);
        let mut hops = 0;
        while let Some(c) = pending.pop() {
            if c == "." {
                continue;
            }
            if c == ".." {
                if resolved.pop().is_none() {
                    return Err(self.unsafe_entry(
                        link,
                        "is a symlink that leads outside the target directory",
                    ));
                }
                continue;
            }
            let here: PathBuf = resolved.iter().collect::<PathBuf>().join(&c);
            let full = self.root.join(&here);
            match fs::symlink_metadata(&full) {
                Ok(m) if m.file_type().is_symlink() => {
                    hops += 1;
                    if hops > MAX_LINK_HOPS {
                        return Err(self.invalid(format_args!(
                            "symlink '{}' is part of a loop",
                            link.display()
                        )));
                    }
                    let target = fs::read_link(&full)
                        .map_err(|e| Error::io(LOCAL_IO, "reading the symlink", &full, e))?;
                    if !push_rev(&mut pending, &target) {
                        return Err(self.unsafe_entry(
                            link,
                            format_args!("leads to the absolute path '{}'", target.display()),
                        ));
                    }
                }
                _ => resolved.push(c),
            }
        }
        Ok(())
    }
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

    #[test]
    fn a_link_to_dot_cannot_be_used_to_climb_out() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir(&root).unwrap();
        let src = Path::new("pkg");
        let mut tree = Tree::new(&root, src);
        // Each alone stays inside; together `up` is root/.. .
        tree.add_symlink(Path::new("here"), Path::new(".")).unwrap();
        tree.add_symlink(Path::new("up"), Path::new("here/.."))
            .unwrap();
        let err = tree.finish().unwrap_err();
        assert_eq!(err.reason, Reason::UnsafeArchive, "{err}");
        assert!(err.message.contains("'up'"), "{err}");
    }

    #[test]
    fn links_inside_are_fine_and_loops_are_caught() {
        let dir = tempfile::tempdir().unwrap();
        let mut tree = Tree::new(dir.path(), Path::new("pkg"));
        tree.add_dir(Path::new("a/b"), 0o755).unwrap();
        tree.add_symlink(Path::new("a/b/up"), Path::new("../.."))
            .unwrap();
        tree.add_symlink(Path::new("a/dangling"), Path::new("nothing/here"))
            .unwrap();
        tree.finish().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let mut tree = Tree::new(dir.path(), Path::new("pkg"));
        tree.add_symlink(Path::new("x"), Path::new("y")).unwrap();
        tree.add_symlink(Path::new("y"), Path::new("x")).unwrap();
        let err = tree.finish().unwrap_err();
        assert_eq!(err.reason, Reason::ArchiveInvalid, "{err}");
    }
}
