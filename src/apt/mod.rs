//! Reading an apt repository's index, as far as the installer needs it to
//! find kernel header packages: `dists/<suite>/InRelease` (or `Release`
//! with `Release.gpg`), its `SHA256:` list, and the `Packages` index of each
//! component for one architecture, downloaded through [`crate::fetch::fetch`]
//! with the sha256 the Release gives, so it is verified and cached like any
//! package.
//!
//! **Trust.** The Release's OpenPGP signature is verified
//! ([`crate::aptsig`]) before anything in it is used, and only the signed
//! text is parsed: with the keyring shipped for the repository (Debian's
//! archive keys, or Garden Linux's for its repository), or the keyring file
//! the source names (`--apt-keyring`). A repository with neither a valid
//! `InRelease` nor a `Release` with a valid `Release.gpg` is refused with
//! `SignatureInvalid`; unsigned repositories are not supported. From the
//! Release on, the sha256 chain (Release → `Packages` → each `.deb`)
//! carries the trust.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::PathBuf;

use crate::aptsig::{self, Builtin, Keyring, Rejected, Verified};
use crate::error::{Error, Failure, Result};
use crate::fetch::{self, FetchPolicy, FetchRequest};

mod parse;
mod records;
mod version;

pub(crate) use parse::{parse_packages, parse_release};
pub use records::{Dependency, Package, Relation, Release, ReleaseFile};
pub(crate) use version::compare_versions;

/// A Release file larger than this is not a Release file (Debian's main
/// InRelease is ~150 KiB).
const MAX_RELEASE_BYTES: u64 = 32 << 20;

/// Where to look: `<repository>/dists/<suite>/<component>/binary-<arch>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    /// Base URL, e.g. `https://deb.debian.org/debian` or
    /// `https://packages.gardenlinux.io/gardenlinux`.
    pub repository: String,
    /// e.g. `bookworm`, or a Garden Linux version such as `1592.4`.
    pub suite: String,
    /// Searched in order; `main` for both Garden Linux and Debian.
    pub components: Vec<String>,
    /// Debian architecture name, e.g. `amd64`.
    pub architecture: String,
    /// The OpenPGP keyring the Release must be signed with. `None`: the one
    /// shipped for the repository ([`Builtin::for_repository`]).
    pub keyring: Option<PathBuf>,
}

impl AptSource {
    /// The `main` component for `amd64`.
    pub fn new(repository: &str, suite: &str) -> Self {
        AptSource {
            repository: repository.trim_end_matches('/').to_string(),
            suite: suite.to_string(),
            components: vec!["main".to_string()],
            architecture: "amd64".to_string(),
            keyring: None,
        }
    }

    /// The same source with its Release checked against `keyring` (a
    /// keyring file) instead of the shipped one; `None` keeps the shipped.
    pub fn with_keyring(mut self, keyring: Option<PathBuf>) -> Self {
        self.keyring = keyring;
        self
    }

    /// The keys this source's Release must be signed with.
    pub(crate) fn trusted_keys(&self) -> Result<Keyring> {
        match &self.keyring {
            Some(path) => Keyring::from_file(path),
            None => Keyring::builtin(Builtin::for_repository(&self.repository)),
        }
    }

    /// `<repository>/dists/<suite>/<path>`
    pub(crate) fn dists_url(&self, path: &str) -> String {
        format!(
            "{}/dists/{}/{path}",
            self.repository.trim_end_matches('/'),
            self.suite
        )
    }

    /// A package's `Filename:` (relative to the repository root) as a URL.
    pub(crate) fn pool_url(&self, filename: &str) -> String {
        format!(
            "{}/{}",
            self.repository.trim_end_matches('/'),
            filename.trim_start_matches('/')
        )
    }

    fn describe(&self) -> String {
        format!(
            "{} suite {} ({}, {})",
            self.repository,
            self.suite,
            self.components.join(", "),
            self.architecture
        )
    }
}

/// The packages kept from a repository's index, and where they came from.
#[derive(Debug, Clone)]
pub struct Index {
    pub source: AptSource,
    /// The URL the Release was read from (InRelease or Release).
    pub release_url: String,
    /// The `Packages` index files used, one per component.
    pub index_urls: Vec<String>,
    pub packages: Vec<Package>,
}

impl Index {
    /// The newest package called `name` (or, if none is, providing it) that
    /// `dep` allows; `dep` may be `None` for any version.
    pub fn best(&self, name: &str, dep: Option<&Dependency>) -> Option<&Package> {
        let allowed = |p: &&Package| dep.is_none_or(|d| d.allows(&p.version));
        let newest = |a: &&Package, b: &&Package| compare_versions(&a.version, &b.version);
        self.packages
            .iter()
            .filter(|p| p.name == name)
            .filter(allowed)
            .max_by(newest)
            .or_else(|| {
                // A versioned dependency on a virtual package is only met by
                // a versioned Provides, which is not kept; offer real ones.
                if dep.is_some_and(|d| d.constraint.is_some()) {
                    return None;
                }
                self.packages
                    .iter()
                    .filter(|p| p.provides.iter().any(|v| v == name))
                    .max_by(newest)
            })
    }
}

