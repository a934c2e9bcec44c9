//! The directory an archive is unpacked into, and the rules for filling
//! it: paths stay inside, nothing is written through a symlink, links
//! resolve inside the tree, and the size and entry limits hold.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use super::limits::{Limits, limits};
use crate::error::{Error, Failure, Result};

/// Failures of the local filesystem (opening the package, creating the
/// target, writing files) are not the package's fault; the closed reason
/// list has nothing closer than Internal for them (a full disk becomes
/// InsufficientDisk in `Error::io`).
pub(super) const LOCAL_IO: Failure = Failure::Internal;

/// Symlinks followed while checking where a link leads, as Linux's limit.
const MAX_LINK_HOPS: usize = 40;

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
pub(super) struct Tree<'a> {
    root: &'a Path,
    src: &'a Path,
    /// Relative paths known to be real directories (created by us).
    dirs: HashSet<PathBuf>,
    dir_modes: Vec<(PathBuf, u32)>,
    pub(super) symlinks: Vec<PathBuf>,
    pub(super) entries: u64,
    pub(super) bytes: u64,
    pub(super) limits: Limits,
    /// The tree is an image of `/` (a `.deb`'s data.tar): absolute symlink
    /// targets mean "from the root of the tree" and are rewritten relative,
    /// instead of being refused.
    pub(super) root_image: bool,
}

impl<'a> Tree<'a> {
    pub(super) fn new(root: &'a Path, src: &'a Path) -> Self {
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
            Failure::UnsafeArchive,
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
            Failure::ArchiveInvalid,
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
    pub(super) fn unpack_tar(&mut self, reader: impl Read) -> Result<()> {
        let mut archive = tar::Archive::new(reader);
        {
            let entries = archive.entries().map_err(|e| self.read_err(e))?;
            for entry in entries {
                let mut entry = entry.map_err(|e| self.read_err(e))?;
                self.unpack_entry(&mut entry)?;
            }
        }
        // The rest after the first zero block: the second one and the record
        // padding. Reading it also makes the decompressor check its trailer.
        let rest =
            io::copy(&mut archive.into_inner(), &mut io::sink()).map_err(|e| self.read_err(e))?;
        if rest == 0 {
            return Err(
                self.invalid("truncated: the tar stream ends without its end-of-archive marker")
            );
        }
        Ok(())
    }

    fn read_err(&self, e: io::Error) -> Error {
        self.invalid(format_args!(
            "reading the tar stream (truncated or corrupt): {e}"
        ))
    }

    /// One tar entry into the tree, by its type; extension headers are
    /// the tar crate's, already applied to the entry they precede.
    fn unpack_entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<()> {
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader
                | tar::EntryType::XHeader
                | tar::EntryType::GNULongName
                | tar::EntryType::GNULongLink
        ) {
            return Ok(());
        }
        let raw = entry.path().map_err(|e| self.read_err(e))?.into_owned();
        let mode = entry.header().mode().map_err(|e| self.read_err(e))?;
        let Some(rel) = self.rel_path(&raw)? else {
            if kind.is_dir() {
                return Ok(());
            }
            return Err(self.invalid(format_args!(
                "entry '{}' names the top directory but is not a directory",
                raw.display()
            )));
        };
        match kind {
            tar::EntryType::Directory => self.add_dir(&rel, mode),
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let mtime = entry.header().mtime().ok();
                let size = (!kind.is_gnu_sparse()).then(|| entry.size());
                self.add_file(&rel, mode, mtime, entry, size)
            }
            tar::EntryType::Symlink => {
                let target = self.link_target(entry, &rel, "symlink")?;
                self.add_symlink(&rel, &target)
            }
            tar::EntryType::Link => {
                let target = self.link_target(entry, &rel, "hard link")?;
                self.add_hardlink(&rel, &target)
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                Err(self.unsafe_entry(&rel, "is a device node or fifo; packages have none"))
            }
            other => Err(self.invalid(format_args!(
                "entry '{}' has an unsupported tar type {:?}",
                rel.display(),
                other
            ))),
        }
    }

    /// A link entry's target; `what` names the kind of link in the error.
    fn link_target<R: Read>(
        &self,
        entry: &tar::Entry<'_, R>,
        rel: &Path,
        what: &str,
    ) -> Result<PathBuf> {
        Ok(entry
            .link_name()
            .map_err(|e| self.read_err(e))?
            .ok_or_else(|| self.invalid(format_args!("{what} '{}' has no target", rel.display())))?
            .into_owned())
    }

    /// Copies the tree under `src_root/rel` with the same rules as a tar.
    pub(super) fn copy_dir(&mut self, src_root: &Path, rel: &Path) -> Result<()> {
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
    pub(super) fn finish(&mut self) -> Result<()> {
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
    use crate::error::Reason;

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
        assert!(err.to_string().contains("'up'"), "{err}");
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
