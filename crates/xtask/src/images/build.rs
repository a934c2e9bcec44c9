//! `images build`: the binaries, the key, the locks, buildah, the archives
//! and images.json, and the pruning of other keys.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

use super::buildah::{Bud, Buildah};
use super::sys::{self, Timer};
use super::{IMAGES, Opts, base, meta};
use crate::cache::Cache;
use crate::cmd::{cmd, read, run};
use crate::static_build::{self, Arch};

const BASE_IMAGE: &str = "localhost/debian:bookworm-slim";
const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The module's source: part of the images' key (the checks in check.rs
/// change no image).
const SOURCE: [&str; 6] = [
    include_str!("mod.rs"),
    include_str!("build.rs"),
    include_str!("base.rs"),
    include_str!("buildah.rs"),
    include_str!("meta.rs"),
    include_str!("sys.rs"),
];

/// What goes into the images besides the Containerfiles.
struct Binaries {
    installer: PathBuf,
    operator: PathBuf,
    pause: PathBuf,
    exporter: PathBuf,
    plugin: PathBuf,
}

/// The cache directory of this key, built if needed.
pub fn build(repo: &Path, opts: &Opts) -> Result<PathBuf> {
    if !crate::apt::is_root() {
        bail!("needs root (debootstrap, buildah's chroot isolation)");
    }
    crate::apt::ensure(&[crate::apt::IMAGES])?;
    let cache = Cache::resolve()?;
    let images_dir = cache.root().join("images");
    // buildah sees /var/lib and /var/tmp through a private overlay.
    if images_dir.starts_with("/var/lib") || images_dir.starts_with("/var/tmp") {
        bail!(
            "the cache must not be under /var/lib or /var/tmp: {}",
            images_dir.display()
        );
    }
    let base_dir = images_dir.join("base");
    fs::create_dir_all(&base_dir).with_context(|| format!("creating {}", base_dir.display()))?;
    let mut t = Timer::default();
    t.stage("static binaries");
    let bins = binaries(repo, &cache)?;
    let mirror = std::env::var("GPU_DRIVER_DEBIAN_MIRROR")
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "http://deb.debian.org/debian".into());
    let base_key = base::key(&mirror);
    let key = key(repo, &bins, &base_key, &opts.packages)?;
    t.end();
    let job = Job {
        repo,
        opts,
        out: images_dir.join(&key[..16]),
        tag: key[..12].to_string(),
        base_tar: base_dir.join(format!("debian-bookworm-{base_key}.tar")),
        mirror,
        bins,
        images_dir,
    };
    job.run(&mut t).context("images not built")
}

fn binaries(repo: &Path, cache: &Cache) -> Result<Binaries> {
    let bins = ["gpu-driver-installer", "gpu-driver-operator"];
    let mut st = static_build::build(repo, &bins, Arch::X86_64)?.into_iter();
    let (installer, operator) = (
        st.next().context("no installer")?,
        st.next().context("no operator")?,
    );
    // The exporter is dynamically linked (it dlopens libnvidia-ml.so.1)
    // against this machine's glibc: Debian 12's, the exporter image's base.
    run(cmd("cargo").current_dir(repo).args([
        "build",
        "--release",
        "--locked",
        "-p",
        "gpu-driver-exporter",
        "--bin",
        "gpu-driver-exporter",
    ]))?;
    // NVIDIA's device plugin, for scripts/real-node (its own cache, by version).
    let plugin = crate::tools::device_plugin(repo, cache)?.join("bin/nvidia-device-plugin");
    let target = static_build::target_dir(repo)?;
    let pause = target.join("pause");
    let new = target.join("pause.new");
    run(cmd("gcc")
        .args(["-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&new)
        .arg(repo.join("images/pause.c")))?;
    fs::rename(&new, &pause).with_context(|| format!("renaming {}", new.display()))?;
    let kind = read(cmd("file").arg("-b").arg(&pause))?;
    if !kind.contains("statically linked") && !kind.contains("static-pie linked") {
        bail!("{} is not statically linked: {kind}", pause.display());
    }
    Ok(Binaries {
        installer,
        operator,
        pause,
        exporter: target.join("release/gpu-driver-exporter"),
        plugin,
    })
}

/// sha256 over the Containerfiles, this module's source, pause.c, the
/// five binaries, the base's key and the builder's extra packages.
fn key(repo: &Path, b: &Binaries, base_key: &str, packages: &str) -> Result<String> {
    let sha = |p: &Path| -> Result<String> {
        let bytes = fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        Ok(hex::encode(Sha256::digest(&bytes)))
    };
    let mut text = String::new();
    for (_, file, _) in IMAGES {
        text += &format!("{file} {}\n", sha(&repo.join("images").join(file))?);
    }
    text += &format!("source {}\n", hex::encode(Sha256::digest(SOURCE.concat())));
    text += &format!("pause.c {}\n", sha(&repo.join("images/pause.c"))?);
    for (what, p) in [
        ("installer", &b.installer),
        ("operator", &b.operator),
        ("pause", &b.pause),
        ("exporter", &b.exporter),
        ("nvidia-device-plugin", &b.plugin),
    ] {
        text += &format!("{what} {}\n", sha(p)?);
    }
    text += &format!("base {base_key}\nbuilder packages: {packages}\n");
    Ok(hex::encode(Sha256::digest(text.as_bytes())))
}

struct Job<'a> {
    repo: &'a Path,
    opts: &'a Opts,
    images_dir: PathBuf,
    /// `<cache>/images/<key16>`.
    out: PathBuf,
    tag: String,
    base_tar: PathBuf,
    mirror: String,
    bins: Binaries,
}

/// Paths removed when the build ends, failed or not (a work directory, a
/// half-made base root).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            if let Err(e) = sys::remove_tree(p) {
                eprintln!("warning: {e:#}");
            }
        }
    }
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

