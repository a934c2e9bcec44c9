//! Rolling driver upgrades: a few nodes at a time, cordoned, drained of GPU
//! pods and of the GPU Operator's operands (paused by their deploy labels)
//! before their install Job; after a version change, the toolkit's pod is
//! restarted so that its CDI specification names the new driver's files.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, EvictParams, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use super::context::{Context, Error};
use super::expect::{Kind, Slot};
use super::lookup::{driver_for_labels, facts};
use super::patch::{Change, NodeAnnotations, NodePatch, NodeSpecPatch, failure_patch};
use crate::crd::GpuDriver;
use crate::decide::{self, DrainStep, NodeFacts, UpgradeState};
use crate::keys;

/// The pods an upgrading node waits for: those that use an NVIDIA device
/// plugin resource (evicted), and those that run there only while a label
/// the upgrade takes away holds (the GPU Operator's paused operands, our
/// exporter, the device plugin: their DaemonSets delete them).
#[derive(Debug, Default)]
struct Holding {
    gpu: Vec<Pod>,
    followers: Vec<Pod>,
}

impl Holding {
    fn is_empty(&self) -> bool {
        self.gpu.is_empty() && self.followers.is_empty()
    }

    fn len(&self) -> usize {
        self.gpu.len() + self.followers.len()
    }

    /// `ns/name` of every pod, GPU pods first.
    fn names(&self) -> Vec<String> {
        self.gpu
            .iter()
            .chain(&self.followers)
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect()
    }
}

/// The pods on `node` that have not ended, sorted into [`Holding`];
/// `taken`: the labels the upgrade removes or pauses on it.
async fn holding(ctx: &Context, node: &str, taken: &[String]) -> Result<Holding, Error> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let list = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|e| Error::Kube(format!("listing the pods on node {node}"), e))?;
    let mut held = Holding::default();
    for p in list.items {
        let ended = matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if ended {
            continue;
        }
        if uses_gpu(&p) {
            held.gpu.push(p);
        } else if follows(&p, taken) {
            held.followers.push(p);
        }
    }
    Ok(held)
}

/// Does the pod's node selector name one of `taken`?
fn follows(pod: &Pod, taken: &[String]) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .is_some_and(|sel| decide::follows_labels(sel, taken))
}

/// Does any container of the pod request or limit an `nvidia.com/*`
/// resource?
pub(crate) fn uses_gpu(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .any(|r| {
            r.limits
                .iter()
                .chain(r.requests.iter())
                .flat_map(|m| m.keys())
                .any(|k| decide::is_gpu_resource(k))
        })
}

impl Context {
    /// The roll of `gd`'s nodes: (maxUnavailable as a count, nodes in
    /// progress, the node it stopped at). Every node a slot waits for
    /// looks at every cached node, so this reads their labels and
    /// annotations in place instead of copying each into [`NodeFacts`]
    /// (at 1000 nodes those copies were most of the operator's CPU).
    pub(super) fn roll(&self, gd: &GpuDriver) -> (u32, HashSet<String>, Option<String>) {
        let drivers = self.drivers.state();
        let owner = gd.metadata.name.as_deref();
        let mut gpu_nodes = 0u32;
        let mut busy = HashSet::new();
        let mut stopped = None;
        for n in self.nodes.state().iter() {
            let (labels, annotations) = (n.labels(), n.annotations());
            if driver_for_labels(&drivers, labels)
                .is_none_or(|d| d.metadata.name.as_deref() != owner)
            {
                continue;
            }
            if decide::gpu_presence_in(&gd.spec, labels, annotations) == decide::Gpu::Yes {
                gpu_nodes += 1;
            }
            let st = UpgradeState::in_annotations(annotations);
            if st.in_progress() {
                busy.insert(n.name_any());
            }
            if st == UpgradeState::Failed && stopped.is_none() {
                stopped = Some(n.name_any());
            }
        }
        let max = decide::max_unavailable(&gd.spec.upgrade_policy.max_unavailable, gpu_nodes);
        (max, busy, stopped)
    }

    /// Takes an upgrade slot for `node` if one is free and the roll is not
    /// stopped; the count and the reservation are one step under the
    /// expectations' lock, so that concurrent reconciles never overshoot.
    fn reserve_upgrade(&self, gd: &GpuDriver, node: &str) -> Slot {
        let (max, busy, stopped) = self.roll(gd);
        self.expect()
            .reserve_upgrade(node, busy, max, stopped.is_some())
    }

