//! What the plan carries: module parameters, IOMMU passthrough, Fabric
//! Manager, and compile jobs under a memory limit.

use super::*;

#[test]
fn the_plan_carries_module_parameters_and_iommu_passthrough_from_the_catalog() {
    // B200-class (Blackwell): nvidia-uvm's HMM off.
    let dir = tempfile::tempdir().unwrap();
    synthetic_root(dir.path(), &[0x2901]);
    let r = run(&["--host-root", dir.path().to_str().unwrap(), "resolve"]);
    let params = &r.doc["status"]["moduleParams"];
    assert_eq!(params[0]["module"], "nvidia_uvm", "{}", r.doc);
    assert_eq!(params[0]["params"], "uvm_disable_hmm=1");
    assert!(r.doc["status"].get("iommuPassthrough").is_none());
    // A Turing node: no parameters.
    let r = run_on("gardenlinux-1592-t4", &["resolve"]);
    assert!(r.doc["status"].get("moduleParams").is_none(), "{}", r.doc);
    // Garden Linux metal (VARIANT_ID metal-…): IOMMU passthrough.
    let r = run_on("gardenlinux-2150-h100", &["resolve"]);
    let why = r.doc["status"]["iommuPassthrough"].as_str().unwrap();
    assert!(why.contains("IO_PAGE_FAULT"), "{why}");
    assert!(
        run_on("gardenlinux-1877-l4", &["resolve"]).doc["status"]
            .get("iommuPassthrough")
            .is_none()
    );
}

/// NVSwitch hosts get Fabric Manager of exactly the driver's version, as
/// NVIDIA's redist archive (its sha256 comes from the release manifest at
/// fetch time); hosts without NVSwitches do not. Data-center GPUs (3D
/// controllers) get nvidia-persistenced, VGA boards do not.
#[test]
fn nvswitch_hosts_plan_fabric_manager_of_the_drivers_version() {
    for (name, switches) in [("gardenlinux-2150-h100", 4), ("debian-13-hgx-a100", 6)] {
        let r = run_on(name, &["resolve"]);
        let s = &r.doc["status"];
        assert_eq!(s["reason"], "Resolved", "{name}: {}", r.doc);
        let version = s["driverVersion"].as_str().unwrap();
        let fm = &s["fabricManager"];
        assert_eq!(fm["version"], version, "{name}");
        assert_eq!(
            fm["package"]["url"],
            format!(
                "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-{version}-archive.tar.xz"
            ),
            "{name}"
        );
        assert_eq!(
            fm["package"]["fileName"],
            format!("fabricmanager-linux-x86_64-{version}-archive.tar.xz")
        );
        assert_eq!(fm["package"]["checksumKnown"], false);
        assert!(fm["package"].get("sha256").is_none(), "never invented");
        let why = fm["reason"].as_str().unwrap();
        assert!(
            why.starts_with(&format!("{switches} NVSwitch(es)")),
            "{why}"
        );
        assert!(why.contains("error 802"), "{why}");
        assert!(s["persistenced"].as_str().unwrap().contains("data-center"));
    }
    // An explicit version is followed, and aarch64 is NVIDIA's linux-sbsa.
    let r = run_on(
        "gardenlinux-2150-h100",
        &[
            "--arch",
            "aarch64",
            "resolve",
            "--driver-version",
            "580.95.05",
        ],
    );
    let fm = &r.doc["status"]["fabricManager"];
    assert_eq!(fm["version"], "580.95.05", "{}", r.doc);
    assert_eq!(
        fm["package"]["url"],
        "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-sbsa/fabricmanager-linux-sbsa-580.95.05-archive.tar.xz"
    );

    let r = run_on("gardenlinux-1592-t4", &["resolve"]);
    assert_eq!(r.doc["status"]["reason"], "Resolved", "{}", r.doc);
    assert!(r.doc["status"].get("fabricManager").is_none(), "{}", r.doc);
    assert!(
        r.doc["status"]["persistenced"].is_string(),
        "a T4 is a 3D controller"
    );
    let r = run_on("debian-12-workstation-audio", &["resolve"]);
    assert!(r.doc["status"].get("fabricManager").is_none(), "{}", r.doc);
    assert!(r.doc["status"].get("persistenced").is_none(), "{}", r.doc);
}

