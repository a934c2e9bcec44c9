//! `images check`: the archives imported into a throwaway containerd the
//! way a node's is fed (`ctr -n k8s.io images import`), each image run
//! once. containerd gets its own root, state and socket in a temporary
//! directory, and runs with its shims and containers in a mount namespace
//! of its own whose /run is a tmpfs (containerd 1.6 keeps its shims'
//! sockets in /run/containerd whatever its state directory); ctr joins
//! that namespace (its FIFOs go to /run/containerd too): nothing stays
//! behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};

use super::meta::{self, ImageMeta};
use super::sys::{self, Timer};
use crate::cmd::cmd;

/// The images a node test counts on.
const CHECKED: [&str; 4] = ["installer", "operator", "builder-bookworm", "pause"];

/// In the new mount namespace, before containerd starts.
const NAMESPACE_SETUP: &str = r#"mount -t tmpfs tmpfs /run && exec "$@""#;

const OUTPUT_MAX: u64 = 1 << 20;

pub fn check(dir: &Path) -> Result<()> {
    let json = dir.join("images.json");
    if !json.is_file() {
        bail!("no images.json in {}", dir.display());
    }
    let dir = fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
    let images = meta::parse(&sys::read_capped(&json, OUTPUT_MAX)?)
        .with_context(|| format!("reading {}", json.display()))?;
    let name = |image: &str| -> Result<&ImageMeta> {
        images
            .get(image)
            .with_context(|| format!("{} has no {image}", json.display()))
    };
    let tmp = TempDir::new()?;
    let c = Containerd::start(&tmp.0)?;
    let mut t = Timer::default();
    for image in CHECKED {
        t.stage(format!("import {image}"));
        let archive = &name(image)?.archive;
        if archive.contains('/') {
            bail!(
                "{}: {image}'s archive is not a file name: {archive}",
                json.display()
            );
        }
        let archive = dir.join(archive);
        sys::run(
            c.ctr().args(["images", "import"]).arg(&archive),
            Duration::from_secs(600),
        )?;
    }
    t.end();
    eprintln!("ctr -n k8s.io images ls:");
    sys::run(c.ctr().args(["images", "ls"]), Duration::from_secs(60))?;
    let listed = c.read(&["images", "ls", "-q"])?;
    for image in CHECKED {
        let n = &name(image)?.name;
        if !has_line(&listed, n) {
            bail!("{image} is not listed as {n}");
        }
    }
    t.stage("run installer, operator");
    // The installer's CMD is --help.
    let out = c.read(&["run", "--rm", &name("installer")?.name, "check-installer"])?;
    if !prints_usage(&out, "gpu-driver-installer") {
        bail!("installer printed: {out}");
    }
    let op = &name("operator")?.name;
    let out = c.read(&[
        "run",
        "--rm",
        op,
        "check-operator",
        "/gpu-driver-operator",
        "--help",
    ])?;
    if !prints_usage(&out, "gpu-driver-operator") {
        bail!("operator printed: {out}");
    }
    t.stage("run builder-bookworm");
    builder(&c, &tmp.0, &name("builder-bookworm")?.name)?;
    t.stage("run pause until SIGTERM");
    pause(&c, &name("pause")?.name)?;
    t.end();
    eprintln!("all images imported and ran");
    Ok(())
}

/// The builder has gcc, make, kmod and xz, and its apt sources work (over
/// the host's network and resolver).
fn builder(c: &Containerd, tmp: &Path, image: &str) -> Result<()> {
    let resolv = tmp.join("resolv.conf");
    fs::copy("/etc/resolv.conf", &resolv).context("copying /etc/resolv.conf")?;
    let mount = format!(
        "type=bind,src={},dst=/etc/resolv.conf,options=rbind:ro",
        resolv.display()
    );
    let script = "gcc --version | head -n 1 && make --version | head -n 1 && kmod --version \
                  && xz --version | head -n 1 && apt-get update -qq && echo apt-ok";
    let out = sys::output(
        c.ctr()
            .args(["run", "--rm", "--net-host", "--mount", &mount, image])
            .args(["check-builder", "sh", "-c", script]),
        OUTPUT_MAX,
        Duration::from_secs(900),
    )?;
    let out = String::from_utf8_lossy(&out);
    eprint!("{out}");
    if !has_line(&out, "apt-ok") {
        bail!("the builder's checks did not end with apt-ok");
    }
    Ok(())
}

