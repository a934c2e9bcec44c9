//! Kernel headers from the OS's apt repository, for nodes that have none
//! installed: `linux-headers-<release>` plus the packages it needs for an
//! external module build (Debian's `linux-headers-*-common` and
//! `linux-kbuild-*`), downloaded verified and unpacked into a scratch root.
//! Garden Linux's repository has the same layout as Debian's
//! (`https://packages.gardenlinux.io/gardenlinux dists/<version>/main`).
//! Also finds and inspects headers already installed on the host
//! ([`installed_headers`], [`locate_headers`], [`inspect_headers`]).
//! See `docs/headers.md`.

use std::fs;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use crate::apt::{self, AptSource, Index, Package};
use crate::deb;
use crate::error::{Error, Failure, Result};
use crate::fetch::{self, FetchPolicy, FetchRequest};
use crate::host_root::HostRoot;
use crate::node::CpuArch;

/// Local filesystem failures (scratch directory) are not the repository's
/// fault; the closed reason list has nothing closer than Internal.
const LOCAL_IO: Failure = Failure::Internal;

/// A downloaded, verified package that went into the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadersPackage {
    pub name: String,
    pub version: String,
    pub sha256: String,
}

/// Unpacked headers, ready for `make -C <arch_dir> M=… modules` (or
/// NVIDIA's `SYSSRC=<common_dir> SYSOUT=<arch_dir>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadersTree {
    pub release: String,
    /// The scratch root everything was unpacked into (an image of `/`).
    pub root: PathBuf,
    /// `<root>/usr/src/linux-headers-<release>`: `.config`, `Module.symvers`,
    /// generated headers; the kernel's build output directory.
    pub arch_dir: PathBuf,
    /// The kernel source headers the arch directory's Makefile includes
    /// (Debian: `<root>/usr/src/linux-headers-<abi>-common`); `arch_dir`
    /// itself when the package is self-contained.
    pub common_dir: PathBuf,
    /// In the order they were unpacked: headers, then what it depends on.
    pub packages: Vec<HeadersPackage>,
}

/// Names of the packages a headers package's dependencies are followed to:
/// the shared headers and the build tools (`scripts/`, `tools/objtool`).
/// Everything else it depends on (linux-image on trixie, the compiler,
/// linux-base) is not needed to build modules and is not fetched.
fn is_build_dependency(name: &str) -> bool {
    (name.starts_with("linux-headers-") && name.contains("-common"))
        || name.starts_with("linux-kbuild-")
}

/// Finds `linux-headers-<release>` in `repo`'s suite `suite` (component
/// `main`, `amd64`), downloads it with the packages it needs (each verified
/// against the index's sha256 and cached in `opts.cache_dir`) and unpacks
/// them into `scratch_root`,
/// which must not exist or be an empty directory.
///
/// Not in the index: `KernelHeadersNotFound` naming repository, suite and
/// package. A download that does not verify: `ChecksumMismatch`. A broken
/// package: `ArchiveInvalid`/`UnsafeArchive`. Unpacked but unusable (no
/// Makefile, `.config`, `scripts/`; another release): `KernelHeadersMismatch`.
pub fn fetch_headers(
    repo: &str,
    suite: &str,
    release: &str,
    opts: &FetchPolicy,
    scratch_root: &Path,
) -> Result<HeadersTree> {
    fetch_headers_from(&AptSource::new(repo, suite), release, opts, scratch_root)
}

/// [`fetch_headers`] with the components and architecture chosen.
pub fn fetch_headers_from(
    source: &AptSource,
    release: &str,
    opts: &FetchPolicy,
    scratch_root: &Path,
) -> Result<HeadersTree> {
    if release.is_empty() || release.contains(['/', ' ']) {
        return Err(Error::new(
            Failure::InvalidArgument,
            format!("{release:?} is not a kernel release"),
        ));
    }
    check_scratch_root(scratch_root)?;
    let index = apt::read_index(source, opts, &mut |name: &str| {
        name.starts_with("linux-headers-") || name.starts_with("linux-kbuild-")
    })?;
    let wanted = select_packages(&index, release)?;
    let debs = download_packages(source, &index, &wanted, opts)?;
    let (arch_rel, common_rel) = unpack_into(&debs, release, scratch_root)?;
    Ok(HeadersTree {
        release: release.to_string(),
        root: scratch_root.to_path_buf(),
        arch_dir: scratch_root.join(&arch_rel),
        common_dir: scratch_root.join(&common_rel),
        packages: debs
            .into_iter()
            .map(|d| HeadersPackage {
                name: d.package.name.clone(),
                version: d.package.version.clone(),
                sha256: d.sha256,
            })
            .collect(),
    })
}

/// A package of the index, downloaded and verified.
struct Downloaded<'a> {
    package: &'a Package,
    path: PathBuf,
    sha256: String,
}

