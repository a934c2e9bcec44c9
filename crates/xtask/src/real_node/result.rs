//! The assertions over what the run saw, and the result line
//! (docs/real-node.md lists its fields).

use std::fs;

use anyhow::{Result, bail};
use serde::Serialize;
use serde::ser::SerializeMap as _;
use serde_json::Value;

use super::chain::Cold;
use super::jobs::{Gpu, s};
use super::kube::{Ctx, node};
use super::reboot::Warm;
use super::vm::Images;
use super::{log, secs};

const GPU_UUID: &str = "GPU-6f3c2a1e-0b7d-4c5e-9a21-3d4e5f607182";

/// Each check logged `ok:` or `FAILED:`; any failure fails the run.
pub(super) fn assert_all(
    ctx: &Ctx,
    images: &Images,
    release: &str,
    c: &Cold,
    g: &Gpu,
    w: &Warm,
) -> Result<()> {
    let mut failed = false;
    let mut check = |d: String, ok: bool| {
        log(&format!("{}: {d}", if ok { "ok" } else { "FAILED" }));
        failed |= !ok;
    };
    let os_image = s(&c.node, "/status/nodeInfo/osImage");
    let kernel = s(&c.node, "/status/nodeInfo/kernelVersion");
    let installer = images.name("installer")?;
    check(
        format!("the node reports Garden Linux ({os_image})"),
        os_image == "Garden Linux 1877.3",
    );
    check(
        format!("the node reports the VM's kernel ({kernel})"),
        kernel == release,
    );
    check(
        format!("the operator recorded the verified install ({})", c.outcome),
        c.outcome == "Installed",
    );
    check_jobs(ctx, installer, c, &mut check);
    check_node_and_pods(c, g, &mut check)?;
    check_reboots(ctx, installer, w, &mut check);
    if failed {
        log(&format!(
            "assertions failed; work files in {}",
            ctx.out.display()
        ));
        bail!("assertions failed");
    }
    Ok(())
}

/// What the build and install Jobs did and ran with.
fn check_jobs(ctx: &Ctx, installer: &str, c: &Cold, check: &mut impl FnMut(String, bool)) {
    let read = |f: &str| fs::read_to_string(ctx.out.join(f)).unwrap_or_default();
    let verified = "\"reason\":\"Verified\"";
    check(
        "the installer's result says Verified".into(),
        read("termination-message.json").contains(verified),
    );
    check(
        "the build Job's result says Built".into(),
        read("build-message.json").contains("\"reason\":\"Built\""),
    );
    check(
        format!(
            "the build Job compiled on the node: the cache was empty ({})",
            c.build_cache
        ),
        c.build_cache == "Miss",
    );
    check(
        format!(
            "the build Job took the package from the store's mirror ({})",
            c.package_from
        ),
        c.package_from.contains("/packages/"),
    );
    let signer = if c.stored_signer.is_empty() {
        "none"
    } else {
        &c.stored_signer
    };
    check(
        format!(
            "the build Job signed the module: the store's entry names the certificate ({signer})"
        ),
        c.stored_signer == c.signer_sha256,
    );
    check(
        format!("the install Job mounts no Secret ({})", c.install_mounts),
        c.install_mounts == "[]",
    );
    check(
        format!(
            "the install Job ran in the installer image alone ({})",
            c.job_image
        ),
        c.job_image == installer,
    );
    check(
        "the install Job may not compile (--no-compile)".into(),
        c.job_args.contains("--no-compile"),
    );
    check(
        "no detect Job was needed: the node is not annotated gpu=false".into(),
        c.annotations
            .get("gpu-driver.gardenlinux.io/gpu")
            .and_then(Value::as_str)
            != Some("false"),
    );
}

