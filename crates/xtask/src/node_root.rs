//! `cargo xtask node-root [--rebuild]` (scripts/node-root): the root disk of
//! scripts/real-node's VM node. Debian bookworm (minbase) with Debian's
//! cloud kernel and its initramfs, containerd, runc, the CNI plugins,
//! iptables, tini, and the node's own files from tools/node/: node-init
//! (PID 1), the kubelet's configuration, a bridge CNI network and Garden
//! Linux's os-release (the kubelet reports it as the node's osImage). The
//! kubelet, the images and the cluster's credentials are not on it: they
//! come per run on a second disk (scripts/real-node).
//!
//! Cache: `<cache>/node/<key>/` with disk.img (ext4, sparse), vmlinuz,
//! initrd.img and node.json (kernel release and package versions); the key
//! hashes this module's source, the package list and tools/node's files.
//! Built in `<key>.tmp` and renamed when complete, under the kind's lock
//! (waited for at most an hour). A root older than
//! `GPU_DRIVER_ROOT_MAX_AGE_DAYS` (default 7, 0: never) is rebuilt, since
//! the archive moves (`GPU_DRIVER_DEBIAN_MIRROR`, default
//! deb.debian.org). Other keys' roots unused for an hour are deleted.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::cache::{self, Cache, Entry, Key, KeyInputs};
use crate::cmd::cmd;
use crate::deadline::{self, run_logged};

const PACKAGES: [&str; 12] = [
    "linux-image-cloud-amd64",
    "initramfs-tools",
    "udev",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "iproute2",
    "kmod",
    "tini",
    "ca-certificates",
    "procps",
];
const NODE_FILES: [&str; 4] = [
    "node-init",
    "kubelet-config.yaml",
    "10-bridge.conflist",
    "os-release",
];
/// The versions node.json records.
const RECORDED: [&str; 4] = [
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
];
const LOCK_WAIT: Duration = Duration::from_secs(3600);
const SLOW: Duration = Duration::from_secs(30 * 60);
const QUICK: Duration = Duration::from_secs(120);

/// The node root's directory, built unless a fresh one is cached.
pub fn build(repo: &Path, rebuild: bool) -> Result<PathBuf> {
    if !crate::apt::is_root() {
        bail!("needs root (debootstrap, chroot, mount)");
    }
    crate::apt::ensure(&[crate::apt::ROOTS, &[("mkfs.ext4", "e2fsprogs")]])?;
    let max_age_days = match std::env::var("GPU_DRIVER_ROOT_MAX_AGE_DAYS") {
        Ok(v) if !v.is_empty() => v
            .parse::<u64>()
            .with_context(|| format!("GPU_DRIVER_ROOT_MAX_AGE_DAYS={v} is not a number"))?,
        _ => 7,
    };
    let mut inputs = KeyInputs::default().line(include_str!("node_root.rs"));
    for p in PACKAGES {
        inputs = inputs.line(p);
    }
    let names: Vec<String> = NODE_FILES.iter().map(|s| s.to_string()).collect();
    let key = inputs.files(&repo.join("tools/node"), &names)?.key();
    let key_text = key.to_string();
    let entry = entry_within(key, LOCK_WAIT)?;
    let dest = entry.path().to_path_buf();
    if !rebuild && fresh(&dest.join("node.json"), max_age_days) {
        eprintln!("node root cached (key {key_text})");
        return Ok(dest);
    }
    let tmp = dest.with_extension("tmp");
    cache::remove(&tmp)?;
    fs::create_dir_all(&tmp)?;
    let mut guard = Building {
        root: tmp.join("root"),
        tmp: tmp.clone(),
        done: false,
    };
    fill(repo, &tmp, &key_text)?;
    guard.done = true;
    cache::remove(&dest)?;
    fs::rename(&tmp, &dest)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    let json = dest.join("node.json");
    // The age counts from the finished root.
    fs::File::options()
        .append(true)
        .open(&json)
        .and_then(|f| f.set_modified(SystemTime::now()))
        .with_context(|| format!("touching {}", json.display()))?;
    eprint!("{}", fs::read_to_string(&json)?);
    drop(entry);
    Ok(dest)
}

/// The cache's entry for `key`, locked, waiting at most `wait` for
/// another run building it.
fn entry_within(key: Key, wait: Duration) -> Result<Entry> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Cache::resolve().and_then(|c| c.entry("node", &key)));
    });
    rx.recv_timeout(wait).map_err(|_| {
        anyhow!(
            "timed out after {} s waiting for the node cache's .lock",
            wait.as_secs()
        )
    })?
}

fn fresh(node_json: &Path, max_age_days: u64) -> bool {
    let Ok(m) = fs::metadata(node_json).and_then(|m| m.modified()) else {
        return false;
    };
    let age = SystemTime::now().duration_since(m).unwrap_or_default();
    max_age_days == 0 || age < Duration::from_secs(max_age_days * 86400)
}

/// Unmounts what a failed build left mounted in the root and removes the
/// temporary directory.
struct Building {
    root: PathBuf,
    tmp: PathBuf,
    done: bool,
}

impl Drop for Building {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        unmount_all(&self.root);
        let _ = cache::remove(&self.tmp);
    }
}