/// Downloads each package, verified against the index's sha256 (and size),
/// into the package cache.
fn download_packages<'a>(
    source: &AptSource,
    index: &Index,
    wanted: &[&'a Package],
    opts: &FetchPolicy,
) -> Result<Vec<Downloaded<'a>>> {
    let mut debs = Vec::new();
    for pkg in wanted {
        let sha = pkg.sha256.clone().ok_or_else(|| {
            Error::new(
                Failure::ChecksumMissing,
                format!(
                    "{} lists no SHA256 for {} {}; it cannot be downloaded verified",
                    index.index_urls.join(", "),
                    pkg.name,
                    pkg.version
                ),
            )
        })?;
        let url = source.pool_url(&pkg.filename);
        tracing::info!("fetching {} {} from {url}", pkg.name, pkg.version);
        let fetched = fetch::fetch(opts, &FetchRequest::new(&url, &sha)).map_err(|e| e.error)?;
        if let Some(size) = pkg.size
            && size != fetched.size
        {
            // The sha256 matched, so the index contradicts itself.
            return Err(Error::new(
                Failure::ArchiveInvalid,
                format!(
                    "{url}: the index says {size} bytes but the verified file has {}",
                    fetched.size
                ),
            ));
        }
        debs.push(Downloaded {
            package: pkg,
            path: fetched.path,
            sha256: sha,
        });
    }
    Ok(debs)
}

/// Unpacks the packages beside `scratch_root`, checks the tree and renames
/// it into place, so a scratch root is always complete (the temporary
/// directory removes itself on any error). Returns the arch and common
/// directories, relative to the root.
fn unpack_into(
    debs: &[Downloaded<'_>],
    release: &str,
    scratch_root: &Path,
) -> Result<(PathBuf, PathBuf)> {
    let parent = match scratch_root.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(parent).map_err(|e| Error::io(LOCAL_IO, "creating", parent, e))?;
    let name = scratch_root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "headers".to_string());
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.partial-"))
        .tempdir_in(parent)
        .map_err(|e| Error::io(LOCAL_IO, "creating a temporary directory in", parent, e))?;
    for d in debs {
        let report = deb::unpack_data(&d.path, tmp.path())?;
        tracing::info!(
            "unpacked {} {} ({}, {} entries)",
            d.package.name,
            d.package.version,
            report.data_member,
            report.extract.entries
        );
    }
    let arch_rel = PathBuf::from(format!("usr/src/linux-headers-{release}"));
    let common_rel = fix_makefile_includes(tmp.path(), &arch_rel)?;
    check_tree(tmp.path(), &arch_rel, &common_rel, release)?;
    replace_scratch_root(tmp, scratch_root)?;
    Ok((arch_rel, common_rel))
}

/// Renames the finished tree to `scratch_root`; an empty directory there
/// (e.g. a fresh tempdir) is replaced.
fn replace_scratch_root(tmp: tempfile::TempDir, scratch_root: &Path) -> Result<()> {
    if fs::symlink_metadata(scratch_root).is_ok() {
        fs::remove_dir(scratch_root)
            .map_err(|e| Error::io(LOCAL_IO, "removing the empty", scratch_root, e))?;
    }
    let done = tmp.keep();
    if let Err(e) = fs::rename(&done, scratch_root) {
        let _ = fs::remove_dir_all(&done);
        return Err(Error::io(
            LOCAL_IO,
            &format!("renaming {} to", done.display()),
            scratch_root,
            e,
        ));
    }
    Ok(())
}

fn check_scratch_root(dir: &Path) -> Result<()> {
    match fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::new(
                    LOCAL_IO,
                    format!(
                        "scratch root {} is not empty; headers are unpacked into a fresh directory",
                        dir.display()
                    ),
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(LOCAL_IO, "reading", dir, e)),
    }
}

