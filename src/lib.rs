//! gpu-driver: detect a node, resolve the NVIDIA driver it needs, fetch,
//! build (or take from the cluster's artifact cache), install and verify
//! it. The binary `gpu-driver-installer` is a thin shell around
//! [`cli::run`]; the pipeline itself is [`run`]. The module map is in
//! `docs/architecture.md`.

pub mod apt;
pub mod aptsig;
pub mod artifact;
pub mod build;
pub mod cache;
pub mod catalog;
pub mod cli;
pub mod confined_fs;
pub mod cuda;
pub mod deb;
pub mod detect;
pub mod digest;
pub mod error;
pub mod extract;
pub mod fabric;
pub mod failpoint;
pub mod fetch;
pub mod headers;
pub use gpu_driver_contract::host_root;
pub mod install;
pub mod lock;
pub mod modinfo;
pub mod named_file;
pub mod node;
pub mod process;
pub mod publish;
pub use gpu_driver_contract::redact;
pub mod report;
pub mod resolve;
pub mod run;
mod runfile;
pub mod schema;
pub mod signing;
pub mod step;
pub use gpu_driver_contract::text;
pub mod tls;
pub mod userspace;
pub mod verify;

pub use error::{Error, Failure, Reason, Result, Success};
