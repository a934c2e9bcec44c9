//! The benchmark's baseline: what an operator without watches and caches
//! does. Every interval it lists the nodes and, for each one not yet
//! installed, reads it again, (re)creates its Job, reads the Job and its
//! pods, and patches the node when done. Same decisions, same Jobs, same
//! node patch as the real controller: only the polling differs. It lives
//! with the benchmark, not in the operator binary: a yardstick, never
//! something to deploy.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use gpu_driver_contract::report::Phase;
use gpu_driver_operator::controller::{driver_for, facts, ready_patch};
use gpu_driver_operator::crd::GpuDriver;
use gpu_driver_operator::decide::{self, Plan};
use gpu_driver_operator::job::{self, JobRequest};
use gpu_driver_operator::metrics::Metrics;
use gpu_driver_operator::outcome::{self, JobState};

/// Polls until `shutdown` resolves.
pub async fn run(
    client: Client,
    namespace: String,
    interval: Duration,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let poll = async {
        loop {
            if let Err(e) = poll_once(&client, &namespace, &metrics).await {
                tracing::warn!("naive poll: {e}");
            }
            tokio::time::sleep(interval).await;
        }
    };
    tokio::select! {
        () = poll => {}
        () = shutdown => {}
    }
}

async fn poll_once(client: &Client, ns: &str, metrics: &Metrics) -> kube::Result<()> {
    let drivers: Vec<Arc<GpuDriver>> = Api::<GpuDriver>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let drivers = &drivers;
    futures::stream::iter(nodes.items)
        .for_each_concurrent(32, |n| async move {
            if let Err(e) = poll_node(client, ns, metrics, drivers, &n.name_any()).await {
                tracing::debug!("naive: node {}: {e}", n.name_any());
            }
        })
        .await;
    Ok(())
}

async fn poll_node(
    client: &Client,
    ns: &str,
    metrics: &Metrics,
    drivers: &[Arc<GpuDriver>],
    name: &str,
) -> kube::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(name).await?;
    let f = facts(&node);
    let Some(gd) = driver_for(drivers, &f) else {
        return Ok(());
    };
    let Plan::Install {
        job: job_name,
        image,
        key,
        ..
    } = decide::plan(&gd.spec, &f, Timestamp::now().as_second())
    else {
        return Ok(());
    };
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let obj = job::build(
        &gd,
        &JobRequest::node_job(decide::JobRole::Install, &job_name, ns, name, &image, &key),
    );
    // No cache: it cannot know whether it made the Job already.
    metrics.write("create", "jobs");
    match jobs.create(&PostParams::default(), &obj).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => return Err(e),
    }
    let job = jobs.get(&job_name).await?;
    let pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job_name}")))
        .await?
        .items;
    let refs: Vec<&Pod> = pods.iter().collect();
    if let JobState::Succeeded(Some(r)) =
        outcome::job_state(&job, &refs, Timestamp::now().as_second())
        && r.phase == Phase::Succeeded
    {
        metrics.write("patch", "nodes");
        let patch = ready_patch(&gd, &node, &key, &job_name, &r, Timestamp::now(), false);
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}