/// Reads the Release of `source` and the `Packages` index of each of its
/// components, keeping the stanzas whose package name `keep` accepts (a
/// full Debian index has ~60,000; keeping only the few needed keeps memory
/// flat). The Packages files are fetched verified into `opts.cache_dir`.
pub fn read_index(
    source: &AptSource,
    opts: &FetchPolicy,
    keep: &mut dyn FnMut(&str) -> bool,
) -> Result<Index> {
    let (release_url, release) = fetch_release(source, opts)?;
    let mut packages = Vec::new();
    let mut index_urls = Vec::new();
    for component in &source.components {
        let (url, mut found) = fetch_packages(source, &release, component, opts, keep)?;
        index_urls.push(url);
        packages.append(&mut found);
    }
    Ok(Index {
        source: source.clone(),
        release_url,
        index_urls,
        packages,
    })
}

/// Fetches `dists/<suite>/InRelease`, falling back to `Release` with
/// `Release.gpg` when the repository has no InRelease, verifies its
/// signature with the source's keyring and parses the signed text. Returns
/// the URL used and the parsed Release. A signature that does not verify,
/// or a Release without one, is `SignatureInvalid`.
pub fn fetch_release(source: &AptSource, opts: &FetchPolicy) -> Result<(String, Release)> {
    if opts.offline {
        return Err(Error::new(
            Failure::NotCached,
            format!(
                "offline: the index of {} cannot be read without the network",
                source.describe()
            ),
        )
        .with_hint("install the kernel headers on the host, or run online once"));
    }
    // Before the network: a bad --apt-keyring fails without a download.
    let keyring = source.trusted_keys()?;
    let inrelease = source.dists_url("InRelease");
    let (url, verified) = if let Some(bytes) = fetch_small(opts, &inrelease)? {
        let text = utf8(&inrelease, bytes)?;
        let verified = aptsig::verify_inrelease(&text, &keyring)
            .map_err(|r| signature_error(source, &inrelease, &keyring, r))?;
        (inrelease, verified)
    } else {
        let url = source.dists_url("Release");
        let Some(release) = fetch_small(opts, &url)? else {
            return Err(no_suite(source, &[inrelease, url]));
        };
        let sig_url = source.dists_url("Release.gpg");
        let Some(sig) = fetch_small(opts, &sig_url)? else {
            return Err(unsigned(source, &url, &sig_url));
        };
        let verified = aptsig::verify_detached(&release, &sig, &keyring)
            .map_err(|r| signature_error(source, &sig_url, &keyring, r))?;
        (url, verified)
    };
    let Verified { text, signers } = verified;
    tracing::info!("{url}: signature by {} verified", signers.join(", "));
    let release = parse_release(&text).map_err(|e| e.context(&url))?;
    Ok((url, release))
}

fn utf8(url: &str, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes)
        .map_err(|_| Error::new(Failure::ArchiveInvalid, format!("{url} is not UTF-8")))
}

fn no_suite(source: &AptSource, tried: &[String]) -> Error {
    Error::new(
        Failure::KernelHeadersNotFound,
        format!(
            "{} has no suite {}: {} answered 404",
            source.repository,
            source.suite,
            tried.join(" and ")
        ),
    )
    .with_hint(format!(
        "check the repository URL and that it publishes suite {} (for Garden Linux, the node's exact version)",
        source.suite
    ))
}

fn unsigned(source: &AptSource, release_url: &str, sig_url: &str) -> Error {
    Error::new(
        Failure::SignatureInvalid,
        format!(
            "{} suite {} is not signed: no InRelease, and {sig_url} answered 404 for {release_url}; \
             unsigned repositories are refused",
            source.repository, source.suite
        ),
    )
    .with_hint("sign the repository (InRelease, or Release.gpg) and pass its key with --apt-keyring")
}

/// The message for a refused signature: repository, suite, the keys that
/// signed it, and what to do.
fn signature_error(source: &AptSource, url: &str, keyring: &Keyring, r: Rejected) -> Error {
    let signed_by = if r.signers.is_empty() {
        String::new()
    } else {
        format!(" (signed by {})", r.signers.join(", "))
    };
    let err = Error::new(
        Failure::SignatureInvalid,
        format!(
            "{url}: the Release of {} suite {} has no valid signature{signed_by}: {}",
            source.repository, source.suite, r.detail
        ),
    );
    if r.tampered {
        return err.with_hint(
            "a trusted key's signature does not match the text: the file was changed after \
             signing (a broken mirror or proxy, or tampering); do not trust another key for it",
        );
    }
    err.with_hint(format!(
        "if {} is signed by another key, pass that key with --apt-keyring PATH \
         (an OpenPGP keyring, binary or armored; trusted now: {})",
        source.repository,
        keyring.fingerprints().join(", ")
    ))
}

