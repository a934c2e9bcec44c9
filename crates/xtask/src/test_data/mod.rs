//! `cargo xtask test-data` (scripts/fetch-test-data): fetches the real
//! archives the tests need and prints the directory holding them (the test
//! pipeline names it in its tools file). It holds:
//!
//! - `nvidia-open-kernel.tar.xz`: Debian bookworm's
//!   nvidia-open-kernel-source tarball (`/usr/src/…` from the .deb, ~20 MB);
//! - `apt-bookworm/`: a local apt repository (`pool/` + `dists/bookworm/`)
//!   with the real linux-headers-<abi>-cloud-amd64,
//!   linux-headers-<abi>-common and linux-kbuild-6.1 .debs (~13 MB),
//!   indexed by dpkg-scanpackages;
//! - `kernel-release`: the headers' kernel release (6.1.0-NN-cloud-amd64);
//! - `libcuda/`: bookworm non-free's libcuda1, NVIDIA's real
//!   `libcuda.so.<version>` and its `libcuda.so.1` link (~29 MB unpacked),
//!   for verify's CUDA check on a machine without a GPU;
//! - `nvidia-smi/`: bookworm non-free's nvidia-smi and libnvidia-ml1,
//!   `bin/nvidia-smi` and `lib/libnvidia-ml.so.<version>` (scripts/real-node).
//!
//! Each item is cached under `<cache>/test-data/<package>_<version>/` and
//! the printed directory (`sets/<versions>/`) links to them, so a second
//! run (or a run without network, if anything is cached) downloads
//! nothing. Versions are resolved with apt each run, never hard-coded; apt
//! runs with a private configuration under the cache (see `apt`).

mod apt;
mod repo;
pub mod runfile;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail, ensure};

use crate::cache::{self, Cache};
use crate::cmd::{cmd, is_executable, on_path};
use crate::deadline;
use apt::Apt;
pub use apt::mirror;
pub use repo::iso8601;

const SUITE: &str = "bookworm";
const TARBALL: &str = "nvidia-open-kernel.tar.xz";

fn log(msg: &str) {
    eprintln!("fetch-test-data: {msg}");
}

/// Fetches what is missing and returns the set's directory.
pub fn fetch(cache: &Cache) -> Result<PathBuf> {
    let dir = cache.dir("test-data")?;
    let mirror = apt::mirror();
    let apt = Apt::new(&dir.join("apt"), &mirror, SUITE, true)?;
    let update_log = apt.root().join("update.log");
    let online = apt.update(Some(&update_log)).is_ok();
    let f = Fetch {
        dir,
        apt,
        mirror,
        online,
        update_log,
    };
    let items = [f.nvidia()?, f.headers()?, f.libcuda()?, f.smi()?];
    f.set(&items)
}

struct Fetch {
    /// `<cache>/test-data`.
    dir: PathBuf,
    apt: Apt,
    mirror: String,
    online: bool,
    update_log: PathBuf,
}

impl Fetch {
    fn version(&self, pkg: &str) -> Option<String> {
        self.online
            .then(|| self.apt.field(pkg, "Version"))
            .flatten()
    }

    /// When apt names no version: the newest cached directory matching
    /// `pattern` that holds `marker`.
    fn cached(&self, what: &str, pattern: &str, marker: &str) -> Result<PathBuf> {
        if let Some(d) = newest_cached(&self.dir, pattern, marker)? {
            log(&format!(
                "cannot resolve {what} from {} (see {}); using cached {}",
                self.mirror,
                self.update_log.display(),
                d.display()
            ));
            return Ok(d);
        }
        bail!(
            "cannot resolve {what} from {} {SUITE} and nothing is cached; {}:\n{}",
            self.mirror,
            self.update_log.display(),
            deadline::tail_of(&self.update_log, 30)
        )
    }

    /// Fills `dir` through `build` (given a scratch directory and the
    /// output directory), renamed into place whole so that a cached
    /// directory is always complete.
    fn install(&self, dir: &Path, build: impl FnOnce(&Path, &Path) -> Result<()>) -> Result<()> {
        let work = scratch(&self.dir)?;
        let out = work.path().join("out");
        fs::create_dir(&out)?;
        build(work.path(), &out)?;
        cache::remove(dir)?;
        fs::rename(&out, dir)
            .with_context(|| format!("renaming {} to {}", out.display(), dir.display()))
    }

