//! The guest's reboots: the reinstall on the same Node after a reboot, and
//! the warm join of a new Node object for the same VM.

use std::fs;

use anyhow::Result;
use serde_json::Value;

use super::jobs::{BUILD, items, json_stream, messages, s};
use super::kube::{Ctx, node};
use super::vm::Images;
use super::{Clock, NODE, NS, log, manifests, now};

/// What the reboots left to check and report.
pub(super) struct Warm {
    pub(super) reboot_start: f64,
    pub(super) reboot_at: f64,
    pub(super) back_at: f64,
    pub(super) boot_id_before: String,
    pub(super) boot_id_after: String,
    pub(super) saw_unready: bool,
    pub(super) saw_zero: bool,
    pub(super) saw_taint: bool,
    pub(super) reinstall_state: String,
    pub(super) reinstall_boot: String,
    pub(super) node_uid_before: String,
    pub(super) builds_before: usize,
    pub(super) builds_after: usize,
    pub(super) join_at: f64,
    pub(super) joined_at: f64,
    pub(super) warm_image: String,
    pub(super) warm_message: String,
    pub(super) bytes_warm: Option<Value>,
}

/// What the Node went through after the reboot, watched every second.
#[derive(Default)]
struct Seen {
    unready: bool,
    zero: bool,
    taint: bool,
}

impl Seen {
    /// Records one look at the Node; true once all three were seen and the
    /// Node is back: label on, one GPU, no startup taint.
    fn back(&mut self, n: &Value) -> bool {
        let (label, gpus, tainted) = (
            node::ready_label(n) == "true",
            node::gpus(n),
            node::tainted(n),
        );
        self.unready |= !label;
        self.zero |= gpus == "0";
        self.taint |= tainted;
        self.unready && self.zero && self.taint && label && gpus == "1" && !tainted
    }
}

pub(super) fn both(ctx: &mut Ctx, images: &Images, st: &mut Clock) -> Result<Warm> {
    st.stage("reboot: same disk, new boot ID; the reinstall")?;
    let builder = images.name("builder-bookworm")?;
    let boot_id_before = node::boot_id(&ctx.kube.json(&["get", "node", NODE])?).to_string();
    let f = ctx.out.join("reboot.yaml");
    fs::write(&f, manifests::reboot("reboot", 1, builder))?;
    let reboot_start = now();
    ctx.restart_deadline(2);
    ctx.kube.run(&["apply", "-f", &f.to_string_lossy()])?;
    // An unreadable Node is no new boot ID.
    ctx.wait_for("a new boot ID", |k| {
        Ok(k.node()
            .is_some_and(|n| !node::boot_id(&n).is_empty() && node::boot_id(&n) != boot_id_before))
    })?;
    let reboot_at = now();
    log("new boot ID; watching the node");
    let mut seen = Seen::default();
    ctx.wait_for(
        "the label, the taint's removal and allocatable back after the reboot",
        |k| Ok(k.node().is_some_and(|n| seen.back(&n))),
    )?;
    let back_at = now();
    let after = ctx.kube.json_to(
        &["get", "node", NODE],
        &ctx.out.join("node-after-reboot.json"),
    )?;
    let ann = |k: &str| node::annotation(&after, k).unwrap_or("null").to_string();
    let reinstall_state = ann("gpu-driver.gardenlinux.io/state");
    let reinstall_boot = ann("gpu-driver.gardenlinux.io/boot-id");
    let boot_id_after = node::boot_id(&after).to_string();
    log(&format!(
        "back after the reboot: {reinstall_state} for boot {reinstall_boot}"
    ));
    let w = Warm {
        reboot_start,
        reboot_at,
        back_at,
        boot_id_before,
        boot_id_after,
        saw_unready: seen.unready,
        saw_zero: seen.zero,
        saw_taint: seen.taint,
        reinstall_state,
        reinstall_boot,
        node_uid_before: String::new(),
        builds_before: 0,
        builds_after: 0,
        join_at: 0.0,
        joined_at: 0.0,
        warm_image: String::new(),
        warm_message: String::new(),
        bytes_warm: None,
    };
    warm_join(ctx, builder, st, w)
}

