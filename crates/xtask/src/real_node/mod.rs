//! `cargo xtask real-node` (behind `scripts/real-node`): a real node. A
//! QEMU VM (TCG, Debian's cloud kernel) with containerd, runc, the CNI
//! plugins and a kubelet of the control plane's own version joins the local
//! control plane (`scripts/local-cluster --kubelet`), and the whole chain
//! runs there from the images built for real, on the GPU double
//! (tests/gpu-double, docs/gpu-double.md) where a GPU would be:
//!
//!  1. the images (`scripts/build-images`: buildah, OCI archives; the
//!     builder image carries the node kernel's headers) are imported into
//!     the node's containerd; node-init shows a PCI function with NVIDIA's
//!     vendor id;
//!  2. the double's package (the kmod stand-in's tree as kernel-open/, the
//!     double's libnvidia-ml, libcuda and nvidia-smi, its profile, a
//!     .manifest) goes into the package mirror of an empty S3 store on the
//!     host, with a catalog ConfigMap that gives its sha256 (`package`);
//!  3. deploy/ (operator, exporter) and NVIDIA's device plugin
//!     (tests/real-node/nvidia-device-plugin.yaml) are applied; a pod
//!     mounting /run/nvidia/driver (DirectoryOrCreate, HostToContainer)
//!     starts first (`chain`);
//!  4. a GpuDriver selects the node (the cold join): the build Job compiles
//!     on the node and stores the artifact (signed with the owner's key
//!     from a kubernetes.io/tls Secret, mounted into it alone), the install
//!     Job installs it from the store and verifies it, the operator takes
//!     the startup taint off and puts the ready label on;
//!  5. the device plugin registers with the kubelet, the Node offers
//!     nvidia.com/gpu, a pod asking for one runs, and the exporter names it
//!     on its GPU;
//!  6. the guest reboots: label off, taint back, allocatable 0, reinstall,
//!     and back (`reboot`);
//!  7. the warm join: the Node is deleted while the guest reboots, and the
//!     node registers as a new one; its install reads the artifact from the
//!     store, nothing is compiled.
//!
//! The last line of stdout is one JSON object (docs/real-node.md has every
//! field, `result` writes it). Every wait has the `--timeout` deadline;
//! after a timeout the cluster's state is dumped into `<out>/state/`. On
//! failure or interruption the VM, the store and the cluster are torn down.
//! Needs root (debootstrap, buildah, chroot).

mod chain;
mod jobs;
mod kube;
mod manifests;
mod package;
mod reboot;
mod result;
mod vm;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};
use nix::sys::signal::{self, SigHandler, Signal};
use nix::unistd::Pid;

use crate::apt::{self, Need};
use crate::cache::Cache;
use crate::cmd::{cmd, read_last_line};

/// The node's name, as the kubelet registers it.
const NODE: &str = "gpu-node-1";
/// The operator's namespace (deploy/).
const NS: &str = "gpu-driver";

/// On top of the test tools: QEMU and mkfs.ext4 for the config disk.
const NODE_TOOLS: &[Need] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("mkfs.ext4", "e2fsprogs"),
];

/// `cargo xtask real-node`'s options (scripts/real-node's).
#[derive(clap::Args)]
pub struct Args {
    /// Leaves the VM and the cluster running (prints how to reach them).
    #[arg(long)]
    keep: bool,
    /// Work files and the VM's console (relative to the repository root;
    /// after a timeout, the cluster's state in DIR/state/).
    #[arg(long, value_name = "DIR", default_value = "target/real-node")]
    out: PathBuf,
    /// scripts/build-images' output in DIR instead of running it.
    #[arg(long, value_name = "DIR")]
    images: Option<PathBuf>,
    /// The control plane's ports N..N+5.
    #[arg(long, value_name = "N", default_value_t = 26443)]
    port_base: u16,
    /// The limit of each wait, in seconds.
    #[arg(long, value_name = "S", default_value_t = 900)]
    timeout: u64,
}

/// What runs in the background and must be stopped on failure.
#[derive(Default)]
struct Live {
    s3: Option<Child>,
    qemu: Option<Child>,
    /// Set once `scripts/local-cluster up` is called: `down` runs then.
    cluster: Option<PathBuf>,
}

/// SIGINT or SIGTERM arrived: the run stops at its next wait or stage.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

pub fn run(repo: &Path, args: Args) -> Result<()> {
    if !apt::is_root() {
        eprintln!("error: needs root (debootstrap, buildah)");
        std::process::exit(2);
    }
    // Relative paths are the repository's, and so is every child's cwd.
    std::env::set_current_dir(repo)?;
    for s in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { signal::signal(s, SigHandler::Handler(on_signal)) }?;
    }
    let out = std::path::absolute(repo.join(&args.out))?;
    let mut live = Live::default();
    let res = steps(repo, &args, &out, &mut live);
    if let Ok(line) = &res {
        if args.keep {
            log(&format!(
                "kept: {}; stop: kill {}; scripts/local-cluster down --dir {}",
                line.1,
                live.qemu.as_ref().map(Child::id).unwrap_or_default(),
                out.join("cluster").display()
            ));
        }
        println!("{}", line.0);
    }
    teardown(&mut live, res.is_ok(), args.keep, &out);
    if INTERRUPTED.load(Ordering::SeqCst) {
        std::process::exit(130);
    }
    res.map(|_| ())
}