/// pause runs until SIGTERM and then exits 0.
fn pause(c: &Containerd, image: &str) -> Result<()> {
    let mut run = c
        .ctr()
        .args(["run", "--rm", image, "check-pause"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("starting ctr run check-pause")?;
    for _ in 0..50 {
        let mut ls = c.ctr();
        ls.args(["task", "ls", "-q"]).stderr(Stdio::null());
        let listed = sys::output(&mut ls, OUTPUT_MAX, Duration::from_secs(10));
        if listed.is_ok_and(|l| has_line(&String::from_utf8_lossy(&l), "check-pause")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    let step = Duration::from_secs(60);
    let res = sys::run(c.ctr().args(["task", "ls"]), step).and_then(|()| {
        sys::run(
            c.ctr()
                .args(["task", "kill", "-s", "SIGTERM", "check-pause"]),
            step,
        )
    });
    let st = sys::wait_child(&mut run, "ctr run check-pause", step);
    res?;
    let st = st?;
    if !st.success() {
        bail!("pause exited {st} on SIGTERM");
    }
    Ok(())
}

/// Whether `out` has the line `want`.
fn has_line(out: &str, want: &str) -> bool {
    out.lines().any(|l| l == want)
}

/// Whether `out` has a line that starts with `Usage: <bin>`.
fn prints_usage(out: &str, bin: &str) -> bool {
    let want = format!("Usage: {bin}");
    out.lines().any(|l| l.starts_with(&want))
}

/// A temporary directory, deleted with everything in it.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!(
            "gpu-driver-check-images.{}.{nanos:09}",
            std::process::id()
        ));
        fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(Self(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = crate::cache::remove(&self.0) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// containerd with only its content store, snapshotters and runtime (the
/// opt plugin would write to /opt/containerd).
struct Containerd {
    child: Child,
    tmp: PathBuf,
}

impl Containerd {
    fn start(tmp: &Path) -> Result<Self> {
        let config = tmp.join("config.toml");
        let text = format!(
            r#"version = 2
root = "{t}/root"
state = "{t}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt"]
[grpc]
  address = "{t}/containerd.sock"
[ttrpc]
  address = "{t}/containerd.sock.ttrpc"
"#,
            t = tmp.display()
        );
        fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
        let log = tmp.join("containerd.log");
        let f = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .args([NAMESPACE_SETUP, "sh", "containerd", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .context("starting containerd")?;
        let c = Self {
            child,
            tmp: tmp.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let answers = || {
            let mut v = c.ctr();
            v.arg("version").stderr(Stdio::null());
            sys::output(&mut v, OUTPUT_MAX, Duration::from_secs(5)).is_ok()
        };
        while !answers() {
            if Instant::now() >= deadline {
                bail!(
                    "containerd did not answer within 10 s; the end of {}:\n{}",
                    log.display(),
                    sys::tail_of(&log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(c)
    }

    /// ctr in containerd's mount namespace (unshare execs sh, which execs
    /// containerd: one pid).
    fn ctr(&self) -> Command {
        let mut c = cmd("nsenter");
        c.arg("--target")
            .arg(self.child.id().to_string())
            .args(["--mount", "--", "ctr", "--address"])
            .arg(self.tmp.join("containerd.sock"))
            .args(["-n", "k8s.io"]);
        c
    }

    fn read(&self, args: &[&str]) -> Result<String> {
        let out = sys::output(self.ctr().args(args), OUTPUT_MAX, Duration::from_secs(600))?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = cmd("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        if sys::wait_child(&mut self.child, "containerd", Duration::from_secs(20)).is_err() {
            eprintln!("warning: containerd was killed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ctr_listings_and_usage() {
        // `ctr images ls -q` and `ctr task ls -q`: one name a line.
        let ls = "localhost/gpu-driver-builder:bookworm-6b8f61411616\n\
                  localhost/pause:6b8f61411616\n\
                  sha256:71f0299d798c2c5ef30470fcb04e4e6b30636bf32d4da54272c2765b429fb828\n";
        assert!(has_line(ls, "localhost/pause:6b8f61411616"));
        assert!(!has_line(ls, "localhost/pause:6b8f6141161"));
        let usage = "Installs NVIDIA drivers\n\nUsage: gpu-driver-installer [OPTIONS] <COMMAND>\n";
        assert!(prints_usage(usage, "gpu-driver-installer"));
        assert!(!prints_usage(usage, "gpu-driver-operator"));
        assert!(has_line(
            "gcc (Debian 12.2.0-14) 12.2.0\napt-ok\n",
            "apt-ok"
        ));
    }
}
