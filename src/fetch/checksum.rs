//! Where the expected sha256 comes from when the catalog or `--sha256` do
//! not give it: a companion `<url>.sha256sum`, or NVIDIA's redistrib
//! manifest, both only over HTTPS.

use std::io::Read;

use super::client::{agent, describe, describe_http_error, retryable_status};
use super::policy::{FetchPolicy, check_url, is_sha256_hex};
use super::request::{ChecksumSource, PackageRequest, file_name_of};
use crate::error::{Error, Failure, Result};

/// NVIDIA's redist archives sit under `.../redist/<component>/<platform>/`;
/// their manifest is `.../redist/redistrib_<version>.json`.
pub(super) fn redistrib_manifest_url(url: &str) -> Option<String> {
    let (base, rest) = url.split_once("/redist/")?;
    let file = file_name_of(rest);
    let version = file
        .strip_suffix("-archive.tar.xz")?
        .rsplit('-')
        .next()
        .filter(|v| crate::node::is_driver_version(v))?;
    Some(format!("{base}/redist/redistrib_{version}.json"))
}

/// The expected checksum: given, else a companion `<url>.sha256sum`, else
/// the redistrib manifest. Companions come over HTTPS (the agent refuses
/// plain HTTP unless it is allowed).
pub(crate) fn find_checksum(
    req: &PackageRequest,
    policy: &FetchPolicy,
) -> Result<(String, ChecksumSource)> {
    if let Some((sum, src)) = &req.sha256 {
        return Ok((sum.to_ascii_lowercase(), *src));
    }
    let file = file_name_of(&req.url);
    let missing = |tried: &str| {
        Error::new(
            Failure::ChecksumMissing,
            format!("no trusted sha256 for {}: {tried}", req.url),
        )
        .with_hint("pass --sha256 HEX, or serve a <url>.sha256sum companion over HTTPS")
    };
    if policy.offline {
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
        match fetch_text(policy, &companion) {
            Ok(text) => match parse_sha256sum(&text, &file) {
                Some(sum) => return Ok((sum, ChecksumSource::Companion)),
                None => tried.push(format!("{companion} holds no sha256 for {file}")),
            },
            Err(e) => tried.push(e.to_string()),
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
        match fetch_text(policy, &manifest) {
            Ok(text) => match sha256_from_redistrib(&text, &file) {
                Some(sum) => return Ok((sum, ChecksumSource::RedistManifest)),
                None => tried.push(format!("{manifest} lists no {file}")),
            },
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(missing(&tried.join("; ")))
}

/// Parses a `sha256sum`-style companion: `<hex>  <name>` (or just `<hex>`).
/// With several lines, the one naming `file_name` wins.
fn parse_sha256sum(text: &str, file_name: &str) -> Option<String> {
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
fn sha256_from_redistrib(json: &str, file_name: &str) -> Option<String> {
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
fn fetch_text(policy: &FetchPolicy, url: &str) -> Result<String> {
    check_url(url, policy.allow_http)?;
    let agent = agent(policy)?;
    let mut last = None;
    for retry in 0..=policy.retry.retries {
        if retry > 0 {
            std::thread::sleep(policy.retry.backoff(retry, None));
        }
        match agent.get(url).send() {
            Ok(resp) if resp.status().as_u16() == 200 => {
                let mut text = String::new();
                resp.take(1 << 20).read_to_string(&mut text).map_err(|e| {
                    Error::new(
                        Failure::DownloadFailed,
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
                    Failure::ChecksumMissing,
                    format!("{url} answered HTTP {}", resp.status().as_u16()),
                ));
            }
            Err(e) => last = Some(describe_http_error(e)),
        }
    }
    Err(Error::new(
        Failure::DownloadFailed,
        format!("{url}: {}", last.unwrap_or_default()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
