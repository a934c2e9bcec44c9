//! `fetch`: get a package onto the node without ever trusting a corrupt or
//! tampered byte. Streams into `<sha256>.partial` while hashing, verifies,
//! fsyncs and renames; resumes with `Range` when the server honours it;
//! retries with an explicit backoff policy; tries mirrors in order; a
//! verified cache hit needs no network at all.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::report::Reason;

/// Read and hash in chunks of this size: large enough that syscalls do not
/// dominate, small enough that memory stays flat whatever the file size.
const CHUNK: usize = 256 * 1024;

/// Start writeback of what was written every this many bytes, so that the
/// final fsync does not wait for the whole file at once.
const WRITEBACK_EVERY: u64 = 16 * 1024 * 1024;

/// How often a non-TTY download logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// When and how long to wait between attempts at one URL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt, per URL.
    pub retries: u32,
    /// Wait before the first retry; doubles each time.
    pub initial_backoff: Duration,
    /// Upper bound of any single wait, also of a server's Retry-After.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 4,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Wait before retry number `retry` (1-based): initial × 2^(retry-1),
    /// capped; a server's Retry-After replaces it, within the same cap.
    pub fn backoff(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << retry.saturating_sub(1).min(16));
        retry_after.unwrap_or(exp).min(self.max_backoff)
    }
}

/// The bounds of one download: time per request and per read, time for
/// the whole fetch, and its size.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    /// Longest wait for the response head or for any single read of the body.
    pub read: Duration,
    /// The whole fetch, every source, retry and backoff included: a server
    /// that sends one byte just inside each read timeout still ends.
    pub total: Duration,
    /// The most bytes a download may have; a larger `Content-Length` is
    /// refused before anything is written.
    pub max_bytes: u64,
}

/// 30 minutes: NVIDIA's largest `.run` (about 400 MB) at 250 kB/s.
pub const DEFAULT_DOWNLOAD_TIMEOUT_SECS: u64 = 1800;

/// 2 GiB: five times NVIDIA's largest `.run`.
pub const DEFAULT_MAX_DOWNLOAD_MIB: u64 = 2048;

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(30),
            read: Duration::from_secs(60),
            total: Duration::from_secs(DEFAULT_DOWNLOAD_TIMEOUT_SECS),
            max_bytes: DEFAULT_MAX_DOWNLOAD_MIB << 20,
        }
    }
}

/// When a fetch must have ended.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    total: Duration,
}

impl Deadline {
    fn new(total: Duration) -> Self {
        Deadline {
            at: Instant::now() + total,
            total,
        }
    }

    fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    fn left(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    fn error(&self, url: &str, got: u64) -> Error {
        Error::new(
            Reason::DownloadFailed,
            format!(
                "{url}: the download deadline of {} s passed after {got} bytes",
                self.total.as_secs()
            ),
        )
        .with_hint("raise --download-timeout for a slow network, or add a closer --mirror")
    }
}

/// Where the expected checksum came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ChecksumSource {
    /// `--sha256`
    Flag,
    /// The catalog's driver entry.
    Catalog,
    /// `<url>.sha256sum` fetched over HTTPS.
    Companion,
    /// NVIDIA's `redistrib_<version>.json` manifest.
    RedistManifest,
}

/// One try at one URL, for the result.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub url: String,
    /// Where the bytes of this attempt came from, after redirects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// Bytes received in this attempt.
    pub bytes: u64,
    /// Whether it continued a partial file (server answered 206).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub struct FetchOptions {
    /// The package URL first, then mirrors, in order.
    pub urls: Vec<String>,
    /// Lower-case hex sha256, and where it came from.
    pub sha256: String,
    pub cache_dir: PathBuf,
    pub offline: bool,
    pub allow_http: bool,
    pub retry: RetryPolicy,
    pub timeouts: Timeouts,
    /// Extra PEM CA certificates (private mirrors); the bundled web roots
    /// are used otherwise.
    pub ca_bundle: Option<PathBuf>,
    /// Show a progress bar (on a TTY).
    pub progress_bar: bool,
}

#[derive(Debug, Clone)]
pub struct Fetched {
    pub path: PathBuf,
    pub size: u64,
    pub cache_hit: bool,
    pub source_url: Option<String>,
    pub attempts: Vec<Attempt>,
}

/// A failure that carries the attempts made, for the result.
#[derive(Debug)]
pub struct FetchError {
    pub error: Error,
    pub attempts: Vec<Attempt>,
}

impl From<Error> for FetchError {
    fn from(error: Error) -> Self {
        FetchError {
            error,
            attempts: Vec::new(),
        }
    }
}

pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Refuses plain HTTP unless allowed, and anything that is not HTTP(S).
pub fn check_url(url: &str, allow_http: bool) -> Result<()> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        Ok(())
    } else if lower.starts_with("http://") {
        if allow_http {
            Ok(())
        } else {
            Err(Error::new(
                Reason::InsecureUrl,
                format!("refusing plain HTTP URL {url}"),
            )
            .with_hint("use an https:// URL or mirror, or pass --allow-http for a trusted network"))
        }
    } else {
        Err(Error::new(
            Reason::InvalidArgument,
            format!("{url} is not an http(s) URL"),
        ))
    }
}

/// Redirects followed per request.
const MAX_REDIRECTS: usize = 5;

