//! Mounts inside a root: `/proc` while packages install, and whatever a
//! killed run left behind.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, Result};

use crate::cmd::{cmd, run};

/// `/proc` mounted in a root, unmounted when dropped (however the build
/// ends).
pub(super) struct Proc(Option<PathBuf>);

impl Proc {
    pub(super) fn mount(root: &Path) -> Result<Proc> {
        let p = root.join("proc");
        run(cmd("mount").args(["-t", "proc", "proc"]).arg(&p))?;
        Ok(Proc(Some(p)))
    }

    pub(super) fn unmount(mut self) {
        if let Some(p) = self.0.take() {
            umount(&p);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            umount(&p);
        }
    }
}

fn umount(p: &Path) {
    let quiet = |lazy: bool| {
        let mut c = cmd("umount");
        if lazy {
            c.arg("-l");
        }
        c.arg(p)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let _ = quiet(false) || quiet(true);
}

/// Unmounts everything at or below `dir`, deepest first.
pub(super) fn unmount_below(dir: &Path) -> Result<()> {
    let table =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    for m in below(&table, &absolute(dir)) {
        umount(Path::new(&m));
    }
    Ok(())
}

/// `realpath -m`: absolute, the parts that exist resolved.
fn absolute(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| match (dir.parent(), dir.file_name()) {
        (Some(p), Some(n)) => std::fs::canonicalize(p).unwrap_or(p.to_path_buf()).join(n),
        _ => dir.to_path_buf(),
    })
}

/// The mount points of a mount table at or below `dir`, deepest first.
fn below(table: &str, dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy();
    let mut v: Vec<String> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .map(|m| m.replace("\\040", " "))
        .filter(|m| {
            *m == dir
                || m.strip_prefix(dir.as_ref())
                    .is_some_and(|r| r.starts_with('/'))
        })
        .collect();
    v.sort();
    v.reverse();
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn mounts_below_a_root_deepest_first() {
        let table = "proc /proc proc rw 0 0\n\
                     proc /r/a/proc proc rw 0 0\n\
                     tmpfs /r/a/proc/x\\040y tmpfs rw 0 0\n\
                     proc /r/ab/proc proc rw 0 0\n";
        assert_eq!(
            super::below(table, std::path::Path::new("/r/a")),
            ["/r/a/proc/x y", "/r/a/proc"]
        );
    }
}
