//! The work directory: its lock, the removal of what a build leaves there,
//! and failures of our own filesystem.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Failure, Result};

/// Failures of our own filesystem (work and output directories): not the
/// package's, the headers' or the compiler's fault, so the closed list has
/// nothing closer than Internal.
pub(super) const LOCAL_IO: Failure = Failure::Internal;

/// Removes the extracted tree and staging area when the build ends, however
/// it ends: they take up to a GiB. The log stays.
pub(super) struct Cleanup {
    pub(super) dirs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for d in &self.dirs {
            if let Err(e) = fs::remove_dir_all(d) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("removing {}: {e}", d.display());
                }
            }
        }
    }
}

/// Takes the work directory's lock (two builds with one work directory
/// would delete each other's trees) and, holding it, removes what a killed
/// build left there: the extractor's temporaries (`.source.partial-*`,
/// hundreds of MB each), which nothing else would ever remove and which
/// would make the disk check fail. The lock is held until the build ends.
pub(super) fn claim_work_dir(work: &Path) -> Result<nix::fcntl::Flock<fs::File>> {
    fs::create_dir_all(work).map_err(|e| Error::io(LOCAL_IO, "creating", work, e))?;
    let lock = crate::lock::lock(&work.join(".lock"), LOCAL_IO)?;
    let entries = fs::read_dir(work).map_err(|e| Error::io(LOCAL_IO, "listing", work, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if crate::extract::is_partial_name(&name.to_string_lossy()) {
            let path = entry.path();
            tracing::info!("removing {} (left by a killed build)", path.display());
            remove_dir_if_present(&path)?;
        }
    }
    Ok(lock)
}

pub(super) fn remove_dir_if_present(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(LOCAL_IO, "removing the earlier run's", dir, e)),
    }
}
