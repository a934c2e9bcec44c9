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
pub mod manifests;
pub mod om;
pub mod results;
pub mod run;
pub mod tools;

use std::path::Path;

/// The repository's root: the tests' package is tests/it, two levels
/// down. Every fixture, chart and manifest path starts here.
pub fn repo_root() -> &'static Path {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .and_then(Path::parent)
        .expect("tests/it has a grandparent")
}