    /// The NVIDIA module source tarball.
    fn nvidia(&self) -> Result<PathBuf> {
        let pkg = "nvidia-open-kernel-source";
        let Some(version) = self.version(pkg) else {
            return self.cached(pkg, &format!("{pkg}_*"), TARBALL);
        };
        let dir = self.dir.join(format!("{pkg}_{version}"));
        if !dir.join(TARBALL).is_file() {
            log(&format!("downloading {pkg} {version}"));
            self.install(&dir, |work, out| {
                self.apt.download(work, &[format!("{pkg}={version}")])?;
                let deb = first_deb(work)?;
                let root = work.join("root");
                unpack(&deb, &root)?;
                let tarball = root.join("usr/src").join(TARBALL);
                ensure!(
                    tarball.is_file(),
                    "{} has no /usr/src/{TARBALL}",
                    deb.display()
                );
                fs::rename(&tarball, out.join(TARBALL))?;
                write_version(out, &version)
            })?;
        }
        log(&format!("{pkg} {version}: {}", dir.join(TARBALL).display()));
        Ok(dir)
    }

    /// The kernel headers as a local apt repository.
    fn headers(&self) -> Result<PathBuf> {
        let meta = "linux-headers-cloud-amd64";
        // The meta package names the current ABI.
        let resolved = self.online.then(|| {
            let pkg = apt::abi_headers(&self.apt.field(meta, "Depends")?)?;
            let version = self.apt.field(&pkg, "Version")?;
            Some((pkg, version))
        });
        let Some((pkg, version)) = resolved.flatten() else {
            return self.cached(meta, "linux-headers-*-cloud-amd64_*", "kernel-release");
        };
        let dir = self.dir.join(format!("{pkg}_{version}"));
        if !dir.join("kernel-release").is_file() {
            ensure!(
                on_path("dpkg-scanpackages"),
                "dpkg-scanpackages is missing: apt-get install dpkg-dev (or run bash .ci/run)"
            );
            let deps = apt::dep_names(&self.apt.field(&pkg, "Depends").unwrap_or_default());
            let (common, kbuild) = apt::headers_parts(&deps).ok_or_else(|| {
                anyhow!(
                    "{pkg} {version} does not depend on a -common headers and a linux-kbuild \
                     package: {}",
                    deps.join(" ")
                )
            })?;
            log(&format!("downloading {pkg} {version}, {common}, {kbuild}"));
            self.install(&dir, |work, out| {
                let repo = out.join("apt-bookworm");
                let pool = repo.join("pool/main/l/linux");
                fs::create_dir_all(&pool)?;
                fs::create_dir_all(repo.join("dists").join(SUITE).join("main/binary-amd64"))?;
                self.apt
                    .download(&pool, &[format!("{pkg}={version}"), common, kbuild])?;
                let debs = find_all(&pool, &|p, _| glob(p, "*.deb"))?.len();
                ensure!(
                    debs == 3,
                    "apt-get download did not produce 3 .debs ({debs})"
                );
                repo::index(&repo, SUITE, work, log)?;
                let release = pkg.strip_prefix("linux-headers-").unwrap_or(&pkg);
                fs::write(out.join("kernel-release"), format!("{release}\n"))?;
                Ok(())
            })?;
        }
        log(&format!(
            "{pkg} {version}: {}",
            dir.join("apt-bookworm").display()
        ));
        Ok(dir)
    }

    /// NVIDIA's real libcuda: `lib/` holds libcuda.so.<v> and the
    /// libcuda.so.1 link. Only libcuda1 itself: dlopen needs nothing else
    /// of NVIDIA's (its NEEDED are glibc's libm, libc, libdl, libpthread,
    /// librt).
    fn libcuda(&self) -> Result<PathBuf> {
        let pkg = "libcuda1";
        let Some(version) = self.version(pkg) else {
            return self.cached(&format!("{pkg} (non-free)"), "libcuda1_*", "lib");
        };
        let dir = self.dir.join(format!("{pkg}_{version}"));
        if !dir.join("lib/libcuda.so.1").exists() {
            log(&format!("downloading {pkg} {version}"));
            self.install(&dir, |work, out| {
                self.apt.download(work, &[format!("{pkg}={version}")])?;
                let deb = first_deb(work)?;
                let root = work.join("root");
                unpack(&deb, &root)?;
                let found = find_all(&root, &|p, m| m.is_file() && glob(p, "libcuda.so.*.*"))?;
                let lib = found
                    .first()
                    .ok_or_else(|| anyhow!("{} has no libcuda.so.<version>", deb.display()))?;
                let name = lib.file_name().context("a file name")?;
                fs::create_dir(out.join("lib"))?;
                fs::rename(lib, out.join("lib").join(name))?;
                std::os::unix::fs::symlink(name, out.join("lib/libcuda.so.1"))?;
                write_version(out, &version)
            })?;
        }
        log(&format!("{pkg} {version}: {}", dir.join("lib").display()));
        Ok(dir)
    }

