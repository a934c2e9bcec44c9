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
//! External programs are run with [`Command`] and argument vectors, never
//! through a shell; running them and parsing their output are separate
//! functions so that the parsers are tested on captured outputs.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::host::{HostRoot, ModuleFlavor};
use crate::modinfo;
use crate::report::{Document, Kind, Outcome, Reason, ResultDocument};

/// Free space the work directory needs. A compile of the open 535/550 trees
/// peaks at about 950 MB (unstripped `nvidia.ko` alone is 184 MB, plus the
/// objects and the extracted sources); twice that leaves room for larger
/// future branches and for the packaging step.
pub const MIN_FREE_DISK_BYTES: u64 = 2 << 30;

/// Lines of the compile log quoted in `status.logExcerpt`: enough for the
/// first error with its context, small enough for a result document.
pub const EXCERPT_LINES: usize = 40;

/// Compiler errors quoted in `status.message`.
const MESSAGE_ERRORS: usize = 3;

/// A log line longer than this is cut in the excerpt (compiler command lines
/// run to several KiB).
const EXCERPT_LINE_CHARS: usize = 400;

/// The modules NVIDIA's Makefile builds (`NV_KERNEL_MODULES`); `nvidia` is
/// the one without which nothing works.
pub const KNOWN_MODULES: &[&str] = &[
    "nvidia",
    "nvidia-uvm",
    "nvidia-modeset",
    "nvidia-drm",
    "nvidia-peermem",
    "nvidia-vgpu-vfio",
];

/// Compiler messages that mean the driver source and the kernel disagree on
/// an interface: a function's signature, a struct's members, a symbol that
/// was removed or renamed. Any of them in the errors makes the failure
/// [`Reason::KernelApiMismatch`], so that the driver/kernel pair can be
/// recognised from the result alone.
pub const KERNEL_API_PATTERNS: &[&str] = &[
    "too few arguments to function",
    "too many arguments to function",
    "implicit declaration of function",
    "has no member named",
    "incompatible pointer type",
    "undeclared",
    "conflicting types",
    "unknown type name",
    // modpost: the module uses a symbol the kernel no longer exports.
    "undefined!",
];

// ------------------------------------------------------------ the document

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildSpec {
    /// The package: a `.run`, a module-source tarball or a directory.
    pub source: String,
    pub kernel_release: String,
    /// `--headers` as given; absent when they were looked up on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<String>,
    pub flavor: ModuleFlavor,
    pub out_dir: String,
    pub work_dir: String,
    pub jobs: usize,
    /// `--driver-version` as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    pub host_root: String,
}

/// The kernel headers used: the release-specific (arch) directory and the
/// common tree it builds on (the same directory for a full tree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeadersUsed {
    /// Passed to make as `SYSOUT`.
    pub arch_dir: String,
    /// Passed to make as `SYSSRC`.
    pub common_dir: String,
    /// `UTS_RELEASE` (or `kernel.release`) of the headers.
    pub release: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompilerUsed {
    /// The command passed to make as `CC`.
    pub command: String,
    /// The first line of `<command> --version`.
    pub version: String,
    /// The kernel's `CONFIG_CC_VERSION_TEXT`, when the headers carry it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_version_text: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuiltModule {
    /// The module name as the kernel knows it (`nvidia_uvm`).
    pub name: String,
    /// The file in the artifact (`modules/nvidia-uvm.ko`).
    pub file: String,
    pub vermagic: String,
    /// Size after stripping debug info.
    pub size_bytes: u64,
    pub sha256: String,
}

/// Wall-clock seconds of each step that ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extract_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package_seconds: Option<f64>,
    /// Time spent with the artifact cache: lookup, waiting for another
    /// builder, download and verification, upload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatus {
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<HeadersUsed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compiler: Option<CompilerUsed>,
    /// The packaged `.tar.zst` (modules, firmware, manifest.json).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<BuiltModule>,
    /// GSP firmware files packaged (`firmware/gsp_*.bin`); empty when the
    /// source has none (Debian's module-source tarballs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub firmware: Vec<String>,
    /// NVIDIA's user space packaged from the `.run`'s `.manifest`
    /// (`usr/bin/nvidia-smi`, `usr/lib/<triplet>/libcuda.so.*`, …); empty
    /// when the source has none (Debian's module-source tarballs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_space: Vec<String>,
    /// The full compile log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// On a failed compile: the log around the first errors (at most 40
    /// lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_excerpt: Option<String>,
    pub timings: Timings,
    /// What the artifact cache did (`--cache-url`); `Disabled` without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::CacheStatus>,
}

pub type BuildResult = Document<BuildSpec, BuildStatus>;

impl ResultDocument for BuildResult {
    fn outcome(&self) -> &Outcome {
        &self.status.outcome
    }
}

impl BuildStatus {
    fn new(outcome: Outcome) -> Self {
        BuildStatus {
            outcome,
            driver_version: None,
            headers: None,
            compiler: None,
            artifact: None,
            artifact_sha256: None,
            modules: Vec::new(),
            firmware: Vec::new(),
            user_space: Vec::new(),
            log: None,
            log_excerpt: None,
            timings: Timings::default(),
            cache: None,
        }
    }
}

/// What `build` is asked to do.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub source: PathBuf,
    pub kernel_release: String,
    /// `--headers`: the release's headers directory in our own filesystem.
    pub headers: Option<PathBuf>,
    /// Where installed headers are looked up when `headers` is not given.
    pub root: HostRoot,
    pub flavor: ModuleFlavor,
    pub out_dir: PathBuf,
    /// Default: `<out>/work-<flavor>-<release>`.
    pub work_dir: Option<PathBuf>,
    /// Keep the extracted and compiled tree (for debugging); the log is
    /// always kept.
    pub keep_work: bool,
    pub jobs: usize,
    pub driver_version: Option<String>,
    /// The artifact cache (`--cache-url`), already checked.
    pub cache: Option<crate::cache::CacheConfig>,
}

impl BuildOptions {
    pub fn work_dir(&self) -> PathBuf {
        self.work_dir.clone().unwrap_or_else(|| {
            self.out_dir
                .join(format!("work-{}-{}", self.flavor, self.kernel_release))
        })
    }

