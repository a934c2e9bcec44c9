//! `gpu-driver-exporter`: per-GPU and per-pod GPU metrics in Prometheus'
//! OpenMetrics text, needing nothing but the driver: NVML loaded at run time
//! ([`nvml`]), the kubelet's PodResources API for which pod holds which GPU
//! ([`podresources`]), and processes mapped to pods through their cgroups
//! ([`cgroup`], [`containers`]). [`scrape`] gathers one [`metrics::Snapshot`]
//! per request, [`metrics`] renders it with the DCGM exporter's names and
//! labels, [`server`] answers `/metrics` and `/healthz`. docs/exporter.md.

pub mod cgroup;
pub mod cli;
pub mod containers;
pub mod metrics;
pub mod nvml;
mod nvml_ffi;
pub mod podresources;
pub mod scrape;
pub mod server;
