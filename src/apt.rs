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

use std::cmp::Ordering;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use crate::aptsig::{self, Builtin, Keyring, Rejected, Verified};
use crate::error::{Error, Result};
use crate::fetch::{self, FetchPolicy, FetchRequest};
use crate::report::Reason;

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
    pub fn trusted_keys(&self) -> Result<Keyring> {
        match &self.keyring {
            Some(path) => Keyring::from_file(path),
            None => Keyring::builtin(Builtin::for_repository(&self.repository)),
        }
    }

    /// `<repository>/dists/<suite>/<path>`
    pub fn dists_url(&self, path: &str) -> String {
        format!(
            "{}/dists/{}/{path}",
            self.repository.trim_end_matches('/'),
            self.suite
        )
    }

    /// A package's `Filename:` (relative to the repository root) as a URL.
    pub fn pool_url(&self, filename: &str) -> String {
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

/// One line of a Release file's `SHA256:` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseFile {
    /// Relative to `dists/<suite>/`, e.g. `main/binary-amd64/Packages.xz`.
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// The parts of a Release file the installer uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Release {
    pub suite: Option<String>,
    pub codename: Option<String>,
    pub components: Vec<String>,
    pub architectures: Vec<String>,
    pub sha256: Vec<ReleaseFile>,
}

impl Release {
    pub fn file(&self, path: &str) -> Option<&ReleaseFile> {
        self.sha256.iter().find(|f| f.path == path)
    }
}

/// One stanza of a `Packages` index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub architecture: String,
    /// Relative to the repository root, e.g. `pool/main/l/linux/…deb`.
    pub filename: String,
    pub size: Option<u64>,
    /// Lower-case hex; `None` if the index gives none (then the package
    /// cannot be downloaded verified).
    pub sha256: Option<String>,
    /// Each inner list is one group of alternatives (`a | b`).
    pub depends: Vec<Vec<Dependency>>,
    /// Virtual package names (version constraints dropped).
    pub provides: Vec<String>,
}

/// A relation in a `Depends:` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// `<<`
    Less,
    /// `<=`
    LessEq,
    /// `=`
    Eq,
    /// `>=`
    GreaterEq,
    /// `>>`
    Greater,
}

/// `name[:arch] [(op version)]`; architecture restrictions (`[amd64]`) and
/// build profiles (`<…>`) are dropped: they do not occur in binary indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    pub name: String,
    pub constraint: Option<(Relation, String)>,
}

impl Dependency {
    /// Whether `version` meets the constraint (true without one).
    pub fn allows(&self, version: &str) -> bool {
        let Some((rel, want)) = &self.constraint else {
            return true;
        };
        let ord = compare_versions(version, want);
        match rel {
            Relation::Less => ord == Ordering::Less,
            Relation::LessEq => ord != Ordering::Greater,
            Relation::Eq => ord == Ordering::Equal,
            Relation::GreaterEq => ord != Ordering::Less,
            Relation::Greater => ord == Ordering::Greater,
        }
    }
}

impl std::fmt::Display for Dependency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        if let Some((rel, v)) = &self.constraint {
            let op = match rel {
                Relation::Less => "<<",
                Relation::LessEq => "<=",
                Relation::Eq => "=",
                Relation::GreaterEq => ">=",
                Relation::Greater => ">>",
            };
            write!(f, " ({op} {v})")?;
        }
        Ok(())
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
            Reason::NotCached,
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
    let release =
        parse_release(&text).map_err(|e| Error::new(e.reason, format!("{url}: {}", e.message)))?;
    Ok((url, release))
}

fn utf8(url: &str, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes)
        .map_err(|_| Error::new(Reason::ArchiveInvalid, format!("{url} is not UTF-8")))
}