/// The Packages index files tried, most compact first, as apt does.
const INDEX_NAMES: [&str; 3] = ["Packages.xz", "Packages.gz", "Packages"];

/// Downloads the `Packages` index of one component (`.xz`, else `.gz`, else
/// plain, whichever the Release lists; the next one if a download fails),
/// verified against the Release's sha256, and parses it. Returns the URL
/// used and the kept packages.
pub(crate) fn fetch_packages(
    source: &AptSource,
    release: &Release,
    component: &str,
    opts: &FetchPolicy,
    keep: &mut dyn FnMut(&str) -> bool,
) -> Result<(String, Vec<Package>)> {
    let dir = format!("{component}/binary-{}", source.architecture);
    let listed: Vec<&ReleaseFile> = INDEX_NAMES
        .iter()
        .filter_map(|n| release.file(&format!("{dir}/{n}")))
        .collect();
    if listed.is_empty() {
        return Err(Error::new(
            Failure::KernelHeadersNotFound,
            format!(
                "{} lists no {dir}/Packages index (components: {}; architectures: {})",
                source.dists_url("Release"),
                release.components.join(" "),
                release.architectures.join(" ")
            ),
        )
        .with_hint("check the component and architecture"));
    }
    let mut first_err: Option<Error> = None;
    for file in listed {
        let url = source.dists_url(&file.path);
        let fetched = match fetch::fetch(opts, &FetchRequest::new(&url, &file.sha256)) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("{url}: {}; trying the next index file", e.error);
                first_err.get_or_insert(e.error);
                continue;
            }
        };
        let f = File::open(&fetched.path).map_err(|e| {
            Error::io(
                Failure::DownloadFailed,
                "opening the index",
                &fetched.path,
                e,
            )
        })?;
        let reader: Box<dyn Read> = if file.path.ends_with(".xz") {
            Box::new(liblzma::read::XzDecoder::new_multi_decoder(f))
        } else if file.path.ends_with(".gz") {
            Box::new(flate2::read::MultiGzDecoder::new(f))
        } else {
            Box::new(f)
        };
        let packages = parse_packages(BufReader::new(reader), keep).map_err(|e| e.context(&url))?;
        return Ok((url, packages));
    }
    Err(first_err.unwrap_or_else(|| Error::new(Failure::DownloadFailed, "no index file")))
}

/// GETs a small file under the fetch policy (HTTPS unless allowed, retries
/// on network errors, 408, 429 and 5xx), all of it within the download
/// deadline (`--download-timeout`): a server that drips one byte inside
/// each read timeout still ends. `None` on 404/410: the file does not
/// exist, which for InRelease is normal.
fn fetch_small(opts: &FetchPolicy, url: &str) -> Result<Option<Vec<u8>>> {
    fetch::check_url(url, opts.allow_http)?;
    let agent = fetch::agent(opts)?;
    let deadline = std::time::Instant::now() + opts.timeouts.total;
    let late = || {
        Error::new(
            Failure::DownloadFailed,
            format!(
                "{url}: the download deadline of {} s passed",
                opts.timeouts.total.as_secs()
            ),
        )
        .with_hint("raise --download-timeout for a slow network, or use a closer mirror")
    };
    let mut last = String::new();
    for retry in 0..=opts.retry.retries {
        if retry > 0 {
            let wait = opts.retry.backoff(retry, None);
            if std::time::Instant::now() + wait >= deadline {
                return Err(late());
            }
            std::thread::sleep(wait);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        // reqwest's blocking timeout covers connecting, the head and the
        // whole body.
        match agent.get(url).timeout(left).send() {
            Ok(resp) => match resp.status().as_u16() {
                200 => {
                    let mut buf = Vec::new();
                    match resp.take(MAX_RELEASE_BYTES + 1).read_to_end(&mut buf) {
                        Ok(_) if buf.len() as u64 > MAX_RELEASE_BYTES => {
                            return Err(Error::new(
                                Failure::ArchiveInvalid,
                                format!("{url} is larger than {MAX_RELEASE_BYTES} bytes"),
                            ));
                        }
                        Ok(_) => return Ok(Some(buf)),
                        Err(_) if std::time::Instant::now() >= deadline => return Err(late()),
                        Err(e) => last = format!("reading the body: {}", fetch::describe(&e)),
                    }
                }
                404 | 410 => return Ok(None),
                code if fetch::retryable_status(code) => last = format!("HTTP {code}"),
                code => {
                    return Err(Error::new(
                        Failure::DownloadFailed,
                        format!("{url} answered HTTP {code}"),
                    ));
                }
            },
            Err(_) if std::time::Instant::now() >= deadline => return Err(late()),
            Err(e) => last = fetch::describe_http_error(e),
        }
        tracing::info!("{url}: {last}; retrying");
    }
    Err(Error::new(
        Failure::DownloadFailed,
        format!(
            "{url}: {last} (after {} attempt(s))",
            opts.retry.retries + 1
        ),
    )
    .with_hint("check the network, HTTPS_PROXY/NO_PROXY"))
}