    /// An upgrade ended (installed, or the node left): wake nodes waiting
    /// for a slot.
    pub(super) fn upgrade_done(&self, node: &str) {
        let picked = self.expect().upgrade_done(node);
        for name in picked {
            let _ = self.wake.send(ObjectRef::new(&name));
        }
    }
}

/// One step of a node's driver upgrade. `None`: drained, go install;
/// `Some(action)`: not yet (no slot, still draining, failed).
pub(super) async fn upgrade(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    key: &str,
) -> Result<Option<Action>, Error> {
    let f = facts(node);
    let name = f.name.clone();
    let policy = &gd.spec.upgrade_policy;
    let now = Timestamp::now();
    let state = UpgradeState::of(&f);
    if state == UpgradeState::Installing {
        return Ok(None);
    }
    if state == UpgradeState::Idle {
        return start_upgrade(ctx, gd, node).await;
    }
    // Draining, or Failed with its backoff over (plan() held it back
    // until then): drain (again). Both states were written with the
    // paused operands' annotation, so the cached node shows it.
    let taken = decide::labels_taken(&decide::operands_paused(&f));
    let pods = holding(ctx, &name, &taken).await?;
    let started = if state == UpgradeState::Failed {
        None
    } else {
        decide::upgrade_started(&f)
    };
    match decide::drain_step(policy, pods.len(), started, now.as_second()) {
        DrainStep::Install => {
            let patch = NodePatch::annotations(NodeAnnotations {
                upgrade: Change::Set(UpgradeState::Installing),
                ..Default::default()
            });
            ctx.patch_node(&name, &patch).await?;
            ctx.event(
                node,
                EventType::Normal,
                "UpgradeDrained",
                "no GPU pod and no paused operand left on the node: installing".into(),
            )
            .await;
            Ok(None)
        }
        DrainStep::Drain => {
            if state == UpgradeState::Failed {
                // A retry after the backoff: the drain's clock starts anew.
                let patch = NodePatch::annotations(NodeAnnotations {
                    upgrade: Change::Set(UpgradeState::Draining),
                    upgrade_started: Change::Set(now.to_string()),
                    ..Default::default()
                });
                ctx.patch_node(&name, &patch).await?;
                ctx.event(
                    node,
                    EventType::Normal,
                    "UpgradeRetry",
                    format!("draining {} pod(s) again", pods.len()),
                )
                .await;
            }
            if policy.evict {
                evict(ctx, &name, &pods.gpu).await;
            }
            Ok(Some(Action::requeue(Duration::from_secs(2))))
        }
        DrainStep::TimedOut => drain_timed_out(ctx, gd, node, key, &pods).await.map(Some),
    }
}

/// The drain took longer than `drainTimeoutSeconds`: the node's upgrade
/// fails (counted for the backoff) and the roll stops there.
async fn drain_timed_out(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
    key: &str,
    pods: &Holding,
) -> Result<Action, Error> {
    let f = facts(node);
    let message = timeout_message(&gd.spec.upgrade_policy, pods);
    let attempts = decide::failures(&f, key) + 1;
    let mut patch = failure_patch(key, attempts, "DrainTimeout", &message, Timestamp::now());
    patch.metadata.annotations.upgrade = Change::Set(UpgradeState::Failed);
    ctx.patch_node(&f.name, &patch).await?;
    ctx.event(
        node,
        EventType::Warning,
        "UpgradeFailed",
        format!("DrainTimeout: {message}; the roll stops here"),
    )
    .await;
    ctx.metrics
        .inc("gpu_driver_upgrades_total", &[("step", "failed")]);
    let wait = decide::backoff_seconds(
        attempts,
        gd.spec.job.retry_base_seconds,
        gd.spec.job.retry_max_seconds,
    );
    Ok(Action::requeue(Duration::from_secs(wait.max(1))))
}