    pub fn spec(&self) -> BuildSpec {
        BuildSpec {
            source: self.source.display().to_string(),
            kernel_release: self.kernel_release.clone(),
            headers: self.headers.as_ref().map(|p| p.display().to_string()),
            flavor: self.flavor,
            out_dir: self.out_dir.display().to_string(),
            work_dir: self.work_dir().display().to_string(),
            jobs: self.jobs,
            driver_version: self.driver_version.clone(),
            host_root: self.root.path().display().to_string(),
        }
    }
}

/// A build that could not start (bad arguments, unreadable kernel release).
pub fn build_failed(spec: BuildSpec, outcome: Outcome) -> BuildResult {
    Document::new(Kind::BuildResult, spec, BuildStatus::new(outcome))
}

/// The whole `build` step, as a result document.
pub fn build(opts: &BuildOptions) -> BuildResult {
    let mut status = BuildStatus::new(Outcome::new(Reason::Internal, "build did not finish"));
    let mut session = opts.cache.as_ref().map(crate::cache::Session::start);
    status.outcome = match run(opts, &mut status, session.as_mut()) {
        Ok(message) => Outcome::new(Reason::Built, message),
        Err(e) => Outcome::from_error(&e),
    };
    status.cache = Some(match session {
        Some(s) => {
            if s.seconds > 0.0 {
                status.timings.cache_seconds = Some(seconds(Duration::from_secs_f64(s.seconds)));
            }
            let c = s.finish();
            if !c.warnings.is_empty() && status.outcome.reason == Reason::Built {
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
    Document::new(Kind::BuildResult, opts.spec(), status)
}

/// Failures of our own filesystem (work and output directories): not the
/// package's, the headers' or the compiler's fault, so the closed list has
/// nothing closer than Internal.
const LOCAL_IO: Reason = Reason::Internal;

fn run(
    opts: &BuildOptions,
    status: &mut BuildStatus,
    mut cache: Option<&mut crate::cache::Session>,
) -> Result<String> {
    let release = opts.kernel_release.as_str();
    check_release_name(release)?;
    if let Some(v) = &opts.driver_version {
        if !crate::host::is_driver_version(v) {
            return Err(Error::new(
                Reason::InvalidArgument,
                format!("--driver-version {v:?} is not a driver version like 535.261.03"),
            ));
        }
    }
    if fs::symlink_metadata(&opts.source).is_err() {
        return Err(Error::new(
            Reason::InvalidArgument,
            format!("--source {} does not exist", opts.source.display()),
        ));
    }

    // ---- preflight: cheap checks first, so that a doomed build fails in
    // milliseconds rather than after minutes of extraction.
    check_proc(Path::new("/proc"))?;
    let arch_dir = locate_headers(opts.headers.as_deref(), &opts.root, release)?;
    let headers = inspect_headers(&arch_dir, &opts.root, release)?;
    status.headers = Some(HeadersUsed {
        arch_dir: headers.arch_dir.display().to_string(),
        common_dir: headers.common_dir.display().to_string(),
        release: headers.release.clone(),
    });
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let cc = check_tools(headers.cc_version_text.as_deref(), &path_var)?;
    let compiler = check_compiler(&cc, headers.cc_version_text.as_deref())?;
    status.compiler = Some(compiler.clone());
    let work = opts.work_dir();
    fs::create_dir_all(&work).map_err(|e| Error::io(LOCAL_IO, "creating", &work, e))?;
    fs::create_dir_all(&opts.out_dir)
        .map_err(|e| Error::io(LOCAL_IO, "creating", &opts.out_dir, e))?;

    // ---- cache: with the driver version known up front (`run` knows it
    // from the plan), a hit skips extraction and compile alike.
    if let (Some(session), Some(dv)) = (cache.as_deref_mut(), &opts.driver_version) {
        if let Some(msg) = restore_from_cache(session, opts, dv, &compiler, status) {
            return Ok(msg);
        }
    }
    check_disk(&work, MIN_FREE_DISK_BYTES)?;

    // ---- extract
    let t = Instant::now();
    let extracted = work.join("source");
    let staging = work.join("staging");
    remove_dir_if_present(&extracted)?;
    remove_dir_if_present(&staging)?;
    let cleanup = Cleanup {
        dirs: if opts.keep_work {
            Vec::new()
        } else {
            vec![extracted.clone(), staging.clone()]
        },
    };
    crate::extract::extract_package(&opts.source, &extracted)?;
    let tree = crate::extract::module_source_dir(&extracted, opts.flavor)?;
    let driver_version = driver_version_of(&tree, opts.driver_version.as_deref())?;
    status.driver_version = Some(driver_version.clone());
    let firmware = find_firmware(&extracted)?;
    let user_space = crate::userspace::collect(&extracted)?;
    status.timings.extract_seconds = Some(seconds(t.elapsed()));
    if let Some(session) = cache.as_deref_mut() {
        if !session.looked_up() {
            if let Some(msg) = restore_from_cache(session, opts, &driver_version, &compiler, status)
            {
                return Ok(msg);
            }
        }
    }

    // ---- compile
    let t = Instant::now();
    let log = work.join("build.log");
    status.log = Some(log.display().to_string());
    let args = make_args(&tree, opts.jobs, release, &headers, &cc);
    let exit = run_logged("make", &args, &log)?;
    status.timings.compile_seconds = Some(seconds(t.elapsed()));
    if !exit.success() {
        let text = read_log(&log)?;
        let failure = classify_log(&text, &tree);
        status.log_excerpt = Some(failure.excerpt.clone());
        return Err(Error::new(
            failure.reason,
            failure_message(&failure, &exit, &driver_version, opts.flavor, release, &log),
        ));
    }

    // ---- package
    let t = Instant::now();
    let built = collect_modules(&tree)?;
    fs::create_dir_all(staging.join("modules"))
        .map_err(|e| Error::io(LOCAL_IO, "creating", &staging, e))?;
    let mut modules = Vec::new();
    for ko in &built {
        modules.push(stage_module(ko, &staging.join("modules"), release)?);
    }
    let artifact = opts
        .out_dir
        .join(artifact_name(&driver_version, opts.flavor, release));
    let manifest = Manifest {
        schema_version: MANIFEST_VERSION,
        generator: format!("gpu-driver-installer {}", env!("CARGO_PKG_VERSION")),
        driver_version: driver_version.clone(),
        flavor: opts.flavor,
        kernel_release: release.to_string(),
        compiler: compiler.version.clone(),
        kernel_compiler: compiler.kernel_version_text.clone(),
        built_at: rfc3339_utc(SystemTime::now()),
        modules: modules.iter().map(|s| s.manifest.clone()).collect(),
        firmware: Vec::new(),
        firmware_note: None,
        user_space: Vec::new(),
        links: Vec::new(),
    };
    let (artifact_sha256, manifest) = write_artifact(
        &artifact,
        manifest,
        &modules,
        &firmware,
        user_space.as_ref(),
        &staging,
    )?;
    status.timings.package_seconds = Some(seconds(t.elapsed()));
    status.firmware = manifest.firmware.iter().map(|f| f.file.clone()).collect();
    status.user_space = manifest
        .user_space
        .iter()
        .map(|f| f.file.clone())
        .chain(manifest.links.iter().map(|l| l.file.clone()))
        .collect();
    status.modules = modules.into_iter().map(|s| s.module).collect();
    status.artifact = Some(artifact.display().to_string());
    if let Some(session) = cache {
        session.publish(&artifact, &artifact_sha256, &manifest);
    }
    status.artifact_sha256 = Some(artifact_sha256);
    drop(cleanup);
    Ok(format!(
        "built {} modules of NVIDIA {driver_version} ({}) for kernel {release} into {}",
        status.modules.len(),
        opts.flavor,
        artifact.display()
    ))
}

/// The name of the artifact of a build.
fn artifact_name(driver_version: &str, flavor: ModuleFlavor, release: &str) -> String {
    format!("nvidia-{driver_version}-{flavor}-{release}.tar.zst")
}

/// Looks the build up in the cache; on a hit the verified artifact is in
/// place, `status` describes it, and the message is returned.
fn restore_from_cache(
    session: &mut crate::cache::Session,
    opts: &BuildOptions,
    driver_version: &str,
    compiler: &CompilerUsed,
    status: &mut BuildStatus,
) -> Option<String> {
    let release = opts.kernel_release.as_str();
    let key = crate::cache::CacheKey::new(release, driver_version, opts.flavor, &compiler.version);
    let artifact = opts
        .out_dir
        .join(artifact_name(driver_version, opts.flavor, release));
    let entry = session.lookup(key, &artifact)?;
    status.driver_version = Some(driver_version.to_string());
    status.artifact = Some(artifact.display().to_string());
    status.artifact_sha256 = Some(entry.artifact_sha256.clone());
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
    Some(format!(
        "restored {} modules of NVIDIA {driver_version} ({}) for kernel {release} from the cache {} ({} bytes, every sha256 verified; built by {} at {}) into {}; nothing compiled",
        status.modules.len(),
        opts.flavor,
        session.status.url.as_deref().unwrap_or("?"),
        session.status.bytes_downloaded,
        entry.stored_by,
        entry.stored_at,
        artifact.display()
    ))
}

/// Removes the extracted tree and staging area when the build ends, however
/// it ends: they take up to a GiB. The log stays.
struct Cleanup {
    dirs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for d in &self.dirs {
            if let Err(e) = fs::remove_dir_all(d) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("removing {}: {e}", d.display());
                }
            }
        }
    }
}

fn remove_dir_if_present(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(LOCAL_IO, "removing the earlier run's", dir, e)),
    }
}

fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
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
            Reason::InvalidArgument,
            format!("kernel release {release:?} is not a release like 6.1.0-50-cloud-amd64"),
        ))
    }
}

// ------------------------------------------------------------ preflight

/// NVIDIA's `conftest.sh` reads `/proc`; without it every conftest "fails"
/// and the build breaks later with misleading errors (missing `stdarg.h`).
pub fn check_proc(proc_dir: &Path) -> Result<()> {
    let exe = proc_dir.join("self/exe");
    if fs::symlink_metadata(&exe).is_ok() {
        return Ok(());
    }
    Err(Error::new(
        Reason::ProcNotMounted,
        format!(
            "{} does not exist: /proc is not mounted in the build environment, and NVIDIA's conftest.sh silently misdetects the kernel without it",
            exe.display()
        ),
    )
    .with_hint("mount it (mount -t proc proc /proc; for a chroot: mount -t proc proc <root>/proc) and run again"))
}

/// The headers directory for `release`: `--headers` when given, else the
/// installed headers under the host root (`/usr/src/linux-headers-<rel>`,
/// `/lib/modules/<rel>/build`).
pub fn locate_headers(given: Option<&Path>, root: &HostRoot, release: &str) -> Result<PathBuf> {
    let hint = format!(
        "install linux-headers-{release} (apt-get install linux-headers-{release}) or pass --headers DIR"
    );
    if let Some(dir) = given {
        return if dir.is_dir() {
            Ok(dir.to_path_buf())
        } else {
            Err(Error::new(
                Reason::KernelHeadersNotFound,
                format!("--headers {} is not a directory", dir.display()),
            )
            .with_hint(hint))
        };
    }
    crate::resolve::installed_headers(root, release).ok_or_else(|| {
        Error::new(
            Reason::KernelHeadersNotFound,
            format!(
                "no kernel headers for {release} under {}: neither /usr/src/linux-headers-{release} nor /lib/modules/{release}/build holds a Makefile",
                root.path().display()
            ),
        )
        .with_hint(hint)
    })
}

/// What the build needs to know about the headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelHeaders {
    pub arch_dir: PathBuf,
    pub common_dir: PathBuf,
    pub release: String,
    pub cc_version_text: Option<String>,
}

/// Checks that `arch_dir` holds complete headers for `release` and finds the
/// common tree they build on.
pub fn inspect_headers(arch_dir: &Path, root: &HostRoot, release: &str) -> Result<KernelHeaders> {
    let incomplete = |what: String| {
        Error::new(
            Reason::KernelHeadersMismatch,
            format!(
                "kernel headers at {} are incomplete: {what}",
                arch_dir.display()
            ),
        )
        .with_hint(format!(
            "reinstall linux-headers-{release} or pass --headers with a complete tree"
        ))
    };
    if !arch_dir.join("Makefile").is_file() {
        return Err(incomplete("no Makefile".into()));
    }
    let found = headers_release(arch_dir)?.ok_or_else(|| {
        incomplete("neither include/generated/utsrelease.h nor include/config/kernel.release names a release".into())
    })?;
    if found != release {
        return Err(Error::new(
            Reason::KernelHeadersMismatch,
            format!(
                "kernel headers at {} are for {found}, not for {release}",
                arch_dir.display()
            ),
        )
        .with_hint(format!(
            "install linux-headers-{release} or pass --headers with the headers of {release}"
        )));
    }
    let common_dir = find_common_dir(arch_dir, root, release).ok_or_else(|| {
        incomplete(
            "the common part they build on (include/linux) was not found: not where the Makefile includes it from, not at its source link, not in the same directory".into(),
        )
    })?;
    Ok(KernelHeaders {
        arch_dir: arch_dir.to_path_buf(),
        common_dir,
        release: found,
        cc_version_text: read_cc_version_text(arch_dir)?,
    })
}

