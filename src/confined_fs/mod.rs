//! Writes under the host root, confined to it.
//!
//! The host root is someone else's filesystem: its `var/lib`, `etc`,
//! `dev` or `run` may be symbolic links, and absolute ones name the
//! host's `/`, not ours. `Path::join` plus `std::fs` would follow such a
//! link into the installer's own filesystem (a pod's root, or the node's
//! `/` seen from a `--host-root` mount), and create device nodes, driver
//! roots or `ld.so.conf.d` files there. So every path under the root is
//! resolved by the kernel with `openat2(RESOLVE_IN_ROOT)` on a handle of
//! the root, as in a chroot: an absolute link restarts at the host root
//! and `..` never climbs above it. The last component is then acted on
//! with a `*at` call on its confined parent (`mkdirat`, `renameat`,
//! `symlinkat`, `mknodat`, `unlinkat`), which never follows a link there;
//! temporary files are created with `O_EXCL | O_NOFOLLOW`.
//!
//! Reads go through [`HostRoot::resolve`] and plain `std::fs`, as before:
//! a read that strays cannot damage anything.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, Flock, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{self, FchmodatFlags, Mode, SFlag};
use nix::unistd::{self, UnlinkatFlags};

use crate::error::{Error, Failure, Result};
use crate::host_root::{HostRoot, components};

/// Failures to change the host's files are the installer's own (there is
/// no host-write reason); a full disk still becomes `InsufficientDisk`
/// through [`Error::io`].
const REASON: Failure = Failure::Internal;

/// Symbolic links followed while creating one path (the kernel's own
/// limit).
const MAX_LINK_HOPS: u32 = 40;

/// Tells temporary names of one process apart (threads share the pid).
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// What is at a path, without following a final symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    File,
    Symlink,
    CharDevice { rdev: u64 },
    Other,
}

/// A handle on the host root through which every write is confined to it.
#[derive(Debug)]
pub(crate) struct HostFs {
    /// `O_PATH | O_DIRECTORY` handle of the host root: the "/" of every
    /// resolution.
    root: OwnedFd,
    host: HostRoot,
}