/// The HTTP client (reqwest, blocking): TLS via rustls with ring (the
/// bundled web roots, plus `ca_bundle`), one proxy from the environment
/// ([`proxy_from_env`]), at most 5 redirects and never from HTTPS to plain
/// HTTP, HTTPS only unless plain HTTP is allowed, no content decoding (the
/// bytes hashed are the bytes served), status codes handled by us.
///
/// `timeouts.read` bounds the wait for the response head (counted from the
/// start of the request, connecting included) and every single read of the
/// body; `timeouts.connect` bounds connecting alone.
pub fn agent(opts: &FetchOptions) -> Result<reqwest::blocking::Client> {
    let mut roots = crate::tls::web_roots();
    if let Some(path) = &opts.ca_bundle {
        let pem = fs::read(path)
            .map_err(|e| Error::io(Reason::InvalidArgument, "reading CA bundle", path, e))?;
        let certs = crate::tls::pem_certificates(&pem).map_err(|e| {
            Error::new(
                Reason::InvalidArgument,
                format!("CA bundle {} is not valid PEM: {e}", path.display()),
            )
        })?;
        if certs.is_empty() {
            return Err(Error::new(
                Reason::InvalidArgument,
                format!("CA bundle {} holds no PEM certificate", path.display()),
            ));
        }
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(Error::new(
                Reason::InvalidArgument,
                format!(
                    "CA bundle {} holds no usable CA certificate",
                    path.display()
                ),
            ));
        }
    }
    let tls = crate::tls::client_config(roots)
        .map_err(|e| Error::new(Reason::Internal, format!("configuring TLS: {e}")))?;
    // The environment's proxy is chosen here, not by reqwest (no_proxy
    // first turns its own lookup off).
    let mut builder = reqwest::blocking::Client::builder()
        .no_proxy()
        .tls_backend_preconfigured(tls)
        .https_only(!opts.allow_http)
        .redirect(redirect_policy())
        .connect_timeout(opts.timeouts.connect)
        .timeout(opts.timeouts.read)
        .http1_only()
        .no_gzip()
        .no_brotli()
        .no_zstd()
        .no_deflate()
        .user_agent(format!(
            "gpu-driver-installer/{}",
            env!("CARGO_PKG_VERSION")
        ));
    if let Some(proxy) = proxy_from_env() {
        builder = builder.proxy(proxy);
    }
    builder.build().map_err(|e| {
        Error::new(
            Reason::Internal,
            format!("building the HTTP client: {}", describe(&e)),
        )
    })
}

/// The proxy for every URL: the first usable of `ALL_PROXY`, `HTTPS_PROXY`
/// and `HTTP_PROXY` (upper or lower case), bypassed for the hosts in
/// `NO_PROXY`. HTTPS goes through it with CONNECT; plain HTTP (only with
/// `--allow-http`) is forwarded by it.
fn proxy_from_env() -> Option<reqwest::Proxy> {
    const VARS: [&str; 6] = [
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ];
    for var in VARS {
        let Ok(value) = std::env::var(var) else {
            continue;
        };
        if value.trim().is_empty() {
            continue;
        }
        match reqwest::Proxy::all(value.trim()) {
            Ok(p) => return Some(p.no_proxy(reqwest::NoProxy::from_env())),
            // The value may hold credentials: name the variable only.
            Err(_) => tracing::warn!("{var} is not a usable proxy URL; ignoring it"),
        }
    }
    None
}

/// At most [`MAX_REDIRECTS`] redirects, and only to HTTPS: `--allow-http`
/// permits the plain-HTTP URLs it was given, never one a server (or a
/// network in between) names, so a redirect can never lower the scheme.
fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            let msg = format!("more than {MAX_REDIRECTS} redirects");
            attempt.error(msg)
        } else if attempt.url().scheme() != "https" {
            let from = attempt.previous().last().map(redacted).unwrap_or_default();
            let msg = format!(
                "refusing a redirect from {from} to {}: redirects are followed to HTTPS only",
                redacted(attempt.url())
            );
            attempt.error(msg)
        } else {
            attempt.follow()
        }
    })
}

/// A URL as it may be shown: without user info or query (either may hold a
/// credential, e.g. a signed mirror URL).
fn redacted(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.to_string()
}

/// An error with its causes. reqwest's own message is terse ("error sending
/// request"); the causes say what happened (refused, timed out, which
/// certificate problem).
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let m = c.to_string();
        if !text.contains(&m) {
            text.push_str(": ");
            text.push_str(&m);
        }
        cause = c.source();
    }
    text
}

/// A request's error, described without its URL (the caller names it).
pub(crate) fn describe_http_error(e: reqwest::Error) -> String {
    describe(&e.without_url())
}