/// What a timed-out drain says: the pods still there, by kind and name.
fn timeout_message(policy: &crate::crd::UpgradePolicy, pods: &Holding) -> String {
    let mut parts = Vec::new();
    if !pods.gpu.is_empty() {
        let names: Vec<String> = pods.names().into_iter().take(pods.gpu.len()).collect();
        parts.push(format!(
            "GPU pods{}: {}",
            if policy.evict {
                " (evictions refused, e.g. by a PodDisruptionBudget)"
            } else {
                " (upgradePolicy.evict is false: waiting for them to end)"
            },
            names.join(", ")
        ));
    }
    if !pods.followers.is_empty() {
        let names: Vec<String> = pods.names().into_iter().skip(pods.gpu.len()).collect();
        parts.push(format!(
            "pods of DaemonSets whose node label the upgrade took away, not yet deleted (is the DaemonSet controller running?): {}",
            names.join(", ")
        ));
    }
    format!(
        "still on the node after {}s: {}",
        policy.drain_timeout_seconds,
        parts.join("; ")
    )
}

/// The node's turn in the roll, if a slot is free: cordon it (unless
/// someone else did), pause the GPU Operator's operands there, record the
/// start, and go straight to installing when no pod holds the driver.
async fn start_upgrade(
    ctx: &Context,
    gd: &GpuDriver,
    node: &Node,
) -> Result<Option<Action>, Error> {
    let f = facts(node);
    let name = f.name.clone();
    let now = Timestamp::now();
    match ctx.reserve_upgrade(gd, &name) {
        Slot::Reserved => {}
        Slot::Started => return Ok(Some(Action::requeue(Duration::from_secs(2)))),
        Slot::Full => return Ok(Some(Action::requeue(Duration::from_secs(30)))),
    }
    let pause = decide::operands_to_pause(&gd.spec.upgrade_policy.gpu_operator_operands, &f);
    let pods = holding(ctx, &name, &decide::labels_taken(&pause)).await?;
    let cordon = !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let next = if pods.is_empty() {
        UpgradeState::Installing
    } else {
        UpgradeState::Draining
    };
    let mut patch = NodePatch::annotations(NodeAnnotations {
        upgrade: Change::Set(next),
        upgrade_started: Change::Set(now.to_string()),
        upgrade_cordoned: Change::Set(cordon.to_string()),
        ..Default::default()
    });
    if !pause.is_empty() {
        patch.metadata.annotations.paused_operands = Change::Set(pause.join(","));
        for operand in &pause {
            let label = decide::deploy_label(operand);
            let paused = Some(decide::OPERAND_PAUSED.to_string());
            patch.metadata.labels.operands.insert(label, paused);
        }
    }
    if f.labels.contains_key(keys::READY_LABEL) {
        // Its turn: the ready label goes with the cordon.
        patch.metadata.labels.ready = Change::Remove;
    }
    if cordon {
        patch.spec = Some(NodeSpecPatch {
            unschedulable: Some(true),
            ..Default::default()
        });
    }
    if let Err(e) = ctx.patch_node(&name, &patch).await {
        // Not started after all: the next reconcile may try again.
        ctx.expect().forget(Kind::UpgradeStarted, &name);
        return Err(e);
    }
    if cordon {
        ctx.expect().expect(Kind::Cordoned, &name, "");
    }
    let note = started_note(gd, &f, cordon, &pods, &pause);
    ctx.event(node, EventType::Normal, "UpgradeStarted", note)
        .await;
    ctx.metrics
        .inc("gpu_driver_upgrades_total", &[("step", "started")]);
    Ok(match next {
        UpgradeState::Installing => None,
        _ => Some(Action::requeue(Duration::from_secs(1))),
    })
}

/// The UpgradeStarted Event's note: from which driver to which, and
/// whether this roll cordoned the node.
fn started_note(
    gd: &GpuDriver,
    f: &NodeFacts,
    cordon: bool,
    pods: &Holding,
    paused: &[String],
) -> String {
    let from = f
        .annotations
        .get(keys::DRIVER_VERSION)
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    let to = gd
        .spec
        .driver
        .version
        .clone()
        .unwrap_or_else(|| "the catalog's".into());
    let paused = if paused.is_empty() {
        String::new()
    } else {
        format!("; GPU Operator operands paused: {}", paused.join(", "))
    };
    format!(
        "driver {from} → {to} ({}): {}; {} GPU pod(s) to drain, {} pod(s) to leave{paused}",
        gd.spec.driver.flavor.as_str(),
        if cordon {
            "cordoned"
        } else {
            "already cordoned by someone else, left so"
        },
        pods.gpu.len(),
        pods.followers.len(),
    )
}

