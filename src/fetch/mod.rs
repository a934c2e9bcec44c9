//! `fetch`: get a package onto the node without ever trusting a corrupt or
//! tampered byte. Streams into `<sha256>.partial` while hashing, verifies,
//! fsyncs and renames; resumes with `Range` when the server honours it;
//! retries with an explicit backoff policy; tries mirrors in order; a
//! verified cache hit needs no network at all.
//!
//! The download engine ([`fetch`]: the HTTP client, retries and backoff,
//! `Range` resume, the package cache's partial → verify → rename) takes a
//! [`FetchPolicy`] (how to download) and a [`FetchRequest`] (what); the
//! `fetch` step ([`fetch_package`]) turns a [`PackageRequest`] into a
//! [`FetchResult`] document, finding the checksum and the mirrors' URLs.

mod attempt;
mod checksum;
mod client;
mod download;
mod fetched;
mod policy;
mod request;
mod step;
mod stream;

pub(crate) use checksum::find_checksum;
pub use client::{PROXY_VARS, agent};
pub(crate) use client::{describe, describe_http_error, retryable_status};
pub use download::fetch;
pub use fetched::{Attempt, FetchError, Fetched};
pub(crate) use policy::{
    DEFAULT_DOWNLOAD_TIMEOUT_SECS, DEFAULT_MAX_DOWNLOAD_MIB, check_url, is_sha256_hex,
};
pub use policy::{FetchPolicy, FetchRequest, RetryPolicy, Timeouts};
pub use request::ChecksumSource;
pub(crate) use request::{PackageRequest, file_name_of};
pub use step::{FetchResult, FetchSpec, FetchStatus};
pub(crate) use step::{fetch_package, fetch_package_failed, fetch_status};
