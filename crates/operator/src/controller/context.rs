//! What every reconcile shares: the caches, the client, the expectations
//! store, Events, and the few writes made the same way everywhere.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};

use super::expect::{Expectations, Kind};
use super::lookup::{driver_for, facts, job_is_terminal};
use super::patch::NodePatch;
use crate::crd::{GpuDriver, TargetStatus};
use crate::decide::{JobRole, NodeFacts};
use crate::keys;
use crate::metrics::Metrics;
use gpu_driver_contract::text::truncate;

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("{0}: {1}")]
    Kube(String, #[source] kube::Error),
}

#[derive(Debug, Clone)]
pub struct Options {
    /// Where the Jobs run (the operator's own namespace).
    pub namespace: String,
    /// This instance, for Events.
    pub instance: String,
    /// How often the GpuDriver status is recomputed (written only when
    /// it changed).
    pub status_interval: Duration,
}

/// Nodes waiting for a target's build Job, by target key: a build Job's
/// change wakes them (it serves no node of its own).
pub(super) type Waiters = Arc<Mutex<HashMap<String, HashSet<String>>>>;

/// An Event's object (kind/namespace/name), reason and action.
type EventKey = (String, String, String);

/// kube's Recorder folds an Event into an earlier one with the same
/// object, reason and action, keeping the first one's note: a second
/// upgrade's `UpgradeStarted` would show the first upgrade's versions. So
/// each (object, reason, action) keeps a recorder for as long as its note
/// stays the same; a new note gets a new recorder, and so a new Event.
/// Bounded by nodes x reasons.
pub(super) struct Events {
    client: Client,
    reporter: Reporter,
    by_key: Mutex<HashMap<EventKey, (Option<String>, Recorder)>>,
}

impl Events {
    pub(super) fn new(client: Client, reporter: Reporter) -> Events {
        Events {
            client,
            reporter,
            by_key: Mutex::new(HashMap::new()),
        }
    }

    /// The recorder whose folding is true for `ev`'s note.
    pub(super) fn recorder_for(&self, regarding: &ObjectReference, ev: &Event) -> Recorder {
        let key = (
            format!(
                "{}/{}/{}",
                regarding.kind.as_deref().unwrap_or_default(),
                regarding.namespace.as_deref().unwrap_or_default(),
                regarding.name.as_deref().unwrap_or_default()
            ),
            ev.reason.clone(),
            ev.action.clone(),
        );
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&key) {
            Some((note, r)) if *note == ev.note => r.clone(),
            _ => {
                let r = Recorder::new(self.client.clone(), self.reporter.clone());
                map.insert(key, (ev.note.clone(), r.clone()));
                r
            }
        }
    }
}

pub(crate) struct Context {
    pub(super) client: Client,
    pub(super) opts: Options,
    pub(super) nodes: Store<Node>,
    pub(super) jobs: Store<Job>,
    pub(super) pods: Store<Pod>,
    pub(super) drivers: Store<GpuDriver>,
    pub(super) events: Events,
    pub metrics: Arc<Metrics>,
    pub(super) expect: Mutex<Expectations>,
    pub(super) wake: tokio::sync::mpsc::UnboundedSender<ObjectRef<Node>>,
    /// Build targets by GpuDriver and target key; what `status.targets`
    /// shows and where it is seeded from after a restart.
    pub(super) targets: Mutex<HashMap<(String, String), TargetStatus>>,
    pub(super) waiters: Waiters,
}

/// The reflector caches the reconciles read.
pub(super) struct Caches {
    pub(super) nodes: Store<Node>,
    pub(super) jobs: Store<Job>,
    pub(super) pods: Store<Pod>,
    pub(super) drivers: Store<GpuDriver>,
}

impl Context {
    pub(super) fn new(
        client: Client,
        opts: Options,
        metrics: Arc<Metrics>,
        caches: Caches,
        wake: tokio::sync::mpsc::UnboundedSender<ObjectRef<Node>>,
    ) -> Context {
        let events = Events::new(
            client.clone(),
            Reporter {
                controller: "gpu-driver-operator".into(),
                instance: Some(opts.instance.clone()),
            },
        );
        Context {
            client,
            opts,
            nodes: caches.nodes,
            jobs: caches.jobs,
            pods: caches.pods,
            drivers: caches.drivers,
            events,
            metrics,
            expect: Mutex::new(Expectations::default()),
            wake,
            targets: Mutex::new(HashMap::new()),
            waiters: Waiters::default(),
        }
    }