/// The whole run; returns the result line and how to reach the cluster.
fn steps(repo: &Path, args: &Args, out: &Path, live: &mut Live) -> Result<(String, String)> {
    let mut st = Clock::default();
    st.stage("tools")?;
    apt::ensure(&[apt::TEST, NODE_TOOLS])?;
    let cache = Cache::resolve()?;

    st.stage("k8s binaries (cargo xtask tool k8s)")?;
    let bin = crate::tools::k8s(repo, &cache, false)?;
    if !crate::cmd::is_executable(&bin.join("kubelet")) {
        bail!("{}/kubelet missing", bin.display());
    }
    st.stage("node root (scripts/node-root)")?;
    let noderoot = PathBuf::from(read_last_line(&mut cmd(repo.join("scripts/node-root")))?);
    let release = vm::kernel_release(&noderoot)?;
    st.stage(&format!(
        "images (scripts/build-images, the builder image with linux-headers-{release})"
    ))?;
    // The in-cluster build Job finds the node kernel's headers in its
    // builder image, as in Garden Linux's kmodbuild images.
    let images = match &args.images {
        Some(d) => std::path::absolute(repo.join(d))?,
        None => PathBuf::from(read_last_line(
            cmd(repo.join("scripts/build-images"))
                .arg("--packages")
                .arg(format!("linux-headers-{release}")),
        )?),
    };
    let images = vm::Images::read(&images)?;

    st.stage(
        "the GPU double's package (hello + the double's user space), in the store's package mirror",
    )?;
    let pkg = package::prepare(repo, &cache, out, &release, live)?;

    let env = chain::up(repo, args, out, &bin, live, &mut st)?;
    let mut ctx = kube::Ctx::new(env, out, &bin, args.timeout, live);
    vm::config_disk(&ctx, &images, &bin, &mut st)?;
    st.stage("boot the node (QEMU TCG)")?;
    let boot_start = vm::boot(&mut ctx, &noderoot)?;
    let cold = chain::cold(&mut ctx, repo, &images, &pkg, boot_start, &mut st)?;
    let gpu = jobs::gpu_pod(&mut ctx, &images, &mut st)?;
    let warm = reboot::both(&mut ctx, &images, &mut st)?;

    st.stage("assertions")?;
    result::assert_all(&ctx, &images, &release, &cold, &gpu, &warm)?;
    st.end();
    let line = result::line(&images, &release, &cold, &gpu, &warm)?;
    let reach = format!(
        "KUBECONFIG={} {}/kubectl get nodes",
        ctx.kube.kubeconfig().display(),
        bin.display()
    );
    Ok((line, reach))
}

/// Stops what runs, unless `--keep` and the run passed; on failure shows
/// the VM's init and kubelet lines.
fn teardown(live: &mut Live, ok: bool, keep: bool, out: &Path) {
    if keep && ok {
        return;
    }
    for child in [live.qemu.as_mut(), live.s3.as_mut()].into_iter().flatten() {
        let _ = signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let _ = child.wait();
    }
    if let Some(dir) = &live.cluster {
        let _ = cmd("scripts/local-cluster")
            .arg("down")
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
    // Before the control plane, only the store ran.
    if !ok && live.cluster.is_some() {
        let code = if INTERRUPTED.load(Ordering::SeqCst) {
            130
        } else {
            1
        };
        let console = out.join("console.log");
        log(&format!(
            "failed (exit {code}); the VM's console: {}",
            console.display()
        ));
        if let Ok(text) = vm::read_tail(&console, 8 << 20) {
            for l in vm::init_lines(&text, 40) {
                eprintln!("{l}");
            }
        }
    }
}

fn log(msg: &str) {
    eprintln!("real-node: {msg}");
}

/// Seconds since the epoch, for the figures (some are against the
/// apiserver's timestamps, so wall clock).
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// The seconds between two stamps, to 0.1 s, as a JSON number written the
/// way jq writes it (a whole number without ".0").
fn secs(from: f64, to: f64) -> serde_json::Value {
    let tenths = ((to - from) * 10.0).round();
    if tenths % 10.0 == 0.0 {
        serde_json::Value::from((tenths / 10.0) as i64)
    } else {
        serde_json::Value::from(tenths / 10.0)
    }
}

/// The stages of the run: `==> name` at the start, `<== name: Ns (M MiB
/// free)` at the end (as the shell scripts' stage lines were).
struct Clock(crate::stages::Stage);

impl Default for Clock {
    fn default() -> Self {
        Clock(crate::stages::Stage::new(Path::new(".")))
    }
}

impl Clock {
    fn stage(&mut self, name: &str) -> Result<()> {
        self.0.end();
        check_interrupted()?;
        self.0.start(name);
        Ok(())
    }

    fn end(&mut self) {
        self.0.end();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rounds_like_printf_and_jq() {
        assert_eq!(super::secs(10.0, 86.61).to_string(), "76.6");
        assert_eq!(super::secs(10.0, 71.02).to_string(), "61");
        assert_eq!(super::secs(0.0, 0.04).to_string(), "0");
    }
}
