//! The cold join's Jobs and the GPU pod: what they leave in the cluster
//! and in their termination messages (the apiserver cannot reach the VM's
//! kubelet: no exec, no logs).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::chain::Cold;
use super::kube::{Ctx, Kube, node};
use super::vm::Images;
use super::{Clock, NODE, NS, log, manifests, now, secs};

const INSTALL: &str = "gpu-driver.gardenlinux.io/role=install";
pub(super) const BUILD: &str = "gpu-driver.gardenlinux.io/role=build";

/// The GpuDriver applied (the cold join: a Ready GPU node, an empty
/// store): the build Job compiles and stores, the install Job installs
/// from the store; then what both left.
pub(super) fn join(ctx: &mut Ctx, images: &Images, signer_sha256: String) -> Result<Cold> {
    let f = ctx.out.join("gpudriver.yaml");
    let gd = manifests::gpudriver(images.name("builder-bookworm")?, images.name("installer")?);
    fs::write(&f, gd)?;
    let selected_at = now();
    ctx.kube.run(&["apply", "-f", &f.to_string_lossy()])?;
    ctx.wait_for("the operator's install Job", |k| {
        Ok(k.poll(&["-n", NS, "get", "jobs", "-l", INSTALL])
            .is_some_and(|l| !items(&l).is_empty()))
    })?;
    let jobs = ctx.kube.json(&["-n", NS, "get", "jobs", "-l", INSTALL])?;
    let job = s(&jobs, "/items/0/metadata/name").to_string();
    let job_obj = ctx.kube.json(&["-n", NS, "get", "job", &job])?;
    let created = s(&job_obj, "/metadata/creationTimestamp").to_string();
    log(&format!("install Job {job} created at {created}"));
    // The build Job stored the artifact first: the install Job runs in the
    // installer image alone (no compiler), with --no-compile.
    let job_image = s(&job_obj, "/spec/template/spec/containers/0/image").to_string();
    let job_args = job_obj
        .pointer("/spec/template/spec/containers/0/args")
        .map(Value::to_string)
        .unwrap_or_default();
    log(&format!("install Job image {job_image}"));
    // The operator marks the node Pending at once; the outcome is one of these.
    let what = format!("the outcome annotation on {NODE}");
    ctx.wait_for(&what, |k| {
        Ok(k.node()
            .is_some_and(|n| matches!(node::state(&n), "NoGpu" | "Installed" | "Failed")))
    })?;
    let annotated_at = now();
    let job_s = secs(parse_time(&created)? as f64, annotated_at);
    let node = ctx
        .kube
        .json_to(&["get", "node", NODE], &ctx.out.join("node.json"))?;
    let annotations: serde_json::Map<String, Value> = node["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("gpu-driver.gardenlinux.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let outcome = annotations["gpu-driver.gardenlinux.io/state"]
        .as_str()
        .unwrap_or("null")
        .to_string();
    let mut c = build_results(&ctx.kube, &ctx.out, &job, &signer_sha256)?;
    log(&format!(
        "outcome {outcome} ({job_s}s from Job creation); annotations: {}",
        Value::Object(annotations.clone())
    ));
    c.install_mounts = secret_volumes(&job_obj);
    Ok(Cold {
        selected_at,
        annotated_at,
        job_s,
        job_image,
        job_args,
        node,
        annotations,
        outcome,
        signer_sha256,
        ..c
    })
}

/// The install and build Jobs' pods and messages, the build Job's run
/// and the signed entry in the store.
fn build_results(k: &Kube, out: &Path, job: &str, signer_sha256: &str) -> Result<Cold> {
    let job_pods = k.json_to(
        &["-n", NS, "get", "pods", "-l", &format!("job-name={job}")],
        &out.join("job-pods.json"),
    )?;
    fs::write(out.join("termination-message.json"), messages(&job_pods))?;
    let build_pods = k.json_to(
        &["-n", NS, "get", "pods", "-l", BUILD],
        &out.join("build-pods.json"),
    )?;
    // The build Job's own run (its startTime → completionTime, 1 s
    // resolution): the part of the cold join a real driver's compile makes
    // minutes long.
    let builds = k.json(&["-n", NS, "get", "jobs", "-l", BUILD])?;
    let build_job_s = parse_time(s(&builds, "/items/0/status/completionTime"))?
        - parse_time(s(&builds, "/items/0/status/startTime"))?;
    let build_msg = messages(&build_pods);
    fs::write(out.join("build-message.json"), &build_msg)?;
    // stored by this build = the cache was empty for the key: compiled here.
    let build_cache = if build_msg.contains("stored by this build") {
        "Miss"
    } else {
        "Hit"
    };
    let package_from = json_stream(&build_msg)?
        .iter()
        .flat_map(|v| {
            v.pointer("/status/steps")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .find(|st| st["kind"] == "FetchResult")
        .map(|st| st["message"].as_str().unwrap_or("null").to_string())
        .unwrap_or_default();
    // The stored entry of the signed build: its key ends in the
    // certificate's fingerprint, its manifest names the signer.
    let stored_signer = match find_signed(
        &out.join("store"),
        &format!("-signer-{}", &signer_sha256[..16]),
    ) {
        Some(m) => {
            let v: Value = serde_json::from_str(&super::vm::read_small(&m)?)
                .with_context(|| format!("parsing {}", m.display()))?;
            s(&v, "/manifest/signer/sha256").to_string()
        }
        None => String::new(),
    };
    Ok(Cold {
        build_job_s,
        build_cache,
        package_from,
        stored_signer,
        ..Cold::default()
    })
}

/// The first `<dir ending in suffix>/manifest.json` under `root`.
fn find_signed(root: &Path, suffix: &str) -> Option<PathBuf> {
    for e in fs::read_dir(root).ok()?.flatten() {
        let p = e.path();
        if !e.file_type().ok()?.is_dir() {
            continue;
        }
        if e.file_name().to_string_lossy().ends_with(suffix) && p.join("manifest.json").is_file() {
            return Some(p.join("manifest.json"));
        }
        if let Some(m) = find_signed(&p, suffix) {
            return Some(m);
        }
    }
    None
}

/// The Secrets a Job's pod mounts, as a JSON list.
fn secret_volumes(job: &Value) -> String {
    let names: Vec<&str> = job
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/secret/secretName").and_then(Value::as_str))
        .collect();
    serde_json::to_string(&names).unwrap_or_default()
}

/// Every terminated container's message in a pod list, one after another.
pub(super) fn messages(pods: &Value) -> String {
    let mut out = String::new();
    for p in items(pods) {
        for c in p
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(m) = c
                .pointer("/state/terminated/message")
                .and_then(Value::as_str)
            {
                out.push_str(m);
                out.push('\n');
            }
        }
    }
    out
}

/// The JSON documents of a text that holds several, one after another.
pub(super) fn json_stream(text: &str) -> Result<Vec<Value>> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .context("the Job's termination messages are not JSON documents")
}

pub(super) fn items(list: &Value) -> &[Value] {
    list["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
}

pub(super) fn s<'v>(v: &'v Value, ptr: &str) -> &'v str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

/// A message's lines joined by spaces, trailing spaces dropped.
pub(super) fn flatten(msg: &str) -> String {
    format!("{msg}\n")
        .replace('\n', " ")
        .trim_end_matches(' ')
        .to_string()
}

/// An apiserver timestamp (`2026-12-07T20:30:01Z`) in seconds since the
/// epoch, as jq's fromdateiso8601 reads it.
pub(super) fn parse_time(t: &str) -> Result<i64> {
    let bad = || anyhow::anyhow!("not a timestamp: {t:?}");
    let b = t.as_bytes();
    if b.len() != 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || b[19] != b'Z'
    {
        return Err(bad());
    }
    let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().map_err(|_| bad());
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Ok(days * 86400 + n(11..13)? * 3600 + n(14..16)? * 60 + n(17..19)?)
}

/// What the GPU pod reported.
pub(super) struct Gpu {
    pub(super) pod_scheduled_s: i64,
    pub(super) phase: String,
    pub(super) visible: String,
    pub(super) device_nodes: String,
    pub(super) pod_metric: String,
}

/// The exporter ready, then a pod holding a GPU (no toleration of the
/// startup taint) runs and reports.
pub(super) fn gpu_pod(ctx: &mut Ctx, images: &Images, st: &mut Clock) -> Result<Gpu> {
    st.stage("the exporter on the node")?;
    let exporters = [
        "-n",
        NS,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=gpu-driver-exporter",
    ];
    ctx.wait_for("the exporter's pod to be ready", |k| {
        Ok(k.poll(&exporters).is_some_and(|l| {
            l.pointer("/items/0/status/containerStatuses/0/ready") == Some(&Value::Bool(true))
        }))
    })?;
    let exporter_ip = s(&ctx.kube.json(&exporters)?, "/items/0/status/podIP").to_string();

    st.stage("a pod holding a GPU (no toleration of the startup taint)")?;
    let f = ctx.out.join("gpu-pod.yaml");
    fs::write(
        &f,
        manifests::gpu_pod(images.name("builder-bookworm")?, &exporter_ip),
    )?;
    ctx.kube.run(&["apply", "-f", &f.to_string_lossy()])?;
    // A pod the kubelet refuses (UnexpectedAdmissionError: the device
    // plugin's Allocate failed) ends Failed at once: say so now, not at
    // the deadline.
    ctx.wait_for("the GPU pod to run", |k| {
        let Some(p) = k.poll(&["get", "pod", "gpu-pod"]) else {
            return Ok(false);
        };
        match s(&p, "/status/phase") {
            "Running" => Ok(true),
            ph @ ("Failed" | "Succeeded") => bail!(
                "the GPU pod ended {ph} before running: {}: {}",
                s(&p, "/status/reason"),
                s(&p, "/status/message")
            ),
            _ => Ok(false),
        }
    })?;
    let running = ctx.kube.json_to(
        &["get", "pod", "gpu-pod"],
        &ctx.out.join("gpu-pod-running.json"),
    )?;
    let pod_scheduled_s = scheduled_after(&running)?;
    ctx.wait_for("the GPU pod's report", |k| {
        Ok(k.poll(&["get", "pod", "gpu-pod"])
            .is_some_and(|p| matches!(s(&p, "/status/phase"), "Succeeded" | "Failed")))
    })?;
    let pod = ctx
        .kube
        .json_to(&["get", "pod", "gpu-pod"], &ctx.out.join("gpu-pod.json"))?;
    let cuda = termination(&pod, "cuda");
    let g = Gpu {
        pod_scheduled_s,
        phase: s(&pod, "/status/phase").to_string(),
        visible: prefixed(&cuda, "NVIDIA_VISIBLE_DEVICES="),
        device_nodes: prefixed(&cuda, "devices: ")
            .trim_end_matches(' ')
            .to_string(),
        pod_metric: termination(&pod, "scrape")
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
    };
    log(&format!(
        "the GPU pod: NVIDIA_VISIBLE_DEVICES={}; device nodes {}; exporter: {}",
        g.visible, g.device_nodes, g.pod_metric
    ));
    Ok(g)
}

/// The pod's creationTimestamp → its PodScheduled condition, in seconds.
fn scheduled_after(pod: &Value) -> Result<i64> {
    let cond = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PodScheduled")
        .context("the GPU pod has no PodScheduled condition")?;
    Ok(parse_time(s(cond, "/lastTransitionTime"))?
        - parse_time(s(pod, "/metadata/creationTimestamp"))?)
}

/// The termination message of one container of a pod.
fn termination(pod: &Value, container: &str) -> String {
    pod.pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == container)
        .filter_map(|c| {
            c.pointer("/state/terminated/message")
                .and_then(Value::as_str)
        })
        .map(|m| format!("{m}\n"))
        .collect()
}

/// The rest of each line that starts with `prefix`, one per line.
fn prefixed(text: &str, prefix: &str) -> String {
    let v: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .collect();
    v.join("\n")
}

#[cfg(test)]
mod tests;
