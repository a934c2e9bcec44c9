//! What the integration tests share: fixture host roots, loopback HTTP
//! servers, signed apt repositories, a real control plane, the workspace's
//! other binaries.

pub mod aptsign;
pub mod bin;
pub mod cluster;
pub mod fabric;
pub mod host;
pub mod http;
pub mod om;
pub mod kernel_headers;
pub mod run;
pub mod tools;
