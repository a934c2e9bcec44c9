//! buildah with a private, throwaway storage: vfs under the work directory
//! (`--root`, `--runroot`, a storage.conf of our own so that no system or
//! user configuration applies), `--isolation chroot`, and a mount
//! namespace of its own where /var/lib and /var/tmp lead into the work
//! directory too: nothing is written to /var/lib/containers.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use super::sys;
use crate::cmd::cmd;

/// In the new mount namespace: /var/lib is an overlay whose changes land
/// in work/varlib (as root, buildah 1.28 always writes its blob info cache
/// to /var/lib/containers/cache) and /var/tmp is work/tmp
/// (containers/storage's temporary layer files ignore TMPDIR). The work
/// directory comes in as `$1`, the command after it.
const NAMESPACE_SETUP: &str = r#"w=$1; shift
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$w/varlib/upper,workdir=$w/varlib/work" /var/lib && mount --bind "$w/tmp" /var/tmp && exec "$@""#;

const STEP: Duration = Duration::from_secs(600);
/// One image's build: the builder's RUN step installs a compiler from the
/// archive.
const BUILD: Duration = Duration::from_secs(3600);

pub struct Buildah {
    work: PathBuf,
}

impl Buildah {
    /// The storage in `work` (created, with its storage.conf).
    pub fn new(work: &Path) -> Result<Self> {
        for d in ["tmp", "varlib/upper", "varlib/work"] {
            let p = work.join(d);
            fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        }
        let conf = format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            work.join("root").display(),
            work.join("run").display()
        );
        let p = work.join("storage.conf");
        fs::write(&p, conf).with_context(|| format!("writing {}", p.display()))?;
        Ok(Self {
            work: work.to_path_buf(),
        })
    }

    fn cmd(&self) -> Command {
        let mut c = cmd("unshare");
        c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(NAMESPACE_SETUP)
            .arg("sh")
            .arg(&self.work)
            .arg("buildah")
            .arg("--root")
            .arg(self.work.join("root"))
            .arg("--runroot")
            .arg(self.work.join("run"))
            .args(["--storage-driver", "vfs"])
            .env("TMPDIR", self.work.join("tmp"))
            .env("BUILDAH_ISOLATION", "chroot")
            .env("CONTAINERS_STORAGE_CONF", self.work.join("storage.conf"));
        c
    }

    /// Imports the root file system tar `tar` as the image `name`.
    pub fn import_base(&self, tar: &Path, name: &str) -> Result<()> {
        let out = sys::output(
            self.cmd().args(["from", "--name", "base", "scratch"]),
            4096,
            STEP,
        )?;
        let c = parse_container(&out)?;
        sys::run_quiet(self.cmd().args(["add", &c]).arg(tar).arg("/"), STEP)?;
        sys::run(
            self.cmd()
                .args(["config", "--os", "linux", "--arch", "amd64", "--created-by"])
                .arg("debootstrap --variant=minbase bookworm (scripts/build-images)")
                .args([
                    "--env",
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ])
                .args(["--cmd", "bash", &c]),
            STEP,
        )?;
        sys::run_quiet(
            self.cmd().args(["commit", "--quiet", "--rm", &c, name]),
            STEP,
        )
    }

    /// Builds `containerfile` in `ctx` as `name`, its output in `log`.
    /// `--layers`: the installer's and the operator's identical certs
    /// stage is built once.
    pub fn bud(&self, b: &Bud, log: &Path) -> Result<()> {
        sys::run_logged(
            self.cmd()
                .args(["bud", "--isolation", "chroot", "--pull=never", "--layers"])
                .arg("--build-arg")
                .arg(format!("DEBIAN_IMAGE={}", b.base))
                .arg("--build-arg")
                .arg(format!("EXTRA_PACKAGES={}", b.packages))
                .arg("-f")
                .arg(b.containerfile)
                .args(["-t", b.name])
                .arg(b.ctx),
            log,
            30,
            BUILD,
        )
    }

    /// Saves `name` as an OCI archive. The reference after the path
    /// becomes the index's org.opencontainers.image.ref.name: the full
    /// name, which `ctr images import` takes as the image's name.
    pub fn push(&self, name: &str, archive: &Path) -> Result<()> {
        sys::run(
            self.cmd()
                .args(["push", "--quiet", "--format", "oci", name])
                .arg(format!("oci-archive:{}:{name}", archive.display())),
            STEP,
        )
    }
}

pub struct Bud<'a> {
    pub base: &'a str,
    pub packages: &'a str,
    pub containerfile: &'a Path,
    pub name: &'a str,
    pub ctx: &'a Path,
}

/// `buildah from`'s output: the new container's name on its last line.
fn parse_container(out: &[u8]) -> Result<String> {
    let text = String::from_utf8_lossy(out);
    match text.lines().map(str::trim).rfind(|l| !l.is_empty()) {
        Some(c) if !c.contains(char::is_whitespace) => Ok(c.to_string()),
        _ => bail!("buildah from printed no container name: {text:?}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_container_name() {
        assert_eq!(super::parse_container(b"base\n").unwrap(), "base");
        assert_eq!(
            super::parse_container(b"Getting image source signatures\nbase-working-container\n")
                .unwrap(),
            "base-working-container"
        );
        assert!(super::parse_container(b"\n").is_err());
    }
}