/// Fetches the package into `<cache_dir>/<sha256>`, verified.
pub fn fetch(opts: &FetchOptions) -> Result<Fetched, FetchError> {
    let sha = opts.sha256.to_ascii_lowercase();
    if !is_sha256_hex(&sha) {
        return Err(Error::new(
            Reason::InvalidArgument,
            format!("sha256 {:?} is not 64 hex digits", opts.sha256),
        )
        .into());
    }
    fs::create_dir_all(&opts.cache_dir).map_err(|e| {
        Error::io(
            Reason::DownloadFailed,
            "creating cache directory",
            &opts.cache_dir,
            e,
        )
    })?;
    let final_path = opts.cache_dir.join(&sha);
    let partial = opts.cache_dir.join(format!("{sha}.partial"));
    // Two installers on one node must not write the same partial file.
    let _lock = crate::files::lock(
        &opts.cache_dir.join(format!("{sha}.lock")),
        Reason::DownloadFailed,
    )?;

    if let Some(hit) = cached(&final_path, &sha)? {
        return Ok(hit);
    }
    if opts.offline {
        return Err(Error::new(
            Reason::NotCached,
            format!(
                "--offline and {} is not in the cache {}",
                sha,
                opts.cache_dir.display()
            ),
        )
        .with_hint(
            "pre-seed the cache (fetch once online, or copy the file there named by its sha256)",
        )
        .into());
    }
    if opts.urls.is_empty() {
        return Err(Error::new(Reason::InvalidArgument, "no URL to fetch from").into());
    }
    for url in &opts.urls {
        check_url(url, opts.allow_http)?;
    }

    let agent = agent(opts)?;
    let deadline = Deadline::new(opts.timeouts.total);
    let mut attempts = Vec::new();
    let mut mismatch = None;
    let mut late = None;
    for url in &opts.urls {
        if deadline.passed() {
            late = Some(deadline.error(url, 0));
            break;
        }
        match fetch_from(&agent, url, &sha, &partial, opts, deadline, &mut attempts) {
            Ok(size) => {
                finish(&partial, &final_path)?;
                // The last attempt delivered the bytes (or their rest):
                // name where they came from, after redirects.
                let source = attempts
                    .last()
                    .and_then(|a| a.final_url.clone())
                    .unwrap_or_else(|| url.clone());
                return Ok(Fetched {
                    path: final_path,
                    size,
                    cache_hit: false,
                    source_url: Some(source),
                    attempts,
                });
            }
            Err(e) if e.reason == Reason::ChecksumMismatch => {
                tracing::warn!("{e}; trying the next source");
                mismatch = Some(e);
            }
            Err(e) if e.reason == Reason::DownloadFailed && deadline.passed() => {
                // What was received stays for a later run to resume.
                late = Some(e);
                break;
            }
            Err(e) if e.reason == Reason::DownloadFailed => {
                tracing::warn!("{url}: {e}; trying the next source");
            }
            Err(e) => {
                // A full disk, a size over the cap, a local I/O error: what
                // was written cannot be resumed usefully, so it goes.
                remove(&partial)?;
                return Err(FetchError { error: e, attempts });
            }
        }
    }
    if let Some(error) = late {
        return Err(FetchError { error, attempts });
    }
    let error = mismatch.unwrap_or_else(|| every_source_failed(&attempts));
    Err(FetchError { error, attempts })
}

/// The cached file when it verifies; a cached file that does not is
/// deleted.
fn cached(final_path: &Path, sha: &str) -> Result<Option<Fetched>> {
    if !final_path.exists() {
        return Ok(None);
    }
    let (got, size) = crate::files::sha256_file(final_path, Reason::DownloadFailed)?;
    if got != sha {
        tracing::warn!(
            "cached {} has sha256 {got}, not {sha}; deleting it",
            final_path.display()
        );
        remove(final_path)?;
        return Ok(None);
    }
    tracing::info!(
        "cache hit: {} ({size} bytes, sha256 verified)",
        final_path.display()
    );
    Ok(Some(Fetched {
        path: final_path.to_path_buf(),
        size,
        cache_hit: true,
        source_url: None,
        attempts: Vec::new(),
    }))
}

/// The error when no source delivered: each attempt's URL and error.
fn every_source_failed(attempts: &[Attempt]) -> Error {
    let detail: Vec<String> = attempts
        .iter()
        .map(|a| {
            format!(
                "{}: {}",
                a.url,
                a.error.as_deref().unwrap_or("no error recorded")
            )
        })
        .collect();
    Error::new(
        Reason::DownloadFailed,
        format!(
            "every source failed after {} attempt(s): {}",
            attempts.len(),
            detail.join("; ")
        ),
    )
    .with_hint("check the network, HTTPS_PROXY/NO_PROXY, or add --mirror")
}

/// One URL, with retries. Returns the verified size.
fn fetch_from(
    agent: &reqwest::blocking::Client,
    url: &str,
    sha: &str,
    partial: &Path,
    opts: &FetchOptions,
    deadline: Deadline,
    attempts: &mut Vec<Attempt>,
) -> Result<u64> {
    let mut retry = 0;
    let mut restarted = false;
    loop {
        let mut attempt = Attempt {
            url: url.to_string(),
            final_url: None,
            http_status: None,
            bytes: 0,
            resumed: false,
            error: None,
        };
        let outcome = download_once(agent, url, partial, opts, deadline, &mut attempt);
        let resumed = attempt.resumed;
        if let Err(t) = &outcome {
            attempt.error = Some(t.error.message.clone());
        }
        attempts.push(attempt);
        match outcome {
            Ok((got, size)) => {
                if got == sha {
                    return Ok(size);
                }
                remove(partial)?;
                if resumed && !restarted {
                    // The kept prefix may come from an older file at the same
                    // URL: start over once before calling the source bad.
                    tracing::warn!("{url}: resumed download does not verify; starting over");
                    restarted = true;
                    continue;
                }
                return Err(Error::new(
                    Reason::ChecksumMismatch,
                    format!(
                        "{url} served bytes with sha256 {got}, expected {sha}; the file was deleted"
                    ),
                ));
            }
            Err(t) if !t.retryable => return Err(t.error),
            Err(t) if retry >= opts.retry.retries => return Err(t.error),
            Err(_) if deadline.passed() => return Err(deadline.error(url, 0)),
            Err(t) => {
                retry += 1;
                let wait = opts
                    .retry
                    .backoff(retry, t.retry_after)
                    .min(deadline.left());
                tracing::info!(
                    "{url}: {}; retry {retry}/{} in {:?}",
                    t.error.message,
                    opts.retry.retries,
                    wait
                );
                std::thread::sleep(wait);
            }
        }
    }
}

struct Transient {
    error: Error,
    retryable: bool,
    retry_after: Option<Duration>,
}

fn transient(msg: String, retryable: bool) -> Transient {
    Transient {
        error: Error::new(Reason::DownloadFailed, msg),
        retryable,
        retry_after: None,
    }
}

