//! The artifact cache in the cluster owner's object storage: a kernel is
//! compiled once per cluster, every other node downloads the result.
//!
//! Stores: `s3://bucket/prefix` (AWS and S3-compatible stores), `gs://`,
//! `az://container/prefix` and `file:///dir`, through the `object_store`
//! crate. Endpoint and credentials come from the providers' standard
//! environment variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, …), which
//! a mounted Secret can supply; nothing secret is ever logged.
//!
//! Layout under the URL's prefix (see `docs/cache.md`):
//!
//! ```text
//! artifacts/v<format>/<arch>/<kernel>/<driver>/<flavor>/cc-<hash>/
//!     manifest.json                  written last: the entry exists once it exists
//!     artifact-<sha256[..16]>.tar.zst  the build artifact, named by its content
//!     lease.json                     while one builder compiles the key
//! packages/<file>                    driver packages (private mirror)
//! ```
//!
//! The cache never fails a node: an unreachable store, a corrupt entry or a
//! failed upload become a [`CacheOutcome`] and warnings in the result, and
//! the build compiles as it would without a cache.
//!
//! `object_store` is async; this module owns a current-thread tokio runtime
//! and offers a blocking interface, so that the rest of the installer stays
//! synchronous.

mod entry;
mod mirror;
mod session;
mod status;
mod store;
mod tee;

pub use entry::{CacheKey, StoredEntry};
pub(crate) use mirror::fetch_with_mirror;
pub use session::Session;
pub use status::{CacheOutcome, CacheStatus};
pub use store::CacheConfig;
pub(crate) use store::{
    DEFAULT_LEASE_TTL_SECS, DEFAULT_POLL_MS, DEFAULT_WAIT_SECS, check_entry_flag, check_sha256_flag,
};

// ------------------------------------------------------------ the document
