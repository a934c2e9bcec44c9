//! The GpuDriver status: recomputed from the caches on a timer, written
//! only when it changed. It reads what the reconciles did (build targets
//! included) and creates nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::context::Context;
use super::lookup::job_is_terminal;
use super::patch::status_patch;
use super::targets::target_records;
use crate::crd::GpuDriver;
use crate::status;

/// Recomputes every GpuDriver's status from the caches and writes the
/// ones that changed; updates the nodes gauge.
pub(super) async fn status_loop(ctx: Arc<Context>) {
    let mut written: HashMap<String, crate::crd::GpuDriverStatus> = HashMap::new();
    loop {
        tokio::time::sleep(ctx.opts.status_interval).await;
        ctx.prune();
        let drivers = ctx.drivers.state();
        let running: HashSet<String> = ctx
            .jobs
            .state()
            .iter()
            .filter(|j| !job_is_terminal(j))
            .map(|j| j.name_any())
            .collect();
        let mut phases: BTreeMap<String, u32> = BTreeMap::new();
        for gd in &drivers {
            let mine = ctx.selected_nodes(gd);
            let previous = written.get(&gd.name_any()).or(gd.status.as_ref());
            let st = status::compute(
                &gd.spec,
                gd.metadata.generation,
                &mine,
                |j| running.contains(j),
                previous,
                Timestamp::now(),
            );
            let mut st = st;
            st.targets = target_records(&ctx, gd, &mine);
            st.upgrade = status::upgrade(&gd.spec, &mine);
            status::merge_phases(&mut phases, &st.phases);
            if gd.status.as_ref() == Some(&st) || written.get(&gd.name_any()) == Some(&st) {
                continue;
            }
            let api: Api<GpuDriver> = Api::all(ctx.client.clone());
            ctx.metrics.write("patch", "gpudrivers/status");
            let body = status_patch(&st, written.get(&gd.name_any()).or(gd.status.as_ref()));
            match api
                .patch_status(&gd.name_any(), &PatchParams::default(), &Patch::Merge(body))
                .await
            {
                Ok(_) => {
                    written.insert(gd.name_any(), st);
                }
                Err(e) => tracing::warn!("status of GpuDriver {}: {e}", gd.name_any()),
            }
        }
        ctx.metrics.set_all("gpu_driver_nodes", "phase", &phases);
    }
}
