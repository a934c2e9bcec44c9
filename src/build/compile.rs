//! The compile: NVIDIA's Makefile with its output streamed to a log, and a
//! failure classified from the compiler's errors in that log.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use super::options::BuildOptions;
use super::preflight::{Preflight, Target};
use super::result::{BuildStatus, seconds};
use super::source::Source;
use super::work::LOCAL_IO;
use crate::error::{Error, Failure, Result};
use crate::headers::KernelHeaders;
use crate::node::ModuleFlavor;

/// A compile of NVIDIA's modules takes 2-10 minutes on 2 cores; one past
/// this is hung (a conftest waiting on something that never comes).
const COMPILE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2 * 3600);

/// Lines of the compile log quoted in `status.logExcerpt`: enough for the
/// first error with its context, small enough for a result document.
pub const EXCERPT_LINES: usize = 40;

/// Compiler errors quoted in `status.message`.
const MESSAGE_ERRORS: usize = 3;

/// A log line longer than this is cut in the excerpt (compiler command lines
/// run to several KiB).
const EXCERPT_LINE_CHARS: usize = 400;

/// an interface: a function's signature, a struct's members, a symbol that
/// was removed or renamed. Any of them in the errors makes the failure
/// [`Reason::KernelApiMismatch`], so that the driver/kernel pair can be
/// recognised from the result alone.
const KERNEL_API_PATTERNS: &[&str] = &[
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

/// NVIDIA's Makefile, its output streamed to the log; a failure is
/// classified from the compiler's errors.
pub(super) fn compile(
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
    let exit = crate::process::run_logged(
        "make",
        &args,
        &log,
        Failure::CompilerMissing,
        COMPILE_DEADLINE,
    )?;
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
pub struct CompileFailure {
    pub reason: Failure,
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
/// interface change (see `KERNEL_API_PATTERNS`) makes it
/// [`Reason::KernelApiMismatch`]; everything else is
/// [`Reason::BuildFailed`]. Both quote the first errors.
pub fn classify_log(log: &str, tree: &Path) -> CompileFailure {
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
    CompileFailure {
        reason: if api {
            Failure::KernelApiMismatch
        } else {
            Failure::BuildFailed
        },
        errors,
        excerpt,
    }
}

fn failure_message(
    f: &CompileFailure,
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
        Failure::KernelApiMismatch => format!(
            "NVIDIA {driver} ({flavor}) does not compile against kernel {release}: the kernel's API changed"
        ),
        _ => format!("NVIDIA {driver} ({flavor}) failed to compile for kernel {release}"),
    };
    let hint = match f.reason {
        Failure::KernelApiMismatch => {
            "use a driver branch that supports this kernel (or the other flavor)"
        }
        _ => "see the log",
    };
    format!(
        "{what} (make {exit}): {quoted}; {hint}; full log: {}",
        log.display()
    )
}
