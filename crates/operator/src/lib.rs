//! `gpu-driver-operator`: watches GPU nodes and runs one short-lived
//! installer Job per node and (kernel, boot, driver, flavor), then marks the
//! node. No DaemonSet and no long-running privileged pod.
//!
//! - [`crd`]: the `GpuDriver` resource;
//! - [`decide`]: pure decisions (OS and kernel, builder image, Job name,
//!   backoff), unit-tested;
//! - [`job`]: the Job objects;
//! - [`outcome`]: reading a Job pod's termination message (the installer's
//!   own result documents);
//! - [`controller`]: the watch-based reconciler;
//! - [`keys`]: the label and annotation keys on nodes, Jobs and pods;
//! - [`status`], [`metrics`], [`leader`]; [`cli`]: the binary's commands.
//!
//! The benchmark's polling baseline is not here: it lives with the
//! benchmark (`crates/operator/examples/bench_operator/naive.rs`).

#[macro_use]
mod str_enum;

pub mod cli;
pub mod controller;
pub mod crd;
pub mod decide;
pub mod job;
pub mod keys;
pub mod leader;
pub mod metrics;
pub mod outcome;
pub(crate) mod status;

/// Installs ring as the process's rustls provider, once: kube's client looks
/// the default up when it is built, and no other provider is compiled in
/// (no aws-lc-rs). Idempotent.
pub fn init_tls() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err only means another thread installed one first: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The operator's API client: kube's defaults, except that it does not
/// retry 429, 503 and 504 by itself. kube's default policy (15 tries, backoff
/// up to 1000 s) turned one eviction that a PodDisruptionBudget refuses
/// (429, at once) into minutes of blocking, past `drainTimeoutSeconds`.
/// Every reconcile requeues on its own, so a refusal or a busy apiserver
/// comes back to it at once.
pub async fn connect() -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    client(config)
}

/// [`connect`]'s client for a given configuration.
pub fn client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    init_tls();
    config.default_retry = false;
    kube::Client::try_from(config)
}
