//! `build`: compiles NVIDIA's kernel modules against a kernel's headers and
//! packages them. Steps, each with its own reasons (see `docs/build.md`):
//!
//! 1. **preflight**: `/proc`, headers present and for this release, tools
//!    and compiler (the one the kernel was built with), free disk;
//! 2. **extract** the package (`.run`, module-source tarball or directory)
//!    with [`crate::extract`] and find the module tree of the flavor;
//! 3. **compile** with NVIDIA's Makefile, the output streamed to a log;
//!    a failure is classified from the compiler's errors;
//! 4. **package** the stripped modules, GSP firmware and a manifest into one
//!    `.tar.zst`, written under a temporary name and renamed.
//!
//! Each step has its own submodule (`preflight`, `source`, `compile`,
//! `package`); the options are `options`', the work directory `work`'s, the
//! result document is `result`'s; the cache lookup and the order of the
//! steps are here.
//!
//! External programs are run with [`Command`](std::process::Command) and
//! argument vectors, never through a shell; running them and parsing their
//! output are separate functions so that the parsers are tested on
//! captured outputs.

mod compile;
mod options;
mod package;
mod parallelism;
mod preflight;
mod result;
mod source;
mod work;

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Failure, Result, Success};
use crate::step::{self, Done, StepResult, StepStatus, Stopped};

pub use compile::{EXCERPT_LINES, classify_log, make_args};

pub use compile::CompileFailure;
pub use package::{check_machine, check_vermagic, collect_modules};
pub use parallelism::default_jobs;
pub use preflight::{
    CompilerMatch, Target, check_compiler, check_disk, check_proc, check_tools, choose_compiler,
    compare_compilers, parse_version_first_line, target_arch,
};
pub use result::{
    BuildResult, BuildSpec, BuildStatus, BuiltModule, CompilerUsed, HeadersUsed, Timings,
};
pub use source::{driver_version_of, find_firmware, parse_nv_version_string, parse_version_mk};

pub use options::BuildOptions;

use compile::compile;
use package::package;
use preflight::{Preflight, preflight};
use result::seconds;
use source::extract_source;
use work::{LOCAL_IO, claim_work_dir};

/// Free space the work directory needs. A compile of the open 535/550 trees
/// peaks at about 950 MB (unstripped `nvidia.ko` alone is 184 MB, plus the
/// objects and the extracted sources); twice that leaves room for larger
/// future branches and for the packaging step.
const MIN_FREE_DISK_BYTES: u64 = 2 << 30;

/// A build that could not start (bad arguments, unreadable kernel release).
pub(crate) fn build_failed(spec: BuildSpec, error: Error) -> BuildResult {
    step::document(spec, Err(Stopped::at_start(error)))
}

/// The whole `build` step, as a result document.
/// An empty `kernel_release` means the host's running kernel; the cache
/// configuration is checked first (a bad one is the caller's mistake).
pub fn build(opts: &BuildOptions) -> BuildResult {
    match running_release(opts) {
        Ok(Some(release)) => build(&BuildOptions {
            kernel_release: release,
            ..opts.clone()
        }),
        Ok(None) => step::document(opts.spec(), build_status(opts)),
        Err(e) => build_failed(opts.spec(), e),
    }
}

/// `run`'s look-up-first: the cache entry for `opts` (the plan knows the
/// driver version) read before the driver package is downloaded, so that a
/// node whose artifact is cached downloads nothing else. Read-only: no
/// lease is taken; a miss goes on to the fetch and the build, which look up
/// again. `Some` when the lookup decides the step: a verified hit, or, with
/// `--no-compile`, whatever it found (a miss is `ArtifactNotCached` before
/// any package byte).
pub(crate) fn look_up_first(opts: &BuildOptions) -> Option<BuildResult> {
    opts.driver_version.as_ref()?;
    let mut cache = opts.cache.clone()?;
    cache.read_only = true;
    let looked = build(&BuildOptions {
        cache: Some(cache),
        lookup_only: true,
        ..opts.clone()
    });
    let hit = looked.status.outcome.reason == crate::report::Reason::Built;
    (hit || opts.no_compile).then_some(looked)
}

/// The cache configuration checked, then the running kernel's release
/// when `opts` names none (`None`: it names one).
fn running_release(opts: &BuildOptions) -> Result<Option<String>> {
    if let Some(cache) = &opts.cache {
        cache.check()?;
    }
    if !opts.kernel_release.is_empty() {
        return Ok(None);
    }
    let release = crate::node::read_kernel_release(&opts.root)?;
    // An empty answer would send `build` back to itself.
    if release.is_empty() {
        return Err(Error::new(
            Failure::HostReadFailed,
            "the running kernel's release is empty",
        ));
    }
    Ok(Some(release))
}