impl HostFs {
    /// Opens the host root. Failing that is `HostReadFailed`: the root
    /// given is not a directory we can reach.
    pub(crate) fn open(host: &HostRoot) -> Result<Self> {
        let root = fcntl::open(
            host.path(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io(Failure::HostReadFailed, "opening", host.path(), e.into()))?;
        Ok(HostFs {
            root,
            host: host.clone(),
        })
    }

    /// The host root's path, for messages and for [`Self::real_dir`].
    pub(crate) fn host(&self) -> &HostRoot {
        &self.host
    }

    /// Creates `rel` and its missing parents (mode 0755). A dangling link
    /// on the way is followed inside the root and its target created, as
    /// the host would resolve it.
    pub(crate) fn create_dir_all(&self, rel: impl AsRef<Path>) -> Result<()> {
        self.mkdirs(rel.as_ref()).map(drop)
    }

    /// Writes `bytes` to `rel` atomically: a temporary file beside it
    /// (`O_CREAT | O_EXCL | O_NOFOLLOW`), fsync, `mode`, `renameat` over
    /// `rel`, then a sync of the directory. Parents are created.
    pub(crate) fn write_atomic(
        &self,
        rel: impl AsRef<Path>,
        bytes: &[u8],
        mode: u32,
    ) -> Result<()> {
        let rel = rel.as_ref();
        let (parent, name) = split(rel)?;
        let dir = self.mkdirs(&parent)?;
        let tmp = temp_name(&name);
        let fd = fcntl::openat(
            &dir,
            tmp.as_os_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| self.err("creating", &parent.join(&tmp), e))?;
        let mut file = File::from(fd);
        let written = file
            .write_all(bytes)
            .and_then(|()| {
                // fchmod, not the create mode: the umask would cut that.
                stat::fchmod(file.as_fd(), Mode::from_bits_truncate(mode)).map_err(Into::into)
            })
            .and_then(|()| file.sync_all());
        if let Err(e) = written {
            let _ = unistd::unlinkat(&dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            return Err(Error::io(
                REASON,
                "writing",
                &self.shown(&parent.join(&tmp)),
                e,
            ));
        }
        drop(file);
        self.rename_in(&dir, &parent, &tmp, &name)?;
        sync(&dir);
        Ok(())
    }

    /// Writes into an existing file (a sysfs parameter), resolved inside
    /// the root; never creates one.
    pub(crate) fn write_existing(&self, rel: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
        let rel = rel.as_ref();
        let fd = self
            .open_in_root(rel, OFlag::O_WRONLY | OFlag::O_NOFOLLOW, Mode::empty())
            .map_err(|e| self.err("opening", rel, e))?;
        File::from(fd)
            .write_all(bytes)
            .map_err(|e| Error::io(REASON, "writing", &self.shown(rel), e))
    }

    /// Points the link `rel` at `target` by creating a fresh link
    /// (`.<name>.<pid>.<n>`) beside it and renaming it over `rel`: readers
    /// see the old target or the new one, never none. Parents are created.
    pub(crate) fn replace_symlink(
        &self,
        rel: impl AsRef<Path>,
        target: impl AsRef<Path>,
    ) -> Result<()> {
        let rel = rel.as_ref();
        let (parent, name) = split(rel)?;
        let dir = self.mkdirs(&parent)?;
        let tmp = temp_name(&name);
        unistd::symlinkat(target.as_ref(), &dir, tmp.as_os_str())
            .map_err(|e| self.err("creating the link", &parent.join(&tmp), e))?;
        self.rename_in(&dir, &parent, &tmp, &name)?;
        sync(&dir);
        Ok(())
    }

    /// A character device node `major:minor` with `mode` at `rel`; one
    /// with these numbers already there is left alone, anything else is
    /// replaced (by renaming a fresh node over it). Parents are created
    /// (a host root without `/dev` of its own, or a dangling `dev` link).
    pub(crate) fn mknod_char(
        &self,
        rel: impl AsRef<Path>,
        major: u32,
        minor: u32,
        mode: u32,
    ) -> Result<()> {
        let rel = rel.as_ref();
        let (parent, name) = split(rel)?;
        let dir = self.mkdirs(&parent)?;
        let dev = stat::makedev(u64::from(major), u64::from(minor));
        if let Ok(Kind::CharDevice { rdev }) = kind_at(&dir, &name) {
            if rdev == dev {
                return Ok(());
            }
        }
        let tmp = temp_name(&name);
        let mode = Mode::from_bits_truncate(mode);
        stat::mknodat(&dir, tmp.as_os_str(), SFlag::S_IFCHR, mode, dev)
            .map_err(|e| self.err(&format!("mknod ({major}:{minor})"), &parent.join(&tmp), e))?;
        // Again without the umask. NoFollowSymlink refuses a link that a
        // concurrent root process put there; a libc that cannot do it
        // without /proc says EOPNOTSUPP, and the node we just made is
        // chmod'ed directly.
        let chmod =
            match stat::fchmodat(&dir, tmp.as_os_str(), mode, FchmodatFlags::NoFollowSymlink) {
                Err(Errno::EOPNOTSUPP) => {
                    stat::fchmodat(&dir, tmp.as_os_str(), mode, FchmodatFlags::FollowSymlink)
                }
                r => r,
            };
        if let Err(e) = chmod {
            let _ = unistd::unlinkat(&dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            return Err(self.err("chmod", &parent.join(&tmp), e));
        }
        self.rename_in(&dir, &parent, &tmp, &name)
    }

    /// Gives the regular file `rel` the permission bits `mode`. A link or
    /// anything but a regular file is refused.
    pub(crate) fn set_mode(&self, rel: impl AsRef<Path>, mode: u32) -> Result<()> {
        let rel = rel.as_ref();
        // O_NONBLOCK: a FIFO put there must not block the open.
        let fd = self
            .open_in_root(
                rel,
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
                Mode::empty(),
            )
            .map_err(|e| self.err("opening", rel, e))?;
        let st = stat::fstat(&fd).map_err(|e| self.err("reading", rel, e))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(Error::new(
                REASON,
                format!("{} is not a regular file", self.shown(rel).display()),
            ));
        }
        stat::fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(|e| self.err("chmod", rel, e))
    }

    /// Renames `from` to `to`; both parents must exist.
    pub(crate) fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        let (from, to) = (from.as_ref(), to.as_ref());
        let (from_parent, from_name) = split(from)?;
        let (to_parent, to_name) = split(to)?;
        let from_dir = self
            .open_dir(&from_parent)
            .map_err(|e| self.err("opening", &from_parent, e))?;
        let to_dir = self
            .open_dir(&to_parent)
            .map_err(|e| self.err("opening", &to_parent, e))?;
        fcntl::renameat(
            &from_dir,
            from_name.as_os_str(),
            &to_dir,
            to_name.as_os_str(),
        )
        .map_err(|e| {
            Error::io(
                REASON,
                &format!("renaming {} to", self.shown(from).display()),
                &self.shown(to),
                e.into(),
            )
        })?;
        sync(&to_dir);
        Ok(())
    }

    /// Removes `rel` and, if it is a directory, everything in it. Links are
    /// removed, never followed. A missing path is fine.
    pub(crate) fn remove_all(&self, rel: impl AsRef<Path>) -> Result<()> {
        let rel = rel.as_ref();
        let (parent, name) = split(rel)?;
        let dir = match self.open_dir(&parent) {
            Ok(d) => d,
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(self.err("opening", &parent, e)),
        };
        remove_at(&dir, &name).map_err(|(inner, e)| self.err("removing", &parent.join(inner), e))
    }

    /// The target of the link `rel`.
    pub(crate) fn read_link(&self, rel: impl AsRef<Path>) -> Result<PathBuf> {
        let rel = rel.as_ref();
        let (parent, name) = split(rel)?;
        let dir = self
            .open_dir(&parent)
            .map_err(|e| self.err("opening", &parent, e))?;
        fcntl::readlinkat(&dir, name.as_os_str())
            .map(PathBuf::from)
            .map_err(|e| self.err("reading the link", rel, e))
    }

    /// What is at `rel` (a final link is not followed); `None` when
    /// nothing is.
    pub(crate) fn kind(&self, rel: impl AsRef<Path>) -> Result<Option<Kind>> {
        let rel = rel.as_ref();
        let (parent, name) = split(rel)?;
        let dir = match self.open_dir(&parent) {
            Ok(d) => d,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(self.err("opening", &parent, e)),
        };
        match kind_at(&dir, &name) {
            Ok(k) => Ok(Some(k)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.err("reading", rel, e)),
        }
    }

    /// The contents of the file `rel`, resolved inside the root; `None`
    /// when it does not exist.
    pub(crate) fn read(&self, rel: impl AsRef<Path>) -> Result<Option<Vec<u8>>> {
        use std::io::Read;
        let rel = rel.as_ref();
        let fd = match self.open_in_root(rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(self.err("opening", rel, e)),
        };
        let mut bytes = Vec::new();
        File::from(fd)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(REASON, "reading", &self.shown(rel), e))?;
        Ok(Some(bytes))
    }

