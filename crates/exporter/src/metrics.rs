//! What one scrape knows ([`Snapshot`]: per-GPU readings, the kubelet's
//! device allocations, process owners, the exporter's own health) and its
//! rendering in OpenMetrics text by prometheus-client. Pure: no NVML, no
//! I/O, so fixtures and the benchmark go through the same code as a real
//! scrape.
//!
//! GPU series carry the DCGM exporter's metric names, units and labels
//! (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`,
//! `GPU_I_PROFILE`/`GPU_I_ID` on MIG instances, and `pod`, `namespace`,
//! `container` where the kubelet assigned the device), so dashboards made
//! for it work unchanged; docs/exporter.md cites the sources.

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::registry::Registry;

use serde::{Deserialize, Serialize};

use exposition::{Exposition, Labels};

mod exposition;

/// Framebuffer memory, in bytes (rendered in MiB as DCGM does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    pub total: u64,
    pub used: u64,
    pub free: u64,
}

/// Critical XID events NVML reported for one GPU since the exporter
/// started watching it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct XidCount {
    pub count: u64,
    /// The last XID code, 0 before the first.
    pub last: u64,
}

/// One MIG device (GPU instance) of a GPU in MIG mode.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MigReading {
    pub gpu_instance_id: Option<u32>,
    /// `1g.10gb` and the like (from the MIG device's name).
    pub profile: String,
    pub uuid: String,
    pub memory: Option<Memory>,
}

/// A process NVML lists on a GPU (compute or graphics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessReading {
    /// In the host's PID namespace.
    pub pid: u32,
    pub used_bytes: Option<u64>,
    /// The MIG GPU instance it runs on, in MIG mode.
    pub gpu_instance_id: Option<u32>,
}

/// Everything read from one GPU; `None` where the GPU does not support a
/// value (NVML's NotSupported) or could not read it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GpuReading {
    /// NVML's index (DCGM's `gpu` label; `device` is `nvidia<index>`).
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// `00000000:3B:00.0`.
    pub pci_bus_id: String,
    /// Percent.
    pub gpu_util: Option<u32>,
    /// Percent of time device memory was read or written.
    pub mem_util: Option<u32>,
    pub memory: Option<Memory>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    /// Since the driver was loaded, in millijoules.
    pub energy_mj: Option<u64>,
    pub temperature_c: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    /// NVML's clocks event (formerly throttle) reasons bitmask.
    pub clock_event_reasons: Option<u64>,
    pub ecc_sbe_volatile: Option<u64>,
    pub ecc_dbe_volatile: Option<u64>,
    pub ecc_sbe_aggregate: Option<u64>,
    pub ecc_dbe_aggregate: Option<u64>,
    pub pcie_replay: Option<u64>,
    /// `None` when the GPU cannot report critical XID events.
    pub xid: Option<XidCount>,
    pub mig_enabled: Option<bool>,
    pub mig: Vec<MigReading>,
    pub processes: Vec<ProcessReading>,
}

/// A container, as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRef {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// One device the kubelet assigned to a container (PodResources API).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, …
    pub resource: String,
    /// A GPU or MIG UUID (the device plugin's default), or a GPU index.
    pub device_id: String,
    pub container: ContainerRef,
}

/// The container a GPU process runs in, from its cgroup; the names come
/// from the kubelet's container log links when they are readable.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessOwner {
    pub pod_uid: String,
    pub container_id: Option<String>,
    pub names: Option<ContainerRef>,
}

/// Whether a source answered, and why not.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    pub up: bool,
    pub error: Option<String>,
}

/// Versions NVML reports once it is up.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverInfo {
    pub driver_version: String,
    pub nvml_version: String,
    /// `12.2`.
    pub cuda_version: String,
}

/// One scrape's input to [`render`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Snapshot {
    /// The node's name (`NODE_NAME`, else the host name): `Hostname`.
    pub hostname: String,
    pub driver: Option<DriverInfo>,
    pub gpus: Vec<GpuReading>,
    pub allocations: Vec<Allocation>,
    /// By PID, for the processes in [`GpuReading::processes`] that run in a pod.
    pub process_owners: BTreeMap<u32, ProcessOwner>,
    /// PIDs whose cgroup was read and is in no pod. A process in neither
    /// (its cgroup unreadable: no host /proc, or it exited) is counted in
    /// no per-pod or host series.
    pub host_processes: BTreeSet<u32>,
    pub nvml: Health,
    pub podresources: Health,
    pub scrape_seconds: f64,
}

