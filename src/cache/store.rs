//! The object store behind the cache: `--cache-url` and its companions,
//! and a blocking client for S3, GCS, Azure or a local directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};
use sha2::{Digest, Sha256};

use crate::error::{Error, Failure, Result};

/// Default of `--cache-wait`: how long a builder waits for another one that
/// holds the key's lease (a compile takes 2–5 minutes).
pub(crate) const DEFAULT_WAIT_SECS: u64 = 900;
/// Default of `--cache-lease-ttl`: a lease older than this is taken to be
/// left by a builder that crashed.
pub(crate) const DEFAULT_LEASE_TTL_SECS: u64 = 1800;
/// Default of `--cache-poll-ms`: how often a waiting builder looks again.
pub(crate) const DEFAULT_POLL_MS: u64 = 2000;

/// `--cache-url` and its companions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    pub url: String,
    /// Plain `http://` endpoints (`--allow-http`).
    pub allow_http: bool,
    /// How long to wait for another builder holding the lease.
    pub wait: Duration,
    pub lease_ttl: Duration,
    pub poll: Duration,
    /// `--cache-read-only`: only read. No lease is taken and nothing is
    /// written (no artifact, no manifest, no package): a node whose
    /// credentials may only read never attempts a write.
    pub read_only: bool,
    /// `--artifact-sha256`: the only artifact sha256 an entry may have to
    /// be used (what the build Job stored); another is refused before it
    /// is downloaded. Lowercase hex.
    pub expected_sha256: Option<String>,
    /// `--cache-entry`: the entry a build Job stored (its
    /// `status.built.cacheKey`), read directly instead of one computed
    /// from the headers and the compiler. Needs `expected_sha256`.
    pub entry: Option<String>,
}

impl CacheConfig {
    pub fn new(url: &str, allow_http: bool) -> Self {
        CacheConfig {
            url: url.to_string(),
            allow_http,
            wait: Duration::from_secs(DEFAULT_WAIT_SECS),
            lease_ttl: Duration::from_secs(DEFAULT_LEASE_TTL_SECS),
            poll: Duration::from_millis(DEFAULT_POLL_MS),
            read_only: false,
            expected_sha256: None,
            entry: None,
        }
    }

    /// Checks the URL and the endpoint's scheme; a bad value is the
    /// operator's mistake and fails the command (the store being down later
    /// does not).
    pub fn check(&self) -> Result<()> {
        parse_url(&self.url).map(|_| ())?;
        if let Some(sha) = &self.expected_sha256 {
            check_sha256_flag(sha)?;
        }
        if let Some(entry) = &self.entry {
            check_entry_flag(entry, self.expected_sha256.is_some())?;
        }
        let scheme = self.url.split(':').next().unwrap_or_default();
        if scheme == "s3" && !self.allow_http {
            if let Some((var, endpoint)) = s3_endpoint_from_env() {
                if endpoint.to_ascii_lowercase().starts_with("http://") {
                    return Err(Error::new(
                        Failure::InsecureUrl,
                        format!(
                            "the cache's S3 endpoint {var}={endpoint} is plain http and --allow-http was not given"
                        ),
                    )
                    .with_hint("use an https:// endpoint, or pass --allow-http on a trusted network"));
                }
            }
        }
        Ok(())
    }
}

/// `--cache-entry` names an entry under the store's `artifacts/`, in the
/// characters keys are made of, and comes with the sha256 it must hold.
pub(crate) fn check_entry_flag(entry: &str, pinned: bool) -> Result<()> {
    let parts: Vec<&str> = entry.split('/').collect();
    let plain = |p: &&str| {
        !p.is_empty()
            && *p != "."
            && *p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._+~-".contains(c))
    };
    if parts.first() != Some(&"artifacts") || parts.len() < 3 || !parts.iter().all(plain) {
        return Err(Error::new(
            Failure::InvalidArgument,
            format!("--cache-entry {entry:?} is not an entry of the cache (artifacts/v…/<arch>/<kernel>/<driver>/<flavor>/cc-…)"),
        )
        .with_hint("pass a build Job's status.built.cacheKey as it is"));
    }
    if !pinned {
        return Err(Error::new(
            Failure::InvalidArgument,
            "--cache-entry without --artifact-sha256: an entry is used only with the sha256 its build Job reported",
        ));
    }
    Ok(())
}

/// `--artifact-sha256` must be a sha256: 64 hex digits.
pub(crate) fn check_sha256_flag(sha: &str) -> Result<()> {
    if crate::fetch::is_sha256_hex(sha) {
        Ok(())
    } else {
        Err(Error::new(
            Failure::InvalidArgument,
            format!("--artifact-sha256 {sha:?} is not a sha256 (64 hex digits)"),
        )
        .with_hint("pass the build Job's status.built.artifactSha256"))
    }
}