fn check_node_and_pods(c: &Cold, g: &Gpu, check: &mut impl FnMut(String, bool)) -> Result<()> {
    let label = node::ready_label(&c.node);
    check(
        format!("the node carries the ready label ({label})"),
        label == "true",
    );
    let taints = serde_json::to_string(&node::taint_keys(&c.node))?;
    check(
        format!("the startup taint is gone ({taints})"),
        !node::tainted(&c.node),
    );
    check(
        "the observer pod ran from before the install and exited 0".into(),
        c.observer
            .pointer("/status/containerStatuses/0/state/terminated/exitCode")
            == Some(&Value::from(0)),
    );
    check(
        format!(
            "the observer pod, started before the install, sees the driver root ({})",
            c.seen
        ),
        has_word(&c.seen, "usr/bin/nvidia-smi"),
    );
    check(
        format!(
            "the Node offers nvidia.com/gpu = the profile's 1 ({})",
            c.gpus_offered
        ),
        c.gpus_offered == "1",
    );
    check(
        "the GPU pod, not tolerating the startup taint, ran and exited 0".into(),
        g.phase == "Succeeded",
    );
    check(
        format!(
            "the GPU pod sees NVIDIA_VISIBLE_DEVICES = the profile's GPU ({})",
            g.visible
        ),
        g.visible == GPU_UUID,
    );
    check(
        format!(
            "the node has the installer's device nodes ({})",
            g.device_nodes
        ),
        has_word(&g.device_nodes, "nvidia0"),
    );
    check(
        format!(
            "the exporter names the pod on its GPU, with the profile's utilization ({})",
            g.pod_metric
        ),
        names_pod(&g.pod_metric),
    );
    Ok(())
}

fn check_reboots(ctx: &Ctx, installer: &str, w: &Warm, check: &mut impl FnMut(String, bool)) {
    check(
        format!(
            "the reboot gave a new boot ID ({} -> {})",
            w.boot_id_before, w.boot_id_after
        ),
        w.boot_id_before != w.boot_id_after,
    );
    check(
        "after the reboot the ready label went off".into(),
        w.saw_unready,
    );
    check(
        "after the reboot the startup taint came back".into(),
        w.saw_taint,
    );
    check(
        "after the reboot allocatable dropped to 0".into(),
        w.saw_zero,
    );
    check(
        format!(
            "the reinstall is recorded for the new boot ({}, {})",
            w.reinstall_state, w.reinstall_boot
        ),
        w.reinstall_state == "Installed" && w.reinstall_boot == w.boot_id_after,
    );
    let uid_now = ctx
        .kube
        .node()
        .map(|n| node::uid(&n).to_string())
        .unwrap_or_default();
    check(
        "the joining node is a new Node object".into(),
        uid_now != w.node_uid_before,
    );
    check(
        "the new node's install says Verified".into(),
        w.warm_message.contains("\"reason\":\"Verified\""),
    );
    check(
        format!(
            "the new node's install ran in the installer image alone ({})",
            w.warm_image
        ),
        w.warm_image == installer,
    );
    check(
        format!(
            "no build Job for the new node ({} before, {} after)",
            w.builds_before, w.builds_after
        ),
        w.builds_before == w.builds_after,
    );
    let bytes = w
        .bytes_warm
        .as_ref()
        .map(Value::to_string)
        .unwrap_or_default();
    check(
        format!("the new node's install downloaded the artifact ({bytes} bytes)"),
        w.bytes_warm
            .as_ref()
            .and_then(Value::as_u64)
            .is_some_and(|b| b > 0),
    );
}

/// `needle` in `hay` between non-word characters (`grep -w`).
fn has_word(hay: &str, needle: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    hay.match_indices(needle).any(|(i, _)| {
        !word(hay[..i].chars().next_back()) && !word(hay[i + needle.len()..].chars().next())
    })
}

/// The exporter's line names the profile's GPU, the pod and its
/// utilization (37).
fn names_pod(line: &str) -> bool {
    let after = |hay: &str, pat: &str| hay.find(pat).map(|i| hay[i + pat.len()..].to_string());
    after(line, &format!("UUID=\"{GPU_UUID}\""))
        .and_then(|r| after(&r, "namespace=\"default\""))
        .and_then(|r| after(&r, "pod=\"gpu-pod\""))
        .is_some_and(|r| r.ends_with(" 37"))
}

/// images.json's sizes in its order.
struct Sizes<'a>(&'a Images);