/// Longest `error` label value: a full dlerror text is enough, a page is not.
const MAX_ERROR_LABEL: usize = 300;

const MIB: f64 = 1024.0 * 1024.0;

/// A DCGM field rendered per GPU (and per MIG instance where `mig` says how).
struct GpuField {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&GpuReading) -> Option<f64>,
    mig: Option<fn(&MigReading) -> Option<f64>>,
}

fn mib(m: Option<Memory>, f: fn(&Memory) -> u64) -> Option<f64> {
    m.map(|m| f(&m) as f64 / MIB)
}

/// A frame buffer gauge (MiB) read from the `Memory` field `$field`, of a
/// whole GPU and of a MIG instance alike.
macro_rules! fb_field {
    ($name:literal, $help:literal, $field:ident) => {
        GpuField {
            name: $name,
            kind: "gauge",
            help: $help,
            value: |g| mib(g.memory, |m| m.$field),
            mig: Some(|m| mib(m.memory, |m| m.$field)),
        }
    };
}

/// The DCGM exporter's field names (etc/default-counters.csv and the
/// go-dcgm field table; docs/exporter.md), in its units: W, mJ, MHz, MiB, °C.
const GPU_FIELDS: &[GpuField] = &[
    GpuField {
        name: "DCGM_FI_DEV_GPU_UTIL",
        kind: "gauge",
        help: "GPU utilization (percent).",
        value: |g| g.gpu_util.map(f64::from),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_MEM_COPY_UTIL",
        kind: "gauge",
        help: "Percent of time device memory was read or written.",
        value: |g| g.mem_util.map(f64::from),
        mig: None,
    },
    fb_field!(
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (MiB).",
        used
    ),
    fb_field!(
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (MiB).",
        free
    ),
    fb_field!(
        "DCGM_FI_DEV_FB_TOTAL",
        "Framebuffer memory total (MiB).",
        total
    ),
    GpuField {
        name: "DCGM_FI_DEV_POWER_USAGE",
        kind: "gauge",
        help: "Power draw (W).",
        value: |g| g.power_mw.map(|p| f64::from(p) / 1000.0),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        kind: "gauge",
        help: "Power management limit (W).",
        value: |g| g.power_limit_mw.map(|p| f64::from(p) / 1000.0),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        kind: "counter",
        help: "Energy consumed since the driver was loaded (mJ).",
        value: |g| g.energy_mj.map(|e| e as f64),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_GPU_TEMP",
        kind: "gauge",
        help: "GPU temperature (C).",
        value: |g| g.temperature_c.map(f64::from),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_SM_CLOCK",
        kind: "gauge",
        help: "SM clock (MHz).",
        value: |g| g.sm_clock_mhz.map(f64::from),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_MEM_CLOCK",
        kind: "gauge",
        help: "Memory clock (MHz).",
        value: |g| g.mem_clock_mhz.map(f64::from),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        kind: "gauge",
        help: "Clock throttle reasons, NVML's bitmask (DCGM 3 name of field 112).",
        value: |g| g.clock_event_reasons.map(|r| r as f64),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        kind: "gauge",
        help: "Clocks event reasons, NVML's bitmask (DCGM 4 name of field 112).",
        value: |g| g.clock_event_reasons.map(|r| r as f64),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_XID_ERRORS",
        kind: "gauge",
        help: "The last critical XID error code seen (0: none since the exporter started).",
        value: |g| g.xid.map(|x| x.last as f64),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        kind: "counter",
        help: "PCIe replays (retries).",
        value: |g| g.pcie_replay.map(|r| r as f64),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        kind: "counter",
        help: "Single-bit (corrected) ECC errors since the driver was loaded.",
        value: |g| g.ecc_sbe_volatile.map(|e| e as f64),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        kind: "counter",
        help: "Double-bit (uncorrected) ECC errors since the driver was loaded.",
        value: |g| g.ecc_dbe_volatile.map(|e| e as f64),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        kind: "counter",
        help: "Single-bit (corrected) ECC errors over the GPU's lifetime.",
        value: |g| g.ecc_sbe_aggregate.map(|e| e as f64),
        mig: None,
    },
    GpuField {
        name: "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        kind: "counter",
        help: "Double-bit (uncorrected) ECC errors over the GPU's lifetime.",
        value: |g| g.ecc_dbe_aggregate.map(|e| e as f64),
        mig: None,
    },
    GpuField {
        name: "gpu_driver_exporter_xid_errors_total",
        kind: "counter",
        help: "Critical XID events NVML reported since the exporter started watching the GPU.",
        value: |g| g.xid.map(|x| x.count as f64),
        mig: None,
    },
    GpuField {
        name: "gpu_driver_exporter_mig_mode",
        kind: "gauge",
        help: "1 when MIG mode is enabled on the GPU, 0 when not.",
        value: |g| g.mig_enabled.map(|m| f64::from(u8::from(m))),
        mig: None,
    },
    GpuField {
        name: "gpu_driver_exporter_gpu_processes",
        kind: "gauge",
        help: "Compute and graphics processes NVML lists on the GPU.",
        value: |g| Some(g.processes.len() as f64),
        mig: None,
    },
];

