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
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::artifact::{
    self, MANIFEST_VERSION, Manifest, ManifestFile, ManifestLink, ManifestModule, ManifestUserFile,
    PackFile,
};
use crate::error::{Error, Result};
use crate::headers::{KernelHeaders, inspect_headers, locate_headers};
use crate::host::{CpuArch, HostRoot, ModuleFlavor};
use crate::modinfo;
use crate::report::{Document, Kind, Outcome, Reason, StatusOutcome};

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
    /// `--arch` as given: the architecture to build for. Absent: the
    /// headers' (their `.config`), else the builder's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<CpuArch>,
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
    /// A cross build's `CROSS_COMPILE` (`aarch64-linux-gnu-`): the prefix
    /// of the compiler, linker and strip used. Absent for a native build.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cross_compile: Option<String>,
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
    /// The CPU architecture the modules are built for (known once the
    /// headers were read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<CpuArch>,
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

impl StatusOutcome for BuildStatus {
    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

impl BuildStatus {
    fn new(outcome: Outcome) -> Self {
        BuildStatus {
            outcome,
            driver_version: None,
            arch: None,
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
    /// `--arch`: the architecture to build for; `None` takes the headers'.
    pub arch: Option<CpuArch>,
    /// The artifact cache (`--cache-url`), already checked.
    pub cache: Option<crate::cache::CacheConfig>,
    /// `run --no-compile`: only the cache may supply the artifact; a build
    /// it does not supply fails (`ArtifactNotCached`) instead of compiling.
    pub no_compile: bool,
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
            arch: self.arch,
            host_root: self.root.path().display().to_string(),
        }
    }
}

/// A build that could not start (bad arguments, unreadable kernel release).
pub fn build_failed(spec: BuildSpec, outcome: Outcome) -> BuildResult {
    Document::new(Kind::BuildResult, spec, BuildStatus::new(outcome))
}

/// The whole `build` step, as a result document.
/// An empty `kernel_release` means the host's running kernel; the cache
/// configuration is checked first (a bad one is the caller's mistake).
pub fn build(opts: &BuildOptions) -> BuildResult {
    if let Some(Err(e)) = opts.cache.as_ref().map(crate::cache::CacheConfig::check) {
        return build_failed(opts.spec(), Outcome::from(&e));
    }
    if opts.kernel_release.is_empty() {
        return match crate::host::read_kernel_release(&opts.root) {
            // An empty answer would send this call back to itself.
            Ok(r) if r.is_empty() => build_failed(
                opts.spec(),
                Outcome::new(
                    Reason::HostReadFailed,
                    "the running kernel's release is empty",
                ),
            ),
            Ok(r) => build(&BuildOptions {
                kernel_release: r,
                ..opts.clone()
            }),
            Err(e) => build_failed(opts.spec(), Outcome::from(&e)),
        };
    }
    let mut status = BuildStatus::new(Outcome::new(Reason::Internal, "build did not finish"));
    let mut session = opts.cache.as_ref().map(crate::cache::Session::start);
    status.outcome = match run(opts, &mut status, session.as_mut()) {
        Ok(message) => Outcome::new(Reason::Built, message),
        Err(e) => Outcome::from(&e),
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
    check_arguments(opts)?;
    let _work_lock = claim_work_dir(&opts.work_dir())?;
    let pre = preflight(opts, status)?;
    // With the driver version known up front (`run` knows it from the
    // plan), a cache hit skips extraction and compile alike.
    if let (Some(session), Some(dv)) = (cache.as_deref_mut(), &opts.driver_version) {
        if let Some(msg) = restore_from_cache(session, opts, dv, &pre, status) {
            return Ok(msg);
        }
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
            Reason::ArtifactNotCached,
            "--no-compile without an artifact cache (--cache-url): nothing can supply the artifact",
        )
        .with_hint("pass --cache-url, or allow compiling on the node"),
    })
}

fn check_arguments(opts: &BuildOptions) -> Result<()> {
    check_release_name(&opts.kernel_release)?;
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
    Ok(())
}

/// What preflight established: the headers, the compiler, the work dir.
struct Preflight {
    headers: KernelHeaders,
    target: Target,
    cc: String,
    compiler: CompilerUsed,
    work: PathBuf,
}