/// The `build` step's work, with what the artifact cache did (on a
/// success, the cache's warnings follow the message).
fn build_status(opts: &BuildOptions) -> StepResult<BuildStatus> {
    let mut session = opts.cache.as_ref().map(crate::cache::Session::start);
    let mut result = step::attempt(BuildStatus::unfinished(), |st| {
        run(opts, st, session.as_mut()).map(|msg| Done::new(Success::Built, msg))
    });
    let (status, succeeded) = match &mut result {
        Ok(status) => (status, true),
        Err(stopped) => (&mut *stopped.status, false),
    };
    status.cache = Some(match session {
        Some(s) => {
            if s.seconds > 0.0 {
                status.timings.cache_seconds = Some(seconds(Duration::from_secs_f64(s.seconds)));
            }
            let c = s.finish();
            if !c.warnings.is_empty() && succeeded {
                status.outcome.message.push_str(&format!(
                    " (cache {:?}: {})",
                    c.outcome,
                    c.warnings.join("; ")
                ));
            }
            c
        }
        None => crate::cache::CacheStatus::disabled(),
    });
    result
}

fn run(
    opts: &BuildOptions,
    status: &mut BuildStatus,
    mut cache: Option<&mut crate::cache::Session>,
) -> Result<String> {
    check_arguments(opts)?;
    let _work_lock = claim_work_dir(&opts.work_dir())?;
    // A build Job named the entry: no headers or compiler to compute a key.
    if let (true, Some(session), Some(dv)) = (
        opts.lookup_only,
        cache.as_deref_mut().filter(|s| s.pinned_entry().is_some()),
        &opts.driver_version,
    ) {
        if let Some(msg) = restore_pinned(session, opts, dv, status)? {
            return Ok(msg);
        }
        refuse_compile(opts, Some(&*session))?;
        return Err(Error::new(Failure::Internal, "not cached; fetch and build"));
    }
    let pre = preflight(opts, status)?;
    // With the driver version known up front (`run` knows it from the
    // plan), a cache hit skips extraction and compile alike.
    if let (Some(session), Some(dv)) = (cache.as_deref_mut(), &opts.driver_version) {
        if let Some(msg) = restore_from_cache(session, opts, dv, &pre, status) {
            return Ok(msg);
        }
    }
    if opts.lookup_only {
        refuse_compile(opts, cache.as_deref())?;
        // Not a result anyone sees: look_up_first drops it.
        return Err(Error::new(Failure::Internal, "not cached; fetch and build"));
    }
    // Refused before the source is even extracted when the lookup ran.
    if cache
        .as_deref()
        .is_none_or(crate::cache::Session::looked_up)
    {
        refuse_compile(opts, cache.as_deref())?;
    }
    check_disk(&pre.work, MIN_FREE_DISK_BYTES)?;
    let src = extract_source(opts, &pre.work, pre.target.arch, status)?;
    if let Some(session) = cache.as_deref_mut() {
        if !session.looked_up() {
            let dv = src.driver_version.as_str();
            if let Some(msg) = restore_from_cache(session, opts, dv, &pre, status) {
                return Ok(msg);
            }
        }
    }
    refuse_compile(opts, cache.as_deref())?;
    compile(opts, &pre, &src, status)?;
    let (artifact, sha256, manifest) = package(opts, &pre, &src, status)?;
    if let Some(session) = cache {
        session.publish(&artifact, &sha256, &manifest);
    }
    drop(src.cleanup);
    Ok(format!(
        "built {} modules of NVIDIA {} ({}) for kernel {} into {}",
        status.modules.len(),
        src.driver_version,
        opts.flavor,
        opts.kernel_release,
        artifact.display()
    ))
}

/// `--no-compile`: past the cache lookup, a build fails instead of
/// compiling (the session says why the cache did not supply it).
fn refuse_compile(opts: &BuildOptions, cache: Option<&crate::cache::Session>) -> Result<()> {
    if !opts.no_compile {
        return Ok(());
    }
    Err(match cache {
        Some(session) => session.not_cached_error(),
        None => Error::new(
            Failure::ArtifactNotCached,
            "--no-compile without an artifact cache (--cache-url): nothing can supply the artifact",
        )
        .with_hint("pass --cache-url, or allow compiling on the node"),
    })
}

