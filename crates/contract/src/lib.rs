//! The wire contract of gpu-driver: the versioned result documents the
//! installer prints and the operator reads back from a Job's termination
//! message, the closed list of reasons with their phases and exit codes,
//! credential redaction, the driver root's layout on a host, and the
//! logging set-up every binary shares. The installer, the operator and the
//! exporter depend on this crate; it depends on none of them.

pub mod detect;
pub mod host_root;
pub mod layout;
pub mod logging;
pub mod node;
pub mod reason;
pub mod redact;
pub mod report;
pub mod run;
pub mod text;

pub use reason::{Failure, Phase, Reason, ReasonClass, Success};
