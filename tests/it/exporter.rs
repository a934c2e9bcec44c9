//! gpu-driver-exporter with real parts:
//!
//! - the real binary on a free loopback port, against NVIDIA's real
//!   `libnvidia-ml.so.1` (Debian bookworm non-free's libnvidia-ml1, from
//!   `scripts/fetch-test-data`) on this machine without a GPU: missing at
//!   first (nvml_up 0, "not found"), then placed where `--nvml` points, so
//!   that a later scrape loads it and reports NVML's real error;
//! - a real gRPC server built from the same kubelet proto (tonic) on a unix
//!   socket, as the kubelet's PodResources API: allocations through the
//!   binary, and the per-pod labels through the library with fixture GPU
//!   readings; a missing and a dead socket reported as PodResources down;
//! - every `/metrics` body parsed back as OpenMetrics text (Prometheus'
//!   text format with `_total` counter samples and a final `# EOF`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_driver_exporter::metrics::{self, Allocation, Snapshot};
use gpu_driver_exporter::podresources::{self, proto};
use gpu_driver_exporter::scrape;
use gpu_driver_installer::host_root::{HostRoot, HostRootSource};

mod format;

use format::{Sample, find, one, parse_ok};

// ------------------------------------------------------------ the binary

struct Exporter {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Exporter {
    /// Starts the binary on 127.0.0.1:0 and waits for the address it logs.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Exporter {
        let mut child = Command::new(crate::support::bin::exporter())
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting gpu-driver-exporter");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a.parse().expect("a socket address"),
            Err(_) => {
                let _ = child.kill();
                panic!("the exporter logged no address:\n{}", log.lock().unwrap());
            }
        };
        Exporter { child, addr, log }
    }

    fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(self.addr).expect("connecting to the exporter");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).expect("reading the answer");
        let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP answer");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, body.to_string())
    }

    fn metrics(&self) -> Vec<Sample> {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "{body}");
        parse_ok(&body).0
    }

    fn assert_alive(&mut self) {
        let exited = self.child.try_wait().unwrap();
        assert!(exited.is_none(), "exited {exited:?}:\n{}", self.log());
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits for `needle` in the log: stderr is read on another thread, so
    /// a line logged during a scrape may arrive after its answer.
    fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// NVIDIA's real libnvidia-ml.so.<version> from scripts/fetch-test-data.
fn real_nvml() -> PathBuf {
    let dir = crate::support::tools::test_data();
    let lib_dir = dir.join("nvidia-smi/lib");
    let lib = std::fs::read_dir(&lib_dir)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libnvidia-ml.so."))
        });
    lib.unwrap_or_else(|| {
        panic!(
            "{} has no libnvidia-ml.so.<version>: {}",
            lib_dir.display(),
            crate::support::tools::HOW
        )
    })
}

fn nvml_error(samples: &[Sample]) -> String {
    let up = one(samples, "gpu_driver_exporter_nvml_up", &[]);
    assert_eq!(up.value, 0.0, "{up:?}");
    up.labels.get("error").cloned().unwrap_or_default()
}

