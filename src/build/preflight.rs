//! Preflight: cheap checks before minutes of extraction and compiling —
//! `/proc`, the headers, the target, the tools and the kernel's compiler,
//! free disk.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use super::options::BuildOptions;
use super::result::{BuildStatus, CompilerUsed, HeadersUsed};
use super::work::LOCAL_IO;
use crate::error::{Error, Failure, Result};
use crate::headers::{KernelHeaders, inspect_headers, locate_headers};
use crate::node::CpuArch;

/// What preflight established: the headers, the compiler, the work dir.
pub(super) struct Preflight {
    pub(super) headers: KernelHeaders,
    pub(super) target: Target,
    pub(super) cc: String,
    pub(super) compiler: CompilerUsed,
    pub(super) work: PathBuf,
    /// `--signing-key/--signing-cert`, checked.
    pub(super) signing: Option<crate::signing::Signing>,
}

/// Cheap checks first, so that a doomed build fails in milliseconds rather
/// than after minutes of extraction.
pub(super) fn preflight(opts: &BuildOptions, status: &mut BuildStatus) -> Result<Preflight> {
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
        crate::node::running_arch()?,
    );
    status.arch = Some(target.arch);
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let cc = check_tools(headers.cc_version_text.as_deref(), &target, &path_var)?;
    let mut compiler = check_compiler(&cc, headers.cc_version_text.as_deref())?;
    compiler.cross_compile = target.is_cross().then(|| target.cross_prefix.clone());
    status.compiler = Some(compiler.clone());
    let signing = match &opts.signing {
        Some(files) => Some(crate::signing::Signing::prepare(
            files,
            &headers.arch_dir,
            &headers.common_dir,
        )?),
        None => None,
    };
    status.signer = signing.as_ref().map(|s| s.signer.clone());
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
        signing,
    })
}

/// NVIDIA's `conftest.sh` reads `/proc`; without it every conftest "fails"
/// and the build breaks later with misleading errors (missing `stdarg.h`).
pub fn check_proc(proc_dir: &Path) -> Result<()> {
    let exe = proc_dir.join("self/exe");
    if fs::symlink_metadata(&exe).is_ok() {
        return Ok(());
    }
    Err(Error::new(
        Failure::ProcNotMounted,
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
            Failure::KernelHeadersMismatch,
            format!(
                "--arch {f} but the kernel headers at {} are for {h} (their .config)",
                headers.arch_dir.display()
            ),
        )
        .with_hint(format!("pass the headers of the {f} kernel, or --arch {h}"))),
        (_, Some(h)) => Ok(h),
        (Some(f), None) => Ok(f),
        (None, None) => crate::node::running_arch(),
    }
}

/// An executable `name` on `path_var` (or `name` itself if it has a `/`).
fn find_in_path(name: &str, path_var: &OsStr) -> Option<PathBuf> {
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
                Failure::CompilerMissing,
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
fn run_compiler_version(cc: &str) -> Result<String> {
    let mut cmd = crate::process::command(cc);
    cmd.arg("--version");
    let out = crate::process::output(&mut cmd, Failure::CompilerMissing)?;
    let text = String::from_utf8_lossy(&out.stdout);
    match (out.status.success(), parse_version_first_line(&text)) {
        (true, Some(v)) => Ok(v),
        _ => Err(crate::process::exit_error(
            &cmd,
            &out,
            Failure::CompilerMissing,
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
fn version_number(text: &str) -> Option<&str> {
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
                    Failure::CompilerMismatch,
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
            Failure::InsufficientDisk,
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