fn no_suite(source: &AptSource, tried: &[String]) -> Error {
    Error::new(
        Reason::KernelHeadersNotFound,
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
        Reason::SignatureInvalid,
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
        Reason::SignatureInvalid,
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
pub fn fetch_packages(
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
            Reason::KernelHeadersNotFound,
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
                Reason::DownloadFailed,
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
        let packages = parse_packages(BufReader::new(reader), keep)
            .map_err(|e| Error::new(e.reason, format!("{url}: {}", e.message)))?;
        return Ok((url, packages));
    }
    Err(first_err.unwrap_or_else(|| Error::new(Reason::DownloadFailed, "no index file")))
}

/// GETs a small file under the fetch policy (HTTPS unless allowed, retries
/// on network errors, 408, 429 and 5xx). `None` on 404/410: the file does
/// not exist, which for InRelease is normal.
fn fetch_small(opts: &FetchPolicy, url: &str) -> Result<Option<Vec<u8>>> {
    fetch::check_url(url, opts.allow_http)?;
    let agent = fetch::agent(opts)?;
    let mut last = String::new();
    for retry in 0..=opts.retry.retries {
        if retry > 0 {
            std::thread::sleep(opts.retry.backoff(retry, None));
        }
        match agent.get(url).send() {
            Ok(resp) => match resp.status().as_u16() {
                200 => {
                    let mut buf = Vec::new();
                    match resp.take(MAX_RELEASE_BYTES + 1).read_to_end(&mut buf) {
                        Ok(_) if buf.len() as u64 > MAX_RELEASE_BYTES => {
                            return Err(Error::new(
                                Reason::ArchiveInvalid,
                                format!("{url} is larger than {MAX_RELEASE_BYTES} bytes"),
                            ));
                        }
                        Ok(_) => return Ok(Some(buf)),
                        Err(e) => last = format!("reading the body: {}", fetch::describe(&e)),
                    }
                }
                404 | 410 => return Ok(None),
                code if fetch::retryable_status(code) => last = format!("HTTP {code}"),
                code => {
                    return Err(Error::new(
                        Reason::DownloadFailed,
                        format!("{url} answered HTTP {code}"),
                    ));
                }
            },
            Err(e) => last = fetch::describe_http_error(e),
        }
        tracing::info!("{url}: {last}; retrying");
    }
    Err(Error::new(
        Reason::DownloadFailed,
        format!(
            "{url}: {last} (after {} attempt(s))",
            opts.retry.retries + 1
        ),
    )
    .with_hint("check the network, HTTPS_PROXY/NO_PROXY"))
}

/// A deb822 paragraph as (field, value) pairs; continuation lines are
/// joined with '\n' to their field's value.
fn paragraph_fields(lines: &[String]) -> Result<Vec<(String, String)>> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for line in lines {
        if line.starts_with(' ') || line.starts_with('\t') {
            match fields.last_mut() {
                Some((_, v)) => {
                    v.push('\n');
                    v.push_str(line.trim());
                }
                None => {
                    return Err(Error::new(
                        Reason::ArchiveInvalid,
                        format!("continuation line before any field: {line:?}"),
                    ));
                }
            }
        } else if line.starts_with('#') {
            continue;
        } else {
            let (k, v) = line.split_once(':').ok_or_else(|| {
                Error::new(
                    Reason::ArchiveInvalid,
                    format!("malformed line (no 'Field:'): {line:?}"),
                )
            })?;
            fields.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok(fields)
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Parses a Release file (the signed text of an InRelease).
pub fn parse_release(text: &str) -> Result<Release> {
    let lines: Vec<String> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    let fields = paragraph_fields(&lines)?;
    let words = |name: &str| -> Vec<String> {
        field(&fields, name)
            .map(|v| v.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let mut sha256 = Vec::new();
    for line in field(&fields, "SHA256").unwrap_or("").lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            [] => {}
            [sum, size, path] if fetch::is_sha256_hex(sum) => sha256.push(ReleaseFile {
                path: (*path).to_string(),
                size: size.parse().map_err(|_| {
                    Error::new(
                        Reason::ArchiveInvalid,
                        format!("Release SHA256 line with a bad size: {line:?}"),
                    )
                })?,
                sha256: sum.to_ascii_lowercase(),
            }),
            _ => {
                return Err(Error::new(
                    Reason::ArchiveInvalid,
                    format!("malformed Release SHA256 line: {line:?}"),
                ));
            }
        }
    }
    if sha256.is_empty() {
        return Err(Error::new(
            Reason::ArchiveInvalid,
            "the Release file has no SHA256 list; nothing in it could be verified",
        ));
    }
    Ok(Release {
        suite: field(&fields, "Suite").map(str::to_string),
        codename: field(&fields, "Codename").map(str::to_string),
        components: words("Components"),
        architectures: words("Architectures"),
        sha256,
    })
}

/// Parses `Packages` stanzas from a stream, keeping those whose `Package:`
/// `keep` accepts. A stanza without Package, Version or Filename is
/// malformed.
pub fn parse_packages<R: BufRead>(
    mut reader: R,
    keep: &mut dyn FnMut(&str) -> bool,
) -> Result<Vec<Package>> {
    let mut out = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    let mut wanted: Option<bool> = None;
    let mut raw = Vec::new();
    loop {
        raw.clear();
        let n = reader.read_until(b'\n', &mut raw).map_err(|e| {
            Error::new(
                Reason::ArchiveInvalid,
                format!("reading the Packages index (truncated or corrupt): {e}"),
            )
        })?;
        let line = String::from_utf8_lossy(&raw);
        let line = line.trim_end_matches(['\n', '\r']);
        if n == 0 || line.trim().is_empty() {
            if wanted == Some(true) {
                out.push(package_of(&paragraph_fields(&lines)?)?);
            }
            lines.clear();
            wanted = None;
            if n == 0 {
                return Ok(out);
            }
            continue;
        }
        if wanted.is_none()
            && let Some(name) = line.strip_prefix("Package:")
        {
            wanted = Some(keep(name.trim()));
        }
        // Stanzas nobody wants are skipped without keeping their lines.
        if wanted != Some(false) {
            lines.push(line.to_string());
        }
    }
}

fn package_of(fields: &[(String, String)]) -> Result<Package> {
    let need = |name: &str| {
        field(fields, name).map(str::to_string).ok_or_else(|| {
            Error::new(
                Reason::ArchiveInvalid,
                format!(
                    "Packages stanza {} has no {name} field",
                    field(fields, "Package").unwrap_or("?")
                ),
            )
        })
    };
    let name = need("Package")?;
    let size = match field(fields, "Size") {
        Some(s) => Some(s.parse().map_err(|_| {
            Error::new(
                Reason::ArchiveInvalid,
                format!("Packages stanza {name}: bad Size {s:?}"),
            )
        })?),
        None => None,
    };
    let sha256 = match field(fields, "SHA256") {
        Some(s) if fetch::is_sha256_hex(s) => Some(s.to_ascii_lowercase()),
        Some(s) => {
            return Err(Error::new(
                Reason::ArchiveInvalid,
                format!("Packages stanza {name}: SHA256 {s:?} is not 64 hex digits"),
            ));
        }
        None => None,
    };
    Ok(Package {
        version: need("Version")?,
        architecture: field(fields, "Architecture").unwrap_or("").to_string(),
        filename: need("Filename")?,
        size,
        sha256,
        depends: parse_depends(field(fields, "Depends").unwrap_or(""))?,
        provides: parse_depends(field(fields, "Provides").unwrap_or(""))?
            .into_iter()
            .flatten()
            .map(|d| d.name)
            .collect(),
        name,
    })
}

/// Parses a `Depends:`-style field: comma-separated groups of `|`
/// alternatives.
pub fn parse_depends(s: &str) -> Result<Vec<Vec<Dependency>>> {
    let mut groups = Vec::new();
    for group in s.split(',') {
        if group.trim().is_empty() {
            continue;
        }
        let mut alts = Vec::new();
        for alt in group.split('|') {
            alts.push(parse_dependency(alt)?);
        }
        groups.push(alts);
    }
    Ok(groups)
}

fn parse_dependency(s: &str) -> Result<Dependency> {
    let bad = || {
        Error::new(
            Reason::ArchiveInvalid,
            format!("malformed dependency {s:?}"),
        )
    };
    // Drop architecture restrictions `[…]` and build profiles `<…>`; inside
    // the version constraint `<` and `>` are operators.
    let mut text = String::new();
    let mut in_constraint = false;
    let mut skip_to: Option<char> = None;
    for ch in s.chars() {
        if let Some(close) = skip_to {
            if ch == close {
                skip_to = None;
            }
            continue;
        }
        match ch {
            '(' => in_constraint = true,
            ')' => in_constraint = false,
            '[' if !in_constraint => {
                skip_to = Some(']');
                continue;
            }
            '<' if !in_constraint => {
                skip_to = Some('>');
                continue;
            }
            _ => {}
        }
        text.push(ch);
    }
    let text = text.trim();
    let (name, constraint) = match text.split_once('(') {
        None => (text, None),
        Some((name, rest)) => {
            let inner = rest.trim().strip_suffix(')').ok_or_else(bad)?.trim();
            let split = inner
                .find(|c: char| !matches!(c, '<' | '>' | '='))
                .ok_or_else(bad)?;
            let (op, version) = inner.split_at(split);
            let rel = match op {
                "<<" | "<" => Relation::Less,
                "<=" => Relation::LessEq,
                "=" => Relation::Eq,
                ">=" => Relation::GreaterEq,
                ">>" | ">" => Relation::Greater,
                _ => return Err(bad()),
            };
            let version = version.trim();
            if version.is_empty() {
                return Err(bad());
            }
            (name, Some((rel, version.to_string())))
        }
    };
    // `name:any`, `name:amd64`: the architecture qualifier does not change
    // which package is meant here.
    let name = name.trim().split(':').next().unwrap_or("").trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(bad());
    }
    Ok(Dependency {
        name: name.to_string(),
        constraint,
    })
}

/// Compares two Debian versions as dpkg does: epoch, then upstream version,
/// then revision, each by dpkg's alternating non-digit/digit rule where `~`
/// sorts before everything, even the end of the string.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let (ea, ua, ra) = split_version(a);
    let (eb, ub, rb) = split_version(b);
    ea.cmp(&eb)
        .then_with(|| compare_part(ua, ub))
        .then_with(|| compare_part(ra, rb))
}

fn split_version(v: &str) -> (u64, &str, &str) {
    let (epoch, rest) = match v.split_once(':') {
        Some((e, rest)) if e.bytes().all(|b| b.is_ascii_digit()) => (e.parse().unwrap_or(0), rest),
        _ => (0, v),
    };
    match rest.rsplit_once('-') {
        Some((up, rev)) => (epoch, up, rev),
        None => (epoch, rest, ""),
    }
}

fn char_order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(b'~') => -1,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(c) => i32::from(c) + 256,
    }
}