#[test]
fn nvml_appears_later_and_its_real_error_is_reported() {
    let real = real_nvml();
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    let lib_dir = dir.path().join("nvml");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libnvidia-ml.so.1");
    let mut e = on_host(&host, &lib, &dir.path().join("no-kubelet.sock"), &[]);

    let first = nvml_error(&e.metrics());
    assert!(first.contains("NVML library not found"), "{first}");
    assert!(first.contains(lib.to_str().unwrap()), "{first}");
    assert!(first.contains("No such file or directory"), "{first}");
    assert_eq!(e.get("/healthz"), (200, "ok\n".to_string()));

    // The driver's library appears where --nvml points.
    let name = real.file_name().unwrap();
    std::fs::copy(&real, lib_dir.join(name)).unwrap();
    std::os::unix::fs::symlink(name, &lib).unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    let later = loop {
        let err = nvml_error(&e.metrics());
        if !err.contains("not found") || Instant::now() > deadline {
            break err;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    // NVIDIA's library, with no kernel module on this machine.
    assert!(
        later.contains("NVML_ERROR_DRIVER_NOT_LOADED"),
        "{later}\n{}",
        e.log()
    );
    assert!(later.contains("NVIDIA driver is not loaded"), "{later}");
    assert!(later.contains(lib.to_str().unwrap()), "{later}");
    assert_eq!(e.get("/healthz"), (200, "ok\n".to_string()));
    assert_eq!(e.get("/nope").0, 404);
    e.assert_alive();
    e.wait_log("NVML library not found");
    e.wait_log("NVML_ERROR_DRIVER_NOT_LOADED");
}

/// The exporter on the host root `host`, with NVML from `nvml` and the
/// kubelet's PodResources at `socket`.
fn on_host(host: &Path, nvml: &Path, socket: &Path, env: &[(&str, &str)]) -> Exporter {
    Exporter::start(
        &[
            "--host-root",
            host.to_str().unwrap(),
            "--nvml",
            nvml.to_str().unwrap(),
            "--kubelet-socket",
            socket.to_str().unwrap(),
        ],
        env,
    )
}

/// Compiles the NVML double `tests/gpu-double/libnvidia-ml.c` (see its
/// header) into `dir/libnvidia-ml.so.1`, with a profile of one GPU beside
/// it unless the test gives its own (`GPU_DOUBLE_PROFILE`).
fn stub_nvml(dir: &Path, defines: &[&str]) -> PathBuf {
    let lib =
        crate::support::host::stub_library(dir, "libnvidia-ml.c", "libnvidia-ml.so.1", defines);
    std::fs::write(
        dir.join("gpu-double.profile"),
        "driver_version = 535.261.03\ngpus = 1\n",
    )
    .unwrap();
    lib
}

/// The exporter on a stand-in NVML that misbehaves in `env`'s way.
fn on_stub(dir: &Path, defines: &[&str], env: &[(&str, &str)]) -> Exporter {
    let lib = stub_nvml(&dir.join("nvml"), defines);
    let host = dir.join("host");
    std::fs::create_dir_all(&host).unwrap();
    on_host(&host, &lib, &dir.join("no-kubelet.sock"), env)
}

/// A misbehaving NVML never takes `/healthz` or the process down: an init
/// that hangs (the exporter used to await it before serving anything),
/// scrapes that come while it hangs (they share the one collection under
/// way and report NVML down after 5 s, instead of queueing blocking calls),
/// a device count of 2^32-1 (capped, not allocated), and a library without
/// `nvmlShutdown` (nvml-wrapper's drop panicked on it).
#[test]
fn a_misbehaving_nvml_never_takes_healthz_or_the_process_down() {
    let dir = tempfile::tempdir().unwrap();
    let mut hung = on_stub(
        &dir.path().join("hung"),
        &[],
        &[("GPU_DOUBLE_NVML_INIT_SLEEP", "600")],
    );
    assert_eq!(hung.get("/healthz"), (200, "ok\n".to_string()));
    let scrapes: Vec<_> = (0..4)
        .map(|_| {
            let addr = hung.addr;
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                write!(s, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
                let mut resp = String::new();
                s.read_to_string(&mut resp).unwrap();
                resp
            })
        })
        .collect();
    for t in scrapes {
        let resp = t.join().unwrap();
        let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        let err = nvml_error(&parse_ok(body).0);
        assert!(err.contains("NVML did not answer within 5 s"), "{err}");
    }
    assert_eq!(hung.get("/healthz"), (200, "ok\n".to_string()));
    hung.assert_alive();

    let hostile = dir.path().join("hostile.profile");
    std::fs::write(&hostile, "driver_version = 535.261.03\ngpus = 4294967295\n").unwrap();
    let mut many = on_stub(
        &dir.path().join("many"),
        &[],
        &[("GPU_DOUBLE_PROFILE", hostile.to_str().unwrap())],
    );
    let samples = many.metrics();
    let up = one(&samples, "gpu_driver_exporter_nvml_up", &[]);
    assert_eq!(up.value, 1.0, "{up:?}\n{}", many.log());
    many.wait_log("NVML reports 4294967295 devices; reading the first 64");
    many.assert_alive();

    let mut no_shutdown = on_stub(&dir.path().join("no-shutdown"), &["STUB_NO_SHUTDOWN"], &[]);
    for _ in 0..3 {
        let err = nvml_error(&no_shutdown.metrics());
        assert!(err.contains("nvmlShutdown"), "{err}");
    }
    no_shutdown.assert_alive();
}

// ------------------------------------------------------ the kubelet's API

/// The kubelet's side of the PodResources API, serving fixed pods.
struct Kubelet {
    pods: proto::ListPodResourcesResponse,
}

#[tonic::async_trait]
impl proto::pod_resources_lister_server::PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: tonic::Request<proto::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<proto::ListPodResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(self.pods.clone()))
    }
    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<proto::AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<proto::AllocatableResourcesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    async fn get(
        &self,
        _: tonic::Request<proto::GetPodResourcesRequest>,
    ) -> Result<tonic::Response<proto::GetPodResourcesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
}

