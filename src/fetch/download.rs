//! The download engine: one verified file into the package cache, from
//! the first source that delivers it, with retries, backoff and resume.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::Digest;

use super::attempt::{Deadline, Transient, fatal, too_large, transient};
use super::client::{agent, describe_http_error, is_certificate_error, retryable_status};
use super::fetched::{Attempt, FetchError, Fetched};
use super::policy::{FetchPolicy, FetchRequest, check_url, is_sha256_hex};
use super::stream::{Progress, StreamBounds, open_partial, stream};
use crate::error::{Error, Failure, Result};
use crate::report::Reason;

/// Fetches the request into `<cache_dir>/<sha256>`, verified: a cache hit
/// when the file is there and verifies, else from the first source that
/// delivers the expected bytes.
pub fn fetch(policy: &FetchPolicy, req: &FetchRequest) -> Result<Fetched, FetchError> {
    let slot = Slot::new(policy, &req.sha256)?;
    // Two installers on one node must not write the same partial file.
    let _lock = crate::lock::lock(&slot.lock, Failure::DownloadFailed)?;
    if let Some(hit) = cached(&slot.final_path, &slot.sha)? {
        return Ok(hit);
    }
    check_sources(policy, req, &slot.sha)?;
    download_from_sources(policy, req, &slot)
}

/// Where one sha256 lives in the package cache: the verified file, the
/// partial download and the lock beside them.
struct Slot {
    sha: String,
    final_path: PathBuf,
    partial: PathBuf,
    lock: PathBuf,
}

impl Slot {
    /// Checks the sha256 and creates the cache directory.
    fn new(policy: &FetchPolicy, sha256: &str) -> Result<Slot> {
        let sha = sha256.to_ascii_lowercase();
        if !is_sha256_hex(&sha) {
            return Err(Error::new(
                Failure::InvalidArgument,
                format!("sha256 {sha256:?} is not 64 hex digits"),
            ));
        }
        let dir = &policy.cache_dir;
        fs::create_dir_all(dir)
            .map_err(|e| Error::io(Failure::DownloadFailed, "creating cache directory", dir, e))?;
        Ok(Slot {
            final_path: dir.join(&sha),
            partial: dir.join(format!("{sha}.partial")),
            lock: dir.join(format!("{sha}.lock")),
            sha,
        })
    }
}

/// Past a cache miss: offline is the end, and every source must be an
/// allowed URL.
fn check_sources(policy: &FetchPolicy, req: &FetchRequest, sha: &str) -> Result<()> {
    if policy.offline {
        return Err(Error::new(
            Failure::NotCached,
            format!(
                "--offline and {} is not in the cache {}",
                sha,
                policy.cache_dir.display()
            ),
        )
        .with_hint(
            "pre-seed the cache (fetch once online, or copy the file there named by its sha256)",
        ));
    }
    if req.urls.is_empty() {
        return Err(Error::new(Failure::InvalidArgument, "no URL to fetch from"));
    }
    for url in &req.urls {
        check_url(url, policy.allow_http)?;
    }
    Ok(())
}

/// Tries each source in order until one delivers the expected bytes, which
/// are then renamed into place.
fn download_from_sources(
    policy: &FetchPolicy,
    req: &FetchRequest,
    slot: &Slot,
) -> Result<Fetched, FetchError> {
    let agent = agent(policy)?;
    let deadline = Deadline::new(policy.timeouts.total);
    let mut attempts = Vec::new();
    let mut mismatch = None;
    let mut late = None;
    for url in &req.urls {
        if deadline.passed() {
            late = Some(deadline.error(url, 0));
            break;
        }
        let partial = &slot.partial;
        match fetch_from(
            &agent,
            url,
            &slot.sha,
            partial,
            policy,
            deadline,
            &mut attempts,
        ) {
            Ok(size) => {
                finish(&slot.partial, &slot.final_path)?;
                // The last attempt delivered the bytes (or their rest):
                // name where they came from, after redirects.
                let source = attempts
                    .last()
                    .and_then(|a| a.final_url.clone())
                    .unwrap_or_else(|| url.clone());
                return Ok(Fetched {
                    path: slot.final_path.clone(),
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
                remove(&slot.partial)?;
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
    let (got, size) = crate::digest::sha256_file(final_path, Failure::DownloadFailed)?;
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
        Failure::DownloadFailed,
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
    policy: &FetchPolicy,
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
        let outcome = download_once(agent, url, partial, policy, deadline, &mut attempt);
        let resumed = attempt.resumed;
        if let Err(t) = &outcome {
            attempt.error = Some(t.error.to_string().clone());
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
                    Failure::ChecksumMismatch,
                    format!(
                        "{url} served bytes with sha256 {got}, expected {sha}; the file was deleted"
                    ),
                ));
            }
            Err(t) if !t.retryable => return Err(t.error),
            Err(t) if retry >= policy.retry.retries => return Err(t.error),
            Err(_) if deadline.passed() => return Err(deadline.error(url, 0)),
            Err(t) => {
                retry += 1;
                let wait = policy
                    .retry
                    .backoff(retry, t.retry_after)
                    .min(deadline.left());
                tracing::info!(
                    "{url}: {}; retry {retry}/{} in {:?}",
                    t.error.to_string(),
                    policy.retry.retries,
                    wait
                );
                std::thread::sleep(wait);
            }
        }
    }
}

/// our Range, starts over on 200.
fn download_once(
    agent: &reqwest::blocking::Client,
    url: &str,
    partial: &Path,
    policy: &FetchPolicy,
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
    let max = policy.timeouts.max_bytes;
    if let Some(total) = total.filter(|t| *t > max) {
        return Err(fatal(too_large(
            url,
            &format!("announces {total} bytes"),
            max,
        )));
    }
    let (mut file, hasher) = open_partial(partial, resume, have)?;
    let mut progress = Progress::new(url, total, start, policy.progress_bar);
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
        .map_err(|e| fatal(Error::io(Failure::DownloadFailed, "syncing", partial, e)))?;
    Ok((hex::encode(hasher.finalize()), start + got))
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

/// `bytes 100-199/200` → 100.
fn parse_content_range_start(v: &str) -> Option<u64> {
    let rest = v.trim().strip_prefix("bytes")?.trim_start();
    rest.split('-').next()?.trim().parse().ok()
}

/// Renames the verified partial into place and makes the rename durable.
fn finish(partial: &Path, final_path: &Path) -> Result<()> {
    fs::rename(partial, final_path).map_err(|e| {
        Error::io(
            Failure::DownloadFailed,
            "renaming into place",
            final_path,
            e,
        )
    })?;
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
        Err(e) => Err(Error::io(Failure::DownloadFailed, "deleting", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(parse_content_range_start("bytes 0-0/*"), Some(0));
        assert_eq!(parse_content_range_start("items 1-2/3"), None);
    }
}
