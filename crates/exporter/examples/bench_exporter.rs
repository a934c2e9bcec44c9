//! The rendering half of `scripts/bench-exporter`: a scrape of eight GPUs,
//! each with three processes in pods and a pod holding it, through the same
//! `metrics::render` a real scrape uses (no GPU here, so the readings are
//! tests/fixtures/exporter/snapshot.json's H100, eight times). Prints one
//! JSON line: the median and 99th percentile render time and the body size.
//!
//! Usage: bench_exporter [--gpus N] [--runs N]

use std::time::Instant;

use gpu_driver_exporter::metrics::{self, Allocation, ContainerRef, ProcessOwner, Snapshot};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `gpus` copies of the fixture's first GPU, each held by its own pod,
/// its processes owned by that pod's container.
fn synthetic(gpus: usize) -> Result<Snapshot, Box<dyn std::error::Error>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/exporter/snapshot.json"
    );
    let base: Snapshot = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let template = base.gpus.first().ok_or("the fixture has no GPU")?.clone();
    let mut snap = Snapshot {
        gpus: Vec::new(),
        ..base
    };
    for i in 0..gpus {
        let mut g = template.clone();
        g.index = i as u32;
        g.uuid = format!("GPU-00000000-0000-0000-0000-{i:012}");
        g.pci_bus_id = format!("00000000:{:02X}:00.0", 0x18 + i * 0x10);
        let container = ContainerRef {
            namespace: "ml".into(),
            pod: format!("train-{i}"),
            container: "cuda".into(),
        };
        for (k, p) in g.processes.iter_mut().enumerate() {
            p.pid = (100_000 + i * 10 + k) as u32;
            snap.process_owners.insert(
                p.pid,
                ProcessOwner {
                    pod_uid: format!("00000000-0000-0000-0000-{i:012}"),
                    container_id: Some(format!("{:064x}", i * 10 + k)),
                    names: Some(container.clone()),
                },
            );
        }
        snap.allocations.push(Allocation {
            resource: "nvidia.com/gpu".into(),
            device_id: g.uuid.clone(),
            container,
        });
        snap.gpus.push(g);
    }
    Ok(snap)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpus = arg("--gpus", 8);
    let runs = arg("--runs", 2000).max(1);
    let snap = synthetic(gpus)?;
    let bytes = metrics::render(&snap).len();
    let mut micros: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let text = metrics::render(&snap);
            let us = t.elapsed().as_secs_f64() * 1e6;
            std::hint::black_box(text);
            us
        })
        .collect();
    micros.sort_by(f64::total_cmp);
    let pct = |p: f64| micros[((micros.len() - 1) as f64 * p).round() as usize];
    println!(
        "{}",
        serde_json::json!({
            "gpus": gpus,
            "runs": runs,
            "renderMedianMicros": pct(0.5),
            "renderP99Micros": pct(0.99),
            "bytes": bytes,
        })
    );
    Ok(())
}
