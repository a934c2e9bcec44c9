//! The confined writes, tried against real paths and links in temporary
//! host roots.

use super::*;
use crate::host_root::HostRootSource;
use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt, symlink};

/// A host root whose directories are absolute links to `outside`, a
/// directory of the machine running the test: followed as `std::fs`
/// would, every write below would land there.
struct Trap {
    root: tempfile::TempDir,
    outside: tempfile::TempDir,
}

impl Trap {
    fn new() -> Self {
        let t = Trap {
            root: tempfile::tempdir().unwrap(),
            outside: tempfile::tempdir().unwrap(),
        };
        let o = t.outside.path();
        for (link, target) in [
            ("var/lib", o.to_path_buf()),
            ("etc/ld.so.conf.d", o.join("ld.so.conf.d")),
            ("dev", o.join("dev")),
            ("run/nvidia", o.join("nvidia")),
            ("lib/firmware", o.join("firmware")),
        ] {
            let at = t.root.path().join(link);
            fs::create_dir_all(at.parent().unwrap()).unwrap();
            symlink(&target, &at).unwrap();
        }
        // Where `dev` resolves in the root (chroot terms) exists; the
        // other targets are dangling there and get created.
        fs::create_dir_all(t.inside(&o.join("dev"))).unwrap();
        t
    }

    fn fs(&self) -> HostFs {
        HostRoot::new(self.root.path(), HostRootSource::Flag)
            .fs()
            .unwrap()
    }

    /// `abs` (a path of this machine) as the host root resolves it.
    fn inside(&self, abs: &Path) -> PathBuf {
        self.root.path().join(abs.strip_prefix("/").unwrap())
    }

    /// The outside directory, as `inside` resolves it.
    fn o(&self) -> PathBuf {
        self.inside(self.outside.path())
    }

    fn assert_outside_untouched(&self) {
        let left: Vec<_> = fs::read_dir(self.outside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "written outside the root: {left:?}");
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

#[test]
fn create_dir_all_follows_links_inside_the_root() {
    let t = Trap::new();
    t.fs()
        .create_dir_all("/var/lib/gpu-driver/drivers")
        .unwrap();
    t.assert_outside_untouched();
    assert!(t.o().join("gpu-driver/drivers").is_dir());
    // A relative link that climbs above the root stops at it.
    symlink("../../../../../../../../etc", t.root.path().join("up")).unwrap();
    t.fs().create_dir_all("up/x").unwrap();
    assert!(t.root.path().join("etc/x").is_dir());
    // A file on the way is an error naming the path.
    fs::write(t.root.path().join("file"), b"").unwrap();
    let e = t.fs().create_dir_all("file/x").unwrap_err();
    assert!(e.to_string().contains("/file"), "{e}");
}

#[test]
fn write_atomic_lands_inside_the_root_and_replaces_links() {
    let t = Trap::new();
    let fs_ = t.fs();
    fs_.write_atomic("/etc/ld.so.conf.d/gpu-driver.conf", b"one\n", 0o644)
        .unwrap();
    fs_.write_atomic("/etc/ld.so.conf.d/gpu-driver.conf", b"two\n", 0o600)
        .unwrap();
    t.assert_outside_untouched();
    let placed = t.o().join("ld.so.conf.d/gpu-driver.conf");
    assert_eq!(fs::read(&placed).unwrap(), b"two\n");
    assert_eq!(
        fs::metadata(&placed).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(names(placed.parent().unwrap()), ["gpu-driver.conf"]);
    // A link at the file's own name is replaced, not written through.
    let victim = t.outside.path().join("victim");
    symlink(&victim, t.root.path().join("etc/victim.conf")).unwrap();
    fs_.write_atomic("etc/victim.conf", b"x", 0o644).unwrap();
    assert!(!victim.exists());
    assert!(
        fs::symlink_metadata(t.root.path().join("etc/victim.conf"))
            .unwrap()
            .is_file()
    );
    t.assert_outside_untouched();
}

#[test]
fn replace_symlink_lands_inside_the_root() {
    let t = Trap::new();
    let fs_ = t.fs();
    fs_.replace_symlink("/run/nvidia/driver", "/var/lib/gpu-driver/drivers/current")
        .unwrap();
    fs_.replace_symlink("/run/nvidia/driver", "/elsewhere")
        .unwrap();
    t.assert_outside_untouched();
    let link = t.o().join("nvidia/driver");
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("/elsewhere"));
    assert_eq!(names(link.parent().unwrap()), ["driver"]);
    assert_eq!(
        fs_.read_link("/run/nvidia/driver").unwrap(),
        Path::new("/elsewhere")
    );
    assert_eq!(fs_.kind("/run/nvidia/driver").unwrap(), Some(Kind::Symlink));
    assert_eq!(fs_.kind("/run/nvidia/none").unwrap(), None);
}

#[test]
fn mknod_char_lands_inside_the_root() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mknod needs root");
        return;
    }
    let t = Trap::new();
    let fs_ = t.fs();
    match fs_.mknod_char("/dev/nvidiactl", 195, 255, 0o666) {
        Err(e) if e.to_string().contains("Operation not permitted") => {
            eprintln!("skipped: no CAP_MKNOD here ({e})");
            return;
        }
        r => r.unwrap(),
    }
    // Again: left alone; other numbers: replaced.
    fs_.mknod_char("/dev/nvidiactl", 195, 255, 0o666).unwrap();
    fs_.mknod_char("/dev/nvidia0", 195, 0, 0o666).unwrap();
    fs_.mknod_char("/dev/nvidia0", 195, 1, 0o666).unwrap();
    t.assert_outside_untouched();
    let node = t.o().join("dev/nvidiactl");
    let meta = fs::symlink_metadata(&node).unwrap();
    assert!(meta.file_type().is_char_device());
    assert_eq!(meta.rdev(), stat::makedev(195, 255));
    assert_eq!(meta.permissions().mode() & 0o777, 0o666);
    let meta = fs::symlink_metadata(t.o().join("dev/nvidia0")).unwrap();
    assert_eq!(meta.rdev(), stat::makedev(195, 1));
    assert_eq!(names(&t.o().join("dev")), ["nvidia0", "nvidiactl"]);
    // A parent in the way is an error naming it, not a node elsewhere.
    fs::write(t.root.path().join("nodev"), b"").unwrap();
    let e = fs_.mknod_char("/nodev/x", 1, 1, 0o666).unwrap_err();
    assert!(e.to_string().contains("/nodev"), "{e}");
    t.assert_outside_untouched();
}

