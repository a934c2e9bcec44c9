//! The project's container images, built with buildah (no daemon) and
//! saved as OCI archives, for tests that import them into a containerd
//! (`ctr -n k8s.io images import FILE`) where no registry is reachable;
//! `images check` imports them into a throwaway containerd and runs them.
//! `scripts/build-images` and `scripts/check-images` are their entry points.
//!
//! Images, each from its Containerfile in images/ (`<tag>` = the cache
//! key's first 12 hex digits): see [`IMAGES`]. The binaries come from
//! `cargo xtask static-build` (the installer and the operator),
//! `gcc -static` (images/pause.c, to target/pause), `cargo build --release`
//! (the exporter, dynamically linked: Debian 12's glibc, the base's) and
//! `cargo xtask tool device-plugin` (NVIDIA's device plugin, for
//! scripts/real-node only).
//!
//! Docker Hub is not needed: the Containerfiles' DEBIAN_IMAGE is set to
//! localhost/debian:bookworm-slim, a base made here (base.rs) and cached as
//! `<cache>/images/base/debian-bookworm-<basekey>.tar`, basekey = sha256 of
//! base.rs and the mirrors (first 16 hex digits). The RUN steps (apt-get)
//! need the Debian archive: GPU_DRIVER_DEBIAN_MIRROR (default
//! http://deb.debian.org/debian), security updates from
//! http://deb.debian.org/debian-security.
//!
//! buildah's storage is private and thrown away (buildah.rs): vfs under
//! `<cache>/images/<key16>.work`. Runs as root.
//!
//! Cache: `<cache>/images/<key16>/` holds the archives (`<image>.oci.tar`)
//! and images.json (meta.rs). key = sha256 of this module's source, the
//! Containerfiles, pause.c, the five binaries, the base's key and
//! `--packages`. A complete directory is reused without running buildah.
//! Built into `<key16>.tmp` and renamed when complete, under an exclusive
//! flock on `<key16>.lock` (users may hold a shared lock). Other keys'
//! directories and bases nobody holds a lock on and nobody used for
//! GPU_DRIVER_CACHE_GRACE_MIN minutes (default 60) are deleted afterwards
//! (unless `--no-prune`).
//!
//! Stage timings go to stderr; the last line of stdout is the cache
//! directory.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

mod base;
mod build;
mod buildah;
mod check;
mod meta;
mod sys;

/// Image, Containerfile in images/, name before the tag; the order they
/// are built in.
const IMAGES: [(&str, &str, &str); 6] = [
    (
        "installer",
        "installer.Containerfile",
        "localhost/gpu-driver-installer:",
    ),
    (
        "operator",
        "operator.Containerfile",
        "localhost/gpu-driver-operator:",
    ),
    (
        "builder-bookworm",
        "builder-debian.Containerfile",
        "localhost/gpu-driver-builder:bookworm-",
    ),
    ("pause", "pause.Containerfile", "localhost/pause:"),
    (
        "exporter",
        "exporter.Containerfile",
        "localhost/gpu-driver-exporter:",
    ),
    (
        "nvidia-device-plugin",
        "nvidia-device-plugin.Containerfile",
        "localhost/nvidia-device-plugin:",
    ),
];

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Builds the images (or finds them in the cache) and prints their
    /// cache directory, <cache>/images/<key16>, with <image>.oci.tar and
    /// images.json (scripts/build-images). Runs as root.
    Build {
        /// Rebuild the base and the images even if cached (the RUN steps'
        /// packages come from the archive at build time).
        #[arg(long)]
        rebuild: bool,
        /// More Debian packages for the builder image, e.g. the node
        /// kernel's linux-headers-<release>.
        #[arg(long, value_name = "LIST", default_value = "")]
        packages: String,
        /// Keep other keys' images and bases.
        #[arg(long)]
        no_prune: bool,
    },
    /// Imports the archives into a throwaway containerd and runs each
    /// image once: every image is listed under its images.json name; the
    /// installer and the operator print their usage; the builder has gcc,
    /// make, kmod and xz and its apt sources work; pause runs until SIGTERM
    /// and then exits 0 (scripts/check-images). Runs as root.
    Check {
        /// `images build`'s output (default: run it).
        dir: Option<PathBuf>,
    },
}

#[derive(Default)]
struct Opts {
    rebuild: bool,
    packages: String,
    prune: bool,
}

pub fn run(repo: &Path, cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Build {
            rebuild,
            packages,
            no_prune,
        } => {
            let opts = Opts {
                rebuild,
                packages,
                prune: !no_prune,
            };
            println!("{}", build::build(repo, &opts)?.display());
            Ok(())
        }
        Cmd::Check { dir } => {
            if !crate::apt::is_root() {
                bail!("needs root (containerd, mount namespace)");
            }
            crate::apt::ensure(&[crate::apt::CONTAINERD])?;
            let dir = match dir {
                Some(d) => d,
                // As its callers run it: the last stdout line is the path.
                None => PathBuf::from(crate::cmd::read_last_line(&mut crate::cmd::cmd(
                    repo.join("scripts/build-images"),
                ))?),
            };
            check::check(&dir)
        }
    }
}