    /// The names in the directory `rel` with what each is (links not
    /// followed), sorted; empty when the directory does not exist.
    pub(crate) fn read_dir(&self, rel: impl AsRef<Path>) -> Result<Vec<(OsString, Kind)>> {
        let rel = rel.as_ref();
        let fd = match self.open_in_root(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(Vec::new()),
            Err(e) => return Err(self.err("opening", rel, e)),
        };
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(|e| self.err("listing", rel, e))?;
        let names = list(&mut dir).map_err(|e| self.err("listing", rel, e))?;
        let mut out = Vec::new();
        for name in names {
            match kind_at(&dir, &name) {
                Ok(k) => out.push((name, k)),
                // Removed since it was listed.
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(self.err("reading", &rel.join(&name), e)),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// An exclusive flock on `rel` (created confined, never through a
    /// link; parents created), held until dropped. Waits, and says so,
    /// while another process holds it.
    pub(crate) fn lock(&self, rel: impl AsRef<Path>) -> Result<Flock<File>> {
        let rel = rel.as_ref();
        let (parent, name) = split(rel)?;
        let dir = self.mkdirs(&parent)?;
        let fd = fcntl::openat(
            &dir,
            name.as_os_str(),
            OFlag::O_CREAT | OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| self.err("opening lock", rel, e))?;
        crate::lock::lock_file(File::from(fd), &self.shown(rel), REASON)
    }

    /// Creates the directory `rel` confined, then returns its real path:
    /// every link on the way resolved inside the root, so that `std::fs`
    /// under it (a package cache, a build's output, an unpacked artifact)
    /// stays in the root.
    ///
    /// The path is checked to name the directory just created (same device
    /// and inode). What this cannot rule out: a process running as root on
    /// the host that replaces a directory of that path with a link between
    /// this check and the caller's writes. Such a process could write there
    /// itself; the check is against links already in the host root, not
    /// against a concurrent root adversary.
    pub(crate) fn real_dir(&self, rel: impl AsRef<Path>) -> Result<PathBuf> {
        let rel = rel.as_ref();
        let fd = self.mkdirs(rel)?;
        let made = stat::fstat(&fd).map_err(|e| self.err("reading", rel, e))?;
        let path = self.host.resolve(rel).ok_or_else(|| {
            Error::new(
                REASON,
                format!(
                    "{} vanished after it was created",
                    self.shown(rel).display()
                ),
            )
        })?;
        let same = std::fs::symlink_metadata(&path)
            .is_ok_and(|m| m.is_dir() && m.dev() == made.st_dev && m.ino() == made.st_ino);
        if !same {
            return Err(Error::new(
                REASON,
                format!(
                    "{} resolves to {}, which is not the directory created there (changed meanwhile?)",
                    self.shown(rel).display(),
                    path.display()
                ),
            ));
        }
        Ok(path)
    }

    // ------------------------------------------------------------ inner

    /// `<host-root>/<rel>`, as messages name it.
    fn shown(&self, rel: &Path) -> PathBuf {
        self.host.join(rel)
    }

    fn err(&self, action: &str, rel: &Path, e: Errno) -> Error {
        let err = Error::io(REASON, action, &self.shown(rel), e.into());
        if e == Errno::ENOSYS {
            err.with_hint("confined writes need openat2(2), Linux 5.6 or later")
        } else {
            err
        }
    }

    /// `openat2(root, rel, RESOLVE_IN_ROOT)`: absolute links restart at the
    /// host root, `..` stops there, and `/proc` magic links (which could
    /// jump anywhere) are refused.
    fn open_in_root(&self, rel: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
        let rel = relative(rel);
        let path: &Path = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &rel
        };
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .mode(mode)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        // EAGAIN: a rename elsewhere raced the lookup of ".."; retrying is
        // what the kernel asks for.
        let mut tries = 0;
        loop {
            match fcntl::openat2(&self.root, path, how) {
                Err(Errno::EAGAIN | Errno::EINTR) if tries < 16 => tries += 1,
                r => return r,
            }
        }
    }

    fn open_dir(&self, rel: &Path) -> nix::Result<OwnedFd> {
        self.open_in_root(rel, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
    }

    /// Creates `rel` and its parents; returns a handle of it. Each
    /// component is looked up from the root (so links resolve as the host
    /// would) and made with `mkdirat` on its confined parent.
    fn mkdirs(&self, rel: &Path) -> Result<OwnedFd> {
        let mut pending: Vec<OsString> = components(rel);
        pending.reverse();
        let mut done = PathBuf::new();
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            let next = done.join(&part);
            match self.open_dir(&next) {
                Ok(_) => {
                    done = next;
                    continue;
                }
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(self.err("opening", &next, e)),
            }
            let parent = self
                .open_dir(&done)
                .map_err(|e| self.err("opening", &done, e))?;
            match stat::mkdirat(&parent, part.as_os_str(), Mode::from_bits_truncate(0o755)) {
                Ok(()) => done = next,
                Err(Errno::EEXIST) => match fcntl::readlinkat(&parent, part.as_os_str()) {
                    // A dangling link: create what it points at, in the root.
                    Ok(target) => {
                        hops += 1;
                        if hops > MAX_LINK_HOPS {
                            return Err(self.err("creating", &next, Errno::ELOOP));
                        }
                        let target = PathBuf::from(target);
                        if target.is_absolute() {
                            done = PathBuf::new();
                        }
                        pending.extend(components(&target).into_iter().rev());
                    }
                    // Made by someone else meanwhile: look again.
                    Err(_) => match self.open_dir(&next) {
                        Ok(_) => done = next,
                        Err(e) => return Err(self.err("creating", &next, e)),
                    },
                },
                Err(e) => return Err(self.err("creating", &next, e)),
            }
        }
        self.open_dir(&done)
            .map_err(|e| self.err("opening", &done, e))
    }

    /// `renameat` within one confined directory, removing `tmp` on failure.
    fn rename_in(&self, dir: &OwnedFd, parent: &Path, tmp: &OsStr, name: &OsStr) -> Result<()> {
        fcntl::renameat(dir, tmp, dir, name).map_err(|e| {
            let _ = unistd::unlinkat(dir, tmp, UnlinkatFlags::NoRemoveDir);
            self.err("renaming into place", &parent.join(name), e)
        })
    }
}

/// Confined writes for a [`HostRoot`] (which lives in the wire contract and
/// knows nothing of writing).
pub(crate) trait HostRootFs {
    /// A handle for confined writes under this root (see [`HostFs`]).
    fn fs(&self) -> Result<HostFs>;
}

impl HostRootFs for HostRoot {
    fn fs(&self) -> Result<HostFs> {
        HostFs::open(self)
    }
}

/// `p` relative to the host root: a host-absolute path such as `/etc/x`
/// becomes `etc/x` (`..` kept for the kernel to resolve inside the root).
fn relative(p: &Path) -> PathBuf {
    components(p).into_iter().collect()
}

/// The parent (relative to the root) and the last name of `rel`, which
/// must be a plain name.
fn split(rel: &Path) -> Result<(PathBuf, OsString)> {
    let mut parts = components(rel);
    match parts.pop() {
        Some(name) if name != ".." => Ok((parts.into_iter().collect(), name)),
        _ => Err(Error::new(
            REASON,
            format!("{} does not end in a file name", rel.display()),
        )),
    }
}

fn temp_name(name: &OsStr) -> OsString {
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(
        ".{}.{}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    tmp
}

fn kind_at(dir: &impl AsFd, name: &OsStr) -> nix::Result<Kind> {
    let st = stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    let fmt = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    Ok(if fmt == SFlag::S_IFDIR {
        Kind::Dir
    } else if fmt == SFlag::S_IFREG {
        Kind::File
    } else if fmt == SFlag::S_IFLNK {
        Kind::Symlink
    } else if fmt == SFlag::S_IFCHR {
        Kind::CharDevice { rdev: st.st_rdev }
    } else {
        Kind::Other
    })
}

/// The entries of an open directory, without `.` and `..`.
fn list(dir: &mut nix::dir::Dir) -> nix::Result<Vec<OsString>> {
    let mut names = Vec::new();
    for entry in dir.iter() {
        let bytes = entry?.file_name().to_bytes().to_vec();
        if bytes != b"." && bytes != b".." {
            names.push(OsStr::from_bytes(&bytes).to_os_string());
        }
    }
    Ok(names)
}

/// Removes `name` in `dir`, a directory's contents first, never following
/// a link. The error names the path (relative to `dir`) that failed.
fn remove_at(dir: &impl AsFd, name: &OsStr) -> std::result::Result<(), (PathBuf, Errno)> {
    let fail = |e| (PathBuf::from(name), e);
    match kind_at(dir, name) {
        Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(fail(e)),
        Ok(Kind::Dir) => {
            let fd = fcntl::openat(
                dir,
                name,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(fail)?;
            let mut sub = nix::dir::Dir::from_fd(fd).map_err(fail)?;
            for child in list(&mut sub).map_err(fail)? {
                remove_at(&sub, &child).map_err(|(p, e)| (Path::new(name).join(p), e))?;
            }
            match unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(fail(e)),
            }
        }
        Ok(_) => match unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(fail(e)),
        },
    }
}

/// Makes a rename or creation in `dir` durable; best effort, like
/// [`crate::publish::sync_dir`].
fn sync(dir: &OwnedFd) {
    // An O_PATH handle cannot be fsynced; "." through it can.
    if let Ok(fd) = fcntl::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        let _ = unistd::fsync(&fd);
    }
}

#[cfg(test)]
mod tests;