/// One eviction call's deadline: the drain loop comes back every 2 s and
/// its timeout must hold, whatever the apiserver or the client does.
const EVICT_DEADLINE: Duration = Duration::from_secs(10);

/// Evicts each pod through the Eviction API, so that PodDisruptionBudgets
/// decide; a refusal (429) is left for the next look.
async fn evict(ctx: &Context, node: &str, pods: &[Pod]) {
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ns = p.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        ctx.metrics.write("create", "pods/eviction");
        let (name, params) = (p.name_any(), EvictParams::default());
        let call = api.evict(&name, &params);
        let Ok(answer) = tokio::time::timeout(EVICT_DEADLINE, call).await else {
            tracing::warn!(
                "node {node}: evicting {ns}/{}: no answer within {}s; trying again later",
                p.name_any(),
                EVICT_DEADLINE.as_secs()
            );
            continue;
        };
        match answer {
            Ok(_) => tracing::info!("node {node}: evicted {ns}/{}", p.name_any()),
            Err(kube::Error::Api(e)) if e.code == 429 => {
                tracing::info!(
                    "node {node}: eviction of {ns}/{} refused for now: {}",
                    p.name_any(),
                    e.message
                );
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!("node {node}: evicting {ns}/{}: {e}", p.name_any()),
        }
    }
}

/// After a driver version change on `node`: evicts the GPU Operator's
/// container toolkit pod there (by `upgradePolicy.toolkitPodLabels`), so
/// that its DaemonSet starts a new one, which writes a CDI specification
/// naming the new driver's versioned library files; the old one names files
/// that are gone. Returns the pods asked to go.
pub(super) async fn restart_toolkit(ctx: &Context, gd: &GpuDriver, node: &str) -> Vec<String> {
    let labels = &gd.spec.upgrade_policy.toolkit_pod_labels;
    if labels.is_empty() {
        return Vec::new();
    }
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let params = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(&selector.join(","));
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let pods = match tokio::time::timeout(EVICT_DEADLINE, api.list(&params)).await {
        Ok(Ok(list)) => list.items,
        Ok(Err(e)) => {
            tracing::warn!("node {node}: listing the toolkit's pods: {e}");
            return Vec::new();
        }
        Err(_) => {
            tracing::warn!("node {node}: listing the toolkit's pods: no answer in time");
            return Vec::new();
        }
    };
    evict(ctx, node, &pods).await;
    pods.iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, selector: Option<(&str, &str)>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {
                "containers": [],
                "nodeSelector": selector.map(|(k, v)| serde_json::json!({k: v})),
            }
        }))
        .unwrap()
    }

    /// A timed-out drain names every pod still there, GPU pods and the
    /// paused operands' pods apart; a pod selecting a label the upgrade did
    /// not take is not waited for.
    #[test]
    fn a_timed_out_drain_names_what_still_holds_the_node() {
        let taken = decide::labels_taken(&["dcgm-exporter".to_string()]);
        let dcgm = pod(
            "gpu-operator",
            "nvidia-dcgm-exporter-x",
            Some(("nvidia.com/gpu.deploy.dcgm-exporter", "true")),
        );
        let toolkit = pod(
            "gpu-operator",
            "toolkit-x",
            Some(("nvidia.com/gpu.deploy.container-toolkit", "true")),
        );
        assert!(follows(&dcgm, &taken));
        assert!(!follows(&toolkit, &taken));
        assert!(!follows(&pod("a", "b", None), &taken));
        let held = Holding {
            gpu: vec![pod("work", "train-1", None)],
            followers: vec![dcgm],
        };
        let policy = crate::crd::UpgradePolicy {
            drain_timeout_seconds: 600,
            ..Default::default()
        };
        assert_eq!(
            timeout_message(&policy, &held),
            "still on the node after 600s: GPU pods (evictions refused, e.g. by a PodDisruptionBudget): work/train-1; \
             pods of DaemonSets whose node label the upgrade took away, not yet deleted (is the DaemonSet controller running?): gpu-operator/nvidia-dcgm-exporter-x"
        );
        assert_eq!(held.len(), 2);
    }
}