/// Cheap checks first, so that a doomed build fails in milliseconds rather
/// than after minutes of extraction.
fn preflight(opts: &BuildOptions, status: &mut BuildStatus) -> Result<Preflight> {
    let release = opts.kernel_release.as_str();
    check_proc(Path::new("/proc"))?;
    let arch_dir = locate_headers(opts.headers.as_deref(), &opts.root, release)?;
    let headers = inspect_headers(&arch_dir, &opts.root, release)?;
    status.headers = Some(HeadersUsed {
        arch_dir: headers.arch_dir.display().to_string(),
        common_dir: headers.common_dir.display().to_string(),
        release: headers.release.clone(),
    });
    let target = Target::new(
        target_arch(opts.arch, &headers)?,
        crate::host::running_arch()?,
    );
    status.arch = Some(target.arch);
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let cc = check_tools(headers.cc_version_text.as_deref(), &target, &path_var)?;
    let mut compiler = check_compiler(&cc, headers.cc_version_text.as_deref())?;
    compiler.cross_compile = target.is_cross().then(|| target.cross_prefix.clone());
    status.compiler = Some(compiler.clone());
    let work = opts.work_dir();
    fs::create_dir_all(&work).map_err(|e| Error::io(LOCAL_IO, "creating", &work, e))?;
    fs::create_dir_all(&opts.out_dir)
        .map_err(|e| Error::io(LOCAL_IO, "creating", &opts.out_dir, e))?;
    Ok(Preflight {
        headers,
        target,
        cc,
        compiler,
        work,
    })
}

/// The unpacked package: its module tree, version, firmware and user space.
struct Source {
    tree: PathBuf,
    driver_version: String,
    firmware: Vec<PathBuf>,
    user_space: Option<(PathBuf, Vec<crate::userspace::Placement>)>,
    staging: PathBuf,
    cleanup: Cleanup,
}

fn extract_source(
    opts: &BuildOptions,
    work: &Path,
    arch: CpuArch,
    status: &mut BuildStatus,
) -> Result<Source> {
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
    let user_space = crate::userspace::collect(&extracted, arch)?;
    status.timings.extract_seconds = Some(seconds(t.elapsed()));
    Ok(Source {
        tree,
        driver_version,
        firmware,
        user_space,
        staging,
        cleanup,
    })
}

/// NVIDIA's Makefile, its output streamed to the log; a failure is
/// classified from the compiler's errors.
fn compile(
    opts: &BuildOptions,
    pre: &Preflight,
    src: &Source,
    status: &mut BuildStatus,
) -> Result<()> {
    let release = opts.kernel_release.as_str();
    let t = Instant::now();
    let log = pre.work.join("build.log");
    status.log = Some(log.display().to_string());
    let args = make_args(
        &src.tree,
        opts.jobs,
        release,
        &pre.headers,
        &pre.cc,
        &pre.target,
    );
    let exit = crate::process::run_logged("make", &args, &log, Reason::CompilerMissing)?;
    status.timings.compile_seconds = Some(seconds(t.elapsed()));
    if exit.success() {
        return Ok(());
    }
    let text = read_log(&log)?;
    let failure = classify_log(&text, &src.tree);
    status.log_excerpt = Some(failure.excerpt.clone());
    Err(Error::new(
        failure.reason,
        failure_message(
            &failure,
            &exit,
            &src.driver_version,
            opts.flavor,
            release,
            &log,
        ),
    ))
}

/// The stripped modules, GSP firmware and user space with their manifest,
/// into one artifact (see [`crate::artifact`]).
fn package(
    opts: &BuildOptions,
    pre: &Preflight,
    src: &Source,
    status: &mut BuildStatus,
) -> Result<(PathBuf, String, Manifest)> {
    let release = opts.kernel_release.as_str();
    let t = Instant::now();
    let built = collect_modules(&src.tree)?;
    let module_dir = src.staging.join("modules");
    fs::create_dir_all(&module_dir).map_err(|e| Error::io(LOCAL_IO, "creating", &module_dir, e))?;
    let mut modules = Vec::new();
    for ko in &built {
        modules.push(stage_module(ko, &module_dir, release, &pre.target)?);
    }
    let mut manifest = Manifest {
        schema_version: MANIFEST_VERSION,
        generator: format!("gpu-driver-installer {}", env!("CARGO_PKG_VERSION")),
        driver_version: src.driver_version.clone(),
        flavor: opts.flavor,
        kernel_release: release.to_string(),
        compiler: pre.compiler.version.clone(),
        kernel_compiler: pre.compiler.kernel_version_text.clone(),
        arch: Some(pre.target.arch),
        built_at: crate::text::rfc3339_utc(SystemTime::now()),
        modules: modules.iter().map(|s| s.manifest.clone()).collect(),
        firmware: Vec::new(),
        firmware_note: None,
        user_space: Vec::new(),
        links: Vec::new(),
    };
    let mut files: Vec<PackFile> = modules
        .iter()
        .map(|m| PackFile {
            name: m.module.file.clone(),
            path: m.path.clone(),
            mode: 0o644,
        })
        .collect();
    files.extend(add_firmware(&mut manifest, &src.firmware)?);
    files.extend(add_user_space(&mut manifest, src.user_space.as_ref())?);
    let artifact = opts.out_dir.join(artifact::file_name(
        &src.driver_version,
        opts.flavor,
        release,
    ));
    let sha256 = artifact::pack(&artifact, &manifest, &files)?;
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
    status.artifact_sha256 = Some(sha256.clone());
    Ok((artifact, sha256, manifest))
}