/// The release the headers were made for. `UTS_RELEASE` is what ends up in
/// every module's vermagic, so it decides; `include/config/kernel.release`
/// only counts when there is no `utsrelease.h`, because Debian bookworm's
/// holds the upstream version (`6.1.176`) instead of the release.
fn headers_release(arch_dir: &Path) -> Result<Option<String>> {
    let uts = arch_dir.join("include/generated/utsrelease.h");
    if let Some(text) = read_text_optional(&uts)? {
        if let Some(r) = parse_uts_release(&text) {
            return Ok(Some(r));
        }
    }
    let rel = arch_dir.join("include/config/kernel.release");
    Ok(read_text_optional(&rel)?
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty()))
}

fn read_text_optional(path: &Path) -> Result<Option<String>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(Reason::KernelHeadersMismatch, "reading", path, e)),
    }
}

/// `#define UTS_RELEASE "6.1.0-50-cloud-amd64"` → the release.
pub fn parse_uts_release(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("#define")?.trim_start();
        let value = rest.strip_prefix("UTS_RELEASE")?.trim();
        let v = value.strip_prefix('"')?.strip_suffix('"')?;
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// A string option from `include/config/auto.conf` or `.config`:
/// `KEY=value` or `KEY="value"` (with `\"` and `\\` escapes).
pub fn parse_kconfig_string(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let value = l.strip_prefix(key)?.strip_prefix('=')?.trim();
        let v = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            Some(quoted) => {
                let mut out = String::new();
                let mut chars = quoted.chars();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => out.extend(chars.next()),
                        c => out.push(c),
                    }
                }
                out
            }
            None => value.to_string(),
        };
        (!v.is_empty()).then_some(v)
    })
}

fn read_cc_version_text(arch_dir: &Path) -> Result<Option<String>> {
    for f in ["include/config/auto.conf", ".config"] {
        if let Some(text) = read_text_optional(&arch_dir.join(f))? {
            if let Some(v) = parse_kconfig_string(&text, "CONFIG_CC_VERSION_TEXT") {
                return Ok(Some(v));
            }
        }
    }
    Ok(None)
}

/// `include /usr/src/linux-headers-6.1.0-50-common/Makefile` (Debian's
/// one-line arch Makefile) → the included path.
pub fn parse_makefile_include(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("include")?;
        if !rest.starts_with([' ', '\t']) {
            return None;
        }
        let path = rest.trim();
        (!path.is_empty() && !path.contains("$(")).then(|| path.to_string())
    })
}

/// The common tree (`SYSSRC`) of Debian-style split headers: the arch
/// directory holds the configuration and generated files, the common one
/// `include/linux` and the Makefile. Tried in order:
///
/// 1. the directory the arch Makefile includes, as written, inside the host
///    root, and as a sibling of the arch directory (an absolute host path
///    seen from a container that mounts the host elsewhere);
/// 2. the arch directory's `source` link (kbuild's `O=` trees);
/// 3. `/lib/modules/<rel>/source` in the host root;
/// 4. the arch directory itself (a full, unsplit tree).
pub fn find_common_dir(arch_dir: &Path, root: &HostRoot, release: &str) -> Option<PathBuf> {
    let is_common = |p: &Path| p.join("Makefile").is_file() && p.join("include/linux").is_dir();
    let mut candidates = Vec::new();
    let makefile = fs::read_to_string(arch_dir.join("Makefile")).unwrap_or_default();
    if let Some(inc) = parse_makefile_include(&makefile) {
        let inc = PathBuf::from(inc);
        if let Some(dir) = inc.parent() {
            if dir.is_absolute() {
                candidates.push(dir.to_path_buf());
                candidates.extend(root.resolve(dir));
            } else {
                candidates.push(arch_dir.join(dir));
            }
            if let (Some(name), Some(parent)) = (dir.file_name(), arch_dir.parent()) {
                candidates.push(parent.join(name));
            }
        }
    }
    if let Ok(target) = fs::read_link(arch_dir.join("source")) {
        if target.is_absolute() {
            candidates.push(target.clone());
            candidates.extend(root.resolve(&target));
        } else {
            candidates.push(arch_dir.join(target));
        }
    }
    candidates.extend(root.resolve(format!("/lib/modules/{release}/source")));
    candidates.push(arch_dir.to_path_buf());
    candidates.into_iter().find(|c| is_common(c))
}