    /// NVIDIA's real nvidia-smi and NVML: bin/nvidia-smi and
    /// lib/libnvidia-ml.so.<v>. A driver root counts as having user space
    /// when it holds nvidia-smi (scripts/real-node).
    fn smi(&self) -> Result<PathBuf> {
        let Some(version) = self.version("nvidia-smi") else {
            return self.cached("nvidia-smi (non-free)", "nvidia-smi_*", "bin");
        };
        let dir = self.dir.join(format!("nvidia-smi_{version}"));
        if !is_executable(&dir.join("bin/nvidia-smi")) {
            log(&format!(
                "downloading nvidia-smi and libnvidia-ml1 {version}"
            ));
            self.install(&dir, |work, out| {
                let specs = [
                    format!("nvidia-smi={version}"),
                    format!("libnvidia-ml1={version}"),
                ];
                self.apt.download(work, &specs)?;
                let root = work.join("root");
                for deb in find_all(work, &|p, _| glob(p, "*.deb"))? {
                    unpack(&deb, &root)?;
                }
                // The executable: the package also ships a lintian override
                // file named nvidia-smi.
                let bin = find_all(&root, &|p, m| {
                    use std::os::unix::fs::PermissionsExt as _;
                    m.is_file() && glob(p, "nvidia-smi") && m.permissions().mode() & 0o100 != 0
                })?;
                let lib = find_all(&root, &|p, m| m.is_file() && glob(p, "libnvidia-ml.so.*.*"))?;
                let (Some(bin), Some(lib)) = (bin.first(), lib.first()) else {
                    bail!("no nvidia-smi or libnvidia-ml.so.<version> in the .debs");
                };
                for (sub, f) in [("bin", bin), ("lib", lib)] {
                    fs::create_dir(out.join(sub))?;
                    fs::rename(f, out.join(sub).join(f.file_name().context("a file name")?))?;
                }
                write_version(out, &version)
            })?;
        }
        log(&format!("nvidia-smi {version}: {}", dir.display()));
        Ok(dir)
    }

    /// One directory per combination of versions, linking to the items.
    fn set(&self, items: &[PathBuf; 4]) -> Result<PathBuf> {
        let names: Vec<String> = items
            .iter()
            .map(|d| {
                d.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let sets = self.dir.join("sets");
        let set = sets.join(names.join("+"));
        if set.join("kernel-release").is_file() {
            return Ok(set);
        }
        let work = scratch(&self.dir)?;
        let [nvidia, headers, libcuda, smi] = &names[..] else {
            unreachable!()
        };
        for (target, link) in [
            (format!("{nvidia}/{TARBALL}"), TARBALL),
            (format!("{headers}/apt-bookworm"), "apt-bookworm"),
            (format!("{libcuda}/lib"), "libcuda"),
            (smi.clone(), "nvidia-smi"),
            (format!("{headers}/kernel-release"), "kernel-release"),
        ] {
            std::os::unix::fs::symlink(format!("../../{target}"), work.path().join(link))?;
        }
        fs::create_dir_all(&sets)?;
        cache::remove(&set)?;
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(work.path(), fs::Permissions::from_mode(0o755))?;
        let work = work.keep();
        fs::rename(&work, &set)
            .with_context(|| format!("renaming {} to {}", work.display(), set.display()))?;
        Ok(set)
    }
}

/// A scratch directory `<dir>/.work.XXXXXX`, removed when dropped.
fn scratch(dir: &Path) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(".work.")
        .tempdir_in(dir)
        .with_context(|| format!("creating a scratch directory in {}", dir.display()))
}

fn write_version(out: &Path, version: &str) -> Result<()> {
    fs::write(out.join("VERSION"), format!("{version}\n")).context("writing VERSION")
}

/// `dpkg-deb -x DEB ROOT`.
fn unpack(deb: &Path, root: &Path) -> Result<()> {
    fs::create_dir_all(root)?;
    deadline::run(
        cmd("dpkg-deb").arg("-x").arg(deb).arg(root),
        Duration::from_secs(600),
    )
}

/// The first .deb apt-get download left in `dir`.
fn first_deb(dir: &Path) -> Result<PathBuf> {
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_file() && glob(&p, "*.deb") {
            return Ok(p);
        }
    }
    bail!("apt-get download produced no .deb in {}", dir.display())
}

