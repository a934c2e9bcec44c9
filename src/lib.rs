//! gpu-driver: detect a node, resolve the NVIDIA driver it needs, fetch,
//! build (or take from the cluster's artifact cache), install and verify
//! it. The binary `gpu-driver-installer` is a thin shell around
//! [`cli::run`]; the pipeline itself is [`run`]. The module map is in
//! `docs/architecture.md`.

pub mod apt;
mod aptsig;
pub mod artifact;
pub mod build;
pub mod cache;
pub mod catalog;
pub mod cli;
mod confined_fs;
mod cuda;
pub mod deb;
pub mod detect;
pub mod digest;
mod error;
pub mod extract;
mod fabric;
mod failpoint;
pub mod fetch;
pub mod headers;
pub use gpu_driver_contract::host_root;
pub mod install;
mod lock;
pub mod modinfo;
mod named_file;
pub mod node;
mod process;
mod publish;
use gpu_driver_contract::redact;
pub mod report;
mod resolve;
pub mod run;
mod runfile;
mod schema;
mod signing;
pub mod step;
pub use gpu_driver_contract::text;
pub mod tls;
mod userspace;
mod verify;

pub use error::{Error, Failure, Reason, Result, Success};