impl Serialize for Sizes<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut m = ser.serialize_map(Some(self.0.list.len()))?;
        for (k, i) in &self.0.list {
            m.serialize_entry(k, &i.bytes)?;
        }
        m.end()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Line<'a> {
    node_ready_seconds: &'a Value,
    node_ready_to_allocatable_seconds: Value,
    install_job_seconds: &'a Value,
    install_job_image: &'a str,
    install_job_image_bytes: Option<u64>,
    pod_scheduled_seconds: i64,
    join_cold_seconds: Value,
    build_job_seconds: i64,
    join_warm_seconds: Value,
    bytes_downloaded_warm: &'a Value,
    signer: &'a str,
    reboot_to_allocatable_seconds: Value,
    new_boot_id_to_allocatable_seconds: Value,
    allocatable: Value,
    pod_gpu_metric: &'a str,
    device_nodes_seen: Vec<&'a str>,
    outcome: &'a str,
    annotations: &'a serde_json::Map<String, Value>,
    driver_root_seen: Vec<&'a str>,
    images: Sizes<'a>,
    kernel_release: &'a str,
}

/// The result line (one JSON object).
pub(super) fn line(images: &Images, release: &str, c: &Cold, g: &Gpu, w: &Warm) -> Result<String> {
    let bytes = images
        .list
        .iter()
        .find(|(k, _)| k == "installer")
        .map(|(_, i)| i.bytes);
    let l = Line {
        node_ready_seconds: &c.node_ready_s,
        node_ready_to_allocatable_seconds: secs(c.ready_at, c.allocatable_at),
        install_job_seconds: &c.job_s,
        install_job_image: &c.job_image,
        install_job_image_bytes: bytes,
        pod_scheduled_seconds: g.pod_scheduled_s,
        join_cold_seconds: secs(c.selected_at, c.annotated_at),
        build_job_seconds: c.build_job_s,
        join_warm_seconds: secs(w.join_at, w.joined_at),
        bytes_downloaded_warm: w.bytes_warm.as_ref().unwrap_or(&Value::Null),
        signer: &c.stored_signer,
        reboot_to_allocatable_seconds: secs(w.reboot_start, w.back_at),
        new_boot_id_to_allocatable_seconds: secs(w.reboot_at, w.back_at),
        allocatable: serde_json::from_str(&c.gpus_offered)?,
        pod_gpu_metric: &g.pod_metric,
        device_nodes_seen: split(&g.device_nodes),
        outcome: &c.outcome,
        annotations: &c.annotations,
        driver_root_seen: split(&c.seen),
        images: Sizes(images),
        kernel_release: release,
    };
    Ok(serde_json::to_string(&l)?)
}

/// jq's `split(" ")`: none for an empty string.
fn split(s: &str) -> Vec<&str> {
    if s.is_empty() {
        Vec::new()
    } else {
        s.split(' ').collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_words_like_grep() {
        assert!(super::has_word("nvidia0 nvidiactl", "nvidia0"));
        assert!(!super::has_word("nvidia01 nvidiactl", "nvidia0"));
        assert!(super::has_word(
            "etc/x usr/bin/nvidia-smi usr/lib",
            "usr/bin/nvidia-smi"
        ));
        assert!(!super::has_word(
            "usr/bin/nvidia-smi2",
            "usr/bin/nvidia-smi"
        ));
    }

    #[test]
    fn finds_the_pod_in_the_metric() {
        let l = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-6f3c2a1e-0b7d-4c5e-9a21-3d4e5f607182\",pci_bus_id=\"00000000:3B:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node-1\",DCGM_FI_DRIVER_VERSION=\"580.178.04\",container=\"cuda\",namespace=\"default\",pod=\"gpu-pod\"} 37";
        assert!(super::names_pod(l));
        assert!(!super::names_pod(&l.replace(" 37", " 38")));
        assert!(!super::names_pod(&l.replace("gpu-pod", "other")));
    }

    #[test]
    fn splits_like_jq() {
        assert!(super::split("").is_empty());
        assert_eq!(super::split("nvidia0 nvidiactl"), ["nvidia0", "nvidiactl"]);
    }
}