/// An executable `name` on `path_var` (or `name` itself if it has a `/`).
pub fn find_in_path(name: &str, path_var: &OsStr) -> Option<PathBuf> {
    let executable = |p: &Path| {
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return executable(&p).then_some(p);
    }
    std::env::split_paths(path_var)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

/// The compiler the build uses: the one named in the kernel's
/// `CONFIG_CC_VERSION_TEXT` (`gcc-12`, `x86_64-linux-gnu-gcc-14`) when it is
/// installed, as NVIDIA's Makefile itself prefers, else `gcc`. It is passed
/// to make as `CC`, so that what was checked is what compiles.
pub fn choose_compiler(cc_version_text: Option<&str>, path_var: &OsStr) -> Option<String> {
    let named = cc_version_text
        .and_then(|t| t.split_whitespace().next())
        .filter(|c| {
            c.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.' | '+'))
        });
    if let Some(c) = named {
        if find_in_path(c, path_var).is_some() {
            return Some(c.to_string());
        }
    }
    find_in_path("gcc", path_var).map(|_| "gcc".to_string())
}

/// make, the linker, strip and a C compiler must be on PATH; returns the
/// compiler command.
pub fn check_tools(cc_version_text: Option<&str>, path_var: &OsStr) -> Result<String> {
    let mut missing: Vec<&str> = ["make", "ld", "strip"]
        .into_iter()
        .filter(|t| find_in_path(t, path_var).is_none())
        .collect();
    let cc = choose_compiler(cc_version_text, path_var);
    if cc.is_none() {
        missing.insert(0, "gcc");
    }
    match (cc, missing.is_empty()) {
        (Some(cc), true) => Ok(cc),
        _ => {
            let kernel_cc = cc_version_text
                .map(|t| format!(" (the kernel was built with {t})"))
                .unwrap_or_default();
            Err(Error::new(
                Reason::CompilerMissing,
                format!(
                    "{} not found on PATH ({}){kernel_cc}",
                    missing.join(", "),
                    path_var.to_string_lossy()
                ),
            )
            .with_hint(
                "install the kernel's compiler and build tools (Debian, Garden Linux: apt-get install gcc make binutils)",
            ))
        }
    }
}

/// Runs `<cc> --version` and returns its first line.
pub fn run_compiler_version(cc: &str) -> Result<String> {
    let out = Command::new(cc)
        .arg("--version")
        .envs(C_LOCALE.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            Error::new(
                Reason::CompilerMissing,
                format!("running {cc} --version: {e}"),
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    match (out.status.success(), parse_version_first_line(&text)) {
        (true, Some(v)) => Ok(v),
        _ => Err(Error::new(
            Reason::CompilerMissing,
            format!(
                "{cc} --version failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        )),
    }
}

/// The first non-empty line of `--version` output.
pub fn parse_version_first_line(output: &str) -> Option<String> {
    output
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

/// How a compiler compares with the kernel's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompilerMatch {
    /// The same text after the program name.
    Same,
    /// The same version number, another vendor revision (e.g. a Debian
    /// point release of gcc-12 12.2.0): compatible, logged as a warning.
    SameVersion,
    Different,
}

/// Compares `<cc> --version`'s first line with `CONFIG_CC_VERSION_TEXT`.
/// The program name is ignored (`gcc` vs `gcc-12` vs
/// `x86_64-linux-gnu-gcc-14` name the same compiler); the version number
/// (the last word, `12.2.0`) decides.
pub fn compare_compilers(ours: &str, kernel: &str) -> CompilerMatch {
    let rest = |s: &str| {
        let s = s.trim();
        s.split_once(char::is_whitespace)
            .map_or("", |(_, r)| r)
            .trim()
            .to_string()
    };
    if rest(ours) == rest(kernel) {
        return CompilerMatch::Same;
    }
    match (version_number(ours), version_number(kernel)) {
        (Some(a), Some(b)) if a == b => CompilerMatch::SameVersion,
        _ => CompilerMatch::Different,
    }
}

/// The last word that looks like a version (`12.2.0`, `14.2.0`).
pub fn version_number(text: &str) -> Option<&str> {
    text.split_whitespace().rev().find(|w| {
        w.contains('.')
            && w.chars().next().is_some_and(|c| c.is_ascii_digit())
            && w.chars().all(|c| c.is_ascii_digit() || c == '.')
    })
}

/// The compiler the kernel was built with must be the one we use, where the
/// headers say which it was.
pub fn check_compiler(cc: &str, kernel_text: Option<&str>) -> Result<CompilerUsed> {
    let version = run_compiler_version(cc)?;
    if let Some(k) = kernel_text {
        match compare_compilers(&version, k) {
            CompilerMatch::Same => {}
            CompilerMatch::SameVersion => tracing::warn!(
                "compiler {version:?} differs from the kernel's {k:?} in packaging only; building anyway"
            ),
            CompilerMatch::Different => {
                return Err(Error::new(
                    Reason::CompilerMismatch,
                    format!(
                        "the compiler is {version:?} but the kernel was built with {k:?} (CONFIG_CC_VERSION_TEXT)"
                    ),
                )
                .with_hint(
                    "build in an image with the kernel's compiler (e.g. the builder image of the node's OS release)",
                ));
            }
        }
    }
    Ok(CompilerUsed {
        command: cc.to_string(),
        version,
        kernel_version_text: kernel_text.map(str::to_string),
    })
}

/// Free bytes for an unprivileged writer in `dir` must reach `needed`.
pub fn check_disk(dir: &Path, needed: u64) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir)
        .map_err(|e| Error::new(LOCAL_IO, format!("statvfs {}: {e}", dir.display())))?;
    let free = st.blocks_available().saturating_mul(st.fragment_size());
    if free < needed {
        return Err(Error::new(
            Reason::InsufficientDisk,
            format!(
                "{} has {} MiB free; a build needs {} MiB",
                dir.display(),
                free >> 20,
                needed >> 20
            ),
        )
        .with_hint("free space there or pass --work-dir on a larger filesystem"));
    }
    Ok(free)
}

// ------------------------------------------------------------ source tree

/// The driver version the tree declares: `NV_VERSION_STRING` in its Kbuild
/// (both the `.run`'s and Debian's trees), else `NVIDIA_VERSION` in a
/// `version.mk` beside or above it. `--driver-version` must agree with it;
/// without a declared version, the flag is required.
pub fn driver_version_of(tree: &Path, flag: Option<&str>) -> Result<String> {
    let mut declared = None;
    for f in ["Kbuild", "Makefile"] {
        if let Some(text) = read_text_optional(&tree.join(f)).ok().flatten() {
            declared = parse_nv_version_string(&text);
            if declared.is_some() {
                break;
            }
        }
    }
    if declared.is_none() {
        for dir in tree.ancestors().take(3) {
            if let Some(text) = read_text_optional(&dir.join("version.mk")).ok().flatten() {
                declared = parse_version_mk(&text);
                if declared.is_some() {
                    break;
                }
            }
        }
    }
    match (declared, flag) {
        (Some(d), Some(f)) if d != f => Err(Error::new(
            Reason::InvalidArgument,
            format!(
                "--driver-version {f} but the source {} is driver {d}",
                tree.display()
            ),
        )),
        (Some(d), _) => Ok(d),
        (None, Some(f)) => Ok(f.to_string()),
        (None, None) => Err(Error::new(
            Reason::InvalidArgument,
            format!(
                "the source {} declares no driver version (no NV_VERSION_STRING in its Kbuild, no version.mk)",
                tree.display()
            ),
        )
        .with_hint("pass --driver-version")),
    }
}

/// `ccflags-y += -DNV_VERSION_STRING=\"535.261.03\"` → `535.261.03`.
pub fn parse_nv_version_string(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (_, rest) = l.split_once("NV_VERSION_STRING=")?;
        let v: String = rest
            .trim_start_matches(['\\', '"'])
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        crate::host::is_driver_version(&v).then_some(v)
    })
}

/// `NVIDIA_VERSION = 535.261.03` → `535.261.03`.
pub fn parse_version_mk(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("NVIDIA_VERSION")?;
        let v = rest.trim_start().strip_prefix(['=', ':'])?;
        let v = v.trim_start_matches('=').trim();
        crate::host::is_driver_version(v).then(|| v.to_string())
    })
}

