//! The one integration-test binary: every crate of the workspace is linked
//! once, and the arrange code lives in [`support`]. Modules by subject;
//! `cargo test -p gpu-driver-tests --test it MODULE::` runs one of them.

mod support;

mod admission;
mod architecture;
mod build;
mod build_parsers;
mod cache;
mod chart;
mod cli;
mod cluster;
mod cuda;
mod device_plugin;
mod docs;
mod exporter;
mod extract;
mod fetch;
mod headers;
mod install;
mod operator;
mod operator_manifests;
mod vm;