const GPU0: &str = "GPU-6f3c2a1e-0b7d-4c5e-9a21-3d4e5f607182";
const MIG1: &str = "MIG-11111111-2222-3333-4444-555555555555";

fn pod(ns: &str, name: &str, container: &str, devices: &[(&str, &[&str])]) -> proto::PodResources {
    proto::PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![proto::ContainerResources {
            name: container.into(),
            devices: devices
                .iter()
                .map(|(r, ids)| proto::ContainerDevices {
                    resource_name: r.to_string(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    topology: None,
                })
                .collect(),
            ..Default::default()
        }],
    }
}

/// A real gRPC server on `socket`, on its own thread and runtime.
fn serve_kubelet(socket: &Path) {
    let pods = proto::ListPodResourcesResponse {
        pod_resources: vec![
            pod("ml", "train-0", "cuda", &[("nvidia.com/gpu", &[GPU0])]),
            pod(
                "serving",
                "infer-1",
                "triton",
                &[("nvidia.com/mig-3g.40gb", &[MIG1])],
            ),
            pod("net", "router", "main", &[("example.com/nic", &["nic0"])]),
        ],
    };
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::from_std(listener).unwrap();
            tonic::transport::Server::builder()
                .add_service(
                    proto::pod_resources_lister_server::PodResourcesListerServer::new(Kubelet {
                        pods,
                    }),
                )
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await
                .unwrap();
        });
    });
}