fn unmount_all(root: &Path) {
    for m in ["proc", "sys", "dev"] {
        let p = root.join(m);
        let mounted = deadline::read(cmd("mountpoint").arg("-q").arg(&p), QUICK).is_ok();
        if mounted {
            let _ = deadline::run(cmd("umount").arg("-l").arg(&p), QUICK);
        }
    }
}

struct Stage(String, Instant);

impl Stage {
    fn start(name: &str) -> Self {
        eprintln!("==> {name}");
        Self(name.to_string(), Instant::now())
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        eprintln!("<== {}: {}s", self.0, self.1.elapsed().as_secs());
    }
}

/// Builds the root in `tmp`: debootstrap, the packages, the node's files,
/// the kernel, node.json and the disk image.
fn fill(repo: &Path, tmp: &Path, key: &str) -> Result<()> {
    let root = tmp.join("root");
    {
        let _s = Stage::start("debootstrap bookworm (node root)");
        run_logged(
            cmd("debootstrap")
                .args(["--variant=minbase", "--components=main", "bookworm"])
                .arg(&root)
                .arg(crate::test_data::mirror()),
            &tmp.join("debootstrap.log"),
            SLOW,
            20,
        )?;
    }
    {
        let _s = Stage::start("node packages (kernel, containerd, runc, CNI plugins, iptables)");
        packages(&root, tmp)?;
    }
    let release = {
        let _s = Stage::start("node files");
        node_files(repo, &root)?;
        let release = kernel_release(&root)?;
        fs::copy(
            root.join(format!("boot/vmlinuz-{release}")),
            tmp.join("vmlinuz"),
        )?;
        fs::copy(
            root.join(format!("boot/initrd.img-{release}")),
            tmp.join("initrd.img"),
        )?;
        release
    };
    let mut versions = serde_json::Map::new();
    for p in RECORDED {
        let v = deadline::read(
            cmd("chroot")
                .arg(&root)
                .args(["dpkg-query", "-W", "-f", "${Version}", p]),
            QUICK,
        )?;
        versions.insert(p.to_string(), v.trim().into());
    }
    let json = serde_json::json!({
        "key": key,
        "kernelRelease": release,
        "created": crate::test_data::iso8601(SystemTime::now()),
        "packages": versions,
    });
    fs::write(
        tmp.join("node.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    let _s = Stage::start("disk image (mkfs.ext4 -d)");
    deadline::run(
        cmd("mkfs.ext4")
            .args(["-q", "-F", "-L", "noderoot", "-d"])
            .arg(&root)
            .arg(tmp.join("disk.img"))
            .arg("6G"),
        SLOW,
    )?;
    cache::remove(&root)
}

/// The kernel, containerd, runc, the CNI plugins and the rest, installed
/// with apt in the chroot.
fn packages(root: &Path, tmp: &Path) -> Result<()> {
    let chroot = || {
        let mut c = cmd("chroot");
        c.arg(root).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    let mount =
        |args: &[&str], at: &str| deadline::run(cmd("mount").args(args).arg(root.join(at)), QUICK);
    mount(&["-t", "proc", "proc"], "proc")?;
    mount(&["--rbind", "/dev"], "dev")?;
    mount(&["-t", "sysfs", "sysfs"], "sys")?;
    // A module-complete initramfs: the VM's disk and network drivers are
    // modules in Debian's cloud kernel.
    let conf = root.join("etc/initramfs-tools/conf.d");
    fs::create_dir_all(&conf)?;
    fs::write(conf.join("modules"), "MODULES=most\n")?;
    deadline::run(chroot().args(["apt-get", "update", "-qq"]), SLOW)?;
    run_logged(
        chroot()
            .args(["apt-get", "install", "-y", "-qq", "--no-install-recommends"])
            .args(PACKAGES),
        &tmp.join("apt.log"),
        SLOW,
        30,
    )?;
    deadline::run(chroot().args(["apt-get", "clean"]), SLOW)?;
    deadline::run(
        cmd("umount")
            .arg("-l")
            .arg(root.join("dev"))
            .arg(root.join("proc"))
            .arg(root.join("sys")),
        QUICK,
    )
}

/// tools/node's files in the image. /etc/os-release links to
/// /usr/lib/os-release in Debian: the kubelet, the installer and every
/// tool read Garden Linux.
fn node_files(repo: &Path, root: &Path) -> Result<()> {
    let src = repo.join("tools/node");
    for (name, dest, mode) in [
        ("node-init", "usr/local/sbin/node-init", 0o755),
        (
            "kubelet-config.yaml",
            "etc/kubernetes/kubelet-config.yaml",
            0o644,
        ),
        (
            "10-bridge.conflist",
            "etc/cni/net.d/10-bridge.conflist",
            0o644,
        ),
        ("os-release", "usr/lib/os-release", 0o644),
    ] {
        install(&src.join(name), &root.join(dest), mode)?;
    }
    Ok(())
}

/// `install -D -m MODE`: a new file (never written through a link).
fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(d) = to.parent() {
        fs::create_dir_all(d)?;
    }
    let _ = fs::remove_file(to);
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The one kernel release under the root's /lib/modules.
fn kernel_release(root: &Path) -> Result<String> {
    let dir = root.join("lib/modules");
    let names: Vec<String> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    match &names[..] {
        [one] => Ok(one.clone()),
        _ => bail!(
            "{} holds {} kernels, not one: {names:?}",
            dir.display(),
            names.len()
        ),
    }
}
