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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig, UpdateVersion,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::artifact::{MANIFEST_VERSION, Manifest};
use crate::error::{Error, Result};
use crate::host::{CpuArch, ModuleFlavor};
use crate::report::Reason;

/// The layout and entry format of the cache. Bumped when either changes
/// (the build manifest's own version is part of the key as well), so that
/// old and new installers never read each other's entries.
pub const FORMAT_VERSION: u32 = 1;

/// Default of `--cache-wait`: how long a builder waits for another one that
/// holds the key's lease (a compile takes 2–5 minutes).
pub const DEFAULT_WAIT_SECS: u64 = 900;
/// Default of `--cache-lease-ttl`: a lease older than this is taken to be
/// left by a builder that crashed.
pub const DEFAULT_LEASE_TTL_SECS: u64 = 1800;
/// Default of `--cache-poll-ms`: how often a waiting builder looks again.
pub const DEFAULT_POLL_MS: u64 = 2000;
/// How long a builder that created the lease waits before checking that
/// the lease still names it (see [`Session::acquire_lease`]). Paid once per
/// compile, which takes minutes.
pub const LEASE_SETTLE: Duration = Duration::from_millis(1000);

// ------------------------------------------------------------ the document

/// What the cache did for a build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CacheOutcome {
    /// A verified artifact came from the store; nothing was compiled.
    Hit,
    /// The store had no entry for the key: compiled (and stored).
    Miss,
    /// The entry was unreadable, truncated or failed a sha256: compiled
    /// and replaced.
    Corrupt,
    /// The store could not be reached or refused: compiled without it.
    Unavailable,
    /// No `--cache-url`.
    Disabled,
}

/// `status.cache` of a build result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheStatus {
    pub outcome: CacheOutcome,
    /// The store (`--cache-url`, without any user info).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The entry's key: its path under the store's prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Bytes read from the store (manifest and artifact).
    pub bytes_downloaded: u64,
    /// Bytes written to the store (artifact and manifest).
    pub bytes_uploaded: u64,
    /// True when this build's artifact was stored under the key.
    #[serde(default)]
    pub stored: bool,
    /// What happened with the key's lease (held, waited for, taken over).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Why the cache could not help (unreachable, corrupt, not stored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl CacheStatus {
    pub fn disabled() -> Self {
        CacheStatus {
            outcome: CacheOutcome::Disabled,
            url: None,
            key: None,
            bytes_downloaded: 0,
            bytes_uploaded: 0,
            stored: false,
            lease: None,
            warnings: Vec::new(),
        }
    }

    fn warn(&mut self, w: String) {
        tracing::warn!("cache: {w}");
        self.warnings.push(w);
    }
}

