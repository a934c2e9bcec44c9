//! What the integration tests share: fixture host roots, loopback HTTP
//! servers, signed apt repositories, a real control plane, the workspace's
//! other binaries.

pub mod aptsign;
pub mod bin;
pub mod cluster;
pub mod deploy;
pub mod elf;
pub mod fabric;
pub mod host;
pub mod http;
pub mod kernel_headers;
pub mod om;
pub mod run;
pub mod tools;
