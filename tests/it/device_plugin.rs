//! NVIDIA's real device plugin (github.com/NVIDIA/k8s-device-plugin
//! v0.19.3, built from the Go module proxy by `cargo xtask tool device-plugin`) on
//! the GPU double: a driver root laid out as the installer's, carrying the
//! double's NVML with a 2-GPU profile, and the kubelet double of
//! `tools/device-plugin` in place of the kubelet. The plugin registers
//! `nvidia.com/gpu`, lists the profile's GPUs as healthy and allocates one
//! by its UUID (docs/gpu-double.md, "NVIDIA's device plugin on the double").

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GPU0: &str = "GPU-6f3c2a1e-0b7d-4c5e-9a21-3d4e5f607182";
const GPU1: &str = "GPU-5b6a9c1e-8f3a-2b7d-41c0-9e2f7a6d3b11";

/// The directory `cargo xtask tool device-plugin` prints: `bin/nvidia-device-plugin`
/// and `bin/kubelet-double`.
fn device_plugin_bins() -> PathBuf {
    let dir = crate::support::tools::tools()
        .device_plugin()
        .unwrap_or_else(|| {
            crate::support::tools::missing(
                "devicePlugin",
                "the directory `cargo xtask tool device-plugin` prints",
            )
        });
    dir.join("bin")
}

/// A child process killed when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A driver root as the installer lays one out (docs/install.md, "The
/// driver root"), under `host/var/lib/gpu-driver/drivers/current`, with
/// the GPU double in place of NVIDIA's user space and its profile beside
/// the libraries. Returns the `current` path, as the chart's
/// `nvidiaDriverRoot` names it.
fn driver_root(dir: &Path) -> PathBuf {
    let double = crate::support::host::gpu_double(
        &dir.join("double"),
        crate::support::host::TWO_H100_PROFILE,
    );
    let drivers = dir.join("host/var/lib/gpu-driver/drivers");
    let root = drivers.join("535.261.03-open-double");
    let lib = root.join(format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH));
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    fs::create_dir_all(&lib).unwrap();
    fs::copy(double.join("nvidia-smi"), root.join("usr/bin/nvidia-smi")).unwrap();
    for name in ["libnvidia-ml", "libcuda"] {
        let file = format!("{name}.so.535.261.03");
        fs::copy(double.join(format!("{name}.so.1")), lib.join(&file)).unwrap();
        symlink(&file, lib.join(format!("{name}.so.1"))).unwrap();
    }
    fs::copy(
        double.join("gpu-double.profile"),
        lib.join("gpu-double.profile"),
    )
    .unwrap();
    symlink("535.261.03-open-double", drivers.join("current")).unwrap();
    drivers.join("current")
}