fn list(socket: &Path) -> Vec<Allocation> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(podresources::list(socket, Duration::from_secs(10)))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn fixture_snapshot() -> Snapshot {
    let path = crate::support::repo_root().join("tests/fixtures/exporter/snapshot.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The binary on the host root `dir`, as node `gpu-node-1`, with NVML
/// from `nvml` and the kubelet double serving `dir`/kubelet.sock (returned
/// with it).
fn on_kubelet(dir: &Path, nvml: &Path) -> (Exporter, PathBuf) {
    let socket = dir.join("kubelet.sock");
    serve_kubelet(&socket);
    let e = on_host(dir, nvml, &socket, &[("NODE_NAME", "gpu-node-1")]);
    (e, socket)
}

#[test]
fn pods_holding_gpus_come_from_the_kubelet() {
    let dir = tempfile::tempdir().unwrap();
    let (mut e, socket) = on_kubelet(dir.path(), &dir.path().join("none/libnvidia-ml.so.1"));
    let m = e.metrics();
    let up = one(&m, "gpu_driver_exporter_podresources_up", &[]);
    assert_eq!((up.value, up.labels.len()), (1.0, 0), "{up:?}\n{}", e.log());
    let got: BTreeSet<Vec<String>> = find(&m, "gpu_driver_exporter_pod_gpu_allocation", &[])
        .into_iter()
        .map(|s| {
            assert_eq!(s.value, 1.0);
            assert_eq!(s.labels["Hostname"], "gpu-node-1");
            ["resource", "device_id", "namespace", "pod", "container"]
                .iter()
                .map(|k| s.labels[*k].clone())
                .collect()
        })
        .collect();
    let want: BTreeSet<Vec<String>> = [
        ["nvidia.com/gpu", GPU0, "ml", "train-0", "cuda"],
        [
            "nvidia.com/mig-3g.40gb",
            MIG1,
            "serving",
            "infer-1",
            "triton",
        ],
    ]
    .iter()
    .map(|r| r.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(got, want);
    // NVML's part is reported all the same.
    assert!(nvml_error(&m).contains("not found"));
    e.assert_alive();

    // The same answer through the library, with fixture GPU readings: the
    // DCGM series of the held GPU and MIG instance carry the pod's labels.
    let mut snap = fixture_snapshot();
    snap.allocations = list(&socket);
    let (samples, _) = parse_ok(&metrics::render(&snap));
    let util = one(&samples, "DCGM_FI_DEV_GPU_UTIL", &[("UUID", GPU0)]);
    assert_eq!(util.value, 93.0);
    for (k, v) in [
        ("pod", "train-0"),
        ("namespace", "ml"),
        ("container", "cuda"),
    ] {
        assert_eq!(util.labels[k], v, "{util:?}");
    }
    let mig = one(&samples, "DCGM_FI_DEV_FB_USED", &[("GPU_I_ID", "1")]);
    assert_eq!(mig.value, 10240.0);
    assert_eq!(mig.labels["pod"], "infer-1");
    assert_eq!(mig.labels["GPU_I_PROFILE"], "3g.40gb");
    let other_mig = one(&samples, "DCGM_FI_DEV_FB_USED", &[("GPU_I_ID", "2")]);
    assert!(!other_mig.labels.contains_key("pod"), "{other_mig:?}");
    // A GPU in MIG mode is not itself held: no pod labels on its series.
    let a100 = one(&samples, "DCGM_FI_DEV_POWER_USAGE", &[("gpu", "1")]);
    assert!(!a100.labels.contains_key("pod"), "{a100:?}");
}

/// The binary end to end over the GPU double's NVML (through nvml-wrapper,
/// as on a node) and the kubelet double's PodResources: the profile's
/// readings come out in DCGM's names and units, the held GPU carries its
/// pod's labels, and what the double does not model (power, clocks,
/// temperature) is left out, not made up.
#[test]
fn the_gpu_doubles_readings_reach_the_pod_that_holds_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let libs = crate::support::host::gpu_double(
        &dir.path().join("driver"),
        crate::support::host::TWO_H100_PROFILE,
    );
    let (mut e, _socket) = on_kubelet(dir.path(), &libs.join("libnvidia-ml.so.1"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = e.metrics();
        let up = one(&m, "gpu_driver_exporter_nvml_up", &[]);
        if up.value == 1.0 || Instant::now() > deadline {
            assert_eq!(up.value, 1.0, "{up:?}\n{}", e.log());
            break m;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let util = one(&m, "DCGM_FI_DEV_GPU_UTIL", &[("UUID", GPU0)]);
    assert_eq!(util.value, 37.0);
    for (k, v) in [
        ("gpu", "0"),
        ("pci_bus_id", "00000000:3B:00.0"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", "gpu-node-1"),
        ("namespace", "ml"),
        ("pod", "train-0"),
        ("container", "cuda"),
    ] {
        assert_eq!(util.labels[k], v, "{util:?}");
    }
    // MiB, as DCGM reports frame buffer memory.
    let used = one(&m, "DCGM_FI_DEV_FB_USED", &[("UUID", GPU0)]);
    assert_eq!(used.value, 1024.0);
    let other = one(&m, "DCGM_FI_DEV_GPU_UTIL", &[("gpu", "1")]);
    assert_eq!(other.value, 0.0);
    assert!(!other.labels.contains_key("pod"), "{other:?}");
    for unmodelled in [
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_SM_CLOCK",
    ] {
        assert!(find(&m, unmodelled, &[]).is_empty(), "{unmodelled}: {m:?}");
    }
    e.assert_alive();
}

#[test]
fn a_missing_or_dead_kubelet_socket_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    let dead = dir.path().join("dead.sock");
    // A socket file nobody listens on any more (a kubelet restarting).
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    for (socket, says) in [(&missing, "not found"), (&dead, "connecting to")] {
        let mut e = Exporter::start(
            &[
                "--host-root",
                dir.path().to_str().unwrap(),
                "--kubelet-socket",
                socket.to_str().unwrap(),
            ],
            &[],
        );
        let m = e.metrics();
        let up = one(&m, "gpu_driver_exporter_podresources_up", &[]);
        assert_eq!(up.value, 0.0);
        let err = &up.labels["error"];
        assert!(
            err.contains(says) && err.contains(socket.to_str().unwrap()),
            "{err}"
        );
        assert!(find(&m, "gpu_driver_exporter_pod_gpu_allocation", &[]).is_empty());
        // The NVML part still answers.
        one(&m, "gpu_driver_exporter_nvml_up", &[]);
        one(&m, "gpu_driver_exporter_scrape_duration_seconds", &[]);
        e.wait_log("PodResources down");
        e.assert_alive();
    }
}

// ------------------------------------------------------------- rendering

/// A host root whose /proc holds the cgroup fixtures for the fixture's
/// processes, and the kubelet's container log link for one of them.
fn fixture_host(dir: &Path) -> HostRoot {
    let cg = crate::support::repo_root().join("tests/fixtures/exporter/cgroup");
    for (pid, file) in [
        (41001, "v2-systemd-containerd-kind.cgroup"),
        (41002, "v1-cgroupfs.cgroup"),
        (52001, "v1-systemd-crio.cgroup"),
        (977, "host-system-slice.cgroup"),
    ] {
        let d = dir.join(format!("proc/{pid}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(cg.join(file), d.join("cgroup")).unwrap();
    }
    let links = dir.join("var/log/containers");
    std::fs::create_dir_all(&links).unwrap();
    let id = "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e";
    std::os::unix::fs::symlink(
        "/var/log/pods/x/cuda/0.log",
        links.join(format!("train-0_ml_cuda-{id}.log")),
    )
    .unwrap();
    HostRoot::new(dir, HostRootSource::Flag)
}

#[test]
fn fixture_readings_render_with_dcgm_names_units_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let root = fixture_host(dir.path());
    let mut snap = fixture_snapshot();
    (snap.process_owners, snap.host_processes) = scrape::process_owners(&root, &snap.gpus);
    let text = metrics::render(&snap);
    let (samples, types) = parse_ok(&text);
    // Prometheus's own parser reads the same series (DCGM's counters
    // without `_total` included).
    assert_eq!(crate::support::om::series(&text), samples.len(), "{text}");

    let gpu0 = [("gpu", "0"), ("UUID", GPU0)];
    let labels = &one(&samples, "DCGM_FI_DEV_GPU_TEMP", &gpu0).labels;
    let names: Vec<&str> = labels.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "DCGM_FI_DRIVER_VERSION",
            "Hostname",
            "UUID",
            "device",
            "gpu",
            "modelName",
            "pci_bus_id"
        ]
    );
    assert_eq!(labels["device"], "nvidia0");
    assert_eq!(labels["modelName"], "NVIDIA H100 80GB HBM3");
    assert_eq!(labels["Hostname"], "gpu-node-1");
    assert_eq!(labels["pci_bus_id"], "00000000:18:00.0");

    // (name, type, value) in DCGM's units: W, mJ, MHz, MiB, °C, %.
    let want: &[(&str, &str, f64)] = &[
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", 93.0),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", 41.0),
        ("DCGM_FI_DEV_FB_USED", "gauge", 61440.0),
        ("DCGM_FI_DEV_FB_FREE", "gauge", 20119.0),
        ("DCGM_FI_DEV_FB_TOTAL", "gauge", 81559.0),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", 612.345),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", 700.0),
        (
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "counter",
            183_472_915_233.0,
        ),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", 67.0),
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", 1980.0),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", 2619.0),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", 4.0),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", 4.0),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", 63.0),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", 0.0),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", 0.0),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", 0.0),
        ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", 3.0),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", 0.0),
        ("gpu_driver_exporter_xid_errors_total", "counter", 1.0),
        ("gpu_driver_exporter_mig_mode", "gauge", 0.0),
        ("gpu_driver_exporter_gpu_processes", "gauge", 3.0),
    ];
    for (name, kind, value) in want {
        assert_eq!(types.get(*name).map(String::as_str), Some(*kind), "{name}");
        assert_eq!(one(&samples, name, &gpu0).value, *value, "{name}");
    }
    // The A100 supports neither utilization nor aggregate ECC here: left out.
    assert!(find(&samples, "DCGM_FI_DEV_GPU_UTIL", &[("gpu", "1")]).is_empty());
    assert!(find(&samples, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", &[("gpu", "1")]).is_empty());
    assert_eq!(
        one(&samples, "gpu_driver_exporter_mig_mode", &[("gpu", "1")]).value,
        1.0
    );
    assert_eq!(
        find(&samples, "DCGM_FI_DEV_FB_TOTAL", &[("gpu", "1")]).len(),
        3,
        "GPU + 2 MIG"
    );

    assert_per_pod_memory(&samples, &gpu0);
    let up = one(&samples, "gpu_driver_exporter_nvml_up", &[]);
    assert_eq!((up.value, up.labels.len()), (1.0, 0));
    let info = one(&samples, "gpu_driver_exporter_driver_info", &[]);
    assert_eq!(info.labels["driver_version"], "550.127.05");
    assert_eq!(one(&samples, "gpu_driver_exporter_gpus", &[]).value, 2.0);
}

/// Per-process memory per pod: named where the log link is there, by
/// UID otherwise; the host process apart.
fn assert_per_pod_memory(samples: &[Sample], gpu0: &[(&str, &str)]) {
    // Per-process memory per pod: named where the log link is there, by
    // UID otherwise; the host process apart.
    let per_pod = "gpu_driver_exporter_container_gpu_memory_used_bytes";
    let named = one(samples, per_pod, &[("pod", "train-0")]);
    assert_eq!(named.value, 60_129_542_144.0);
    assert_eq!(
        named.labels["pod_uid"],
        "1e597579-417e-482f-bf65-5fe170c3aebd"
    );
    assert_eq!(
        (
            named.labels["namespace"].as_str(),
            named.labels["container"].as_str()
        ),
        ("ml", "cuda")
    );
    let by_uid = one(
        samples,
        per_pod,
        &[("pod_uid", "d7874f44-eee0-423c-83c9-f246075bdde1")],
    );
    assert_eq!(by_uid.value, 2_147_483_648.0);
    assert!(!by_uid.labels.contains_key("pod"));
    let mig = one(samples, per_pod, &[("GPU_I_ID", "1")]);
    assert_eq!(
        mig.labels["pod_uid"],
        "a5c1f8d5-1919-434d-add7-4afaafdaef89"
    );
    let host = one(
        samples,
        "gpu_driver_exporter_host_gpu_memory_used_bytes",
        gpu0,
    );
    assert_eq!(host.value, 524_288_000.0);
    // PID 52002 has no /proc entry (exited, or no host /proc): in no series.
    let host_gpu1 = [("gpu", "1")];
    assert!(
        find(
            samples,
            "gpu_driver_exporter_host_gpu_memory_used_bytes",
            &host_gpu1
        )
        .is_empty()
    );
    assert_eq!(find(samples, per_pod, &host_gpu1).len(), 1);
}