/// The containers holding a device: by UUID, or by index when the device
/// plugin reports indexes.
fn holders<'a>(
    allocations: &'a [Allocation],
    uuid: &str,
    index: Option<u32>,
) -> BTreeSet<&'a ContainerRef> {
    let index = index.map(|i| i.to_string());
    allocations
        .iter()
        .filter(|a| a.device_id == uuid || index.as_deref() == Some(a.device_id.as_str()))
        .map(|a| &a.container)
        .collect()
}

/// The DCGM label set of a GPU (or of one of its MIG instances), then
/// `Hostname` and the driver version label, without pod labels.
fn gpu_labels(snap: &Snapshot, g: &GpuReading, mig: Option<&MigReading>) -> Labels {
    let mut out = vec![
        ("gpu", g.index.to_string()),
        ("UUID", g.uuid.clone()),
        ("pci_bus_id", g.pci_bus_id.clone()),
        ("device", format!("nvidia{}", g.index)),
        ("modelName", g.model.clone()),
    ];
    if let Some(m) = mig {
        out.push(("GPU_I_PROFILE", m.profile.clone()));
        let id = m.gpu_instance_id.map(|i| i.to_string()).unwrap_or_default();
        out.push(("GPU_I_ID", id));
    }
    if !snap.hostname.is_empty() {
        out.push(("Hostname", snap.hostname.clone()));
    }
    if let Some(d) = &snap.driver {
        out.push(("DCGM_FI_DRIVER_VERSION", d.driver_version.clone()));
    }
    out
}

fn push_container(labels: &mut Labels, c: &ContainerRef) {
    labels.push(("container", c.container.clone()));
    labels.push(("namespace", c.namespace.clone()));
    labels.push(("pod", c.pod.clone()));
}

/// One series per container holding the device (DCGM's pod mapping), or one
/// without pod labels when none does.
fn per_holder(
    out: &mut Vec<(Labels, f64)>,
    base: &Labels,
    holders: &BTreeSet<&ContainerRef>,
    v: f64,
) {
    if holders.is_empty() {
        out.push((base.clone(), v));
    }
    for c in holders {
        let mut l = base.clone();
        push_container(&mut l, c);
        out.push((l, v));
    }
}

fn render_gpu_fields(snap: &Snapshot, o: &mut Exposition) {
    let gpus: Vec<_> = snap
        .gpus
        .iter()
        .map(|g| {
            let h = holders(&snap.allocations, &g.uuid, Some(g.index));
            let migs: Vec<_> = g
                .mig
                .iter()
                .map(|m| {
                    (
                        m,
                        gpu_labels(snap, g, Some(m)),
                        holders(&snap.allocations, &m.uuid, None),
                    )
                })
                .collect();
            (g, gpu_labels(snap, g, None), h, migs)
        })
        .collect();
    for f in GPU_FIELDS {
        let mut samples = Vec::new();
        for (g, base, h, migs) in &gpus {
            if let Some(v) = (f.value)(g) {
                per_holder(&mut samples, base, h, v);
            }
            let Some(mig_value) = f.mig else { continue };
            for (m, mbase, mh) in migs {
                if let Some(v) = mig_value(m) {
                    per_holder(&mut samples, mbase, mh, v);
                }
            }
        }
        o.family(f.name, f.kind, f.help, samples);
    }
}