/// The same VM comes back as a new Node: the Node object is deleted while
/// the VM reboots, so its kubelet registers a fresh one (no annotations,
/// no labels but its own) and NFD's label is put on as it appears. Nothing
/// is compiled: the install Job reads the artifact from the cache. In this
/// one-node cluster the operator's own pod restarts with the node, which a
/// cluster with a system pool would not wait for.
fn warm_join(ctx: &mut Ctx, builder: &str, st: &mut Clock, mut w: Warm) -> Result<Warm> {
    st.stage("a new node joins, the cache warm")?;
    w.node_uid_before = node::uid(&ctx.kube.json(&["get", "node", NODE])?).to_string();
    let boot_before_join = w.boot_id_after.clone();
    w.builds_before = items(&ctx.kube.json(&["-n", NS, "get", "jobs", "-l", BUILD])?).len();
    let f = ctx.out.join("reboot-join.yaml");
    fs::write(&f, manifests::reboot("reboot-join", 3, builder))?;
    ctx.restart_deadline(3);
    ctx.kube.run(&["apply", "-f", &f.to_string_lossy()])?;
    ctx.wait_for("the reboot pod to run", |k| {
        Ok(k.poll(&["get", "pod", "reboot-join"])
            .is_some_and(|p| s(&p, "/status/phase") == "Running"))
    })?;
    ctx.kube.run(&["delete", "node", NODE, "--wait=false"])?;
    let uid_before = w.node_uid_before.clone();
    ctx.wait_for("the node to register again", |k| {
        Ok(k.node().is_some_and(|n| {
            let (uid, boot) = (node::uid(&n), node::boot_id(&n));
            !uid.is_empty() && uid != uid_before && !boot.is_empty() && boot != boot_before_join
        }))
    })?;
    ctx.kube.run(&[
        "label",
        "node",
        NODE,
        "feature.node.kubernetes.io/pci-10de.present=true",
    ])?;
    ctx.wait_for("the new Node to be Ready", |k| {
        Ok(k.node().is_some_and(|n| node::ready(&n)))
    })?;
    w.join_at = now();
    ctx.wait_for("the install on the new node", |k| {
        Ok(k.node().is_some_and(|n| node::state(&n) == "Installed"))
    })?;
    w.joined_at = now();
    warm_install(ctx, &mut w)?;
    Ok(w)
}

/// The new node's install Job: its image, its result and what it
/// downloaded; the build Jobs, still as many.
fn warm_install(ctx: &Ctx, w: &mut Warm) -> Result<()> {
    let installs = ctx.kube.json(&[
        "-n",
        NS,
        "get",
        "jobs",
        "-l",
        "gpu-driver.gardenlinux.io/role=install",
    ])?;
    // The newest install Job (the last of the newest, as kubectl --sort-by).
    let warm_job = items(&installs)
        .iter()
        .max_by(|a, b| s(a, "/metadata/creationTimestamp").cmp(s(b, "/metadata/creationTimestamp")))
        .map(|j| s(j, "/metadata/name").to_string())
        .unwrap_or_default();
    let pods_file = ctx.out.join("warm-job-pods.json");
    let pods = ctx.kube.json_to(
        &[
            "-n",
            NS,
            "get",
            "pods",
            "-l",
            &format!("job-name={warm_job}"),
        ],
        &pods_file,
    )?;
    w.warm_message = messages(&pods);
    fs::write(
        ctx.out.join("warm-termination-message.json"),
        &w.warm_message,
    )?;
    w.bytes_warm = json_stream(&w.warm_message)?.iter().find_map(|v| {
        v.pointer("/status/bytesDownloaded")
            .filter(|b| !b.is_null())
            .cloned()
    });
    let job = ctx.kube.json(&["-n", NS, "get", "job", &warm_job])?;
    w.warm_image = s(&job, "/spec/template/spec/containers/0/image").to_string();
    w.builds_after = items(&ctx.kube.json(&["-n", NS, "get", "jobs", "-l", BUILD])?).len();
    log(&format!(
        "the new node installed from the cache: Job {warm_job} ({}), {} bytes downloaded",
        w.warm_image,
        w.bytes_warm
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default()
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn watches_the_node_come_back() {
        let up = json!({"metadata": {"labels": {"gpu-driver.gardenlinux.io/ready": "true"}},
                        "status": {"allocatable": {"nvidia.com/gpu": "1"}}});
        let down = json!({"metadata": {"labels": {}},
                          "spec": {"taints": [{"key": "gpu-driver.gardenlinux.io/driver-not-ready"}]},
                          "status": {"allocatable": {"nvidia.com/gpu": "0"}}});
        let mut seen = super::Seen::default();
        assert!(!seen.back(&up), "back before it went away");
        assert!(!seen.back(&down));
        assert!(seen.unready && seen.zero && seen.taint);
        assert!(seen.back(&up));
    }
}