impl Job<'_> {
    fn complete(&self) -> bool {
        !self.opts.rebuild && self.out.join("images.json").is_file()
    }

    fn names(&self) -> Vec<(&'static str, String)> {
        IMAGES
            .iter()
            .map(|(image, _, prefix)| (*image, format!("{prefix}{}", self.tag)))
            .collect()
    }

    /// Under a shared lock a complete key is reused; else, under an
    /// exclusive one (someone may have built it while we waited), built.
    fn run(&self, t: &mut Timer) -> Result<PathBuf> {
        let lock_path = with_suffix(&self.out, ".lock");
        let lock = sys::lock_file(&lock_path)?;
        sys::wait_lock(&lock, &lock_path, true)?;
        if !self.complete() {
            lock.unlock()
                .with_context(|| format!("unlocking {}", lock_path.display()))?;
            sys::wait_lock(&lock, &lock_path, false)?;
        }
        if self.complete() {
            eprintln!("reusing {}", self.out.display());
            sys::touch(&self.out)?;
        } else {
            self.make(t)?;
            if self.opts.prune {
                t.stage("prune other keys");
                self.prune()?;
            }
        }
        t.end();
        let json = sys::read_capped(&self.out.join("images.json"), 1 << 20)?;
        let all = meta::parse(&json)
            .with_context(|| format!("reading {}/images.json", self.out.display()))?;
        for (image, _, _) in IMAGES {
            if let Some(m) = all.get(image) {
                eprintln!("{}", meta::summary(image, m));
            }
        }
        Ok(self.out.clone())
    }

    /// The base (made if missing), the images, their archives and
    /// images.json in `<key16>.tmp`, renamed into place.
    fn make(&self, t: &mut Timer) -> Result<()> {
        let mut cleanup = Cleanup(Vec::new());
        let base_lock_path = with_suffix(&self.base_tar, ".lock");
        let base_lock = sys::lock_file(&base_lock_path)?;
        sys::wait_lock(&base_lock, &base_lock_path, false)?;
        if self.opts.rebuild || !self.base_tar.is_file() {
            t.stage("base root (debootstrap bookworm minbase)");
            let root = with_suffix(&self.base_tar, ".root");
            cleanup.0.push(root.clone());
            sys::remove_tree(&root)?;
            base::make(&root, &self.base_tar, &self.mirror)?;
            sys::remove_tree(&root)?;
        }
        sys::touch(&self.base_tar)?;
        t.stage(format!("import base as {BASE_IMAGE}"));
        let (work, tmp) = (
            with_suffix(&self.out, ".work"),
            with_suffix(&self.out, ".tmp"),
        );
        sys::remove_tree(&work)?;
        sys::remove_tree(&tmp)?;
        cleanup.0.push(work.clone());
        fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let b = Buildah::new(&work)?;
        b.import_base(&self.base_tar, BASE_IMAGE)?;
        drop(base_lock);
        let ctx = self.context(&work.join("context"))?;
        for ((image, name), (_, file, _)) in self.names().iter().zip(IMAGES) {
            t.stage(format!("build {image}"));
            let bud = Bud {
                base: BASE_IMAGE,
                packages: &self.opts.packages,
                containerfile: &self.repo.join("images").join(file),
                name,
                ctx: &ctx,
            };
            b.bud(&bud, &work.join(format!("{image}.log")))?;
        }
        t.stage("push archives");
        for (image, name) in self.names() {
            b.push(&name, &tmp.join(format!("{image}.oci.tar")))?;
        }
        t.stage("record images.json");
        meta::record(&tmp, &self.names())?;
        t.stage("publish");
        sys::remove_tree(&work)?;
        sys::remove_tree(&self.out)?;
        fs::rename(&tmp, &self.out)
            .with_context(|| format!("renaming {} to {}", tmp.display(), self.out.display()))
    }

    /// The build context holds only what the Containerfiles copy, at the
    /// paths they name (those of a checkout after the binaries are built).
    fn context(&self, ctx: &Path) -> Result<PathBuf> {
        let b = &self.bins;
        let static_dir = ctx.join("target").join(STATIC_TARGET).join("release");
        for (from, to) in [
            (&b.installer, static_dir.join("gpu-driver-installer")),
            (&b.operator, static_dir.join("gpu-driver-operator")),
            (&b.pause, ctx.join("target/pause")),
            (&b.exporter, ctx.join("target/release/gpu-driver-exporter")),
            (&b.plugin, ctx.join("nvidia-device-plugin")),
        ] {
            if let Some(d) = to.parent() {
                fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            }
            fs::copy(from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
        Ok(ctx.to_path_buf())
    }

    /// Images and bases of other keys are never reused: those nobody holds
    /// a lock on and nobody used within the grace period are deleted.
    fn prune(&self) -> Result<()> {
        let grace = sys::grace();
        for (other, lock_path) in other_locks(&self.images_dir, |stem| {
            !stem.is_empty() && stem.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })? {
            if other == self.out {
                continue;
            }
            let f = sys::lock_file(&lock_path)?;
            if !sys::try_lock(&f, &lock_path)? {
                eprintln!("kept {} (in use)", other.display());
            } else if sys::used_within(&[other.clone(), lock_path.clone()], grace) {
                eprintln!(
                    "kept {} (used within {} min)",
                    other.display(),
                    grace.as_secs() / 60
                );
            } else {
                for suffix in ["", ".tmp", ".work"] {
                    sys::remove_tree(&with_suffix(&other, suffix))?;
                }
                remove_file(&lock_path)?;
                eprintln!("deleted {}", other.display());
            }
        }
        let base_dir = self.images_dir.join("base");
        for (other, lock_path) in other_locks(&base_dir, |stem| {
            stem.starts_with("debian-bookworm-") && stem.ends_with(".tar")
        })? {
            if other == self.base_tar {
                continue;
            }
            let f = sys::lock_file(&lock_path)?;
            if sys::try_lock(&f, &lock_path)?
                && !sys::used_within(&[other.clone(), lock_path.clone()], grace)
            {
                sys::remove_tree(&with_suffix(&other, ".root"))?;
                for suffix in ["", ".new", ".log", ".lock"] {
                    remove_file(&with_suffix(&other, suffix))?;
                }
                eprintln!("deleted {}", other.display());
            }
        }
        Ok(())
    }
}

/// The `<stem>.lock` files in `dir` whose stem `pick` selects, as
/// `(dir/stem, dir/stem.lock)`.
fn other_locks(dir: &Path, pick: impl Fn(&str) -> bool) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".lock").filter(|s| pick(s)) {
            found.push((dir.join(stem), dir.join(&name)));
        }
    }
    found.sort();
    Ok(found)
}

fn remove_file(p: &Path) -> Result<()> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("deleting {}", p.display()))
        }
        _ => Ok(()),
    }
}
