//! Reading a file someone else names (a flag, a store, a package, the
//! host): a regular file only, bounded in size, never quoted in messages.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Read};
use std::path::Path;

use crate::error::{Error, Failure, Result};

/// How a file that someone else names (a flag, a store, a package, the
/// host) may be read: what it is, for messages; its size cap; the reason a
/// refusal carries; and what to do about it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Named {
    pub what: &'static str,
    pub max: u64,
    pub reason: Failure,
    pub hint: &'static str,
}

impl Named {
    /// Reads the file: a regular file only (a FIFO would block and a device
    /// such as `/dev/zero` never end), at most `max` bytes. The open is
    /// non-blocking, so even a FIFO without a writer cannot hang it. A
    /// missing file is an error naming it.
    pub(crate) fn read(&self, path: &Path) -> Result<Vec<u8>> {
        match self.read_optional(path)? {
            Some(bytes) => Ok(bytes),
            None => Err(Error::new(
                self.reason,
                format!("{} {} does not exist", self.what, path.display()),
            )
            .with_hint_if(self.hint)),
        }
    }

    /// [`Named::read`], with `Ok(None)` when the file does not exist.
    pub(crate) fn read_optional(&self, path: &Path) -> Result<Option<Vec<u8>>> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io("opening", path, e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| self.io("inspecting", path, e))?;
        if !meta.file_type().is_file() {
            return Err(Error::new(
                self.reason,
                format!(
                    "{} {} is not a regular file ({}); refusing to read it",
                    self.what,
                    path.display(),
                    describe_file_type(&meta.file_type())
                ),
            )
            .with_hint_if(self.hint));
        }
        let mut bytes = Vec::new();
        (&file)
            .take(self.max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.io("reading", path, e))?;
        if bytes.len() as u64 > self.max {
            return Err(Error::new(
                self.reason,
                format!(
                    "{} {} is larger than {} KiB, too large for what it should be; refusing to read it",
                    self.what,
                    path.display(),
                    self.max >> 10
                ),
            )
            .with_hint_if(self.hint));
        }
        Ok(Some(bytes))
    }

    /// [`Named::read`] as UTF-8 text. A file that is not text is named,
    /// never quoted.
    pub(crate) fn read_text(&self, path: &Path) -> Result<String> {
        String::from_utf8(self.read(path)?).map_err(|e| {
            Error::new(
                self.reason,
                format!(
                    "{} {} is not UTF-8 text (byte {})",
                    self.what,
                    path.display(),
                    e.utf8_error().valid_up_to()
                ),
            )
            .with_hint_if(self.hint)
        })
    }

    fn io(&self, doing: &str, path: &Path, e: std::io::Error) -> Error {
        Error::io(self.reason, &format!("{doing} {}", self.what), path, e).with_hint_if(self.hint)
    }
}

fn describe_file_type(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Files no reader should take whole or quote, for the tests of every
/// reader of a file someone else names.
#[cfg(test)]
pub(crate) mod hostile {
    use std::fmt::Debug;
    use std::path::{Path, PathBuf};

    /// The secret that [`secret_file`] holds; no message may show it.
    pub(crate) const SECRET: &str = "hunter2-do-not-print";

    /// A FIFO without a writer: a blocking open would wait forever.
    pub(crate) fn fifo(dir: &Path) -> PathBuf {
        let p = dir.join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        p
    }

    /// A link to `/dev/zero`: a read to the end never ends.
    pub(crate) fn zero(dir: &Path) -> PathBuf {
        let p = dir.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        p
    }

    /// A sparse regular file one byte over `max`.
    pub(crate) fn oversized(dir: &Path, max: u64) -> PathBuf {
        let p = dir.join("big");
        std::fs::File::create(&p).unwrap().set_len(max + 1).unwrap();
        p
    }

    /// A file that is not what the reader expects and holds a secret, as
    /// `/proc/self/environ` or a credentials file would.
    pub(crate) fn secret_file(dir: &Path) -> PathBuf {
        let p = dir.join("environ");
        std::fs::write(
            &p,
            format!("AWS_SECRET_ACCESS_KEY={SECRET}\0PATH=/bin\nkey = \"{SECRET}\"\n{SECRET}\n"),
        )
        .unwrap();
        p
    }

    /// `read` refuses each hostile file at once, says why, names it, and
    /// never shows the secret.
    pub(crate) fn assert_refused<T: Debug>(
        max: u64,
        read: impl Fn(&Path) -> crate::error::Result<T>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        for (file, why) in [
            (fifo(dir.path()), Some("a FIFO")),
            (zero(dir.path()), Some("a character device")),
            (oversized(dir.path(), max), Some("larger than")),
            (secret_file(dir.path()), None),
        ] {
            let e = read(&file).expect_err("a hostile file was accepted");
            let shown = format!("{e} {:?}", e.hint);
            assert!(shown.contains(&file.display().to_string()), "{shown}");
            if let Some(why) = why {
                assert!(shown.contains(why), "{file:?}: {shown}");
            }
            assert!(!shown.contains(SECRET), "{file:?}: {shown}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_files_are_read_bounded_regular_and_unquoted() {
        let named = Named {
            what: "the test file",
            max: 1 << 10,
            reason: Failure::InvalidArgument,
            hint: "pass a real one",
        };
        hostile::assert_refused(named.max, |p| {
            // The secret file is valid UTF-8 and small: refuse it the way a
            // parser would, by its path alone.
            let text = named.read_text(p)?;
            Err::<String, _>(Error::new(
                Failure::InvalidArgument,
                format!("{} is not a test file ({} bytes)", p.display(), text.len()),
            ))
        });
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok");
        std::fs::write(&ok, "fine").unwrap();
        assert_eq!(named.read_text(&ok).unwrap(), "fine");
        let e = named.read(&dir.path().join("absent")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert_eq!(
            named.read_optional(&dir.path().join("absent")).unwrap(),
            None
        );
        std::fs::write(&ok, b"\xff\xfe").unwrap();
        assert!(
            named
                .read_text(&ok)
                .unwrap_err()
                .to_string()
                .contains("not UTF-8")
        );
    }
}