fn compare_part(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    while !a.is_empty() || !b.is_empty() {
        // Non-digit prefixes, character by character.
        loop {
            let ca = a.first().copied().filter(|c| !c.is_ascii_digit());
            let cb = b.first().copied().filter(|c| !c.is_ascii_digit());
            if ca.is_none() && cb.is_none() {
                break;
            }
            let ord = char_order(ca).cmp(&char_order(cb));
            if ord != Ordering::Equal {
                return ord;
            }
            a = &a[1..];
            b = &b[1..];
        }
        // Digit runs, numerically (leading zeros ignored, no overflow).
        let da = a.iter().take_while(|c| c.is_ascii_digit()).count();
        let db = b.iter().take_while(|c| c.is_ascii_digit()).count();
        let (na, nb) = (trim_zeros(&a[..da]), trim_zeros(&b[..db]));
        let ord = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
        if ord != Ordering::Equal {
            return ord;
        }
        a = &a[da..];
        b = &b[db..];
    }
    Ordering::Equal
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|&&c| c == b'0').count();
    &d[n..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_like_dpkg() {
        use Ordering::*;
        for (a, b, want) in [
            ("6.1.176-1", "6.1.176-1", Equal),
            ("6.1.176-1", "6.1.99-1", Greater),
            ("6.1.176-1", "6.1.176-2", Less),
            ("1:0.1", "2.0", Greater),
            ("1.0~rc1-1", "1.0-1", Less),
            ("1.0~rc1", "1.0~", Greater),
            ("1.0", "1.0-0", Equal),
            ("6.12.117-1", "6.12.107-1", Greater),
            ("1.0a", "1.0+", Less),
            ("1.0", "1.0.0", Less),
            ("1.007", "1.7", Equal),
            ("1.0+b1", "1.0", Greater),
        ] {
            assert_eq!(compare_versions(a, b), want, "{a} vs {b}");
            assert_eq!(compare_versions(b, a), want.reverse(), "{b} vs {a}");
        }
    }

    #[test]
    fn depends_with_alternatives_and_constraints() {
        // trixie's linux-headers-*-cloud-amd64
        let d = parse_depends(
            "linux-base (>= 4.12~), linux-headers-6.12.117+deb13-common (= 6.12.117-1), \
             linux-image-6.12.117+deb13-cloud-amd64 (= 6.12.117-1) | linux-image-6.12.117+deb13-cloud-amd64-unsigned (= 6.12.117-1), \
             linux-kbuild-6.12.117+deb13, gcc-14, libc6:any [amd64] <!nocheck>",
        )
        .unwrap();
        assert_eq!(d.len(), 6);
        assert_eq!(d[1][0].name, "linux-headers-6.12.117+deb13-common");
        assert_eq!(
            d[1][0].constraint,
            Some((Relation::Eq, "6.12.117-1".to_string()))
        );
        assert_eq!(d[2].len(), 2);
        assert_eq!(d[3][0].name, "linux-kbuild-6.12.117+deb13");
        assert_eq!(d[3][0].constraint, None);
        assert_eq!(d[5][0].name, "libc6");
        assert!(d[0][0].allows("4.12"));
        assert!(!d[0][0].allows("4.11"));
        assert!(d[1][0].allows("6.12.117-1"));
        assert!(!d[1][0].allows("6.12.117-2"));
        assert!(parse_depends("a (>= )").is_err());
        assert!(parse_depends("a (~ 1)").is_err());
        assert_eq!(parse_depends(" ").unwrap().len(), 0);
    }

    #[test]
    fn release_is_parsed() {
        let sum = "a".repeat(64);
        let text = format!(
            "Origin: Debian\nCodename: bookworm\nComponents: main contrib\nArchitectures: all amd64\n\
             SHA256:\n {sum}  1234 main/binary-amd64/Packages.xz\n"
        );
        let r = parse_release(&text).unwrap();
        assert_eq!(r.codename.as_deref(), Some("bookworm"));
        assert_eq!(r.components, ["main", "contrib"]);
        let f = r.file("main/binary-amd64/Packages.xz").unwrap();
        assert_eq!((f.size, f.sha256.as_str()), (1234, sum.as_str()));
        assert!(parse_release("Origin: x\n").is_err());
    }

    #[test]
    fn a_real_debian_inrelease_is_verified_and_parsed() {
        let inrelease = include_str!("../tests/fixtures/apt/debian-bookworm-InRelease");
        let keyring = Keyring::builtin(Builtin::Debian).unwrap();
        let v = aptsig::verify_inrelease(inrelease, &keyring).unwrap();
        let r = parse_release(&v.text).unwrap();
        assert_eq!(r.codename.as_deref(), Some("bookworm"));
        assert!(r.components.iter().any(|c| c == "main"));
        assert!(r.file("main/binary-amd64/Packages.xz").is_some());
        // The shipped keyring is the default for deb.debian.org.
        let source = AptSource::new("https://deb.debian.org/debian", "bookworm");
        let v = aptsig::verify_inrelease(inrelease, &source.trusted_keys().unwrap()).unwrap();
        assert_eq!(v.signers.len(), 3);
    }

    #[test]
    fn packages_stanzas_are_parsed_and_filtered() {
        let sum = "B".repeat(64);
        let text = format!(
            "Package: linux-headers-6.1.0-50-cloud-amd64\nSource: linux\nVersion: 6.1.176-1\n\
             Architecture: amd64\nDepends: linux-headers-6.1.0-50-common (= 6.1.176-1), linux-kbuild-6.1 (>= 6.1.176-1)\n\
             Description: Header files\n long text\n .\n more\nFilename: pool/main/l/linux/h.deb\nSize: 10\nSHA256: {sum}\n\n\
             Package: other\nVersion: 1\nFilename: pool/o.deb\n\n\
             Package: virt-maker\nVersion: 2\nFilename: pool/v.deb\nProvides: virt (= 2), virt2\n"
        );
        let mut seen = Vec::new();
        let pkgs = parse_packages(text.as_bytes(), &mut |n: &str| {
            seen.push(n.to_string());
            n != "other"
        })
        .unwrap();
        assert_eq!(
            seen,
            ["linux-headers-6.1.0-50-cloud-amd64", "other", "virt-maker"]
        );
        assert_eq!(pkgs.len(), 2);
        assert_eq!(pkgs[0].version, "6.1.176-1");
        assert_eq!(pkgs[0].size, Some(10));
        assert_eq!(pkgs[0].sha256.as_deref(), Some("b".repeat(64).as_str()));
        assert_eq!(pkgs[0].depends.len(), 2);
        assert_eq!(pkgs[1].provides, ["virt", "virt2"]);
        assert_eq!(pkgs[1].sha256, None);
        let bad = parse_packages("Package: x\nVersion: 1\n".as_bytes(), &mut |_: &str| true);
        assert_eq!(bad.unwrap_err().reason, Reason::ArchiveInvalid);
    }
}