/// Lists the GSP firmware in the manifest (or why there is none).
fn add_firmware(manifest: &mut Manifest, firmware: &[PathBuf]) -> Result<Vec<PackFile>> {
    let mut files = Vec::new();
    for fw in firmware {
        let (sha256, size_bytes) = crate::files::sha256_file(fw, LOCAL_IO)?;
        let name = fw
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let file = format!("firmware/{name}");
        manifest.firmware.push(ManifestFile {
            file: file.clone(),
            size_bytes,
            sha256,
        });
        files.push(PackFile {
            name: file,
            path: fw.clone(),
            mode: 0o644,
        });
    }
    if firmware.is_empty() {
        manifest.firmware_note = Some(
            "the source carries no GSP firmware (Debian's module-source packages ship it in firmware-nvidia-gsp); install it separately"
                .into(),
        );
    }
    Ok(files)
}

/// Lists NVIDIA's user space (files and links) in the manifest.
fn add_user_space(
    manifest: &mut Manifest,
    user_space: Option<&(PathBuf, Vec<crate::userspace::Placement>)>,
) -> Result<Vec<PackFile>> {
    let mut files = Vec::new();
    let Some((base, placements)) = user_space else {
        return Ok(files);
    };
    for p in placements {
        match p {
            crate::userspace::Placement::File { src, dest, mode } => {
                let path = base.join(src);
                let (sha256, size_bytes) = crate::files::sha256_file(&path, LOCAL_IO)?;
                manifest.user_space.push(ManifestUserFile {
                    file: dest.clone(),
                    size_bytes,
                    sha256,
                    mode: *mode,
                });
                files.push(PackFile {
                    name: dest.clone(),
                    path,
                    mode: *mode,
                });
            }
            crate::userspace::Placement::Link { dest, target } => {
                manifest.links.push(ManifestLink {
                    file: dest.clone(),
                    target: target.clone(),
                })
            }
        }
    }
    Ok(files)
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
    );
    let artifact = opts
        .out_dir
        .join(artifact::file_name(driver_version, opts.flavor, release));
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

/// Takes the work directory's lock (two builds with one work directory
/// would delete each other's trees) and, holding it, removes what a killed
/// build left there: the extractor's temporaries (`.source.partial-*`,
/// hundreds of MB each), which nothing else would ever remove and which
/// would make the disk check fail. The lock is held until the build ends.
fn claim_work_dir(work: &Path) -> Result<nix::fcntl::Flock<fs::File>> {
    fs::create_dir_all(work).map_err(|e| Error::io(LOCAL_IO, "creating", work, e))?;
    let lock = crate::files::lock(&work.join(".lock"), LOCAL_IO)?;
    let entries = fs::read_dir(work).map_err(|e| Error::io(LOCAL_IO, "listing", work, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if crate::extract::is_partial_name(&name.to_string_lossy()) {
            let path = entry.path();
            tracing::info!("removing {} (left by a killed build)", path.display());
            remove_dir_if_present(&path)?;
        }
    }
    Ok(lock)
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

/// What the modules are built for, and the tool prefix that gets there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub arch: CpuArch,
    /// `CROSS_COMPILE`: `aarch64-linux-gnu-` when `arch` is not the
    /// builder's own, empty for a native build.
    pub cross_prefix: String,
}

impl Target {
    /// Building for `arch` on a `builder` CPU.
    pub fn new(arch: CpuArch, builder: CpuArch) -> Target {
        Target {
            arch,
            cross_prefix: if arch == builder {
                String::new()
            } else {
                format!("{}-", arch.gnu_triplet())
            },
        }
    }

    pub fn is_cross(&self) -> bool {
        !self.cross_prefix.is_empty()
    }

    /// A binutils program for the target: `strip`, `aarch64-linux-gnu-ld`.
    pub fn tool(&self, name: &str) -> String {
        format!("{}{name}", self.cross_prefix)
    }

    /// `ARCH=` for NVIDIA's Makefile and kbuild: `arm64`, `x86_64` (what
    /// NVIDIA's Makefile derives from `uname -m` on a native builder).
    pub fn make_arch(&self) -> &'static str {
        match self.arch {
            CpuArch::X86_64 => "x86_64",
            CpuArch::Aarch64 => self.arch.kernel_arch(),
        }
    }
}

