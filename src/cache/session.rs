//! The cache's part in one build: look the key up (holding its lease while
//! this builder compiles, or waiting for the builder that holds it), then
//! publish the fresh build.

use std::ops::ControlFlow;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use object_store::{PutMode, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::entry::{CacheKey, Found, StoredEntry, Wanted, read_entry};
use super::status::{CacheOutcome, CacheStatus};
use super::store::{CacheConfig, Store, StoreResult, describe, is_conflict};
use crate::artifact::Manifest;
use crate::error::{Error, Failure};

/// How long a builder that created the lease waits before checking that
/// the lease still names it (see [`Session::acquire_lease`]). Paid once per
/// compile, which takes minutes.
const LEASE_SETTLE: Duration = Duration::from_millis(1000);

/// A lease object is a few hundred bytes; a bigger one is not ours.
const LEASE_MAX: u64 = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Lease {
    pub owner: String,
    pub acquired_at_unix: u64,
    pub ttl_seconds: u64,
}

impl Lease {
    pub(crate) fn expired(&self, now_unix: u64) -> bool {
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
    pub(crate) fn looked_up(&self) -> bool {
        self.key.is_some()
    }

    /// Why there is nothing to install when compiling is not allowed
    /// (`run --no-compile`) and the lookup found no usable entry:
    /// `ChecksumMismatch` for an entry with another sha256 than
    /// `--artifact-sha256`, else `ArtifactNotCached`.
    pub(crate) fn not_cached_error(&self) -> Error {
        let key = self.status.key.as_deref().unwrap_or("(not looked up)");
        let url = self.status.url.as_deref().unwrap_or("?");
        if let (Some(found), Some(expected)) = (&self.refused_sha256, &self.cfg.expected_sha256) {
            return Error::new(
                Failure::ChecksumMismatch,
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
            Failure::ArtifactNotCached,
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
        // Without a store (it could not be opened) there is nothing to look up.
        self.store.as_ref()?;
        if self.cfg.read_only {
            return self.lookup_read_only(Wanted::Key(&key), &dir, artifact);
        }
        let mut wait = Waiting {
            start: Instant::now(),
            corrupt: false,
            waited_for: None,
            seen_manifest: None,
        };
        loop {
            if !self.manifest_unchanged(&dir, &wait) {
                if let ControlFlow::Break(found) = self.read_step(&key, &dir, artifact, &mut wait) {
                    return found;
                }
            }
            self.status.outcome = if wait.corrupt {
                CacheOutcome::Corrupt
            } else {
                CacheOutcome::Miss
            };
            if self.lease_step(&dir, &mut wait).is_break() {
                return None;
            }
        }
    }

    /// While waiting, an unchanged manifest (a corrupt one that the lease
    /// holder is replacing) is not downloaded again.
    fn manifest_unchanged(&self, dir: &str, wait: &Waiting) -> bool {
        let (Some(store), Some(_), Some(seen)) =
            (&self.store, &wait.waited_for, &wait.seen_manifest)
        else {
            return false;
        };
        match store.head(&format!("{dir}/manifest.json")) {
            Ok(Some(etag)) => etag.is_some() && &etag == seen,
            _ => false,
        }
    }

    /// Reads the entry. A hit, a refused entry or an unavailable store end
    /// the lookup (`Break`); a missing or corrupt entry goes on to the
    /// lease (`Continue`).
    fn read_step(
        &mut self,
        key: &CacheKey,
        dir: &str,
        artifact: &Path,
        wait: &mut Waiting,
    ) -> ControlFlow<Option<StoredEntry>> {
        let Some(store) = self.store.as_ref() else {
            return ControlFlow::Break(None);
        };
        let expected = self.cfg.expected_sha256.as_deref();
        match read_entry(
            store,
            Wanted::Key(key),
            dir,
            artifact,
            expected,
            &mut self.status,
        ) {
            Found::Hit(entry) => {
                self.status.outcome = CacheOutcome::Hit;
                if let Some(owner) = &wait.waited_for {
                    self.status.lease = Some(format!(
                        "waited {:.1} s for builder {owner}",
                        wait.start.elapsed().as_secs_f64()
                    ));
                }
                ControlFlow::Break(Some(*entry))
            }
            Found::Miss => ControlFlow::Continue(()),
            Found::Corrupt(why) => {
                if !wait.corrupt {
                    self.status.warn(format!(
                        "entry {dir} is corrupt, compiling to replace it: {why}"
                    ));
                }
                wait.corrupt = true;
                wait.seen_manifest = store.head(&format!("{dir}/manifest.json")).ok().flatten();
                ControlFlow::Continue(())
            }
            Found::Unexpected(found) => {
                self.refuse_unexpected(dir, found);
                ControlFlow::Break(None)
            }
            Found::Unavailable(why) => {
                self.status.outcome = CacheOutcome::Unavailable;
                self.status
                    .warn(format!("store unavailable, compiling without it: {why}"));
                ControlFlow::Break(None)
            }
        }
    }

    /// Takes the key's lease, so that this builder compiles (`Break`), or
    /// waits a poll for the builder that holds it (`Continue`), until
    /// `--cache-wait` has passed.
    fn lease_step(&mut self, dir: &str, wait: &mut Waiting) -> ControlFlow<()> {
        match self.acquire_lease(dir) {
            Ok(LeaseState::Acquired(note)) => {
                self.lease_held = true;
                self.status.lease = Some(match &wait.waited_for {
                    Some(owner) => format!(
                        "{note} after waiting {:.1} s for builder {owner}",
                        wait.start.elapsed().as_secs_f64()
                    ),
                    None => note,
                });
                ControlFlow::Break(())
            }
            Ok(LeaseState::HeldBy(owner)) => {
                if wait.start.elapsed() >= self.cfg.wait {
                    self.status.warn(format!(
                        "waited {:.0} s (--cache-wait) for builder {owner}, which holds the lease of {dir}; compiling here",
                        wait.start.elapsed().as_secs_f64()
                    ));
                    self.status.lease = Some(format!("gave up waiting for builder {owner}"));
                    return ControlFlow::Break(());
                }
                if wait.waited_for.is_none() {
                    tracing::info!(
                        "cache: builder {owner} is compiling {dir}; waiting up to {} s for its artifact",
                        self.cfg.wait.as_secs()
                    );
                }
                wait.waited_for = Some(owner);
                std::thread::sleep(self.cfg.poll);
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.status.warn(format!(
                    "could not take the lease of {dir}, compiling without coordination: {}",
                    describe(&e)
                ));
                ControlFlow::Break(())
            }
        }
    }

    /// `--cache-read-only`: one read of the entry; no lease, no waiting
    /// for another builder's, and nothing is ever written.
    /// `--cache-entry`, when given.
    pub(crate) fn pinned_entry(&self) -> Option<&str> {
        self.cfg.entry.as_deref()
    }

    /// The entry a build Job named (`--cache-entry`, its
    /// `status.built.cacheKey`), read-only: no key is computed here (so no
    /// headers or compiler are needed), but the entry's key must be
    /// `target`'s, whatever compiler built it, and its artifact the
    /// expected sha256.
    pub(crate) fn lookup_entry(
        &mut self,
        dir: &str,
        target: CacheKey,
        artifact: &Path,
    ) -> Option<StoredEntry> {
        let t = Instant::now();
        self.status.key = Some(dir.to_string());
        self.key = Some(target.clone());
        let found = self.lookup_read_only(Wanted::Target(&target), dir, artifact);
        self.seconds += t.elapsed().as_secs_f64();
        found
    }

    fn lookup_read_only(
        &mut self,
        key: Wanted<'_>,
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
            .get(&rel, LEASE_MAX)?
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
        let Some((bytes, etag)) = store.get(&rel, LEASE_MAX)? else {
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
        let ours = match store.get(&rel, LEASE_MAX) {
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

/// Where a lookup stands while it waits for another builder's lease.
struct Waiting {
    start: Instant,
    /// The entry was found corrupt (warned once).
    corrupt: bool,
    /// The builder holding the lease, once this one waits for it.
    waited_for: Option<String>,
    /// The ETag of the corrupt manifest last read, if any.
    seen_manifest: Option<Option<String>>,
}

enum LeaseState {
    Acquired(String),
    HeldBy(String),
}

#[cfg(test)]
mod tests {
    use super::*;

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
