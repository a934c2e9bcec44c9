//! Publishing a local file atomically: a temporary file in the same
//! directory, fsync, rename, directory sync. Writes under the host root go
//! through `confined_fs` instead, which confines path resolution to the root.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::{Error, Failure, Result};

/// Writes `bytes` to `path` through a temporary file in the same directory
/// (created with O_EXCL by tempfile), fsyncs it, gives it `mode` and renames
/// it over `path`, then syncs the directory: a reader sees the old file or
/// the new one, never half of one. The directory is created if missing.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32, reason: Failure) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(|e| Error::io(reason, "creating", dir, e))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".gpu-driver-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| Error::io(reason, "creating a temporary file in", dir, e))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .and_then(|()| std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode)))
        .map_err(|e| Error::io(reason, "writing", tmp.path(), e))?;
    tmp.persist(path)
        .map_err(|e| Error::io(reason, "renaming into place", path, e.error))?;
    sync_dir(dir);
    Ok(())
}

/// Makes a rename or creation in `dir` durable. Best effort: a directory
/// that cannot be opened or synced only loses durability, not data.
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

    #[test]
    fn write_atomic_replaces_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/result.json");
        write_atomic(&p, b"one", 0o600, Failure::Internal).unwrap();
        write_atomic(&p, b"two", 0o644, Failure::Internal).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("result.json")]);
    }

    #[test]
    fn write_atomic_into_a_missing_parent_that_cannot_be_made_names_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        let e = write_atomic(
            &dir.path().join("file/x"),
            b"y",
            0o644,
            Failure::InvalidArgument,
        )
        .unwrap_err();
        assert_eq!(e.reason, Reason::InvalidArgument);
        assert!(e.to_string().contains("/file"), "{e}");
    }
}