/// The architecture to build for. The headers' `.config` decides
/// (`CONFIG_ARM64=y`): it is what the kernel was built for, whatever its
/// release is called. `--arch` must agree with it; it only decides for
/// headers whose configuration names neither architecture, and without
/// both the builder's own architecture is taken.
pub fn target_arch(flag: Option<CpuArch>, headers: &KernelHeaders) -> Result<CpuArch> {
    match (flag, headers.arch) {
        (Some(f), Some(h)) if f != h => Err(Error::new(
            Reason::KernelHeadersMismatch,
            format!(
                "--arch {f} but the kernel headers at {} are for {h} (their .config)",
                headers.arch_dir.display()
            ),
        )
        .with_hint(format!("pass the headers of the {f} kernel, or --arch {h}"))),
        (_, Some(h)) => Ok(h),
        (Some(f), None) => Ok(f),
        (None, None) => crate::host::running_arch(),
    }
}

/// An executable `name` on `path_var` (or `name` itself if it has a `/`).
pub fn find_in_path(name: &str, path_var: &OsStr) -> Option<PathBuf> {
    // A name with a slash is a path, as a shell would take it; the current
    // directory only matters for those.
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    which::which_in(name, Some(path_var), cwd).ok()
}

/// The compiler the build uses: the one named in the kernel's
/// `CONFIG_CC_VERSION_TEXT` (`gcc-12`, `x86_64-linux-gnu-gcc-14`) when it is
/// installed, as NVIDIA's Makefile itself prefers, else `gcc`. It is passed
/// to make as `CC`, so that what was checked is what compiles. A cross build
/// takes the same program with the target's prefix (`gcc-12` →
/// `aarch64-linux-gnu-gcc-12`, else `aarch64-linux-gnu-gcc`): the kernel
/// of a native arm64 build names its compiler without one.
pub fn choose_compiler(
    cc_version_text: Option<&str>,
    target: &Target,
    path_var: &OsStr,
) -> Option<String> {
    let named = cc_version_text
        .and_then(|t| t.split_whitespace().next())
        .filter(|c| {
            c.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.' | '+'))
        });
    let named = match named {
        // `x86_64-linux-gnu-gcc-14` → `aarch64-linux-gnu-gcc-14`.
        Some(c) if target.is_cross() => Some(
            target.tool(
                c.rsplit_once("-linux-gnu-")
                    .map_or(c, |(_, program)| program),
            ),
        ),
        other => other.map(str::to_string),
    };
    if let Some(c) = named {
        if find_in_path(&c, path_var).is_some() {
            return Some(c);
        }
    }
    let gcc = target.tool("gcc");
    find_in_path(&gcc, path_var).map(|_| gcc)
}

/// make, the linker, strip and a C compiler (the target's, for a cross
/// build) must be on PATH; returns the compiler command.
pub fn check_tools(
    cc_version_text: Option<&str>,
    target: &Target,
    path_var: &OsStr,
) -> Result<String> {
    let mut missing: Vec<String> = ["make".to_string(), target.tool("ld"), target.tool("strip")]
        .into_iter()
        .filter(|t| find_in_path(t, path_var).is_none())
        .collect();
    let cc = choose_compiler(cc_version_text, target, path_var);
    if cc.is_none() {
        missing.insert(0, target.tool("gcc"));
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
            .with_hint(if target.is_cross() {
                format!(
                    "install the cross compiler and binutils for {} (Debian: apt-get install gcc-<N>-{triplet} binutils-{triplet} make, <N> the kernel's gcc major)",
                    target.arch,
                    triplet = target.arch.gnu_triplet()
                )
            } else {
                "install the kernel's compiler and build tools (Debian, Garden Linux: apt-get install gcc make binutils)".to_string()
            }))
        }
    }
}