/// The S3 endpoint the environment sets, in `object_store`'s order of
/// precedence for the names it reads.
fn s3_endpoint_from_env() -> Option<(&'static str, String)> {
    ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
        .into_iter()
        .find_map(|v| {
            std::env::var(v)
                .ok()
                .filter(|s| !s.is_empty())
                .map(|s| (v, s))
        })
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    File(PathBuf),
    S3 { bucket: String, prefix: String },
    Gcs { bucket: String, prefix: String },
    Azure { container: String, prefix: String },
}

fn parse_url(url: &str) -> Result<Location> {
    let bad = |why: &str| {
        Error::new(
            Failure::InvalidArgument,
            format!("--cache-url {url:?}: {why}"),
        )
        .with_hint(
            "use s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX or file:///DIR",
        )
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    if rest.contains('@') {
        return Err(bad(
            "credentials do not belong in the URL; set them in the environment (AWS_ACCESS_KEY_ID, …)",
        ));
    }
    if scheme == "file" {
        let dir = PathBuf::from(rest);
        if !dir.is_absolute() {
            return Err(bad("a file:// URL needs an absolute path (file:///dir)"));
        }
        return Ok(Location::File(dir));
    }
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket"));
    }
    let prefix = prefix.trim_matches('/').to_string();
    if prefix.split('/').any(|p| p == "." || p == "..") {
        return Err(bad("the prefix must not contain . or .."));
    }
    let bucket = bucket.to_string();
    match scheme {
        "s3" | "s3a" => Ok(Location::S3 { bucket, prefix }),
        "gs" => Ok(Location::Gcs { bucket, prefix }),
        "az" | "azure" => Ok(Location::Azure {
            container: bucket,
            prefix,
        }),
        other => Err(bad(&format!("unsupported scheme {other}"))),
    }
}
// ------------------------------------------------------------ the store

/// An opened store: the client, the prefix and the runtime that drives it.
pub(crate) struct Store {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    rt: tokio::runtime::Runtime,
    /// A `file://` store's directory: its objects are checked to be
    /// regular files before they are opened (a FIFO would block the open).
    local: Option<PathBuf>,
    /// The URL as shown in results and logs.
    pub display: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("url", &self.display).finish()
    }
}

pub(super) type StoreResult<T> = std::result::Result<T, object_store::Error>;

/// An object streamed to a temporary file ([`Store::get_to_file`]); the
/// file goes away unless persisted.
pub(crate) struct Downloaded {
    pub file: tempfile::NamedTempFile,
    pub size: u64,
    pub sha256: String,
    /// The result of the check that read the bytes as they came, if one
    /// was given.
    pub checked: Option<Result<()>>,
}