/// GSP firmware of a `.run` (`firmware/gsp_*.bin`, at the top or one
/// directory down); Debian's module-source tarballs have none.
pub fn find_firmware(extracted: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs = vec![extracted.join("firmware")];
    if let Ok(entries) = fs::read_dir(extracted) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path().join("firmware"));
            }
        }
    }
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let e = e.map_err(|e| Error::io(LOCAL_IO, "reading", &dir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("gsp_")
                && name.ends_with(".bin")
                && e.file_type().is_ok_and(|t| t.is_file())
            {
                out.push(e.path());
            }
        }
        if !out.is_empty() {
            break;
        }
    }
    out.sort();
    Ok(out)
}

// ------------------------------------------------------------ compile

/// NVIDIA's documented external-build interface: `SYSSRC` (common tree),
/// `SYSOUT` (the release's configured tree), `KERNEL_UNAME`; `CC` pins the
/// compiler that preflight checked.
pub fn make_args(
    tree: &Path,
    jobs: usize,
    release: &str,
    headers: &KernelHeaders,
    cc: &str,
) -> Vec<OsString> {
    let kv = |k: &str, v: &OsStr| {
        let mut s = OsString::from(k);
        s.push("=");
        s.push(v);
        s
    };
    vec![
        OsString::from(format!("-j{}", jobs.max(1))),
        OsString::from("-C"),
        tree.as_os_str().to_owned(),
        kv("KERNEL_UNAME", OsStr::new(release)),
        kv("SYSSRC", headers.common_dir.as_os_str()),
        kv("SYSOUT", headers.arch_dir.as_os_str()),
        kv("CC", OsStr::new(cc)),
        OsString::from("modules"),
    ]
}

/// The C locale for compilers and make: English messages with ASCII quotes,
/// which the classifier reads. `LC_ALL` alone is not enough: the kernel's
/// Makefile unexports it, so gcc would fall back to `LANG` (often
/// `C.UTF-8`, giving `‘’` quotes).
const C_LOCALE: &[(&str, &str)] = &[
    ("LC_ALL", "C"),
    ("LANG", "C"),
    ("LC_CTYPE", "C"),
    ("LC_MESSAGES", "C"),
];

/// Runs `program args`, its stdout and stderr interleaved (one pipe for
/// both, as a terminal would show them) into `log` and to tracing at debug
/// level, in the C locale.
pub fn run_logged(
    program: &str,
    args: &[OsString],
    log: &Path,
) -> Result<std::process::ExitStatus> {
    let mut file = File::create(log).map_err(|e| Error::io(LOCAL_IO, "creating", log, e))?;
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let header = format!("$ {program} {}\n", shown.join(" "));
    file.write_all(header.as_bytes())
        .map_err(|e| Error::io(LOCAL_IO, "writing", log, e))?;
    tracing::info!("running {}", header.trim_start_matches("$ ").trim_end());

    let (reader, writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::new(LOCAL_IO, format!("creating a pipe for {program}: {e}")))?;
    let writer2 = writer
        .try_clone()
        .map_err(|e| Error::new(LOCAL_IO, format!("duplicating a pipe for {program}: {e}")))?;
    let mut child = Command::new(program)
        .args(args)
        .envs(C_LOCALE.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(writer2))
        .spawn()
        .map_err(|e| Error::new(Reason::CompilerMissing, format!("running {program}: {e}")))?;
    // The Command held the only copies of the write end; with them dropped,
    // the reader sees EOF when the child (and its children) exit.
    let mut lines = BufReader::new(File::from(reader));
    let mut line = Vec::new();
    let mut write_err = None;
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                if write_err.is_none() {
                    if let Err(e) = file.write_all(&line) {
                        write_err = Some(e);
                    }
                }
                tracing::debug!(target: "make", "{}", String::from_utf8_lossy(&line).trim_end());
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                write_err.get_or_insert(e);
                break;
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| Error::new(LOCAL_IO, format!("waiting for {program}: {e}")))?;
    if let Some(e) = write_err {
        return Err(Error::io(LOCAL_IO, "writing", log, e));
    }
    file.sync_all()
        .map_err(|e| Error::io(LOCAL_IO, "writing", log, e))?;
    Ok(status)
}

/// The log, at most its last 64 MiB (the errors are near the end).
fn read_log(log: &Path) -> Result<String> {
    const MAX: u64 = 64 << 20;
    let mut f = File::open(log).map_err(|e| Error::io(LOCAL_IO, "opening", log, e))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(len - MAX))
            .map_err(|e| Error::io(LOCAL_IO, "reading", log, e))?;
    }
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)
        .map_err(|e| Error::io(LOCAL_IO, "reading", log, e))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// What a failed compile's log says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    /// The first error lines (compiler, modpost, linker; else make's own),
    /// with the module tree's path prefix removed.
    pub errors: Vec<String>,
    /// The log from just before the first error, at most [`EXCERPT_LINES`].
    pub excerpt: String,
}

fn is_error_line(l: &str) -> bool {
    l.contains(": error: ")
        || l.contains(": fatal error: ")
        || l.starts_with("error: ")
        || l.starts_with("ERROR: modpost:")
        || l.contains("undefined reference to")
}