/// Waits for `child` to exit, killing it at `deadline`.
fn wait_exit(child: &mut Child, deadline: Instant, what: &str) -> std::process::ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not exit in time");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The kubelet double serving `plugins/kubelet.sock`, once the socket is
/// there.
fn start_kubelet(bins: &Path, plugins: &Path, log: &Path) -> Running {
    let child = Command::new(bins.join("kubelet-double"))
        .arg("--dir")
        .arg(plugins)
        .args(["--timeout", "60"])
        .stdout(Stdio::piped())
        .stderr(fs::File::create(log).unwrap())
        .spawn()
        .expect("starting the kubelet double");
    let kubelet = Running(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !plugins.join("kubelet.sock").exists() {
        assert!(
            Instant::now() < deadline,
            "the kubelet double made no socket: {}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    kubelet
}

/// NVIDIA's plugin with the settings of deploy/nvidia/device-plugin-values.yaml
/// that apply without a container (`nvidiaDriverRoot`, `nvidiaDevRoot: /`,
/// `deviceIDStrategy: uuid`), but `envvar` for the device list: this machine
/// has no container toolkit and no CDI.
///
/// The plugin's kubelet socket is a flag (`--kubelet-socket`, v0.19.3
/// cmd/nvidia-device-plugin/main.go:162), but its own endpoint is not:
/// `pluginapi.DevicePluginPath` + `nvidia-gpu.sock`
/// (internal/plugin/server.go:106, /var/lib/kubelet/device-plugins/). So it
/// runs in its own mount namespace (`unshare --mount`, private propagation)
/// where a tmpfs covers /var/lib and `plugins` is bind-mounted onto
/// /var/lib/kubelet/device-plugins: its socket appears in `plugins`.
///
/// It loads NVML from the driver root under `--driver-root-ctr-path`
/// (main.go:336-344: where the chart mounts the driver root in its pod,
/// /driver-root; the host path here, as there is no pod), and its platform
/// probe gets that root too. LD_LIBRARY_PATH names the root's library
/// directory as well: v0.17.4's probe dlopened `libnvidia-ml.so.1` by name
/// without a root (what the `nvidia` runtime class makes loadable in a pod),
/// and failed "Incompatible strategy detected auto" without it.
fn start_plugin(bins: &Path, root: &Path, plugins: &Path, log: &Path) -> Running {
    let lib = root.join(format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH));
    let out = fs::File::create(log).unwrap();
    let script = "mount -t tmpfs tmpfs /var/lib && mkdir -p /var/lib/kubelet/device-plugins \
                  && mount --bind \"$1\" /var/lib/kubelet/device-plugins && shift && exec \"$@\"";
    let child = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(plugins)
        .arg(bins.join("nvidia-device-plugin"))
        .args([
            "--device-list-strategy",
            "envvar",
            "--device-id-strategy",
            "uuid",
        ])
        .arg("--nvidia-driver-root")
        .arg(root)
        .args(["--nvidia-dev-root", "/"])
        .arg("--driver-root-ctr-path")
        .arg(root)
        .arg("--kubelet-socket")
        .arg(plugins.join("kubelet.sock"))
        .env("LD_LIBRARY_PATH", &lib)
        .env_remove("GPU_DOUBLE_PROFILE")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("starting unshare (the test needs root)");
    Running(child)
}

/// What the kubelet double printed once the plugin registered and
/// answered, or a panic with both logs.
fn kubelet_report(
    kubelet: &mut Running,
    plugin_log: &Path,
    kubelet_log: &Path,
) -> serde_json::Value {
    let logs = || {
        format!(
            "plugin log:\n{}\nkubelet double:\n{}",
            fs::read_to_string(plugin_log).unwrap_or_default(),
            fs::read_to_string(kubelet_log).unwrap_or_default()
        )
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = wait_exit(&mut kubelet.0, deadline, "the kubelet double");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut kubelet.0.stdout.take().unwrap(), &mut out).unwrap();
    assert!(status.success(), "kubelet double: {status}\n{}", logs());
    serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("kubelet double printed {out:?}: {e}\n{}", logs()))
}

#[test]
fn nvidias_device_plugin_serves_the_gpu_doubles_gpus_to_the_kubelet() {
    let bins = device_plugin_bins();
    let tmp = tempfile::tempdir().unwrap();
    assert!(
        !tmp.path().starts_with("/var/lib"),
        "the plugin's namespace covers /var/lib: set TMPDIR elsewhere"
    );
    let root = driver_root(tmp.path());
    let plugins = tmp.path().join("device-plugins");
    fs::create_dir_all(&plugins).unwrap();
    let (kubelet_log, plugin_log) = (
        tmp.path().join("kubelet.log"),
        tmp.path().join("plugin.log"),
    );

    let mut kubelet = start_kubelet(&bins, &plugins, &kubelet_log);
    let mut plugin = start_plugin(&bins, &root, &plugins, &plugin_log);
    let r = kubelet_report(&mut kubelet, &plugin_log, &kubelet_log);

    assert_eq!(r["resourceName"], "nvidia.com/gpu", "{r}");
    assert_eq!(r["version"], "v1beta1", "{r}");
    assert_eq!(r["endpoint"], "nvidia-gpu.sock", "{r}");
    assert!(
        plugins.join("nvidia-gpu.sock").exists(),
        "no endpoint socket in {}",
        plugins.display()
    );
    let devices = r["devices"].as_array().expect("devices");
    let mut ids: Vec<&str> = devices.iter().map(|d| d["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [GPU1, GPU0], "{r}");
    for d in devices {
        assert_eq!(d["health"], "Healthy", "{r}");
    }
    // The first device listed was allocated: envvar names it by its UUID,
    // and nothing else (no device specs, no CDI annotations).
    let allocated = &devices[0]["id"];
    let alloc = &r["allocate"];
    assert_eq!(alloc["envs"]["NVIDIA_VISIBLE_DEVICES"], *allocated, "{r}");
    assert_eq!(alloc["devices"], serde_json::json!([]), "{r}");
    assert_eq!(alloc["annotations"], serde_json::json!({}), "{r}");
    assert_eq!(r["options"]["getPreferredAllocationAvailable"], true, "{r}");

    // Its health check (XID events on the double's NVML) keeps running:
    // the plugin is alive a second later and has marked nothing unhealthy.
    std::thread::sleep(Duration::from_secs(1));
    let log = fs::read_to_string(&plugin_log).unwrap();
    assert!(
        plugin.0.try_wait().unwrap().is_none(),
        "the plugin exited:\n{log}"
    );
    for bad in [
        "unhealthy",
        "failed to start health check",
        "symbol lookup error",
    ] {
        assert!(!log.to_lowercase().contains(bad), "{bad}:\n{log}");
    }
}