/// A server certificate the trusted roots reject (unknown issuer, wrong
/// name, expired): configuration, not weather, so a retry only delays the
/// answer. rustls reports it as its own error, somewhere in the chain of
/// causes, usually wrapped in the handshake's io::Error (whose `source`
/// skips the wrapped error itself, hence the look inside).
fn is_certificate_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let bad = |r: &rustls::Error| {
        matches!(
            r,
            rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
        )
    };
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some_and(bad) {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| is_certificate_error(inner))
            {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// HTTP statuses worth retrying: timeouts, throttling, server errors.
pub fn retryable_status(code: u16) -> bool {
    code == 408 || code == 429 || (500..=599).contains(&code)
}

/// One request: appends to the partial file when the server answers 206 to
/// our Range, starts over on 200.
fn download_once(
    agent: &reqwest::blocking::Client,
    url: &str,
    partial: &Path,
    opts: &FetchOptions,
    deadline: Deadline,
    attempt: &mut Attempt,
) -> std::result::Result<(String, u64), Transient> {
    let have = fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
    let resp = send(agent, url, have)?;
    attempt.http_status = Some(resp.status().as_u16());
    attempt.final_url = Some(resp.url().to_string());
    let resume = resumes(&resp, url, partial, have)?;
    attempt.resumed = resume;
    let expected_len = header(&resp, "content-length").and_then(|v| v.parse::<u64>().ok());
    let start = if resume { have } else { 0 };
    let total = expected_len.map(|n| n.saturating_add(start));
    let max = opts.timeouts.max_bytes;
    if let Some(total) = total.filter(|t| *t > max) {
        return Err(fatal(too_large(
            url,
            &format!("announces {total} bytes"),
            max,
        )));
    }
    let (mut file, hasher) = open_partial(partial, resume, have)?;
    let mut progress = Progress::new(url, total, start, opts.progress_bar);
    let bounds = StreamBounds {
        start,
        max,
        deadline,
    };
    let streamed = stream(resp, &mut file, hasher, url, partial, bounds, &mut progress);
    progress.finish();
    let (hasher, got) = match streamed {
        Ok(r) => r,
        Err((t, got)) => {
            attempt.bytes = got;
            return Err(t);
        }
    };
    attempt.bytes = got;
    if let Some(len) = expected_len {
        if got != len {
            return Err(transient(
                format!("{url}: body ended after {got} of {len} bytes"),
                true,
            ));
        }
    }
    file.sync_all()
        .map_err(|e| fatal(Error::io(Reason::DownloadFailed, "syncing", partial, e)))?;
    Ok((hex::encode(hasher.finalize()), start + got))
}

/// A download over `--max-download-size`.
fn too_large(url: &str, what: &str, max: u64) -> Error {
    Error::new(
        Reason::UnsafeArchive,
        format!(
            "{url} {what}, more than the {} MiB a download may have; nothing of it was kept",
            max >> 20
        ),
    )
    .with_hint("a real driver package is under 1 GiB; check the URL, or raise --max-download-size")
}

/// Where a body continues the file, and how far it may go.
#[derive(Clone, Copy)]
struct StreamBounds {
    /// Bytes already in the partial file.
    start: u64,
    /// The most the whole file may have.
    max: u64,
    deadline: Deadline,
}

/// A local failure: retrying the URL would not help.
fn fatal(error: Error) -> Transient {
    Transient {
        error,
        retryable: false,
        retry_after: None,
    }
}

fn header(resp: &reqwest::blocking::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Sends the GET, with a Range from `have` when part of the file is here.
fn send(
    agent: &reqwest::blocking::Client,
    url: &str,
    have: u64,
) -> std::result::Result<reqwest::blocking::Response, Transient> {
    let mut req = agent.get(url);
    if have > 0 {
        req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
    }
    req.send().map_err(|e| {
        let certificate = is_certificate_error(&e);
        let e = describe_http_error(e);
        if certificate {
            transient(
                format!("TLS certificate not trusted, not retried ({e}); a private mirror's CA goes in --ca-bundle"),
                false,
            )
        } else {
            transient(e, true)
        }
    })
}

/// Whether the answer continues the partial file (206 at our offset) or
/// starts it over (200); anything else is an error, retryable or not.
fn resumes(
    resp: &reqwest::blocking::Response,
    url: &str,
    partial: &Path,
    have: u64,
) -> std::result::Result<bool, Transient> {
    match resp.status().as_u16() {
        206 => {
            // Only a range that starts exactly where we stopped is usable.
            let ok = header(resp, "content-range")
                .and_then(|v| parse_content_range_start(&v))
                .is_some_and(|start| start == have);
            if !ok {
                let _ = fs::remove_file(partial);
                return Err(transient(
                    format!("{url} answered 206 with an unusable Content-Range; starting over"),
                    true,
                ));
            }
            Ok(true)
        }
        200 => Ok(false),
        416 => {
            // Our partial is not a prefix the server recognises.
            let _ = fs::remove_file(partial);
            Err(transient(
                format!("{url} answered 416 to a resume; starting over"),
                true,
            ))
        }
        code => {
            let mut t = transient(
                format!("{url} answered HTTP {code}"),
                retryable_status(code),
            );
            t.retry_after = header(resp, "retry-after")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            Err(t)
        }
    }
}

/// Opens the partial file for appending (resume) or from scratch, and the
/// hash of what it keeps: a resumed download hashes its prefix once, so
/// the file is read back at most once, and only that part.
fn open_partial(
    partial: &Path,
    resume: bool,
    have: u64,
) -> std::result::Result<(File, Sha256), Transient> {
    let io = |action: &str, e| fatal(Error::io(Reason::DownloadFailed, action, partial, e));
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(!resume)
        .open(partial)
        .map_err(|e| io("opening", e))?;
    let mut hasher = Sha256::new();
    if resume {
        file.seek(SeekFrom::End(0)).map_err(|e| io("seeking", e))?;
        hash_prefix(partial, have, &mut hasher).map_err(fatal)?;
    }
    Ok((file, hasher))
}

/// Streams the body into the file while hashing it on a second thread;
/// returns the hash and the bytes received, or the error and the bytes
/// received before it.
fn stream(
    mut reader: reqwest::blocking::Response,
    file: &mut File,
    hasher: Sha256,
    url: &str,
    partial: &Path,
    bounds: StreamBounds,
    progress: &mut Progress,
) -> std::result::Result<(Sha256, u64), (Transient, u64)> {
    let start = bounds.start;
    let mut hashing = ParallelHasher::new(hasher);
    let mut got = 0u64;
    let mut flushed = 0u64;
    loop {
        let mut buf = hashing.buffer();
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {
                hashing.give_back(buf);
                continue;
            }
            Err(e) => {
                let msg = format!("{url}: connection lost after {got} bytes: {}", describe(&e));
                return Err((transient(msg, true), got));
            }
        };
        if start + got + n as u64 > bounds.max {
            let what = format!("sent more than {} bytes", bounds.max);
            return Err((fatal(too_large(url, &what, bounds.max)), got));
        }
        if let Err(e) = file.write_all(&buf[..n]) {
            let err = Error::io(Reason::DownloadFailed, "writing", partial, e);
            return Err((fatal(err), got));
        }
        hashing.submit(buf, n);
        got += n as u64;
        if bounds.deadline.passed() {
            return Err((fatal(bounds.deadline.error(url, got)), got));
        }
        progress.update(start + got);
        if got - flushed >= WRITEBACK_EVERY {
            start_writeback(file, start + flushed, got - flushed);
            flushed = got;
        }
    }
    Ok((hashing.finish(), got))
}

/// Hashes on a second thread while the first one receives and writes, so
/// that checksumming does not add to the download's wall time. A small pool
/// of buffers bounds the memory in flight (DEPTH × CHUNK).
struct ParallelHasher {
    full: Option<std::sync::mpsc::SyncSender<(Vec<u8>, usize)>>,
    free: std::sync::mpsc::Receiver<Vec<u8>>,
    worker: Option<std::thread::JoinHandle<Sha256>>,
    allocated: usize,
}

const DEPTH: usize = 8;

impl ParallelHasher {
    fn new(mut hasher: Sha256) -> Self {
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(Vec<u8>, usize)>(DEPTH);
        let (free_tx, free_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(DEPTH);
        let worker = std::thread::spawn(move || {
            for (buf, n) in full_rx {
                hasher.update(&buf[..n]);
                // The receiver may be gone once the download ended.
                let _ = free_tx.send(buf);
            }
            hasher
        });
        ParallelHasher {
            full: Some(full_tx),
            free: free_rx,
            worker: Some(worker),
            allocated: 0,
        }
    }

    fn buffer(&mut self) -> Vec<u8> {
        if let Ok(buf) = self.free.try_recv() {
            return buf;
        }
        if self.allocated < DEPTH {
            self.allocated += 1;
            return vec![0u8; CHUNK];
        }
        // Every buffer is in flight: wait for the hasher to return one.
        self.free.recv().unwrap_or_else(|_| vec![0u8; CHUNK])
    }

    fn give_back(&mut self, buf: Vec<u8>) {
        self.allocated = self.allocated.saturating_sub(1);
        drop(buf);
    }

    fn submit(&mut self, buf: Vec<u8>, n: usize) {
        if let Some(tx) = &self.full {
            let _ = tx.send((buf, n));
        }
    }

    fn finish(mut self) -> Sha256 {
        drop(self.full.take());
        match self.worker.take().map(std::thread::JoinHandle::join) {
            Some(Ok(h)) => h,
            // The worker only hashes; it cannot fail short of a panic, which
            // must not pass for a valid digest.
            _ => Sha256::new_with_prefix(b"hasher thread panicked"),
        }
    }
}

/// Asks the kernel to start writing a written range back to disk now
/// (POSIX_FADV_DONTNEED starts asynchronous writeback on Linux and drops the
/// range from the page cache once clean, which also keeps a 300 MB package
/// from crowding out a node's cache). Advisory: errors are ignored.
fn start_writeback(file: &File, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    let _ = nix::fcntl::posix_fadvise(
        file,
        offset,
        len,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
}

/// Feeds the first `len` bytes of a file to `hasher`.
fn hash_prefix(path: &Path, len: u64, hasher: &mut Sha256) -> Result<()> {
    let f = File::open(path).map_err(|e| Error::io(Reason::DownloadFailed, "opening", path, e))?;
    let mut r = f.take(len);
    let mut buf = vec![0u8; CHUNK];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(Reason::DownloadFailed, "reading", path, e)),
        }
    }
}