/// Classifies a failed compile from its log. Any error typical of a kernel
/// interface change (see [`KERNEL_API_PATTERNS`]) makes it
/// [`Reason::KernelApiMismatch`]; everything else is
/// [`Reason::BuildFailed`]. Both quote the first errors.
pub fn classify_log(log: &str, tree: &Path) -> Failure {
    let lines: Vec<&str> = log.lines().collect();
    let mut first = None;
    let mut errors = Vec::new();
    let mut api = false;
    for (i, l) in lines.iter().enumerate() {
        if is_error_line(l) {
            first.get_or_insert(i);
            api |= KERNEL_API_PATTERNS.iter().any(|p| l.contains(p));
            errors.push(l.trim().to_string());
        }
    }
    if errors.is_empty() {
        // No compiler message: make's own (`*** No rule to make target`,
        // a conftest abort) is the best we have.
        for (i, l) in lines.iter().enumerate() {
            if l.contains("*** ") || l.starts_with("make: ") || l.contains("Error ") {
                first.get_or_insert(i);
                errors.push(l.trim().to_string());
            }
        }
    }
    // Without the module tree's prefix, and with ASCII quotes whatever the
    // locale was, so that messages compare across builders.
    let prefix = format!("{}/", tree.display());
    let errors: Vec<String> = errors
        .into_iter()
        .map(|e| e.replace(&prefix, "").replace(['‘', '’'], "'"))
        .collect();
    let start = match first {
        // Two lines of context ("In function ..."), then the error.
        Some(i) => i.saturating_sub(2),
        None => lines.len().saturating_sub(EXCERPT_LINES),
    };
    let excerpt = lines[start..]
        .iter()
        .take(EXCERPT_LINES)
        .map(|l| cut(l, EXCERPT_LINE_CHARS))
        .collect::<Vec<_>>()
        .join("\n");
    Failure {
        reason: if api {
            Reason::KernelApiMismatch
        } else {
            Reason::BuildFailed
        },
        errors,
        excerpt,
    }
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut n = max;
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    format!("{}…", &s[..n])
}

fn failure_message(
    f: &Failure,
    exit: &std::process::ExitStatus,
    driver: &str,
    flavor: ModuleFlavor,
    release: &str,
    log: &Path,
) -> String {
    let quoted = if f.errors.is_empty() {
        "no error message in the log".to_string()
    } else {
        let mut seen = Vec::new();
        for e in &f.errors {
            if !seen.contains(e) {
                seen.push(e.clone());
            }
            if seen.len() == MESSAGE_ERRORS {
                break;
            }
        }
        seen.join(" | ")
    };
    let what = match f.reason {
        Reason::KernelApiMismatch => format!(
            "NVIDIA {driver} ({flavor}) does not compile against kernel {release}: the kernel's API changed"
        ),
        _ => format!("NVIDIA {driver} ({flavor}) failed to compile for kernel {release}"),
    };
    let hint = match f.reason {
        Reason::KernelApiMismatch => {
            "use a driver branch that supports this kernel (or the other flavor)"
        }
        _ => "see the log",
    };
    format!(
        "{what} (make {exit}): {quoted}; {hint}; full log: {}",
        log.display()
    )
}

// ------------------------------------------------------------ modules

/// The `.ko` files the build produced, in [`KNOWN_MODULES`] order; `nvidia.ko`
/// must be among them.
pub fn collect_modules(tree: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = KNOWN_MODULES
        .iter()
        .map(|m| tree.join(format!("{m}.ko")))
        .filter(|p| p.is_file())
        .collect();
    // NVIDIA's trees keep nvidia.ko's sources in nvidia/: there it is
    // required. Other trees with NVIDIA's make interface (the VM test's
    // module) give whatever .ko files they built.
    let nvidia_tree = tree.join("nvidia").is_dir();
    if found.is_empty() && !nvidia_tree {
        let mut other: Vec<PathBuf> = fs::read_dir(tree)
            .map_err(|e| Error::io(LOCAL_IO, "reading", tree, e))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "ko"))
            .collect();
        other.sort();
        found = other;
    }
    if found.is_empty() || (nvidia_tree && !found.iter().any(|p| p.ends_with("nvidia.ko"))) {
        return Err(Error::new(
            Reason::BuildFailed,
            format!("make succeeded but {} holds no nvidia.ko", tree.display()),
        ));
    }
    Ok(found)
}

/// A module stripped into the staging area.
struct Staged {
    module: BuiltModule,
    manifest: ManifestModule,
    path: PathBuf,
}

/// Strips debug info into `dest_dir` (an unstripped `nvidia.ko` is 184 MB,
/// stripped 11 MB), reads its modinfo and checks the vermagic's release.
fn stage_module(ko: &Path, dest_dir: &Path, release: &str) -> Result<Staged> {
    let file_name = ko
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dest = dest_dir.join(&file_name);
    run_strip(ko, &dest)?;
    let info = modinfo::read_modinfo(&dest)
        .map_err(|e| Error::new(Reason::BuildFailed, format!("reading modinfo: {e}")))?;
    check_vermagic(&file_name, &info.vermagic, release)?;
    let (sha256, size_bytes) = sha256_file(&dest)?;
    let module = BuiltModule {
        name: info.name.clone(),
        file: format!("modules/{file_name}"),
        vermagic: info.vermagic.trim_end().to_string(),
        size_bytes,
        sha256,
    };
    let manifest = ManifestModule {
        name: module.name.clone(),
        file: module.file.clone(),
        vermagic: module.vermagic.clone(),
        depends: info.depends,
        version: info.version,
        size_bytes,
        sha256: module.sha256.clone(),
    };
    Ok(Staged {
        module,
        manifest,
        path: dest,
    })
}