impl Store {
    /// Builds the client. `Err` means the store is unusable here: the
    /// caller reports it as `Unavailable` and builds anyway.
    pub(crate) fn open(cfg: &CacheConfig) -> Result<Store> {
        let location = parse_url(&cfg.url)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                Error::new(
                    Failure::Internal,
                    format!("starting the cache's runtime: {e}"),
                )
            })?;
        let local = match &location {
            Location::File(dir) => Some(dir.clone()),
            _ => None,
        };
        let (store, prefix) = backend(cfg, location)?;
        Ok(Store {
            store,
            prefix,
            rt,
            local,
            display: cfg.url.clone(),
        })
    }

    fn path(&self, rel: &str) -> ObjPath {
        if self.prefix.is_empty() {
            ObjPath::from(rel)
        } else {
            ObjPath::from(format!("{}/{rel}", self.prefix))
        }
    }

    /// A small object's bytes and ETag; `None` when it does not exist. The
    /// store is not trusted to be small: past `max` bytes (announced or
    /// streamed) it is an error, and nothing more is read.
    pub(crate) fn get(
        &self,
        rel: &str,
        max: u64,
    ) -> StoreResult<Option<(Vec<u8>, Option<String>)>> {
        use futures::StreamExt;
        self.check_local(rel)?;
        let path = self.path(rel);
        let too_big = || object_store::Error::Generic {
            store: "cache",
            source: format!("{}/{rel} is over {} KiB; not read", self.display, max >> 10).into(),
        };
        self.rt.block_on(async {
            let r = match self.store.get(&path).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            if r.meta.size > max {
                return Err(too_big());
            }
            let etag = r.meta.e_tag.clone();
            let mut bytes = Vec::new();
            let mut stream = r.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                if (bytes.len() + chunk.len()) as u64 > max {
                    return Err(too_big());
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(Some((bytes, etag)))
        })
    }

    /// In a `file://` store, an object that exists must be a regular file:
    /// a FIFO would block object_store's open for good, a device never end.
    fn check_local(&self, rel: &str) -> StoreResult<()> {
        let Some(dir) = &self.local else {
            return Ok(());
        };
        let file = dir.join(self.path(rel).as_ref());
        match std::fs::metadata(&file) {
            Ok(m) if !m.is_file() => Err(object_store::Error::Generic {
                store: "cache",
                source: format!(
                    "{} is not a regular file; not read (the store holds something it should not)",
                    file.display()
                )
                .into(),
            }),
            _ => Ok(()),
        }
    }

    /// Streams the object into a new temporary file in `dir`, hashing it
    /// as it comes, never holding it in memory. `None` when it does not
    /// exist; an error past `max` bytes (the store is not trusted to be
    /// small).
    pub(crate) fn get_to_file(
        &self,
        rel: &str,
        dir: &Path,
        max: u64,
        check: Option<super::tee::StreamCheck>,
    ) -> Result<Option<Downloaded>> {
        use futures::StreamExt;
        use std::io::Write;
        self.check_local(rel).map_err(|e| unavailable(&e))?;
        let path = self.path(rel);
        let tmp = tempfile::Builder::new()
            .prefix(".cache-get-")
            .suffix(".partial")
            .tempfile_in(dir)
            .map_err(|e| Error::io(Failure::Internal, "creating a temporary file in", dir, e))?;
        let write_err = |e| Error::io(Failure::Internal, "writing", tmp.path(), e);
        let mut out = std::io::BufWriter::new(tmp.as_file());
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut tee = check.map(super::tee::Tee::start).transpose()?;
        let got = self.rt.block_on(async {
            let r = match self.store.get(&path).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(false),
                Err(e) => return Err(unavailable(&e)),
            };
            let mut stream = r.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| unavailable(&e))?;
                size += chunk.len() as u64;
                if size > max {
                    return Err(Error::new(
                        Failure::ArtifactInvalid,
                        format!("{}/{rel} is over {} MiB; not used", self.display, max >> 20),
                    ));
                }
                hasher.update(&chunk);
                out.write_all(&chunk).map_err(write_err)?;
                if let Some(t) = tee.as_mut() {
                    t.feed(&chunk);
                }
            }
            Ok(true)
        });
        // Joined on every path: the check sees EOF and its thread ends.
        let checked = tee.map(super::tee::Tee::finish);
        if !got? {
            return Ok(None);
        }
        out.flush().map_err(write_err)?;
        drop(out);
        tmp.as_file().sync_all().map_err(write_err)?;
        Ok(Some(Downloaded {
            file: tmp,
            size,
            sha256: hex::encode(hasher.finalize()),
            checked,
        }))
    }

    /// The object's ETag, when it exists.
    pub(crate) fn head(&self, rel: &str) -> StoreResult<Option<Option<String>>> {
        let path = self.path(rel);
        self.rt.block_on(async {
            match self.store.head(&path).await {
                Ok(m) => Ok(Some(m.e_tag)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    pub(crate) fn put(
        &self,
        rel: &str,
        bytes: Vec<u8>,
        mode: PutMode,
    ) -> StoreResult<Option<String>> {
        let path = self.path(rel);
        let opts = PutOptions {
            mode,
            ..PutOptions::default()
        };
        self.rt.block_on(async {
            self.store
                .put_opts(&path, PutPayload::from(bytes), opts)
                .await
                .map(|r| r.e_tag)
        })
    }

    pub(crate) fn delete(&self, rel: &str) -> StoreResult<()> {
        let path = self.path(rel);
        self.rt.block_on(async {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }
}

/// Retries of one store request: a few quick ones, then the store counts
/// as unavailable (the build goes on without it).
fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 2,
        retry_timeout: Duration::from_secs(20),
    }
}

/// The HTTP client options of the cloud stores.
fn client_options(allow_http: bool) -> ClientOptions {
    // object_store's reqwest client takes the process's crypto provider.
    crate::tls::init();
    tls_roots(
        ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(300))
            .with_allow_http(allow_http),
    )
}

/// The `object_store` backend of a location, and the prefix inside it.
fn backend(cfg: &CacheConfig, location: Location) -> Result<(Arc<dyn ObjectStore>, String)> {
    let fail = |e: object_store::Error| {
        Error::new(
            Failure::InvalidArgument,
            format!("configuring the store {}: {e}", cfg.url),
        )
    };
    Ok(match location {
        Location::File(dir) => {
            // A read-only session creates nothing, not even the store.
            if !cfg.read_only {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| Error::io(Failure::Internal, "creating", &dir, e))?;
            }
            let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .map_err(fail)?
                .with_automatic_cleanup(true);
            (Arc::new(fs), String::new())
        }
        Location::S3 { bucket, prefix } => {
            let s = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry_config())
                .with_client_options(client_options(cfg.allow_http))
                .with_allow_http(cfg.allow_http)
                .build()
                .map_err(fail)?;
            (Arc::new(s), prefix)
        }
        Location::Gcs { bucket, prefix } => {
            let s = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry_config())
                .with_client_options(client_options(cfg.allow_http))
                .build()
                .map_err(fail)?;
            (Arc::new(s), prefix)
        }
        Location::Azure { container, prefix } => {
            let s = object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_container_name(container)
                .with_retry(retry_config())
                .with_client_options(client_options(cfg.allow_http))
                .with_allow_http(cfg.allow_http)
                .build()
                .map_err(fail)?;
            (Arc::new(s), prefix)
        }
    })
}