/// The newest (by version order) directory in `dir` whose name matches
/// `pattern` and that holds `marker`.
fn newest_cached(dir: &Path, pattern: &str, marker: &str) -> Result<Option<PathBuf>> {
    let mut found: Vec<String> = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if glob_str(pattern, &name) && fs::symlink_metadata(dir.join(&name).join(marker)).is_ok() {
            found.push(name);
        }
    }
    Ok(found
        .into_iter()
        .max_by(|a, b| version_cmp(a, b))
        .map(|n| dir.join(n)))
}

/// Whether `p`'s file name matches `pattern`.
fn glob(p: &Path, pattern: &str) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| glob_str(pattern, n))
}

/// A shell pattern whose only wildcard is `*`.
fn glob_str(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((head, rest)) => {
            let Some(s) = s.strip_prefix(head) else {
                return false;
            };
            (0..=s.len()).any(|i| s.is_char_boundary(i) && glob_str(rest, &s[i..]))
        }
    }
}

/// `sort -V`'s order: runs of digits compare as numbers, the rest as
/// bytes.
fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn runs(s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut start = 0;
        let b = s.as_bytes();
        for i in 1..=b.len() {
            if i == b.len() || b[i].is_ascii_digit() != b[i - 1].is_ascii_digit() {
                out.push(&s[start..i]);
                start = i;
            }
        }
        out
    }
    // Digits padded to one width compare as numbers.
    let key = |r: &str| -> String {
        if r.bytes().all(|c| c.is_ascii_digit()) {
            format!("{:0>40}", r.trim_start_matches('0'))
        } else {
            r.to_string()
        }
    };
    let (ra, rb) = (runs(a), runs(b));
    for (x, y) in ra.iter().zip(&rb) {
        let o = key(x).cmp(&key(y));
        if o.is_ne() {
            return o;
        }
    }
    ra.len().cmp(&rb.len())
}

/// The files under `root` for which `pred` holds, as `find` lists them:
/// depth first, each directory in its own order, symlinks not followed.
fn find_all(root: &Path, pred: &dyn Fn(&Path, &fs::Metadata) -> bool) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    walk(root, pred, &mut out)?;
    Ok(out)
}

fn walk(
    dir: &Path,
    pred: &dyn Fn(&Path, &fs::Metadata) -> bool,
    out: &mut Vec<PathBuf>,
) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        let m = fs::symlink_metadata(&p)?;
        if pred(&p, &m) {
            out.push(p.clone());
        }
        if m.is_dir() {
            walk(&p, pred, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_str("libcuda.so.*.*", "libcuda.so.535.261.03"));
        assert!(!glob_str("libcuda.so.*.*", "libcuda.so.1"));
        assert!(glob_str(
            "linux-headers-*-cloud-amd64_*",
            "linux-headers-6.1.0-50-cloud-amd64_6.1.176-1"
        ));
        assert!(!glob_str(
            "linux-headers-*-cloud-amd64_*",
            "libcuda1_535.261.03-1"
        ));
        assert!(glob_str("*.deb", "a_1_amd64.deb"));
        assert!(!glob_str("*.deb", "a.deb.partial"));
        assert!(glob_str("nvidia-smi", "nvidia-smi"));
    }

    #[test]
    fn version_order() {
        let mut v = vec![
            "nvidia-smi_550.54.14-1",
            "nvidia-smi_535.261.03-1",
            "nvidia-smi_535.54.03-1",
            "nvidia-smi_535.261.03-10",
            "nvidia-smi_535.261.03-2",
        ];
        v.sort_by(|a, b| version_cmp(a, b));
        assert_eq!(
            v,
            [
                "nvidia-smi_535.54.03-1",
                "nvidia-smi_535.261.03-1",
                "nvidia-smi_535.261.03-2",
                "nvidia-smi_535.261.03-10",
                "nvidia-smi_550.54.14-1",
            ]
        );
    }

    #[test]
    fn newest_cached_needs_the_marker() {
        let d = tempfile::tempdir().unwrap();
        for (name, marker) in [
            ("libcuda1_9-1", true),
            ("libcuda1_10-1", false),
            ("libcuda1_8-1", true),
        ] {
            fs::create_dir(d.path().join(name)).unwrap();
            if marker {
                fs::create_dir(d.path().join(name).join("lib")).unwrap();
            }
        }
        let n = newest_cached(d.path(), "libcuda1_*", "lib")
            .unwrap()
            .unwrap();
        assert_eq!(n, d.path().join("libcuda1_9-1"));
        assert_eq!(
            newest_cached(d.path(), "nvidia-smi_*", "bin").unwrap(),
            None
        );
    }
}