/// GPU memory of processes summed per (GPU, MIG instance, pod, container);
/// processes outside any pod go to their own family.
fn render_processes(snap: &Snapshot, o: &mut Exposition) {
    type Key<'a> = (Labels, Option<u32>, &'a str, Option<&'a ContainerRef>);
    let mut pods: BTreeMap<Key, f64> = BTreeMap::new();
    let mut host: Vec<(Labels, f64)> = Vec::new();
    for g in &snap.gpus {
        let base = gpu_labels(snap, g, None);
        let mut outside = 0.0;
        let mut outside_seen = false;
        for p in &g.processes {
            let Some(bytes) = p.used_bytes else { continue };
            match snap.process_owners.get(&p.pid) {
                Some(owner) => {
                    let key = (
                        base.clone(),
                        p.gpu_instance_id,
                        owner.pod_uid.as_str(),
                        owner.names.as_ref(),
                    );
                    *pods.entry(key).or_default() += bytes as f64;
                }
                None if snap.host_processes.contains(&p.pid) => {
                    outside += bytes as f64;
                    outside_seen = true;
                }
                None => {}
            }
        }
        if outside_seen {
            host.push((base, outside));
        }
    }
    let samples: Vec<(Labels, f64)> = pods
        .into_iter()
        .map(|((mut l, gi, uid, names), v)| {
            if let Some(gi) = gi {
                l.push(("GPU_I_ID", gi.to_string()));
            }
            l.push(("pod_uid", uid.to_string()));
            if let Some(c) = names {
                push_container(&mut l, c);
            }
            (l, v)
        })
        .collect();
    o.family(
        "gpu_driver_exporter_container_gpu_memory_used_bytes",
        "gauge",
        "GPU memory used by the processes of one pod's container (pod names where the kubelet's container log links are readable).",
        samples,
    );
    o.family(
        "gpu_driver_exporter_host_gpu_memory_used_bytes",
        "gauge",
        "GPU memory used by processes that run in no pod.",
        host,
    );
}

fn render_allocations(snap: &Snapshot, o: &mut Exposition) {
    let samples: Vec<(Labels, f64)> = snap
        .allocations
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|a| {
            let mut l = vec![
                ("resource", a.resource.clone()),
                ("device_id", a.device_id.clone()),
            ];
            if !snap.hostname.is_empty() {
                l.push(("Hostname", snap.hostname.clone()));
            }
            push_container(&mut l, &a.container);
            (l, 1.0)
        })
        .collect();
    o.family(
        "gpu_driver_exporter_pod_gpu_allocation",
        "gauge",
        "1 for each GPU or MIG device the kubelet assigned to a container (PodResources API).",
        samples,
    );
}

fn health_sample(h: &Health) -> Vec<(Labels, f64)> {
    let sample = match (&h.error, h.up) {
        (Some(e), false) => (
            vec![(
                "error",
                gpu_driver_contract::text::truncate(e, MAX_ERROR_LABEL).to_string(),
            )],
            0.0,
        ),
        (_, up) => (Vec::new(), f64::from(u8::from(up))),
    };
    vec![sample]
}

fn render_own(snap: &Snapshot, o: &mut Exposition) {
    o.family(
        "gpu_driver_exporter_nvml_up",
        "gauge",
        "1 when NVML is loaded and initialized; 0 with the reason in the error label.",
        health_sample(&snap.nvml),
    );
    o.family(
        "gpu_driver_exporter_podresources_up",
        "gauge",
        "1 when the kubelet's PodResources API answered this scrape; 0 with the reason in the error label.",
        health_sample(&snap.podresources),
    );
    if snap.nvml.up {
        o.family(
            "gpu_driver_exporter_gpus",
            "gauge",
            "GPUs NVML reports.",
            vec![(Vec::new(), snap.gpus.len() as f64)],
        );
    }
    if let Some(d) = &snap.driver {
        o.family(
            "gpu_driver_exporter_driver_info",
            "gauge",
            "The driver, NVML and CUDA driver API versions NVML reports (value 1).",
            vec![(
                vec![
                    ("driver_version", d.driver_version.clone()),
                    ("nvml_version", d.nvml_version.clone()),
                    ("cuda_version", d.cuda_version.clone()),
                ],
                1.0,
            )],
        );
    }
    o.family(
        "gpu_driver_exporter_scrape_duration_seconds",
        "gauge",
        "Time this scrape took to read NVML, the kubelet and /proc.",
        vec![(Vec::new(), snap.scrape_seconds)],
    );
}