// ------------------------------------------------------------ configuration

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
        let scheme = self.url.split(':').next().unwrap_or_default();
        if scheme == "s3" && !self.allow_http {
            if let Some((var, endpoint)) = s3_endpoint_from_env() {
                if endpoint.to_ascii_lowercase().starts_with("http://") {
                    return Err(Error::new(
                        Reason::InsecureUrl,
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

/// `--artifact-sha256` must be a sha256: 64 hex digits.
pub fn check_sha256_flag(sha: &str) -> Result<()> {
    if crate::fetch::is_sha256_hex(sha) {
        Ok(())
    } else {
        Err(Error::new(
            Reason::InvalidArgument,
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
            Reason::InvalidArgument,
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

// ------------------------------------------------------------ the key

/// Everything that makes two artifacts interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheKey {
    pub arch: String,
    pub kernel_release: String,
    pub driver_version: String,
    pub flavor: ModuleFlavor,
    /// The builder's identity: the first line of `<cc> --version`.
    pub compiler: String,
    /// `<cache format>.<manifest version>`.
    pub format: String,
}

impl CacheKey {
    /// `arch` is the modules' architecture (a cross build's target, not
    /// the builder's).
    pub fn new(
        arch: CpuArch,
        kernel_release: &str,
        driver_version: &str,
        flavor: ModuleFlavor,
        compiler: &str,
    ) -> Self {
        CacheKey {
            arch: arch.nvidia_name().to_string(),
            kernel_release: kernel_release.to_string(),
            driver_version: driver_version.to_string(),
            flavor,
            compiler: compiler.to_string(),
            format: format!("{FORMAT_VERSION}.{MANIFEST_VERSION}"),
        }
    }

    /// The entry's directory under the store's prefix. The compiler string
    /// (spaces, parentheses) is hashed; the entry's manifest holds it whole.
    pub fn path(&self) -> String {
        let cc = hex::encode(Sha256::digest(self.compiler.as_bytes()));
        format!(
            "artifacts/v{}/{}/{}/{}/{}/cc-{}",
            self.format,
            self.arch,
            self.kernel_release,
            self.driver_version,
            self.flavor,
            &cc[..16]
        )
    }
}

/// `manifest.json` of an entry: the key, the artifact object and its
/// sha256, and the build manifest with the sha256 of every file inside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredEntry {
    pub key: CacheKey,
    /// Object name of the artifact, relative to the entry's directory.
    pub artifact: String,
    pub artifact_sha256: String,
    pub artifact_size_bytes: u64,
    pub stored_at: String,
    pub stored_by: String,
    pub manifest: Manifest,
}

/// `lease.json`: who compiles the key, since when, for how long at most.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub owner: String,
    pub acquired_at_unix: u64,
    pub ttl_seconds: u64,
}

impl Lease {
    pub fn expired(&self, now_unix: u64) -> bool {
        now_unix >= self.acquired_at_unix.saturating_add(self.ttl_seconds)
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// This builder's name in leases and entries: host, pid and a nonce (two
/// builders in one process, as in the tests, differ too).
fn builder_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{host}/{}/{nanos:08x}{n}", std::process::id())
}

// ------------------------------------------------------------ the store

/// An opened store: the client, the prefix and the runtime that drives it.
pub struct Store {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    rt: tokio::runtime::Runtime,
    /// The URL as shown in results and logs.
    pub display: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("url", &self.display).finish()
    }
}

type StoreResult<T> = std::result::Result<T, object_store::Error>;

/// An object streamed to a temporary file ([`Store::get_to_file`]); the
/// file goes away unless persisted.
pub struct Downloaded {
    pub file: tempfile::NamedTempFile,
    pub size: u64,
    pub sha256: String,
}

impl Store {
    /// Builds the client. `Err` means the store is unusable here: the
    /// caller reports it as `Unavailable` and builds anyway.
    pub fn open(cfg: &CacheConfig) -> Result<Store> {
        let location = parse_url(&cfg.url)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                Error::new(
                    Reason::Internal,
                    format!("starting the cache's runtime: {e}"),
                )
            })?;
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: Duration::from_secs(20),
        };
        // object_store's reqwest client takes the process's crypto provider.
        crate::tls::init();
        let client = tls_roots(
            ClientOptions::new()
                .with_connect_timeout(Duration::from_secs(5))
                .with_timeout(Duration::from_secs(300))
                .with_allow_http(cfg.allow_http),
        );
        let fail = |e: object_store::Error| {
            Error::new(
                Reason::InvalidArgument,
                format!("configuring the store {}: {e}", cfg.url),
            )
        };
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match location {
            Location::File(dir) => {
                // A read-only session creates nothing, not even the store.
                if !cfg.read_only {
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| Error::io(Reason::Internal, "creating", &dir, e))?;
                }
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(fail)?
                    .with_automatic_cleanup(true);
                (Arc::new(fs), String::new())
            }
            Location::S3 { bucket, prefix } => {
                let s = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_retry(retry)
                    .with_client_options(client)
                    .with_allow_http(cfg.allow_http)
                    .build()
                    .map_err(fail)?;
                (Arc::new(s), prefix)
            }
            Location::Gcs { bucket, prefix } => {
                let s = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(bucket)
                    .with_retry(retry)
                    .with_client_options(client)
                    .build()
                    .map_err(fail)?;
                (Arc::new(s), prefix)
            }
            Location::Azure { container, prefix } => {
                let s = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(container)
                    .with_retry(retry)
                    .with_client_options(client)
                    .with_allow_http(cfg.allow_http)
                    .build()
                    .map_err(fail)?;
                (Arc::new(s), prefix)
            }
        };
        Ok(Store {
            store,
            prefix,
            rt,
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

    /// The object's bytes and ETag; `None` when it does not exist.
    pub fn get(&self, rel: &str) -> StoreResult<Option<(Vec<u8>, Option<String>)>> {
        let path = self.path(rel);
        self.rt.block_on(async {
            match self.store.get(&path).await {
                Ok(r) => {
                    let etag = r.meta.e_tag.clone();
                    let bytes = r.bytes().await?;
                    Ok(Some((bytes.to_vec(), etag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// Streams the object into a new temporary file in `dir`, hashing it
    /// as it comes, never holding it in memory. `None` when it does not
    /// exist; an error past `max` bytes (the store is not trusted to be
    /// small).
    pub fn get_to_file(&self, rel: &str, dir: &Path, max: u64) -> Result<Option<Downloaded>> {
        use futures::StreamExt;
        use std::io::Write;
        let path = self.path(rel);
        let tmp = tempfile::Builder::new()
            .prefix(".cache-get-")
            .suffix(".partial")
            .tempfile_in(dir)
            .map_err(|e| Error::io(Reason::Internal, "creating a temporary file in", dir, e))?;
        let write_err = |e| Error::io(Reason::Internal, "writing", tmp.path(), e);
        let mut out = std::io::BufWriter::new(tmp.as_file());
        let mut hasher = Sha256::new();
        let mut size = 0u64;
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
                        Reason::ArtifactInvalid,
                        format!("{}/{rel} is over {} MiB; not used", self.display, max >> 20),
                    ));
                }
                hasher.update(&chunk);
                out.write_all(&chunk).map_err(write_err)?;
            }
            Ok(true)
        })?;
        if !got {
            return Ok(None);
        }
        out.flush().map_err(write_err)?;
        drop(out);
        tmp.as_file().sync_all().map_err(write_err)?;
        Ok(Some(Downloaded {
            file: tmp,
            size,
            sha256: hex::encode(hasher.finalize()),
        }))
    }

    /// The object's ETag, when it exists.
    pub fn head(&self, rel: &str) -> StoreResult<Option<Option<String>>> {
        let path = self.path(rel);
        self.rt.block_on(async {
            match self.store.head(&path).await {
                Ok(m) => Ok(Some(m.e_tag)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    pub fn put(&self, rel: &str, bytes: Vec<u8>, mode: PutMode) -> StoreResult<Option<String>> {
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

    pub fn delete(&self, rel: &str) -> StoreResult<()> {
        let path = self.path(rel);
        self.rt.block_on(async {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }
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
fn describe(e: &object_store::Error) -> String {
    e.to_string()
}

fn is_conflict(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }
    )
}

// ------------------------------------------------------------ a build's session

/// What reading an entry found.
enum Found {
    Hit(Box<StoredEntry>),
    Miss,
    Corrupt(String),
    /// A complete entry whose artifact sha256 is not `--artifact-sha256`:
    /// the sha256 it has.
    Unexpected(String),
    Unavailable(String),
}

/// The cache's part in one build: lookup (with the lease), then publish.
/// Dropping it releases a lease still held (a failed compile), so that the
/// others stop waiting.
pub struct Session {
    store: Option<Store>,
    cfg: CacheConfig,
    key: Option<CacheKey>,
    id: String,
    lease_held: bool,
    /// The sha256 of an entry refused for not being `--artifact-sha256`.
    refused_sha256: Option<String>,
    pub status: CacheStatus,
    /// Seconds spent on the store (lookup, waiting, download, upload).
    pub seconds: f64,
}

impl Session {
    /// Opens the store; a store that cannot be configured makes the
    /// session `Unavailable` (the build goes on without it).
    pub fn start(cfg: &CacheConfig) -> Session {
        let mut status = CacheStatus::disabled();
        status.url = Some(cfg.url.clone());
        let store = match Store::open(cfg) {
            Ok(s) => Some(s),
            Err(e) => {
                status.outcome = CacheOutcome::Unavailable;
                status.warn(format!("store not usable, compiling without it: {e}"));
                None
            }
        };
        Session {
            store,
            cfg: cfg.clone(),
            key: None,
            id: builder_id(),
            lease_held: false,
            refused_sha256: None,
            status,
            seconds: 0.0,
        }
    }

    /// Whether [`Session::lookup`] ran.
    pub fn looked_up(&self) -> bool {
        self.key.is_some()
    }

    /// Why there is nothing to install when compiling is not allowed
    /// (`run --no-compile`) and the lookup found no usable entry:
    /// `ChecksumMismatch` for an entry with another sha256 than
    /// `--artifact-sha256`, else `ArtifactNotCached`.
    pub fn not_cached_error(&self) -> Error {
        let key = self.status.key.as_deref().unwrap_or("(not looked up)");
        let url = self.status.url.as_deref().unwrap_or("?");
        if let (Some(found), Some(expected)) = (&self.refused_sha256, &self.cfg.expected_sha256) {
            return Error::new(
                Reason::ChecksumMismatch,
                format!(
                    "the cache entry {key} in {url} holds an artifact with sha256 {found}, not the expected {expected} (--artifact-sha256); refused, and --no-compile forbids compiling on the node"
                ),
            )
            .with_hint("let a build Job (`gpu-driver-installer prebuild`) store the artifact again and pass its status.built.artifactSha256, or allow compiling on the node");
        }
        let why = if self.status.warnings.is_empty() {
            format!("{:?}", self.status.outcome)
        } else {
            format!(
                "{:?}: {}",
                self.status.outcome,
                self.status.warnings.join("; ")
            )
        };
        Error::new(
            Reason::ArtifactNotCached,
            format!(
                "no usable artifact for {key} in the cache {url} ({why}), and --no-compile forbids compiling on the node"
            ),
        )
        .with_hint("a build Job (`gpu-driver-installer prebuild` with write credentials) must store it first, or allow compiling on the node (run without --no-compile)")
    }

    /// Looks the key up. On a hit the verified artifact is written to
    /// `artifact` and its entry returned. Otherwise the outcome says why not
    /// and, where the store works, this builder holds the key's lease or
    /// gave up waiting for the builder that does.
    pub fn lookup(&mut self, key: CacheKey, artifact: &Path) -> Option<StoredEntry> {
        let t = Instant::now();
        let found = self.lookup_inner(key, artifact);
        self.seconds += t.elapsed().as_secs_f64();
        found
    }

    fn lookup_inner(&mut self, key: CacheKey, artifact: &Path) -> Option<StoredEntry> {
        let dir = key.path();
        self.status.key = Some(dir.clone());
        self.key = Some(key.clone());
        let store = self.store.as_ref()?;
        if self.cfg.read_only {
            return self.lookup_read_only(&key, &dir, artifact);
        }
        let start = Instant::now();
        let mut corrupt = false;
        let mut waited_for: Option<String> = None;
        let mut seen_manifest: Option<Option<String>> = None;
        loop {
            // While waiting, an unchanged manifest (a corrupt one that the
            // lease holder is replacing) is not downloaded again.
            let unchanged = match (&waited_for, &seen_manifest) {
                (Some(_), Some(seen)) => match store.head(&format!("{dir}/manifest.json")) {
                    Ok(Some(etag)) => etag.is_some() && &etag == seen,
                    _ => false,
                },
                _ => false,
            };
            if !unchanged {
                let expected = self.cfg.expected_sha256.as_deref();
                match read_entry(store, &key, &dir, artifact, expected, &mut self.status) {
                    Found::Hit(entry) => {
                        self.status.outcome = CacheOutcome::Hit;
                        if let Some(owner) = waited_for {
                            self.status.lease = Some(format!(
                                "waited {:.1} s for builder {owner}",
                                start.elapsed().as_secs_f64()
                            ));
                        }
                        return Some(*entry);
                    }
                    Found::Miss => {}
                    Found::Corrupt(why) => {
                        if !corrupt {
                            self.status.warn(format!(
                                "entry {dir} is corrupt, compiling to replace it: {why}"
                            ));
                        }
                        corrupt = true;
                        seen_manifest = store.head(&format!("{dir}/manifest.json")).ok().flatten();
                    }
                    Found::Unexpected(found) => {
                        self.refuse_unexpected(&dir, found);
                        return None;
                    }
                    Found::Unavailable(why) => {
                        self.status.outcome = CacheOutcome::Unavailable;
                        self.status
                            .warn(format!("store unavailable, compiling without it: {why}"));
                        return None;
                    }
                }
            }
            self.status.outcome = if corrupt {
                CacheOutcome::Corrupt
            } else {
                CacheOutcome::Miss
            };
            match self.acquire_lease(&dir) {
                Ok(LeaseState::Acquired(note)) => {
                    self.lease_held = true;
                    self.status.lease = Some(match waited_for {
                        Some(owner) => format!(
                            "{note} after waiting {:.1} s for builder {owner}",
                            start.elapsed().as_secs_f64()
                        ),
                        None => note,
                    });
                    return None;
                }
                Ok(LeaseState::HeldBy(owner)) => {
                    if start.elapsed() >= self.cfg.wait {
                        self.status.warn(format!(
                            "waited {:.0} s (--cache-wait) for builder {owner}, which holds the lease of {dir}; compiling here",
                            start.elapsed().as_secs_f64()
                        ));
                        self.status.lease = Some(format!("gave up waiting for builder {owner}"));
                        return None;
                    }
                    if waited_for.is_none() {
                        tracing::info!(
                            "cache: builder {owner} is compiling {dir}; waiting up to {} s for its artifact",
                            self.cfg.wait.as_secs()
                        );
                    }
                    waited_for = Some(owner);
                    std::thread::sleep(self.cfg.poll);
                }
                Err(e) => {
                    self.status.warn(format!(
                        "could not take the lease of {dir}, compiling without coordination: {}",
                        describe(&e)
                    ));
                    return None;
                }
            }
        }
    }

    /// `--cache-read-only`: one read of the entry; no lease, no waiting
    /// for another builder's, and nothing is ever written.
    fn lookup_read_only(
        &mut self,
        key: &CacheKey,
        dir: &str,
        artifact: &Path,
    ) -> Option<StoredEntry> {
        let store = self.store.as_ref()?;
        let expected = self.cfg.expected_sha256.as_deref();
        match read_entry(store, key, dir, artifact, expected, &mut self.status) {
            Found::Hit(entry) => {
                self.status.outcome = CacheOutcome::Hit;
                return Some(*entry);
            }
            Found::Miss => {
                self.status.outcome = CacheOutcome::Miss;
                self.status.warn(format!(
                    "no entry {dir}; the cache is read-only (--cache-read-only), so nothing built here is stored"
                ));
            }
            Found::Corrupt(why) => {
                self.status.outcome = CacheOutcome::Corrupt;
                self.status.warn(format!(
                    "entry {dir} is corrupt and the cache is read-only (--cache-read-only), so it is not replaced: {why}"
                ));
            }
            Found::Unexpected(found) => self.refuse_unexpected(dir, found),
            Found::Unavailable(why) => {
                self.status.outcome = CacheOutcome::Unavailable;
                self.status
                    .warn(format!("store unavailable, compiling without it: {why}"));
            }
        }
        None
    }

    /// An entry with another artifact sha256 than `--artifact-sha256`:
    /// not used, and left in place (it is not this node's to replace; the
    /// node's own compile would not have the expected sha256 either).
    fn refuse_unexpected(&mut self, dir: &str, found: String) {
        self.status.outcome = CacheOutcome::Miss;
        self.status.warn(format!(
            "entry {dir} holds an artifact with sha256 {found}, not the expected {} (--artifact-sha256); not used, and not replaced",
            self.cfg.expected_sha256.as_deref().unwrap_or("?")
        ));
        self.refused_sha256 = Some(found);
    }

    /// Takes the key's lease, then confirms it: after [`LEASE_SETTLE`] the
    /// lease must still name this builder. A store whose conditional create
    /// is a check followed by a write (s3s-fs; possibly other S3-compatible
    /// servers) can let two racing creates both succeed; the last write
    /// stays, and only its writer goes on.
    fn acquire_lease(&self, dir: &str) -> StoreResult<LeaseState> {
        let note = match self.try_lease(dir)? {
            LeaseState::Acquired(note) => note,
            held => return Ok(held),
        };
        let Some(store) = &self.store else {
            return Ok(LeaseState::Acquired(note));
        };
        std::thread::sleep(LEASE_SETTLE);
        let rel = format!("{dir}/lease.json");
        let now = store
            .get(&rel)?
            .and_then(|(bytes, _)| serde_json::from_slice::<Lease>(&bytes).ok());
        match now {
            Some(l) if l.owner == self.id => Ok(LeaseState::Acquired(note)),
            Some(l) => {
                tracing::info!(
                    "cache: lease of {dir} was also written by {}, whose write stayed",
                    l.owner
                );
                Ok(LeaseState::HeldBy(l.owner))
            }
            None => Ok(LeaseState::HeldBy("unknown".into())),
        }
    }

    fn try_lease(&self, dir: &str) -> StoreResult<LeaseState> {
        let Some(store) = &self.store else {
            return Ok(LeaseState::Acquired("no store".into()));
        };
        let rel = format!("{dir}/lease.json");
        let lease = Lease {
            owner: self.id.clone(),
            acquired_at_unix: now_unix(),
            ttl_seconds: self.cfg.lease_ttl.as_secs(),
        };
        let body = serde_json::to_vec_pretty(&lease).unwrap_or_default();
        match store.put(&rel, body.clone(), PutMode::Create) {
            Ok(_) => return Ok(LeaseState::Acquired("acquired".into())),
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(e),
        }
        let Some((bytes, etag)) = store.get(&rel)? else {
            // Released between our create and our read: try again at once.
            return match store.put(&rel, body, PutMode::Create) {
                Ok(_) => Ok(LeaseState::Acquired("acquired".into())),
                Err(e) if is_conflict(&e) => Ok(LeaseState::HeldBy("unknown".into())),
                Err(e) => Err(e),
            };
        };
        let held: Option<Lease> = serde_json::from_slice(&bytes).ok();
        let stale = match &held {
            Some(l) => l.expired(now_unix()),
            // An unreadable lease (a truncated write) protects nothing.
            None => true,
        };
        let owner = held.map_or_else(|| "unknown".to_string(), |l| l.owner);
        if !stale {
            return Ok(LeaseState::HeldBy(owner));
        }
        tracing::warn!("cache: lease of {dir} by {owner} expired; taking it over");
        let note = format!("took over the expired lease of {owner}");
        // Compare-and-swap on the ETag where the store has it (S3, GCS,
        // Azure); the local file system has only create, so delete + create.
        match store.put(
            &rel,
            body.clone(),
            PutMode::Update(UpdateVersion {
                e_tag: etag,
                version: None,
            }),
        ) {
            Ok(_) => Ok(LeaseState::Acquired(note)),
            Err(e) if is_conflict(&e) => Ok(LeaseState::HeldBy(owner)),
            Err(object_store::Error::NotImplemented { .. }) => {
                store.delete(&rel)?;
                match store.put(&rel, body, PutMode::Create) {
                    Ok(_) => Ok(LeaseState::Acquired(note)),
                    Err(e) if is_conflict(&e) => Ok(LeaseState::HeldBy("unknown".into())),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Stores a fresh build under the key: the artifact first, the manifest
    /// last, then releases the lease. Does nothing after a hit or when the
    /// store is unavailable; a failure is a warning.
    pub fn publish(&mut self, artifact: &Path, sha256: &str, manifest: &Manifest) {
        let t = Instant::now();
        self.publish_inner(artifact, sha256, manifest);
        self.release();
        self.seconds += t.elapsed().as_secs_f64();
    }

    fn publish_inner(&mut self, artifact: &Path, sha256: &str, manifest: &Manifest) {
        if matches!(
            self.status.outcome,
            CacheOutcome::Hit | CacheOutcome::Unavailable | CacheOutcome::Disabled
        ) || self.cfg.read_only
            || self.refused_sha256.is_some()
        {
            return;
        }
        let (Some(store), Some(key)) = (&self.store, &self.key) else {
            return;
        };
        let dir = key.path();
        let bytes = match std::fs::read(artifact) {
            Ok(b) => b,
            Err(e) => {
                self.status
                    .warn(format!("not stored: reading {}: {e}", artifact.display()));
                return;
            }
        };
        // The first 16 hex digits name it (the manifest holds the whole
        // sha256): object keys stay short, which some S3 servers need
        // (s3s-fs names a metadata file after the base64 of the key).
        let name = format!("artifact-{}.tar.zst", &sha256[..sha256.len().min(16)]);
        let entry = StoredEntry {
            key: key.clone(),
            artifact: name.clone(),
            artifact_sha256: sha256.to_string(),
            artifact_size_bytes: bytes.len() as u64,
            stored_at: crate::text::rfc3339_utc(SystemTime::now()),
            stored_by: self.id.clone(),
            manifest: manifest.clone(),
        };
        let entry_json = match serde_json::to_vec_pretty(&entry) {
            Ok(j) => j,
            Err(e) => {
                self.status.warn(format!("not stored: {e}"));
                return;
            }
        };
        let size = bytes.len() as u64;
        // The artifact is named by its sha256, so that two builders that
        // both compiled never overwrite each other's bytes under a manifest
        // that names the other's.
        if let Err(e) = store.put(&format!("{dir}/{name}"), bytes, PutMode::Overwrite) {
            self.status.warn(format!(
                "not stored: uploading the artifact: {}",
                describe(&e)
            ));
            return;
        }
        self.status.bytes_uploaded += size;
        let manifest_size = entry_json.len() as u64;
        if let Err(e) = store.put(
            &format!("{dir}/manifest.json"),
            entry_json,
            PutMode::Overwrite,
        ) {
            self.status.warn(format!(
                "not stored: uploading the manifest: {}",
                describe(&e)
            ));
            return;
        }
        self.status.bytes_uploaded += manifest_size;
        self.status.stored = true;
        tracing::info!(
            "cache: stored {dir} ({} bytes) in {}",
            self.status.bytes_uploaded,
            store.display
        );
    }

    /// Deletes the lease if this builder still holds it.
    fn release(&mut self) {
        if !self.lease_held {
            return;
        }
        self.lease_held = false;
        let (Some(store), Some(key)) = (&self.store, &self.key) else {
            return;
        };
        let rel = format!("{}/lease.json", key.path());
        let ours = match store.get(&rel) {
            Ok(Some((bytes, _))) => serde_json::from_slice::<Lease>(&bytes)
                .map(|l| l.owner == self.id)
                .unwrap_or(false),
            _ => false,
        };
        if ours {
            if let Err(e) = store.delete(&rel) {
                tracing::warn!("cache: releasing the lease {rel}: {}", describe(&e));
            }
        }
    }

    /// The status for the result.
    pub fn finish(mut self) -> CacheStatus {
        self.release();
        std::mem::replace(&mut self.status, CacheStatus::disabled())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.release();
    }
}

enum LeaseState {
    Acquired(String),
    HeldBy(String),
}

/// Reads and verifies the entry; on success the artifact is at `artifact`.
fn read_entry(
    store: &Store,
    key: &CacheKey,
    dir: &str,
    artifact: &Path,
    expected_sha256: Option<&str>,
    status: &mut CacheStatus,
) -> Found {
    let manifest = match store.get(&format!("{dir}/manifest.json")) {
        Ok(Some((bytes, _))) => bytes,
        Ok(None) => return Found::Miss,
        Err(e) => return Found::Unavailable(describe(&e)),
    };
    status.bytes_downloaded += manifest.len() as u64;
    let entry: StoredEntry = match serde_json::from_slice(&manifest) {
        Ok(e) => e,
        Err(e) => {
            return Found::Corrupt(format!(
                "manifest.json ({} bytes) is not a valid entry: {e}",
                manifest.len()
            ));
        }
    };
    if &entry.key != key {
        return Found::Corrupt(format!(
            "manifest.json is for another key ({:?})",
            entry.key
        ));
    }
    if entry.artifact.contains('/') || !entry.artifact.ends_with(".tar.zst") {
        return Found::Corrupt(format!("manifest.json names artifact {:?}", entry.artifact));
    }
    // Refused before the download: the artifact is checked against the
    // manifest's sha256 below, so the manifest's must be the expected one.
    if let Some(expected) = expected_sha256 {
        if !entry.artifact_sha256.eq_ignore_ascii_case(expected) {
            return Found::Unexpected(entry.artifact_sha256);
        }
    }
    if entry.artifact_size_bytes > MAX_ARTIFACT_BYTES {
        return Found::Corrupt(format!(
            "{} claims {} bytes, more than an artifact may have",
            entry.artifact, entry.artifact_size_bytes
        ));
    }
    let parent = match artifact.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let rel = format!("{dir}/{}", entry.artifact);
    let got = match store.get_to_file(&rel, parent, entry.artifact_size_bytes) {
        Ok(Some(d)) => d,
        Ok(None) => return Found::Corrupt(format!("{} is missing", entry.artifact)),
        Err(e) if e.reason == Reason::ArtifactInvalid => return Found::Corrupt(e.message),
        Err(e) => return Found::Unavailable(e.message),
    };
    status.bytes_downloaded += got.size;
    if let Err(e) = verify_artifact(&got, &entry) {
        return Found::Corrupt(e.message);
    }
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    if let Err(e) = std::fs::set_permissions(got.file.path(), mode) {
        return Found::Unavailable(format!(
            "setting permissions of {}: {e}",
            got.file.path().display()
        ));
    }
    if let Err(e) = got.file.persist(artifact) {
        return Found::Unavailable(format!("renaming into {}: {}", artifact.display(), e.error));
    }
    Found::Hit(Box::new(entry))
}

/// The largest artifact a cache entry may name (modules and user space of
/// one driver are a few hundred MiB).
const MAX_ARTIFACT_BYTES: u64 = 4 << 30;

/// The artifact's size and sha256 against the entry, its modules' vermagic
/// against the key, then every file inside against the build manifest
/// (the artifact module's check, streamed from the downloaded file).
pub fn verify_artifact(got: &Downloaded, entry: &StoredEntry) -> Result<()> {
    let corrupt = |m: String| Error::new(Reason::ArtifactInvalid, m);
    if got.size != entry.artifact_size_bytes {
        return Err(corrupt(format!(
            "{} is truncated or padded: {} bytes, the manifest says {}",
            entry.artifact, got.size, entry.artifact_size_bytes
        )));
    }
    if got.sha256 != entry.artifact_sha256 {
        return Err(corrupt(format!(
            "{} has sha256 {}, the manifest says {}",
            entry.artifact, got.sha256, entry.artifact_sha256
        )));
    }
    if !entry
        .manifest
        .modules
        .iter()
        .any(|m| m.file == "modules/nvidia.ko")
    {
        return Err(corrupt("the manifest lists no modules/nvidia.ko".into()));
    }
    for m in &entry.manifest.modules {
        if m.vermagic.split_whitespace().next() != Some(entry.key.kernel_release.as_str()) {
            return Err(corrupt(format!(
                "{} has vermagic {:?}, not for kernel {}",
                m.file, m.vermagic, entry.key.kernel_release
            )));
        }
    }
    let file = std::fs::File::open(got.file.path())
        .map_err(|e| Error::io(Reason::Internal, "reading", got.file.path(), e))?;
    crate::artifact::check_reader(std::io::BufReader::new(file), &entry.manifest)
}

// ------------------------------------------------------------ packages

/// The object name of a driver package in the store's mirror.
pub fn package_object(file: &str) -> String {
    format!("packages/{file}")
}

/// Restores `packages/<file>` into `dest` if the store has it and its
/// sha256 is `sha256` (the checksum comes from the usual trusted sources,
/// never from the store). `Ok(None)`: not in the store; `Err`: unusable.
pub fn restore_package(
    cfg: &CacheConfig,
    file: &str,
    sha256: &str,
    dest: &Path,
) -> Result<Option<u64>> {
    check_file_name(file)?;
    let store = Store::open(cfg)?;
    let rel = package_object(file);
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // A node's first fetch: its package cache may not exist yet.
    std::fs::create_dir_all(parent)
        .map_err(|e| Error::io(Reason::Internal, "creating", parent, e))?;
    let max = crate::fetch::DEFAULT_MAX_DOWNLOAD_MIB << 20;
    let Some(got) = store.get_to_file(&rel, parent, max)? else {
        return Ok(None);
    };
    if got.sha256 != sha256 {
        return Err(Error::new(
            Reason::ChecksumMismatch,
            format!(
                "{}/{rel} has sha256 {}, not the trusted {sha256}; not used",
                store.display, got.sha256
            ),
        ));
    }
    let file = got.file;
    std::fs::set_permissions(
        file.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .map_err(|e| Error::io(Reason::Internal, "setting permissions of", file.path(), e))?;
    file.persist(dest)
        .map_err(|e| Error::io(Reason::Internal, "renaming into place", dest, e.error))?;
    crate::files::sync_dir(parent);
    Ok(Some(got.size))
}

/// `fetch` with the cache's store as a private package mirror: a package the
/// store holds (`<cache-url>/packages/<file>`) is placed into the local
/// package cache if its sha256 is the trusted one, and a package downloaded
/// from elsewhere is stored there for the other nodes. The store never
/// supplies a checksum, and its failures are only warnings.
pub fn fetch_with_mirror(
    cache: &CacheConfig,
    req: &crate::fetch::PackageRequest,
    opts: crate::fetch::FetchOptions,
) -> crate::fetch::FetchResult {
    let file = crate::fetch::file_name_of(&req.url);
    let sha = match &req.sha256 {
        Some((s, _)) => Some(s.to_ascii_lowercase()),
        None if !opts.offline => crate::fetch::find_checksum(req, &opts).ok().map(|(s, _)| s),
        None => None,
    };
    let mut restored = None;
    if let Some(sha) = sha.filter(|s| crate::fetch::is_sha256_hex(s)) {
        let dest = opts.cache_dir.join(&sha);
        if !dest.exists() {
            match restore_package(cache, &file, &sha, &dest) {
                Ok(Some(n)) => {
                    tracing::info!("{file}: {n} bytes from the cache store {}", cache.url);
                    restored = Some(n);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("{file}: cache store not used as a mirror: {e}"),
            }
        }
    }
    let mut doc = crate::fetch::fetch_package(req, opts);
    if doc.status.outcome.reason != Reason::Fetched {
        return doc;
    }
    if let Some(n) = restored {
        doc.status.outcome.message = format!(
            "{file} came from the cache store {}/{} ({n} bytes) and was verified against the trusted sha256 at {}",
            cache.url.trim_end_matches('/'),
            package_object(&file),
            doc.status.path.as_deref().unwrap_or("?")
        );
    } else if cache.read_only {
        tracing::debug!("{file}: not stored in the cache store: it is read-only");
    } else if let Some(path) = &doc.status.path {
        match store_package(cache, &file, Path::new(path)) {
            Ok(true) => tracing::info!("{file}: stored in the cache store {}", cache.url),
            Ok(false) => {}
            Err(e) => tracing::warn!("{file}: not stored in the cache store: {e}"),
        }
    }
    doc
}

/// Stores a verified package as `packages/<file>` unless it is there
/// already. Returns whether it was written.
pub fn store_package(cfg: &CacheConfig, file: &str, path: &Path) -> Result<bool> {
    check_file_name(file)?;
    if cfg.read_only {
        return Ok(false);
    }
    let store = Store::open(cfg)?;
    let rel = package_object(file);
    if store.head(&rel).map_err(|e| unavailable(&e))?.is_some() {
        return Ok(false);
    }
    let bytes = std::fs::read(path).map_err(|e| Error::io(Reason::Internal, "reading", path, e))?;
    match store.put(&rel, bytes, PutMode::Create) {
        Ok(_) => Ok(true),
        Err(e) if is_conflict(&e) => Ok(false),
        Err(e) => Err(unavailable(&e)),
    }
}

/// A store request that failed: the store is unreachable or refused.
fn unavailable(e: &object_store::Error) -> Error {
    Error::new(Reason::DownloadFailed, describe(e))
}

fn check_file_name(file: &str) -> Result<()> {
    if file.is_empty() || file.contains('/') || file.starts_with('.') {
        Err(Error::new(
            Reason::InvalidArgument,
            format!("{file:?} is not a package file name"),
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(e.message.contains("s3://BUCKET"), "{}", e.message);
        }
    }

    #[test]
    fn key_path_covers_every_part() {
        let k = CacheKey::new(
            CpuArch::X86_64,
            "6.1.0-50-cloud-amd64",
            "535.261.03",
            ModuleFlavor::Open,
            "gcc (Debian 12.2.0-14) 12.2.0",
        );
        let p = k.path();
        assert!(p.starts_with(&format!("artifacts/v{FORMAT_VERSION}.{MANIFEST_VERSION}/")));
        assert!(p.contains("/x86_64/"), "{p}");
        assert!(p.contains("/6.1.0-50-cloud-amd64/535.261.03/open/cc-"));
        let other_cc = CacheKey::new(
            CpuArch::X86_64,
            "6.1.0-50-cloud-amd64",
            "535.261.03",
            ModuleFlavor::Open,
            "gcc (Debian 12.2.0-14+deb12u1) 12.2.0",
        );
        assert_ne!(p, other_cc.path());
        let other_flavor = CacheKey::new(
            CpuArch::X86_64,
            "6.1.0-50-cloud-amd64",
            "535.261.03",
            ModuleFlavor::Proprietary,
            "gcc (Debian 12.2.0-14) 12.2.0",
        );
        assert_ne!(p, other_flavor.path());
        // A cross build's modules are keyed by their architecture.
        let arm = CacheKey::new(
            CpuArch::Aarch64,
            "6.1.0-50-cloud-amd64",
            "535.261.03",
            ModuleFlavor::Open,
            "gcc (Debian 12.2.0-14) 12.2.0",
        );
        assert!(arm.path().contains("/aarch64/"), "{}", arm.path());
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
            assert!(e.message.contains("--artifact-sha256"), "{e}");
        }
    }

    #[test]
    fn leases_expire_after_their_ttl() {
        let l = Lease {
            owner: "a".into(),
            acquired_at_unix: 1000,
            ttl_seconds: 60,
        };
        assert!(!l.expired(1059));
        assert!(l.expired(1060));
    }
}