/// Runs `<cc> --version` and returns its first line.
pub fn run_compiler_version(cc: &str) -> Result<String> {
    let mut cmd = crate::process::command(cc);
    cmd.arg("--version");
    let out = crate::process::output(&mut cmd, Reason::CompilerMissing)?;
    let text = String::from_utf8_lossy(&out.stdout);
    match (out.status.success(), parse_version_first_line(&text)) {
        (true, Some(v)) => Ok(v),
        _ => Err(crate::process::exit_error(
            &cmd,
            &out,
            Reason::CompilerMissing,
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
        cross_compile: None,
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
        if let Some(text) = crate::host::read_optional(&tree.join(f)).ok().flatten() {
            declared = parse_nv_version_string(&text);
            if declared.is_some() {
                break;
            }
        }
    }
    if declared.is_none() {
        for dir in tree.ancestors().take(3) {
            if let Some(text) = crate::host::read_optional(&dir.join("version.mk"))
                .ok()
                .flatten()
            {
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
/// compiler that preflight checked. A cross build adds `ARCH` (NVIDIA's
/// Makefile takes it from `uname -m` otherwise) and `CROSS_COMPILE` (kbuild's
/// prefix for `ld`, `objcopy`, …); a native build passes neither, as before.
pub fn make_args(
    tree: &Path,
    jobs: usize,
    release: &str,
    headers: &KernelHeaders,
    cc: &str,
    target: &Target,
) -> Vec<OsString> {
    let kv = |k: &str, v: &OsStr| {
        let mut s = OsString::from(k);
        s.push("=");
        s.push(v);
        s
    };
    let mut args = vec![
        OsString::from(format!("-j{}", jobs.max(1))),
        OsString::from("-C"),
        tree.as_os_str().to_owned(),
        kv("KERNEL_UNAME", OsStr::new(release)),
        kv("SYSSRC", headers.common_dir.as_os_str()),
        kv("SYSOUT", headers.arch_dir.as_os_str()),
        kv("CC", OsStr::new(cc)),
    ];
    if target.is_cross() {
        args.push(kv("ARCH", OsStr::new(target.make_arch())));
        args.push(kv("CROSS_COMPILE", OsStr::new(&target.cross_prefix)));
    }
    args.push(OsString::from("modules"));
    args
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
        .map(|l| crate::text::truncate(l, EXCERPT_LINE_CHARS))
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
fn stage_module(ko: &Path, dest_dir: &Path, release: &str, target: &Target) -> Result<Staged> {
    let file_name = ko
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dest = dest_dir.join(&file_name);
    run_strip(&target.tool("strip"), ko, &dest)?;
    let info = modinfo::read_modinfo(&dest)
        .map_err(|e| Error::new(Reason::BuildFailed, format!("reading modinfo: {e}")))?;
    check_vermagic(&file_name, &info.vermagic, release)?;
    check_machine(&file_name, info.machine, target.arch)?;
    let (sha256, size_bytes) = crate::files::sha256_file(&dest, LOCAL_IO)?;
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
/// `strip` is the target's (`aarch64-linux-gnu-strip` for arm64 modules on
/// an x86_64 builder: the native one does not know their format).
pub fn run_strip(strip: &str, src: &Path, dest: &Path) -> Result<()> {
    let mut cmd = crate::process::command(strip);
    cmd.arg("--strip-debug").arg("-o").arg(dest).arg(src);
    // Not starting is a missing tool; failing is a bad module file.
    let out = crate::process::output(&mut cmd, Reason::CompilerMissing)?;
    if !out.status.success() {
        return Err(crate::process::exit_error(&cmd, &out, Reason::BuildFailed));
    }
    Ok(())
}

/// A module is for the CPU the build targeted: a cross build that quietly
/// produced host objects (a make variable lost on the way) stops here.
pub fn check_machine(module: &str, machine: u16, arch: CpuArch) -> Result<()> {
    if machine == arch.elf_machine() {
        return Ok(());
    }
    let found = CpuArch::from_elf_machine(machine)
        .map_or_else(|| format!("ELF machine {machine}"), |a| a.to_string());
    Err(Error::new(
        Reason::BuildFailed,
        format!("{module} was built for {found}, not for {arch}"),
    ))
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

// ------------------------------------------------------------ artifact