/// The whole `/metrics` body: OpenMetrics text, ending in `# EOF`.
pub fn render(snap: &Snapshot) -> String {
    let mut o = Exposition::default();
    render_gpu_fields(snap, &mut o);
    render_processes(snap, &mut o);
    render_allocations(snap, &mut o);
    render_own(snap, &mut o);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(o));
    let mut text = String::with_capacity(4096 + snap.gpus.len() * 6144);
    // Writing into a String does not fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> GpuReading {
        GpuReading {
            index: 0,
            uuid: "GPU-1".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: "00000000:18:00.0".into(),
            gpu_util: Some(87),
            memory: Some(Memory {
                total: 80 * 1024 * 1024 * 1024,
                used: 1024 * 1024 * 1024,
                free: 79 * 1024 * 1024 * 1024,
            }),
            power_mw: Some(312_500),
            ..Default::default()
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            hostname: "node-1".into(),
            gpus: vec![gpu()],
            nvml: Health {
                up: true,
                error: None,
            },
            ..Default::default()
        }
    }

    #[test]
    fn units_are_dcgms() {
        let text = render(&snapshot());
        assert!(
            text.contains("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\",UUID=\"GPU-1\",pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\"} 312.5\n"),
            "{text}"
        );
        assert!(text.contains("DCGM_FI_DEV_FB_USED{"), "{text}");
        assert!(text.contains("} 1024\n"), "FB in MiB: {text}");
        assert!(text.contains("DCGM_FI_DEV_FB_TOTAL{") && text.contains("} 81920\n"));
    }

    #[test]
    fn unsupported_values_are_left_out() {
        let text = render(&snapshot());
        assert!(!text.contains("DCGM_FI_DEV_GPU_TEMP"), "{text}");
        assert!(!text.contains("DCGM_FI_DEV_ECC"), "{text}");
        assert!(!text.contains("gpu_driver_exporter_xid_errors_total"));
    }

    #[test]
    fn each_holder_gets_its_series() {
        let mut s = snapshot();
        // Time-sliced: two pods on GPU-1.
        for (pod, id) in [("a", "GPU-1"), ("b", "GPU-1"), ("c", "GPU-2")] {
            s.allocations.push(Allocation {
                resource: "nvidia.com/gpu".into(),
                device_id: id.into(),
                container: ContainerRef {
                    namespace: "ml".into(),
                    pod: pod.into(),
                    container: "main".into(),
                },
            });
        }
        let text = render(&s);
        let util: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
            .collect();
        assert_eq!(util.len(), 2, "{util:?}");
        assert!(util[0].ends_with(",container=\"main\",namespace=\"ml\",pod=\"a\"} 87"));
        assert!(util[1].contains("pod=\"b\""));
    }

    #[test]
    fn the_error_label_is_escaped_and_bounded() {
        let mut s = snapshot();
        s.nvml = Health {
            up: false,
            error: Some(format!("say \"no\"\\\n{}", "x".repeat(1000))),
        };
        let text = render(&s);
        let line = text
            .lines()
            .find(|l| l.starts_with("gpu_driver_exporter_nvml_up{"))
            .unwrap_or_default();
        assert!(line.starts_with("gpu_driver_exporter_nvml_up{error=\"say \\\"no\\\"\\\\\\nxxx"));
        assert!(line.len() < MAX_ERROR_LABEL + 80, "{}", line.len());
        assert!(line.ends_with("} 0"));
    }

    #[test]
    fn numbers() {
        let text = |v: f64| {
            let mut s = snapshot();
            s.scrape_seconds = v;
            let t = render(&s);
            let line = t
                .lines()
                .find(|l| l.starts_with("gpu_driver_exporter_scrape_duration_seconds "))
                .unwrap_or_default()
                .to_string();
            line.rsplit(' ').next().unwrap_or_default().to_string()
        };
        assert_eq!(text(3.0), "3");
        assert_eq!(text(312.5), "312.5");
        assert_eq!(text(0.000123).parse::<f64>(), Ok(0.000123));
        assert_eq!(text(1.5e300).parse::<f64>(), Ok(1.5e300));
    }

    #[test]
    fn openmetrics_counters_and_eof() {
        let mut s = snapshot();
        s.gpus[0].energy_mj = Some(7);
        s.gpus[0].xid = Some(XidCount { count: 2, last: 13 });
        let text = render(&s);
        // DCGM's counter keeps its name; ours gets `_total` from the family.
        assert!(text.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"));
        assert!(text.contains("\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"0\","));
        assert!(text.contains("# TYPE gpu_driver_exporter_xid_errors counter\n"));
        assert!(text.contains("\ngpu_driver_exporter_xid_errors_total{gpu=\"0\","));
        assert!(text.contains("\ngpu_driver_exporter_nvml_up 1\n"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