fn check_arguments(opts: &BuildOptions) -> Result<()> {
    check_release_name(&opts.kernel_release)?;
    if let Some(v) = &opts.driver_version {
        if !crate::node::is_driver_version(v) {
            return Err(Error::new(
                Failure::InvalidArgument,
                format!("--driver-version {v:?} is not a driver version like 535.261.03"),
            ));
        }
    }
    if !opts.lookup_only && fs::symlink_metadata(&opts.source).is_err() {
        return Err(Error::new(
            Failure::InvalidArgument,
            format!("--source {} does not exist", opts.source.display()),
        ));
    }
    Ok(())
}

/// The entry a build Job named (`--cache-entry`), for the plan's target:
/// on a hit the verified artifact is in place and the message returned.
fn restore_pinned(
    session: &mut crate::cache::Session,
    opts: &BuildOptions,
    driver_version: &str,
    status: &mut BuildStatus,
) -> Result<Option<String>> {
    let arch = match opts.arch {
        Some(a) => a,
        None => crate::node::running_arch()?,
    };
    let release = opts.kernel_release.as_str();
    let Some(dir) = session.pinned_entry().map(str::to_string) else {
        return Ok(None);
    };
    let target = crate::cache::CacheKey::new(arch, release, driver_version, opts.flavor, "");
    fs::create_dir_all(&opts.out_dir)
        .map_err(|e| Error::io(LOCAL_IO, "creating", &opts.out_dir, e))?;
    let artifact = opts.artifact_path(driver_version);
    let Some(entry) = session.lookup_entry(&dir, target, &artifact) else {
        return Ok(None);
    };
    status.arch = Some(arch);
    Ok(Some(restored(
        session,
        opts,
        driver_version,
        &entry,
        &artifact,
        status,
    )))
}

/// Looks the build up in the cache; on a hit the verified artifact is in
/// place, `status` describes it, and the message is returned.
fn restore_from_cache(
    session: &mut crate::cache::Session,
    opts: &BuildOptions,
    driver_version: &str,
    pre: &Preflight,
    status: &mut BuildStatus,
) -> Option<String> {
    let release = opts.kernel_release.as_str();
    let key = crate::cache::CacheKey::new(
        pre.target.arch,
        release,
        driver_version,
        opts.flavor,
        &pre.compiler.version,
    )
    .signed_by(pre.signing.as_ref().map(|s| &s.signer));
    let artifact = opts.artifact_path(driver_version);
    let entry = session.lookup(key, &artifact)?;
    Some(restored(
        session,
        opts,
        driver_version,
        &entry,
        &artifact,
        status,
    ))
}

/// `status` for the restored `entry` at `artifact`, and the message.
fn restored(
    session: &crate::cache::Session,
    opts: &BuildOptions,
    driver_version: &str,
    entry: &crate::cache::StoredEntry,
    artifact: &Path,
    status: &mut BuildStatus,
) -> String {
    let release = opts.kernel_release.as_str();
    status.driver_version = Some(driver_version.to_string());
    status.artifact = Some(artifact.display().to_string());
    status.artifact_sha256 = Some(entry.artifact_sha256.clone());
    status.signer = entry.manifest.signer.clone();
    status.firmware = entry
        .manifest
        .firmware
        .iter()
        .map(|f| f.file.clone())
        .collect();
    status.modules = entry
        .manifest
        .modules
        .iter()
        .map(|m| BuiltModule {
            name: m.name.clone(),
            file: m.file.clone(),
            vermagic: m.vermagic.clone(),
            size_bytes: m.size_bytes,
            sha256: m.sha256.clone(),
        })
        .collect();
    format!(
        "restored {} modules of NVIDIA {driver_version} ({}) for kernel {release} from the cache {} ({} bytes, every sha256 verified; built by {} at {}) into {}; nothing compiled",
        status.modules.len(),
        opts.flavor,
        session.status.url.as_deref().unwrap_or("?"),
        session.status.bytes_downloaded,
        entry.stored_by,
        entry.stored_at,
        artifact.display()
    )
}

/// The release ends up in file names and make arguments: refuse anything
/// that is not a plain release string.
fn check_release_name(release: &str) -> Result<()> {
    let ok = !release.is_empty()
        && release.len() <= 128
        && release
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+' | '~'));
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            Failure::InvalidArgument,
            format!("kernel release {release:?} is not a release like 6.1.0-50-cloud-amd64"),
        ))
    }
}