#[test]
fn rename_and_remove_all_stay_inside_the_root() {
    let t = Trap::new();
    let fs_ = t.fs();
    fs_.create_dir_all("/var/lib/d/.staging/sub").unwrap();
    fs_.write_atomic("/var/lib/d/.staging/sub/f", b"x", 0o644)
        .unwrap();
    // A link in the tree to a directory outside: removed, not followed.
    fs::write(t.outside.path().join("keep"), b"k").unwrap();
    symlink(t.outside.path(), t.o().join("d/.staging/sub/escape")).unwrap();
    fs_.rename("/var/lib/d/.staging", "/var/lib/d/root")
        .unwrap();
    assert!(t.o().join("d/root/sub/f").is_file());
    fs_.remove_all("/var/lib/d/root").unwrap();
    assert!(!t.o().join("d/root").exists());
    assert_eq!(names(t.outside.path()), ["keep"]);
    // Missing is fine; a link itself goes, its target stays.
    fs_.remove_all("/var/lib/d/root").unwrap();
    fs_.remove_all("/var/lib").unwrap();
    assert!(fs::symlink_metadata(t.root.path().join("var/lib")).is_err());
    assert_eq!(names(t.outside.path()), ["keep"]);
}

#[test]
fn lock_is_created_confined_and_never_through_a_link() {
    let t = Trap::new();
    let fs_ = t.fs();
    let lock = fs_.lock("/var/lib/gpu-driver/install.lock").unwrap();
    assert!(t.o().join("gpu-driver/install.lock").is_file());
    drop(lock);
    // The lock file's own name a link (to a file outside): refused.
    fs::create_dir_all(t.root.path().join("run/gpu-driver")).unwrap();
    let target = t.outside.path().join("lock");
    symlink(&target, t.root.path().join("run/gpu-driver/install.lock")).unwrap();
    let e = fs_.lock("/run/gpu-driver/install.lock").unwrap_err();
    assert!(e.to_string().contains("run/gpu-driver/install.lock"), "{e}");
    t.assert_outside_untouched();
}

#[test]
fn real_dir_is_inside_the_root_and_free_of_links() {
    let t = Trap::new();
    let fs_ = t.fs();
    let real = fs_.real_dir("/var/lib/gpu-driver/cache").unwrap();
    assert_eq!(real, t.o().join("gpu-driver/cache"));
    // No link left in it below the root.
    let below = real.strip_prefix(t.root.path()).unwrap();
    assert_eq!(
        fs::canonicalize(&real).unwrap(),
        fs::canonicalize(t.root.path()).unwrap().join(below)
    );
    fs::write(real.join("pkg"), b"p").unwrap();
    t.assert_outside_untouched();
}

#[test]
fn reads_modes_and_sysfs_style_writes() {
    let t = Trap::new();
    let fs_ = t.fs();
    fs_.write_atomic("/lib/firmware/a", b"fw", 0o600).unwrap();
    fs_.set_mode("/lib/firmware/a", 0o755).unwrap();
    let placed = t.o().join("firmware/a");
    assert_eq!(
        fs::metadata(&placed).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(fs_.read("/lib/firmware/a").unwrap().unwrap(), b"fw");
    assert_eq!(fs_.read("/lib/firmware/none").unwrap(), None);
    assert_eq!(
        fs_.read_dir("/lib/firmware").unwrap(),
        [(OsString::from("a"), Kind::File)]
    );
    assert!(fs_.read_dir("/none").unwrap().is_empty());
    fs_.write_existing("/lib/firmware/a", b"new").unwrap();
    assert_eq!(fs::read(&placed).unwrap(), b"new");
    // Never creates.
    assert!(fs_.write_existing("/lib/firmware/b", b"x").is_err());
    // set_mode refuses a link.
    symlink("a", t.o().join("firmware/l")).unwrap();
    assert!(fs_.set_mode("/lib/firmware/l", 0o777).is_err());
    t.assert_outside_untouched();
}
