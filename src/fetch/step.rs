//! The `fetch` step: a [`PackageRequest`] (URL, mirrors, whatever checksum
//! is known) into a verified file and a [`FetchResult`] document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::checksum::find_checksum;
use super::download::fetch;
use super::fetched::{Attempt, FetchError, Fetched};
use super::policy::{FetchPolicy, FetchRequest, check_url};
use super::request::{ChecksumSource, PackageRequest, file_name_of};
use crate::error::{Error, Failure, Result, Success};
use crate::report::{Kind, Outcome, Reason};
use crate::step::{self, Done, StepResult, StepStatus, Stopped};

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
    fn bytes_downloaded(&self) -> u64 {
        self.attempts.iter().map(|a| a.bytes).sum()
    }
}

/// The package URL, then each mirror's URL for the file, in order.
fn source_urls(req: &PackageRequest, file: &str) -> Result<Vec<String>> {
    let mut urls = vec![req.url.clone()];
    for m in &req.mirrors {
        urls.push(mirror_url(m, file, req.version.as_deref())?);
    }
    Ok(urls)
}

/// A mirror is a URL prefix the file name is appended to, or a template
/// with `{file}` and/or `{version}`.
fn mirror_url(mirror: &str, file: &str, version: Option<&str>) -> Result<String> {
    if mirror.contains("{version}") && version.is_none() {
        return Err(Error::new(
            Failure::InvalidArgument,
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

impl FetchSpec {
    fn new(
        url: String,
        mirrors: Vec<String>,
        sha256: Option<String>,
        policy: &FetchPolicy,
    ) -> Self {
        FetchSpec {
            url,
            mirrors,
            sha256,
            cache_dir: policy.cache_dir.display().to_string(),
            offline: policy.offline,
            allow_http: policy.allow_http,
            retries: policy.retry.retries,
        }
    }
}

impl StepStatus for FetchStatus {
    const KIND: Kind = Kind::FetchResult;
    fn unfinished() -> Self {
        FetchStatus {
            outcome: Outcome::new(Reason::Internal, "fetch did not finish"),
            path: None,
            sha256: None,
            checksum_source: None,
            size_bytes: None,
            cache_hit: false,
            source_url: None,
            attempts: Vec::new(),
        }
    }
    fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

/// A fetch that ended before it began (bad plan, bad arguments).
pub(crate) fn fetch_package_failed(url: String, policy: &FetchPolicy, error: Error) -> FetchResult {
    step::document(
        FetchSpec::new(url, Vec::new(), None, policy),
        Err(Stopped::at_start(error)),
    )
}

/// The whole `fetch` step, as a result document.
pub(crate) fn fetch_package(req: &PackageRequest, policy: FetchPolicy) -> FetchResult {
    step::document(FetchSpec::of(req, &policy), fetch_status(req, &policy))
}

impl FetchSpec {
    /// What fetching `req` under `policy` is asked.
    pub(crate) fn of(req: &PackageRequest, policy: &FetchPolicy) -> Self {
        FetchSpec::new(
            req.url.clone(),
            req.mirrors.clone(),
            req.sha256.as_ref().map(|(s, _)| s.clone()),
            policy,
        )
    }
}

/// The `fetch` step's work: the checksum found, the file downloaded (or
/// found in the package cache) and verified; every attempt recorded,
/// failed ones included.
pub(crate) fn fetch_status(req: &PackageRequest, policy: &FetchPolicy) -> StepResult<FetchStatus> {
    step::attempt(FetchStatus::unfinished(), |status| {
        let file = file_name_of(&req.url);
        let got = (|| -> Result<Fetched, FetchError> {
            let urls = source_urls(req, &file)?;
            for url in &urls {
                check_url(url, policy.allow_http)?;
            }
            let (sha256, source) = find_checksum(req, policy)?;
            status.sha256 = Some(sha256.clone());
            status.checksum_source = Some(source);
            fetch(policy, &FetchRequest { urls, sha256 })
        })();
        let f = got.map_err(|e| {
            status.attempts = e.attempts;
            e.error
        })?;
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
        Ok(Done::new(Success::Fetched, msg))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::checksum::redistrib_manifest_url;

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
}