/// The roots HTTPS endpoints are verified against: Mozilla's (bundled, as
/// for `fetch`), plus the PEM bundle named by `SSL_CERT_FILE` (a private CA)
/// and the system's bundle where there is one. The HTTP client's own system
/// lookup is off: without `/etc/ssl/certs` (builder roots, scratch images)
/// it fails to build at all, even for http endpoints.
fn tls_roots(mut client: ClientOptions) -> ClientOptions {
    client = client.with_config(object_store::ClientConfigKey::NoSystemCertificates, "true");
    for der in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
        if let Ok(c) = object_store::Certificate::from_der(der) {
            client = client.with_root_certificate(c);
        }
    }
    let mut bundles: Vec<PathBuf> = vec![PathBuf::from("/etc/ssl/certs/ca-certificates.crt")];
    if let Some(f) = std::env::var_os("SSL_CERT_FILE") {
        bundles.push(PathBuf::from(f));
    }
    for path in bundles {
        let Ok(pem) = std::fs::read(&path) else {
            continue;
        };
        match object_store::Certificate::from_pem_bundle(&pem) {
            Ok(certs) => {
                for c in certs {
                    client = client.with_root_certificate(c);
                }
            }
            Err(e) => tracing::warn!("cache: CA bundle {} not used: {e}", path.display()),
        }
    }
    client
}

/// A store error as shown in results: object_store's message (which names
/// the path and the HTTP status), never a credential.
pub(super) fn describe(e: &object_store::Error) -> String {
    e.to_string()
}

pub(super) fn is_conflict(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }
    )
}

/// A store request that failed: the store is unreachable or refused.
pub(super) fn unavailable(e: &object_store::Error) -> Error {
    Error::new(Failure::DownloadFailed, describe(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

    #[test]
    fn urls_parse_into_locations() {
        assert_eq!(
            parse_url("s3://bucket/a/b/").unwrap(),
            Location::S3 {
                bucket: "bucket".into(),
                prefix: "a/b".into()
            }
        );
        assert_eq!(
            parse_url("gs://b").unwrap(),
            Location::Gcs {
                bucket: "b".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            parse_url("az://c/p").unwrap(),
            Location::Azure {
                container: "c".into(),
                prefix: "p".into()
            }
        );
        assert_eq!(
            parse_url("file:///var/cache/x").unwrap(),
            Location::File(PathBuf::from("/var/cache/x"))
        );
        for bad in [
            "bucket/prefix",
            "ftp://x/y",
            "file://relative",
            "s3:///prefix",
            "s3://key:secret@bucket/p",
            "s3://b/../x",
        ] {
            let e = parse_url(bad).unwrap_err();
            assert_eq!(e.reason, Reason::InvalidArgument, "{bad}");
            assert!(e.to_string().contains("s3://BUCKET"), "{}", e.to_string());
        }
    }

    #[test]
    fn the_expected_artifact_sha256_must_be_a_sha256() {
        let mut cfg = CacheConfig::new("file:///var/cache/x", false);
        cfg.expected_sha256 = Some("ab".repeat(32));
        cfg.check().unwrap();
        for bad in ["", "abc", &"g".repeat(64), &"a".repeat(65)] {
            cfg.expected_sha256 = Some(bad.to_string());
            let e = cfg.check().unwrap_err();
            assert_eq!(e.reason, Reason::InvalidArgument, "{bad:?}");
            assert!(e.to_string().contains("--artifact-sha256"), "{e}");
        }
    }
}