/// `linux-headers-<release>` and, transitively, the build dependencies it
/// names (see [`is_build_dependency`]), each at the newest version its
/// dependency allows.
fn select_packages<'a>(index: &'a Index, release: &str) -> Result<Vec<&'a Package>> {
    let name = format!("linux-headers-{release}");
    let top = index.best(&name, None).ok_or_else(|| {
        Error::new(
            Failure::KernelHeadersNotFound,
            format!(
                "no package {name} in {} suite {} ({} for {}; read from {})",
                index.source.repository,
                index.source.suite,
                index.source.components.join(", "),
                index.source.architecture,
                index.index_urls.join(", ")
            ),
        )
        .with_hint(
            "the repository may no longer (or not yet) carry this kernel's headers: \
             install linux-headers for the running kernel on the node, upgrade the node to a \
             kernel the repository has, or point the catalog's headersRepository at a mirror that keeps it",
        )
    })?;
    let mut chosen = vec![top];
    let mut i = 0;
    while i < chosen.len() {
        let pkg = chosen[i];
        i += 1;
        for group in &pkg.depends {
            let Some(dep) = group.iter().find(|d| is_build_dependency(&d.name)) else {
                continue;
            };
            let found = group
                .iter()
                .filter(|d| is_build_dependency(&d.name))
                .find_map(|d| index.best(&d.name, Some(d)))
                .ok_or_else(|| {
                    Error::new(
                        Failure::KernelHeadersNotFound,
                        format!(
                            "{} {} depends on {dep}, which {} suite {} does not have",
                            pkg.name, pkg.version, index.source.repository, index.source.suite
                        ),
                    )
                    .with_hint("the repository's index is inconsistent or only partly mirrored")
                })?;
            if !chosen.iter().any(|c| c.name == found.name) {
                chosen.push(found);
            }
        }
    }
    Ok(chosen)
}

/// Debian's arch headers Makefile is one line, `include
/// /usr/src/linux-headers-<abi>-common/Makefile`: an absolute path that
/// means the host's `/usr/src`, not the scratch root. Each such include of a
/// file that exists in the tree is rewritten relative to the Makefile's own
/// location (`$(dir $(lastword $(MAKEFILE_LIST)))`), so the tree works
/// wherever it lies and whatever directory make starts in. Returns the
/// directory of the included kernel Makefile (the common headers), or the
/// arch directory when it includes nothing.
fn fix_makefile_includes(root: &Path, arch_rel: &Path) -> Result<PathBuf> {
    let makefile = root.join(arch_rel).join("Makefile");
    let text = match fs::read_to_string(&makefile) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(arch_rel.to_path_buf()),
        Err(e) => return Err(Error::io(LOCAL_IO, "reading", &makefile, e)),
    };
    let mut common = None;
    let mut out = String::new();
    let mut changed = false;
    for line in text.lines() {
        let trimmed = line.trim();
        let parsed = ["include ", "-include ", "sinclude "]
            .iter()
            .find_map(|kw| Some((*kw, trimmed.strip_prefix(kw)?.trim())));
        match parsed {
            Some((kw, target))
                if target.starts_with('/') && !target.contains(char::is_whitespace) =>
            {
                let target_rel: PathBuf = Path::new(target)
                    .components()
                    .filter(|c| matches!(c, Component::Normal(_)))
                    .collect();
                if !root.join(&target_rel).is_file() {
                    return Err(Error::new(
                        Failure::KernelHeadersMismatch,
                        format!(
                            "incomplete headers: {} includes {target}, which none of the packages provides",
                            makefile.display()
                        ),
                    ));
                }
                if common.is_none() {
                    common = target_rel.parent().map(Path::to_path_buf);
                }
                out.push_str(&format!(
                    "# {target} rewritten by gpu-driver: relative to this Makefile, inside the unpacked root\n\
                     {kw}$(dir $(lastword $(MAKEFILE_LIST))){}\n",
                    relative_path(arch_rel, &target_rel).display()
                ));
                changed = true;
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if changed {
        fs::write(&makefile, out).map_err(|e| Error::io(LOCAL_IO, "writing", &makefile, e))?;
    }
    Ok(common.unwrap_or_else(|| arch_rel.to_path_buf()))
}

/// `to` as seen from the directory `from` (both relative to one root,
/// without `..`): `usr/src/a`, `usr/src/b/Makefile` → `../b/Makefile`.
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let f: Vec<_> = from.components().collect();
    let t: Vec<_> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c.as_os_str());
    }
    out
}

/// What an external module build reads: the arch directory's Makefile,
/// configuration and `scripts/` (a link into linux-kbuild), and the common
/// headers' Makefile; and the release the headers were generated for.
fn check_tree(root: &Path, arch_rel: &Path, common_rel: &Path, release: &str) -> Result<()> {
    let arch = root.join(arch_rel);
    let common = root.join(common_rel);
    let incomplete = |what: String| {
        Error::new(
            Failure::KernelHeadersMismatch,
            format!("incomplete headers for {release}: {what}"),
        )
        .with_hint("the repository's headers packages do not match each other; report it")
    };
    if !arch.is_dir() {
        return Err(incomplete(format!(
            "linux-headers-{release} did not provide /{}",
            arch_rel.display()
        )));
    }
    for (dir, file) in [(&arch, "Makefile"), (&common, "Makefile")] {
        if !dir.join(file).is_file() {
            return Err(incomplete(format!("no {}", dir.join(file).display())));
        }
    }
    if !arch.join(".config").is_file() && !arch.join("include/config/auto.conf").is_file() {
        return Err(incomplete(format!(
            "no .config or include/config/auto.conf in {}",
            arch.display()
        )));
    }
    // Followed through the symlink into linux-kbuild.
    if !arch.join("scripts/Makefile.build").is_file() {
        return Err(incomplete(format!(
            "{}/scripts does not lead to kbuild's scripts (is linux-kbuild missing?)",
            arch.display()
        )));
    }
    let uts = arch.join("include/generated/utsrelease.h");
    if let Ok(text) = fs::read_to_string(&uts)
        && let Some(found) = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("#define UTS_RELEASE"))
            .map(|v| v.trim().trim_matches('"'))
        && found != release
    {
        return Err(Error::new(
            Failure::KernelHeadersMismatch,
            format!(
                "linux-headers-{release} holds headers for {found} ({})",
                uts.display()
            ),
        ));
    }
    Ok(())
}