/// `bytes 100-199/200` → 100.
pub fn parse_content_range_start(v: &str) -> Option<u64> {
    let rest = v.trim().strip_prefix("bytes")?.trim_start();
    rest.split('-').next()?.trim().parse().ok()
}

/// Renames the verified partial into place and makes the rename durable.
fn finish(partial: &Path, final_path: &Path) -> Result<()> {
    fs::rename(partial, final_path)
        .map_err(|e| Error::io(Reason::DownloadFailed, "renaming into place", final_path, e))?;
    if let Some(dir) = final_path.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

fn remove(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(Reason::DownloadFailed, "deleting", path, e)),
    }
}

/// A bar on a TTY, a log line every few seconds otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    url: String,
    total: Option<u64>,
    last_log: Instant,
    started: Instant,
}

impl Progress {
    fn new(url: &str, total: Option<u64>, start: u64, want_bar: bool) -> Self {
        let bar = (want_bar && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
            let bar = match total {
                Some(t) => indicatif::ProgressBar::new(t),
                None => indicatif::ProgressBar::new_spinner(),
            };
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bytes}/{total_bytes} {bar:40} {bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style);
            }
            bar.set_position(start);
            bar
        });
        Progress {
            bar,
            url: url.to_string(),
            total,
            last_log: Instant::now(),
            started: Instant::now(),
        }
    }

    fn update(&mut self, pos: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(pos);
        } else if self.last_log.elapsed() >= LOG_EVERY {
            self.last_log = Instant::now();
            let secs = self.started.elapsed().as_secs_f64().max(0.001);
            tracing::info!(
                "{}: {} of {} bytes ({:.1} MiB/s)",
                self.url,
                pos,
                self.total.map_or("?".to_string(), |t| t.to_string()),
                pos as f64 / secs / (1024.0 * 1024.0)
            );
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

// ---------------------------------------------------------------- the command

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FetchSpec {
    pub url: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<String>,
    /// The expected sha256, when given or known before fetching.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub cache_dir: String,
    pub offline: bool,
    pub allow_http: bool,
    pub retries: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FetchStatus {
    #[serde(flatten)]
    pub outcome: crate::report::Outcome,
    /// The verified file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksum_source: Option<ChecksumSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// True when the verified file was already cached: no network was used.
    #[serde(default)]
    pub cache_hit: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_url: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Attempt>,
}

pub type FetchResult = crate::report::Document<FetchSpec, FetchStatus>;

impl crate::report::StatusOutcome for FetchStatus {
    fn outcome(&self) -> &crate::report::Outcome {
        &self.outcome
    }
}

/// What to fetch: a URL, its file name, and whatever checksum is known.
#[derive(Debug, Clone)]
pub struct PackageRequest {
    pub url: String,
    pub sha256: Option<(String, ChecksumSource)>,
    /// Mirror prefixes or templates (`{file}`, `{version}`).
    pub mirrors: Vec<String>,
    pub version: Option<String>,
    /// Explicit redistrib manifest URL.
    pub manifest: Option<String>,
}

/// The file name at the end of a URL.
pub fn file_name_of(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// A mirror is a URL prefix the file name is appended to, or a template
/// with `{file}` and/or `{version}`.
pub fn mirror_url(mirror: &str, file: &str, version: Option<&str>) -> Result<String> {
    if mirror.contains("{version}") && version.is_none() {
        return Err(Error::new(
            Reason::InvalidArgument,
            format!("mirror {mirror} needs a driver version, and none is known"),
        ));
    }
    let filled = mirror.replace("{version}", version.unwrap_or(""));
    Ok(if filled.contains("{file}") {
        filled.replace("{file}", file)
    } else {
        format!("{}/{file}", filled.trim_end_matches('/'))
    })
}

/// NVIDIA's redist archives sit under `.../redist/<component>/<platform>/`;
/// their manifest is `.../redist/redistrib_<version>.json`.
pub fn redistrib_manifest_url(url: &str) -> Option<String> {
    let (base, rest) = url.split_once("/redist/")?;
    let file = file_name_of(rest);
    let version = file
        .strip_suffix("-archive.tar.xz")?
        .rsplit('-')
        .next()
        .filter(|v| crate::host::is_driver_version(v))?;
    Some(format!("{base}/redist/redistrib_{version}.json"))
}

/// The expected checksum: given, else a companion `<url>.sha256sum`, else
/// the redistrib manifest. Companions come over HTTPS (the agent refuses
/// plain HTTP unless it is allowed).
pub fn find_checksum(
    req: &PackageRequest,
    opts: &FetchOptions,
) -> Result<(String, ChecksumSource)> {
    if let Some((sum, src)) = &req.sha256 {
        return Ok((sum.to_ascii_lowercase(), *src));
    }
    let file = file_name_of(&req.url);
    let missing = |tried: &str| {
        Error::new(
            Reason::ChecksumMissing,
            format!("no trusted sha256 for {}: {tried}", req.url),
        )
        .with_hint("pass --sha256 HEX, or serve a <url>.sha256sum companion over HTTPS")
    };
    if opts.offline {
        return Err(missing("--offline forbids fetching a companion file"));
    }
    let mut tried = Vec::new();
    let companion = format!("{}.sha256sum", req.url);
    // A checksum that came over plain HTTP proves nothing about a package
    // that came the same way: companions and manifests only over HTTPS.
    let secure = |url: &str| url.to_ascii_lowercase().starts_with("https://");
    if !secure(&companion) {
        tried.push(format!(
            "{companion} would come over plain HTTP, and a checksum is only trusted over HTTPS or from the catalog"
        ));
    } else {
        match fetch_text(opts, &companion) {
            Ok(text) => match parse_sha256sum(&text, &file) {
                Some(sum) => return Ok((sum, ChecksumSource::Companion)),
                None => tried.push(format!("{companion} holds no sha256 for {file}")),
            },
            Err(e) => tried.push(e.message),
        }
    }
    if let Some(manifest) = req
        .manifest
        .clone()
        .or_else(|| redistrib_manifest_url(&req.url))
        .filter(|m| {
            let ok = secure(m);
            if !ok {
                tried.push(format!(
                    "{m} would come over plain HTTP; not used for a checksum"
                ));
            }
            ok
        })
    {
        match fetch_text(opts, &manifest) {
            Ok(text) => match sha256_from_redistrib(&text, &file) {
                Some(sum) => return Ok((sum, ChecksumSource::RedistManifest)),
                None => tried.push(format!("{manifest} lists no {file}")),
            },
            Err(e) => tried.push(e.message),
        }
    }
    Err(missing(&tried.join("; ")))
}

impl FetchSpec {
    fn new(url: String, mirrors: Vec<String>, sha256: Option<String>, opts: &FetchOptions) -> Self {
        FetchSpec {
            url,
            mirrors,
            sha256,
            cache_dir: opts.cache_dir.display().to_string(),
            offline: opts.offline,
            allow_http: opts.allow_http,
            retries: opts.retry.retries,
        }
    }
}

impl FetchStatus {
    fn new(outcome: crate::report::Outcome) -> Self {
        FetchStatus {
            outcome,
            path: None,
            sha256: None,
            checksum_source: None,
            size_bytes: None,
            cache_hit: false,
            source_url: None,
            attempts: Vec::new(),
        }
    }
}

/// A fetch that ended before it began (bad plan, bad arguments).
pub fn fetch_package_failed(
    url: String,
    opts: &FetchOptions,
    outcome: crate::report::Outcome,
) -> FetchResult {
    crate::report::Document::new(
        crate::report::Kind::FetchResult,
        FetchSpec::new(url, Vec::new(), None, opts),
        FetchStatus::new(outcome),
    )
}

/// The whole `fetch` step, as a result document.
pub fn fetch_package(req: &PackageRequest, mut opts: FetchOptions) -> FetchResult {
    let spec = FetchSpec::new(
        req.url.clone(),
        req.mirrors.clone(),
        req.sha256.as_ref().map(|(s, _)| s.clone()),
        &opts,
    );
    let mut status = FetchStatus::new(crate::report::Outcome::new(
        Reason::Internal,
        "fetch did not finish",
    ));
    let file = file_name_of(&req.url);
    let result = (|| -> Result<Fetched, FetchError> {
        let mut urls = vec![req.url.clone()];
        for m in &req.mirrors {
            urls.push(mirror_url(m, &file, req.version.as_deref())?);
        }
        opts.urls = urls;
        for url in &opts.urls {
            check_url(url, opts.allow_http)?;
        }
        let (sum, source) = find_checksum(req, &opts)?;
        status.sha256 = Some(sum.clone());
        status.checksum_source = Some(source);
        opts.sha256 = sum;
        fetch(&opts)
    })();
    status.outcome = match result {
        Ok(f) => {
            let msg = if f.cache_hit {
                format!(
                    "{file} was already cached and verified at {}; no network used",
                    f.path.display()
                )
            } else {
                format!(
                    "{file} downloaded from {} and verified ({} bytes) at {}",
                    f.source_url.as_deref().unwrap_or("?"),
                    f.size,
                    f.path.display()
                )
            };
            status.path = Some(f.path.display().to_string());
            status.size_bytes = Some(f.size);
            status.cache_hit = f.cache_hit;
            status.source_url = f.source_url;
            status.attempts = f.attempts;
            crate::report::Outcome::new(Reason::Fetched, msg)
        }
        Err(e) => {
            status.attempts = e.attempts;
            crate::report::Outcome::from(&e.error)
        }
    };
    crate::report::Document::new(crate::report::Kind::FetchResult, spec, status)
}

// ---------------------------------------------------------------- checksums

/// Parses a `sha256sum`-style companion: `<hex>  <name>` (or just `<hex>`).
/// With several lines, the one naming `file_name` wins.
pub fn parse_sha256sum(text: &str, file_name: &str) -> Option<String> {
    let mut only = None;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let Some(hex) = parts.next() else { continue };
        if !is_sha256_hex(hex) {
            continue;
        }
        match parts.next().map(|n| n.trim_start_matches('*')) {
            Some(name) if name == file_name => return Some(hex.to_ascii_lowercase()),
            Some(_) => {}
            None => only = Some(hex.to_ascii_lowercase()),
        }
    }
    // An unnamed line counts; a line naming another file never does.
    only
}

/// Finds a file's sha256 in NVIDIA's `redistrib_<version>.json`: any object
/// whose `relative_path` ends with `/<file_name>` (or equals it).
pub fn sha256_from_redistrib(json: &str, file_name: &str) -> Option<String> {
    fn walk(v: &serde_json::Value, file_name: &str) -> Option<String> {
        match v {
            serde_json::Value::Object(map) => {
                if let (Some(serde_json::Value::String(p)), Some(serde_json::Value::String(s))) =
                    (map.get("relative_path"), map.get("sha256"))
                {
                    if (p == file_name || p.ends_with(&format!("/{file_name}"))) && is_sha256_hex(s)
                    {
                        return Some(s.to_ascii_lowercase());
                    }
                }
                map.values().find_map(|v| walk(v, file_name))
            }
            serde_json::Value::Array(items) => items.iter().find_map(|v| walk(v, file_name)),
            _ => None,
        }
    }
    walk(&serde_json::from_str(json).ok()?, file_name)
}

/// Downloads a small text (a checksum companion) with the same agent rules;
/// at most 1 MiB.
pub fn fetch_text(opts: &FetchOptions, url: &str) -> Result<String> {
    check_url(url, opts.allow_http)?;
    let agent = agent(opts)?;
    let mut last = None;
    for retry in 0..=opts.retry.retries {
        if retry > 0 {
            std::thread::sleep(opts.retry.backoff(retry, None));
        }
        match agent.get(url).send() {
            Ok(resp) if resp.status().as_u16() == 200 => {
                let mut text = String::new();
                resp.take(1 << 20).read_to_string(&mut text).map_err(|e| {
                    Error::new(
                        Reason::DownloadFailed,
                        format!("reading {url}: {}", describe(&e)),
                    )
                })?;
                return Ok(text);
            }
            Ok(resp) if retryable_status(resp.status().as_u16()) => {
                last = Some(format!("HTTP {}", resp.status().as_u16()));
            }
            Ok(resp) => {
                return Err(Error::new(
                    Reason::ChecksumMissing,
                    format!("{url} answered HTTP {}", resp.status().as_u16()),
                ));
            }
            Err(e) => last = Some(describe_http_error(e)),
        }
    }
    Err(Error::new(
        Reason::DownloadFailed,
        format!("{url}: {}", last.unwrap_or_default()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = RetryPolicy {
            retries: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(700),
        };
        assert_eq!(p.backoff(1, None), Duration::from_millis(100));
        assert_eq!(p.backoff(2, None), Duration::from_millis(200));
        assert_eq!(p.backoff(3, None), Duration::from_millis(400));
        assert_eq!(p.backoff(4, None), Duration::from_millis(700));
        assert_eq!(p.backoff(40, None), Duration::from_millis(700));
        assert_eq!(
            p.backoff(1, Some(Duration::from_secs(60))),
            Duration::from_millis(700)
        );
        assert_eq!(
            p.backoff(1, Some(Duration::from_millis(5))),
            Duration::from_millis(5)
        );
    }

    #[test]
    fn retryable_statuses() {
        for c in [408, 429, 500, 502, 503, 504] {
            assert!(retryable_status(c), "{c}");
        }
        for c in [200, 301, 400, 401, 403, 404, 410] {
            assert!(!retryable_status(c), "{c}");
        }
    }

    #[test]
    fn urls_must_be_https_unless_allowed() {
        assert!(check_url("https://x/y", false).is_ok());
        assert_eq!(
            check_url("http://x/y", false).unwrap_err().reason,
            Reason::InsecureUrl
        );
        assert!(check_url("http://x/y", true).is_ok());
        assert_eq!(
            check_url("ftp://x/y", true).unwrap_err().reason,
            Reason::InvalidArgument
        );
    }

    #[test]
    fn mirrors_and_manifests() {
        assert_eq!(
            mirror_url("https://m/x/", "a.run", None).unwrap(),
            "https://m/x/a.run"
        );
        assert_eq!(
            mirror_url("https://m/{version}/{file}", "a.run", Some("580.95.05")).unwrap(),
            "https://m/580.95.05/a.run"
        );
        assert!(mirror_url("https://m/{version}", "a.run", None).is_err());
        assert_eq!(
            file_name_of("https://h/p/NVIDIA-Linux-x86_64-580.95.05.run?x=1"),
            "NVIDIA-Linux-x86_64-580.95.05.run"
        );
        assert_eq!(
            redistrib_manifest_url("https://developer.download.nvidia.com/compute/nvidia-driver/redist/nvidia_driver/linux-x86_64/nvidia_driver-linux-x86_64-580.95.05-archive.tar.xz").as_deref(),
            Some("https://developer.download.nvidia.com/compute/nvidia-driver/redist/redistrib_580.95.05.json")
        );
        assert_eq!(
            redistrib_manifest_url(
                "https://us.download.nvidia.com/tesla/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run"
            ),
            None
        );
    }

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(parse_content_range_start("bytes 0-0/*"), Some(0));
        assert_eq!(parse_content_range_start("items 1-2/3"), None);
    }

    #[test]
    fn sha256sum_companions() {
        let h = "a".repeat(64);
        let o = "b".repeat(64);
        assert_eq!(
            parse_sha256sum(&format!("{h}  NVIDIA.run\n"), "NVIDIA.run"),
            Some(h.clone())
        );
        assert_eq!(
            parse_sha256sum(&format!("{h} *NVIDIA.run\n"), "NVIDIA.run"),
            Some(h.clone())
        );
        assert_eq!(
            parse_sha256sum(&format!("{h}\n"), "NVIDIA.run"),
            Some(h.clone())
        );
        assert_eq!(
            parse_sha256sum(&format!("{o}  other.run\n{h}  NVIDIA.run\n"), "NVIDIA.run"),
            Some(h.clone())
        );
        assert_eq!(
            parse_sha256sum(&format!("{o}  other.run\n"), "NVIDIA.run"),
            None
        );
        assert_eq!(parse_sha256sum("not a checksum\n", "NVIDIA.run"), None);
    }

    #[test]
    fn redistrib_manifest() {
        // Shape of NVIDIA's redistrib_<version>.json (values shortened).
        let json = r#"{
          "release_date": "2025-10-01",
          "nvidia_driver": {
            "name": "NVIDIA Linux Driver",
            "version": "580.95.05",
            "linux-x86_64": {
              "relative_path": "nvidia_driver/linux-x86_64/nvidia_driver-linux-x86_64-580.95.05-archive.tar.xz",
              "sha256": "834aa3b89d8e3ec829b8cee3c8c7a3a0c5da3d98e2010b31c62ceec8c138a232",
              "size": "327488172"
            },
            "linux-sbsa": {
              "relative_path": "nvidia_driver/linux-sbsa/nvidia_driver-linux-sbsa-580.95.05-archive.tar.xz",
              "sha256": "0788fb8d72f5364d7e75534d7d579b8a9e54f7ef6ef2f07cbf5d543353e6e9df"
            }
          }
        }"#;
        assert_eq!(
            sha256_from_redistrib(json, "nvidia_driver-linux-x86_64-580.95.05-archive.tar.xz")
                .as_deref(),
            Some("834aa3b89d8e3ec829b8cee3c8c7a3a0c5da3d98e2010b31c62ceec8c138a232")
        );
        assert_eq!(sha256_from_redistrib(json, "missing.tar.xz"), None);
        assert_eq!(sha256_from_redistrib("{not json", "x"), None);
    }
}
