//! gpu-driver: detect a node, resolve the NVIDIA driver it needs, and (in
//! later steps) fetch, build, load and verify it. The binary
//! `gpu-driver-installer` is a thin shell around [`cli::run`].

pub mod apt;
pub mod build;
pub mod cache;
pub mod catalog;
pub mod cli;
pub mod deb;
pub mod detect;
pub mod error;
pub mod extract;
pub mod failpoint;
pub mod headers;
pub mod host;
pub mod load;
pub mod modinfo;
#[cfg(feature = "operator")]
pub mod operator;
pub mod report;
pub mod resolve;
pub mod run;
mod runfile;
pub mod schema;
pub mod tls;
pub mod userspace;
pub mod verify;

pub use error::{Error, Result};
pub use report::Reason;
pub mod fetch;
