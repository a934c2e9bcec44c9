//! The one cache of heavy, deterministic builds (Go binaries, builder roots,
//! VM kernels, test data): its root is resolved once, and every entry is a
//! directory `<root>/<kind>/<key>` whose key is a hash of its inputs. An
//! entry is filled in `<kind>/.<key>.tmp` and renamed into place under the
//! kind's lock, so a killed build never leaves a half entry that looks done.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

/// What marks an entry as finished.
const COMPLETE: &str = ".complete";

pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// `GPU_DRIVER_CACHE`, else `$XDG_CACHE_HOME/gpu-driver`, else
    /// `~/.cache/gpu-driver`. Created if missing.
    pub fn resolve() -> Result<Self> {
        let root = match std::env::var_os("GPU_DRIVER_CACHE").filter(|v| !v.is_empty()) {
            Some(r) => PathBuf::from(r),
            None => match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
                Some(x) => PathBuf::from(x).join("gpu-driver"),
                None => {
                    let home = std::env::var_os("HOME")
                        .context("neither GPU_DRIVER_CACHE nor HOME is set")?;
                    PathBuf::from(home).join(".cache/gpu-driver")
                }
            },
        };
        fs::create_dir_all(&root)
            .with_context(|| format!("creating the cache root {}", root.display()))?;
        let root = fs::canonicalize(&root)?;
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A plain directory under the root that is not keyed (Go's module and
    /// build caches, which key their own contents).
    pub fn dir(&self, name: &str) -> Result<PathBuf> {
        let d = self.root.join(name);
        fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(d)
    }

    /// The entry of `kind` for `key`, locked until the entry is dropped.
    /// Marks it used and deletes the kind's other entries unused for
    /// `GPU_DRIVER_CACHE_GRACE_MIN` minutes (default 60: a second checkout
    /// running beside this one keeps its own).
    pub fn entry(&self, kind: &str, key: &Key) -> Result<Entry> {
        let dir = self.dir(kind)?;
        let lock = lock(&dir.join(".lock"))?;
        let path = dir.join(&key.0);
        if path.is_dir() {
            touch(&path)?;
        }
        prune(&dir, Some(&path), grace())?;
        Ok(Entry {
            path,
            tmp: dir.join(format!(".{}.tmp", key.0)),
            _lock: lock,
        })
    }

    /// Deletes, in each of `kinds`, the entries nobody used for `unused`
    /// (the CI machine's cache outlives many commits).
    pub fn prune_unused(&self, kinds: &[&str], unused: Duration) -> Result<()> {
        for kind in kinds {
            let dir = self.root.join(kind);
            if dir.is_dir() {
                let _lock = lock(&dir.join(".lock"))?;
                prune(&dir, None, unused)?;
            }
        }
        Ok(())
    }
}

/// The hash of an entry's inputs: 16 hex digits of a sha256 over lines
/// that name each input and its content.
pub struct Key(String);

#[derive(Default)]
pub struct KeyInputs(String);

impl KeyInputs {
    pub fn line(mut self, line: impl AsRef<str>) -> Self {
        self.0.push_str(line.as_ref());
        self.0.push('\n');
        self
    }

    /// `file <name> <sha256>` for each file, in the order given.
    pub fn files(mut self, base: &Path, names: &[String]) -> Result<Self> {
        for n in names {
            let p = base.join(n);
            let bytes = fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            self = self.line(format!("file {n} {}", hex::encode(Sha256::digest(&bytes))));
        }
        Ok(self)
    }

    pub fn key(&self) -> Key {
        Key(hex::encode(Sha256::digest(self.0.as_bytes()))[..16].to_string())
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub struct Entry {
    path: PathBuf,
    tmp: PathBuf,
    _lock: File,
}

impl Entry {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_complete(&self) -> bool {
        self.path.join(COMPLETE).is_file()
    }

    /// The finished entry: `build` fills an empty temporary directory,
    /// which is marked complete and renamed into place; a finished entry
    /// is returned as it is.
    pub fn fill(&self, build: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
        if self.is_complete() {
            return Ok(self.path.clone());
        }
        remove(&self.tmp)?;
        fs::create_dir_all(&self.tmp)?;
        build(&self.tmp)?;
        File::create(self.tmp.join(COMPLETE))?.write_all(b"")?;
        remove(&self.path)?;
        fs::rename(&self.tmp, &self.path).with_context(|| {
            format!("renaming {} to {}", self.tmp.display(), self.path.display())
        })?;
        Ok(self.path.clone())
    }
}

fn grace() -> Duration {
    let min = std::env::var("GPU_DRIVER_CACHE_GRACE_MIN")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(60);
    Duration::from_secs(min * 60)
}

/// An exclusive lock on `path`, waited for: two runs asking for the same
/// entry build it once.
fn lock(path: &Path) -> Result<File> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening the lock {}", path.display()))?;
    f.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(f)
}

fn touch(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.set_modified(SystemTime::now()))
        .with_context(|| format!("marking {} used", path.display()))
}

/// Deletes the directories in `dir` other than `keep` (entries and
/// leftover `.<key>.tmp`) whose mtime is older than `unused`.
fn prune(dir: &Path, keep: Option<&Path>, unused: Duration) -> Result<()> {
    let now = SystemTime::now();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let p = e.path();
        let ft = e.file_type()?;
        if !ft.is_dir() || Some(p.as_path()) == keep {
            continue;
        }
        let age = e
            .metadata()?
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok());
        if age.is_some_and(|a| a > unused) {
            remove(&p)?;
            eprintln!(
                "deleted {} (not this run's key, unused for {} min)",
                p.display(),
                unused.as_secs() / 60
            );
        }
    }
    Ok(())
}

/// `rm -rf` that stays on one file system (a builder root may have /proc
/// mounted if a run was killed).
pub fn remove(path: &Path) -> Result<()> {
    if fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let st = std::process::Command::new("rm")
        .args(["-rf", "--one-file-system", "--"])
        .arg(path)
        .status()
        .context("running rm")?;
    if !st.success() {
        bail!("rm -rf {} failed", path.display());
    }
    Ok(())
}
