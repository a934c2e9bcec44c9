//! Leader election on a `coordination.k8s.io/v1` Lease, like client-go's:
//! take the Lease when it is free or expired, renew it while working, and
//! stop working (the process exits) when a renewal has not succeeded for a
//! whole lease duration. Updates carry the resourceVersion, so two
//! candidates cannot both win.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::metrics::Metrics;

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_period: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, identity: &str) -> Self {
        LeaseConfig {
            namespace: namespace.to_string(),
            name: "gpu-driver-operator".to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_period: Duration::from_secs(5),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Is the Lease free for `identity` at `now`? (Pure: unit-tested.)
pub fn can_take(lease: &Lease, identity: &str, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return true;
    };
    match spec.holder_identity.as_deref() {
        None | Some("") => return true,
        Some(h) if h == identity => return true,
        Some(_) => {}
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    match renewed {
        Some(t) => t + SignedDuration::from_secs(duration) < now,
        None => true,
    }
}

/// One attempt to take or renew the Lease; true when we hold it after.
pub async fn try_acquire(
    client: &Client,
    cfg: &LeaseConfig,
    metrics: &Metrics,
) -> kube::Result<bool> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let now = Timestamp::now();
    let secs = i32::try_from(cfg.lease_duration.as_secs()).unwrap_or(15);
    match api.get_opt(&cfg.name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            metrics.write("create", "leases");
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            if !can_take(&lease, &cfg.identity, now) {
                return Ok(false);
            }
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
                spec.holder_identity = Some(cfg.identity.clone());
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.lease_duration_seconds = Some(secs);
            spec.renew_time = Some(MicroTime(now));
            metrics.write("update", "leases");
            match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Waits until this instance leads, then keeps renewing in the background.
/// The returned receiver turns `false` once leadership is lost.
pub async fn lead(
    client: Client,
    cfg: LeaseConfig,
    metrics: Arc<Metrics>,
) -> tokio::sync::watch::Receiver<bool> {
    loop {
        match try_acquire(&client, &cfg, &metrics).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::warn!("leader election: {e}"),
        }
        tokio::time::sleep(cfg.retry_period).await;
    }
    tracing::info!(
        "leading as {} (lease {}/{})",
        cfg.identity,
        cfg.namespace,
        cfg.name
    );
    metrics.set("gpu_driver_is_leader", &[], 1.0);
    let (tx, rx) = tokio::sync::watch::channel(true);
    tokio::spawn(async move {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(cfg.renew_period).await;
            match try_acquire(&client, &cfg, &metrics).await {
                Ok(true) => last_ok = Instant::now(),
                Ok(false) => {
                    tracing::error!("leader lease taken by another instance");
                    break;
                }
                Err(e) => {
                    tracing::warn!("renewing the leader lease: {e}");
                    if last_ok.elapsed() >= cfg.lease_duration {
                        break;
                    }
                }
            }
        }
        metrics.set("gpu_driver_is_leader", &[], 0.0);
        let _ = tx.send(false);
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed_secs_ago: i64, now: Timestamp) -> Lease {
        Lease {
            metadata: Default::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_lease_is_free_when_unheld_ours_or_expired() {
        let now = Timestamp::now();
        assert!(can_take(&lease(None, 0, now), "me", now));
        assert!(can_take(&lease(Some("me"), 1, now), "me", now));
        assert!(!can_take(&lease(Some("other"), 5, now), "me", now));
        assert!(can_take(&lease(Some("other"), 16, now), "me", now));
        assert!(can_take(&Lease::default(), "me", now));
    }
}