/// `--module-params` names a file in a privileged container: `/dev/zero`
/// is not read until memory runs out, a FIFO does not hang the Job, and a
/// file that is not module parameters (`/proc/self/environ`, a secret) is
/// refused by its path and line, its content never in the result or on
/// stderr.
#[test]
fn the_module_params_file_is_read_bounded_and_never_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let secret = dir.path().join("environ");
    fs::write(
        &secret,
        "nvidia NVreg_X=1\nAWS_SECRET_ACCESS_KEY=hunter2-never-shown\0HOME=/root\0",
    )
    .unwrap();
    let artifact = dir.path().join("no-artifact.tar.zst");
    for (file, want) in [
        (
            Path::new("/dev/zero"),
            "is not a regular file (a character device)",
        ),
        (fifo.as_path(), "is not a regular file (a FIFO)"),
        (secret.as_path(), "line 2 does not start with a module name"),
    ] {
        let mut c = bin();
        c.arg("--host-root")
            .arg(fixture("gardenlinux-1592-t4"))
            .arg("install")
            .arg("--artifact")
            .arg(&artifact)
            .arg("--module-params")
            .arg(file);
        let out = crate::support::run::output_within(c, std::time::Duration::from_secs(120));
        let r = crate::support::run::finish(out);
        assert_eq!(r.doc["status"]["reason"], "InvalidArgument", "{}", r.doc);
        let msg = r.doc["status"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{msg}");
        assert!(msg.contains(&file.display().to_string()), "{msg}");
        assert!(
            !r.doc.to_string().contains("hunter2") && !r.stderr.contains("hunter2"),
            "{}\n{}",
            r.doc,
            r.stderr
        );
    }
}

/// A memory cgroup of this process's own with `limit` bytes (v2 where the
/// unified hierarchy is mounted, else v1's memory controller), removed on
/// drop. These machines run the tests as root with a writable hierarchy.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    fn new(name: &str, limit: u64) -> MemoryCgroup {
        let own = fs::read_to_string("/proc/self/cgroup").unwrap();
        let unified = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let (mount, path, file) = if unified {
            let p = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
            ("/sys/fs/cgroup", p, "memory.max")
        } else {
            let p = own
                .lines()
                .find_map(|l| l.split_once(":memory:").map(|(_, p)| p))
                .unwrap();
            ("/sys/fs/cgroup/memory", p, "memory.limit_in_bytes")
        };
        let dir = Path::new(mount)
            .join(path.trim_start_matches('/'))
            .join(format!("{name}-{}", std::process::id()));
        fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "making the memory cgroup {} (this test needs root and a writable cgroup hierarchy): {e}",
                dir.display()
            )
        });
        fs::write(dir.join(file), limit.to_string()).unwrap();
        MemoryCgroup(dir)
    }

    /// `cmd` started inside the cgroup (a shell moves itself in first).
    fn wrap(&self, cmd: &Command) -> Command {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(r#"echo $$ >"$0/cgroup.procs" && exec "$@""#)
            .arg(&self.0)
            .arg(cmd.get_program())
            .args(cmd.get_args());
        sh
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.0);
    }
}

/// Without `--jobs`, a build runs one compiler per CPU but no more than
/// its cgroup's memory limit holds (320 MiB plus 128 MiB each), and says
/// so; `--jobs` still wins.
#[test]
fn a_memory_limit_lowers_the_default_compile_jobs() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let jobs_in = |limit: u64, extra: &[&str]| {
        let cg = MemoryCgroup::new("gpu-driver-jobs", limit);
        let mut cmd = bin();
        cmd.args(["--log-level", "info", "build", "--source", "/nonexistent"])
            .args([
                "--kernel",
                "6.1.0",
                "--flavor",
                "open",
                "--out",
                "/nonexistent/out",
            ])
            .args(extra);
        let out = cg.wrap(&cmd).output().unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            doc["spec"]["jobs"].as_u64().unwrap() as usize,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (jobs, stderr) = jobs_in(400 << 20, &[]);
    assert_eq!(jobs, 1);
    if cpus > 1 {
        assert!(
            stderr.contains(&format!(
                "compiling with -j1, not -j{cpus}: the container's memory limit is 400 MiB"
            )),
            "{stderr}"
        );
    }
    assert_eq!(jobs_in(64 << 30, &[]).0, cpus);
    assert_eq!(jobs_in(400 << 20, &["--jobs", "3"]).0, 3);
}