/// `strip --strip-debug -o dest src`: the source tree stays as built.
pub fn run_strip(src: &Path, dest: &Path) -> Result<()> {
    let out = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(dest)
        .arg(src)
        .envs(C_LOCALE.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::new(Reason::CompilerMissing, format!("running strip: {e}")))?;
    if !out.status.success() {
        return Err(Error::new(
            Reason::BuildFailed,
            format!(
                "strip --strip-debug {} failed ({}): {}",
                src.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

/// A module loads only into the kernel its vermagic names.
pub fn check_vermagic(module: &str, vermagic: &str, release: &str) -> Result<()> {
    if vermagic.split_whitespace().next() == Some(release) {
        Ok(())
    } else {
        Err(Error::new(
            Reason::BuildFailed,
            format!(
                "{module} was built with vermagic {:?}, which is not for kernel {release}; the headers do not match the release",
                vermagic.trim_end()
            ),
        ))
    }
}

fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut f = File::open(path).map_err(|e| Error::io(LOCAL_IO, "opening", path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                size += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(LOCAL_IO, "reading", path, e)),
        }
    }
    Ok((hex::encode(hasher.finalize()), size))
}

// ------------------------------------------------------------ artifact

/// Bumped when the manifest's meaning changes.
/// 2: user space (`userSpace`, `links`) from a `.run`'s `.manifest`.
pub const MANIFEST_VERSION: u32 = 2;

/// `manifest.json` inside the artifact: what was built, for what, with what,
/// and the sha256 of every other file in the archive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    pub generator: String,
    pub driver_version: String,
    pub flavor: ModuleFlavor,
    pub kernel_release: String,
    /// `<cc> --version`, first line.
    pub compiler: String,
    /// The kernel's `CONFIG_CC_VERSION_TEXT`, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_compiler: Option<String>,
    /// RFC 3339, UTC.
    pub built_at: String,
    pub modules: Vec<ManifestModule>,
    pub firmware: Vec<ManifestFile>,
    /// Why `firmware` is empty, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware_note: Option<String>,
    /// NVIDIA's user space, at its place in a root filesystem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_space: Vec<ManifestUserFile>,
    /// SONAME and convenience links of the user space (not in the tar:
    /// install creates them, after checking each target is a plain name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<ManifestLink>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestUserFile {
    pub file: String,
    pub size_bytes: u64,
    pub sha256: String,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestLink {
    pub file: String,
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestModule {
    pub name: String,
    pub file: String,
    pub vermagic: String,
    pub depends: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub size_bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestFile {
    pub file: String,
    pub size_bytes: u64,
    pub sha256: String,
}

/// Writes `manifest.json`, `modules/*.ko` and `firmware/*` into a `.tar.zst`
/// under a temporary name beside `artifact`, then renames it into place, so
/// that a reader never sees half an artifact. Returns its sha256 and the
/// final manifest.
fn write_artifact(
    artifact: &Path,
    mut manifest: Manifest,
    modules: &[Staged],
    firmware: &[PathBuf],
    user_space: Option<&(PathBuf, Vec<crate::userspace::Placement>)>,
    staging: &Path,
) -> Result<(String, Manifest)> {
    let mut user_files: Vec<(String, PathBuf, u32)> = Vec::new();
    if let Some((base, placements)) = user_space {
        for p in placements {
            match p {
                crate::userspace::Placement::File { src, dest, mode } => {
                    let path = base.join(src);
                    let (sha256, size_bytes) = sha256_file(&path)?;
                    manifest.user_space.push(ManifestUserFile {
                        file: dest.clone(),
                        size_bytes,
                        sha256,
                        mode: *mode,
                    });
                    user_files.push((dest.clone(), path, *mode));
                }
                crate::userspace::Placement::Link { dest, target } => {
                    manifest.links.push(ManifestLink {
                        file: dest.clone(),
                        target: target.clone(),
                    })
                }
            }
        }
    }
    for fw in firmware {
        let (sha256, size_bytes) = sha256_file(fw)?;
        let name = fw
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        manifest.firmware.push(ManifestFile {
            file: format!("firmware/{name}"),
            size_bytes,
            sha256,
        });
    }
    if firmware.is_empty() {
        manifest.firmware_note = Some(
            "the source carries no GSP firmware (Debian's module-source packages ship it in firmware-nvidia-gsp); install it separately"
                .into(),
        );
    }
    let manifest_json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Error::new(Reason::Internal, format!("serializing the manifest: {e}")))?;
    let manifest_path = staging.join("manifest.json");
    fs::write(&manifest_path, &manifest_json)
        .map_err(|e| Error::io(LOCAL_IO, "writing", &manifest_path, e))?;

    let dir = artifact.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".artifact-")
        .suffix(".partial")
        .tempfile_in(dir)
        .map_err(|e| Error::io(LOCAL_IO, "creating a temporary file in", dir, e))?;
    let mtime = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    {
        let file = tmp
            .as_file()
            .try_clone()
            .map_err(|e| Error::io(LOCAL_IO, "opening", tmp.path(), e))?;
        let enc = zstd::stream::write::Encoder::new(std::io::BufWriter::new(file), 3)
            .map_err(|e| Error::io(LOCAL_IO, "compressing", tmp.path(), e))?;
        let mut tar = tar::Builder::new(enc);
        let mut entries: Vec<(String, PathBuf, u32)> =
            vec![("manifest.json".into(), manifest_path.clone(), 0o644)];
        for m in modules {
            entries.push((m.module.file.clone(), m.path.clone(), 0o644));
        }
        for (fw, entry) in firmware.iter().zip(&manifest.firmware) {
            entries.push((entry.file.clone(), fw.clone(), 0o644));
        }
        entries.extend(user_files);
        for (name, path, mode) in entries {
            append_file(&mut tar, &name, &path, mode, mtime)
                .map_err(|e| Error::io(LOCAL_IO, &format!("packaging {name} from"), &path, e))?;
        }
        let enc = tar
            .into_inner()
            .map_err(|e| Error::io(LOCAL_IO, "writing", tmp.path(), e))?;
        let mut buf = enc
            .finish()
            .map_err(|e| Error::io(LOCAL_IO, "writing", tmp.path(), e))?;
        buf.flush()
            .map_err(|e| Error::io(LOCAL_IO, "writing", tmp.path(), e))?;
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| Error::io(LOCAL_IO, "writing", tmp.path(), e))?;
    let (sha256, _) = sha256_file(tmp.path())?;
    let perms = fs::Permissions::from_mode(0o644);
    fs::set_permissions(tmp.path(), perms)
        .map_err(|e| Error::io(LOCAL_IO, "setting permissions of", tmp.path(), e))?;
    tmp.persist(artifact)
        .map_err(|e| Error::io(LOCAL_IO, "renaming into place", artifact, e.error))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok((sha256, manifest))
}

fn append_file<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    path: &Path,
    mode: u32,
    mtime: u64,
) -> std::io::Result<()> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut header = tar::Header::new_gnu();
    header.set_size(len);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(mtime);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, name, &mut f)
}

/// RFC 3339 in UTC with second precision (`2026-12-02T13:21:05Z`), from the
/// civil-from-days algorithm (H. Hinnant): no time crate needed.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
