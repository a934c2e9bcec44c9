//! The cache's store as a private mirror of driver packages
//! (`<cache-url>/packages/<file>`).

use std::path::Path;

use object_store::PutMode;

use super::store::{CacheConfig, Store, is_conflict, unavailable};
use crate::error::{Error, Failure, Result};

/// The object name of a driver package in the store's mirror.
fn package_object(file: &str) -> String {
    format!("packages/{file}")
}

/// Restores `packages/<file>` into `dest` if the store has it and its
/// sha256 is `sha256` (the checksum comes from the usual trusted sources,
/// never from the store). `Ok(None)`: not in the store; `Err`: unusable.
fn restore_package(
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
        .map_err(|e| Error::io(Failure::Internal, "creating", parent, e))?;
    let max = crate::fetch::DEFAULT_MAX_DOWNLOAD_MIB << 20;
    let Some(got) = store.get_to_file(&rel, parent, max, None)? else {
        return Ok(None);
    };
    if got.sha256 != sha256 {
        return Err(Error::new(
            Failure::ChecksumMismatch,
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
    .map_err(|e| Error::io(Failure::Internal, "setting permissions of", file.path(), e))?;
    file.persist(dest)
        .map_err(|e| Error::io(Failure::Internal, "renaming into place", dest, e.error))?;
    crate::publish::sync_dir(parent);
    Ok(Some(got.size))
}

/// `fetch` with the cache's store as a private package mirror: a package the
/// store holds (`<cache-url>/packages/<file>`) is placed into the local
/// package cache if its sha256 is the trusted one, and a package downloaded
/// from elsewhere is stored there for the other nodes. The store never
/// supplies a checksum, and its failures are only warnings.
pub(crate) fn fetch_with_mirror(
    cache: &CacheConfig,
    req: &crate::fetch::PackageRequest,
    opts: crate::fetch::FetchPolicy,
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
    let spec = crate::fetch::FetchSpec::of(req, &opts);
    let mut result = crate::fetch::fetch_status(req, &opts);
    if let Ok(status) = &mut result {
        if let Some(n) = restored {
            status.outcome.message = format!(
                "{file} came from the cache store {}/{} ({n} bytes) and was verified against the trusted sha256 at {}",
                cache.url.trim_end_matches('/'),
                package_object(&file),
                status.path.as_deref().unwrap_or("?")
            );
        } else if cache.read_only {
            tracing::debug!("{file}: not stored in the cache store: it is read-only");
        } else if let Some(path) = &status.path {
            match store_package(cache, &file, Path::new(path)) {
                Ok(true) => tracing::info!("{file}: stored in the cache store {}", cache.url),
                Ok(false) => {}
                Err(e) => tracing::warn!("{file}: not stored in the cache store: {e}"),
            }
        }
    }
    crate::step::document(spec, result)
}

/// Stores a verified package as `packages/<file>` unless it is there
/// already. Returns whether it was written.
fn store_package(cfg: &CacheConfig, file: &str, path: &Path) -> Result<bool> {
    check_file_name(file)?;
    if cfg.read_only {
        return Ok(false);
    }
    let store = Store::open(cfg)?;
    let rel = package_object(file);
    if store.head(&rel).map_err(|e| unavailable(&e))?.is_some() {
        return Ok(false);
    }
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(Failure::Internal, "reading", path, e))?;
    match store.put(&rel, bytes, PutMode::Create) {
        Ok(_) => Ok(true),
        Err(e) if is_conflict(&e) => Ok(false),
        Err(e) => Err(unavailable(&e)),
    }
}

fn check_file_name(file: &str) -> Result<()> {
    if file.is_empty() || file.contains('/') || file.starts_with('.') {
        Err(Error::new(
            Failure::InvalidArgument,
            format!("{file:?} is not a package file name"),
        ))
    } else {
        Ok(())
    }
}