/// Headers installed on the host for `release`: `/usr/src/linux-headers-<rel>`
/// or `/lib/modules/<rel>/build` (resolved inside the root), whichever holds
/// a Makefile first. The path is the one we can open (root prefix included).
pub(crate) fn installed_headers(root: &HostRoot, release: &str) -> Option<PathBuf> {
    [
        format!("/usr/src/linux-headers-{release}"),
        format!("/lib/modules/{release}/build"),
    ]
    .iter()
    .filter_map(|candidate| root.resolve(candidate))
    .find(|found| found.join("Makefile").is_file())
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
                Failure::KernelHeadersNotFound,
                format!("--headers {} is not a directory", dir.display()),
            )
            .with_hint(hint))
        };
    }
    installed_headers(root, release).ok_or_else(|| {
        Error::new(
            Failure::KernelHeadersNotFound,
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
    /// The CPU architecture the kernel was configured for (`CONFIG_ARM64=y`,
    /// `CONFIG_X86_64=y`); `None` when the configuration says neither.
    pub arch: Option<CpuArch>,
}

/// Checks that `arch_dir` holds complete headers for `release` and finds the
/// common tree they build on.
pub fn inspect_headers(arch_dir: &Path, root: &HostRoot, release: &str) -> Result<KernelHeaders> {
    let incomplete = |what: String| {
        Error::new(
            Failure::KernelHeadersMismatch,
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
            Failure::KernelHeadersMismatch,
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
        cc_version_text: read_config_value(arch_dir, |t| {
            parse_kconfig_string(t, "CONFIG_CC_VERSION_TEXT")
        })?,
        arch: read_config_value(arch_dir, parse_kconfig_arch)?,
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
        Err(e) => Err(Error::io(
            Failure::KernelHeadersMismatch,
            "reading",
            path,
            e,
        )),
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

/// A value from the headers' configuration: `include/config/auto.conf`,
/// else `.config`.
pub(crate) fn read_config_value<T>(
    arch_dir: &Path,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>> {
    for f in ["include/config/auto.conf", ".config"] {
        if let Some(text) = read_text_optional(&arch_dir.join(f))? {
            if let Some(v) = parse(&text) {
                return Ok(Some(v));
            }
        }
    }
    Ok(None)
}

/// The architecture a kernel configuration is for: `CONFIG_ARM64=y` is
/// arm64, `CONFIG_X86_64=y` x86_64 (both symbols are set by the arch's own
/// Kconfig, whatever the release is called).
pub fn parse_kconfig_arch(text: &str) -> Option<CpuArch> {
    text.lines().find_map(|l| match l.trim() {
        "CONFIG_ARM64=y" => Some(CpuArch::Aarch64),
        "CONFIG_X86_64=y" => Some(CpuArch::X86_64),
        _ => None,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert_eq!(
            relative_path(
                Path::new("usr/src/linux-headers-6.1.0-50-cloud-amd64"),
                Path::new("usr/src/linux-headers-6.1.0-50-common/Makefile")
            ),
            Path::new("../linux-headers-6.1.0-50-common/Makefile")
        );
        assert_eq!(
            relative_path(Path::new("a/b"), Path::new("c")),
            Path::new("../../c")
        );
    }

    #[test]
    fn build_dependencies() {
        assert!(is_build_dependency("linux-headers-6.1.0-50-common"));
        assert!(is_build_dependency("linux-headers-6.1.0-50-common-rt"));
        assert!(is_build_dependency("linux-headers-6.12.117+deb13-common"));
        assert!(is_build_dependency("linux-kbuild-6.1"));
        assert!(is_build_dependency("linux-kbuild-6.12.117+deb13"));
        assert!(!is_build_dependency(
            "linux-image-6.12.117+deb13-cloud-amd64"
        ));
        assert!(!is_build_dependency("linux-compiler-gcc-12-x86"));
        assert!(!is_build_dependency("gcc-14"));
        assert!(!is_build_dependency("linux-base"));
    }
}