    pub(super) fn job_ref(&self, name: &str) -> ObjectRef<Job> {
        ObjectRef::new(name).within(&self.opts.namespace)
    }

    pub(super) fn pods_of(&self, job: &str) -> Vec<Arc<Pod>> {
        self.pods.state_filter(|p| {
            p.labels()
                .get("batch.kubernetes.io/job-name")
                .or_else(|| p.labels().get("job-name"))
                .is_some_and(|j| j == job)
        })
    }

    pub(super) fn expect(&self) -> std::sync::MutexGuard<'_, Expectations> {
        self.expect.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The nodes whose GpuDriver is `gd`.
    pub(super) fn selected_nodes(&self, gd: &GpuDriver) -> Vec<NodeFacts> {
        let drivers = self.drivers.state();
        let owner = gd.name_any();
        self.nodes
            .state()
            .iter()
            .map(|n| facts(n))
            .filter(|n| driver_for(&drivers, n).is_some_and(|d| d.name_any() == owner))
            .collect()
    }

    /// Install Jobs of this GpuDriver still running (from the cache, plus
    /// those just created).
    pub(super) fn active_installs(&self, gd: &GpuDriver) -> usize {
        let owner = gd.name_any();
        let expect = self.expect();
        let mut names: HashSet<String> = self
            .jobs
            .state()
            .iter()
            .filter(|j| {
                j.labels().get(keys::OWNER_LABEL) == Some(&owner)
                    && j.labels().get(keys::ROLE_LABEL).map(String::as_str) == Some("install")
                    && !job_is_terminal(j)
                    && !expect.holds(Kind::JobHandled, &j.name_any())
            })
            .map(|j| j.name_any())
            .collect();
        names.extend(expect.recently_created().map(String::from));
        names.len()
    }

    /// Build Jobs still running in the operator's namespace, whichever
    /// GpuDriver started them (from the cache, plus those just created):
    /// `build.maxParallel` is a cap on the whole cluster's compiles.
    pub(super) fn active_builds(&self) -> usize {
        let expect = self.expect();
        let build = JobRole::Build.as_str();
        let mut names: HashSet<String> = self
            .jobs
            .state()
            .iter()
            .filter(|j| {
                j.labels().get(keys::ROLE_LABEL).map(String::as_str) == Some(build)
                    && !job_is_terminal(j)
                    && !expect.holds(Kind::JobHandled, &j.name_any())
            })
            .map(|j| j.name_any())
            .collect();
        let prefix = format!("gpu-{build}-");
        names.extend(
            expect
                .recently_created()
                .filter(|n| n.starts_with(&prefix))
                .map(String::from),
        );
        names.len()
    }

    pub(super) async fn patch_node(&self, node: &str, patch: &NodePatch) -> Result<(), Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        self.metrics.write("patch", "nodes");
        api.patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| Error::Kube(format!("patching node {node}"), e))?;
        Ok(())
    }

    pub(super) async fn event(&self, node: &Node, type_: EventType, reason: &str, note: String) {
        self.publish(node, "InstallDriver", type_, reason, note)
            .await;
    }

    /// Records an Event about `obj`. An Event is information: failing to
    /// record one must not stop a reconcile.
    pub(super) async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        action: &str,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.metrics.write("create", "events");
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(&note, 1000)),
            action: action.into(),
            secondary: None,
        };
        let reference = obj.object_ref(&());
        let recorder = self.events.recorder_for(&reference, &ev);
        if let Err(e) = recorder.publish(&ev, &reference).await {
            let name = obj.meta().name.clone().unwrap_or_default();
            tracing::warn!("event {reason} for {} {name}: {e}", K::kind(&()));
        }
    }

    pub(super) fn wake_waiting(&self, n: usize) {
        let picked = self.expect().dequeue_installs(n);
        for name in picked {
            let _ = self.wake.send(ObjectRef::new(&name));
        }
    }

    /// Forget old expectations; the caches have long caught up with them.
    pub(super) fn prune(&self) {
        self.expect().prune();
    }
}
