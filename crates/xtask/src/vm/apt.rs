//! A private apt configuration under the cache (its own sources, lists and
//! archives), so the system's apt setup is neither needed nor changed, and
//! the parsers of what `apt-cache show` prints.

use std::cmp::Ordering;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result};

use super::proc;
use crate::cmd::cmd;

/// Debian's archive key, as Debian's own sources name it.
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

pub use crate::apt::debian_mirror as mirror;

pub struct Apt {
    root: PathBuf,
    /// arm64's packages on this x86_64 machine.
    arm64: bool,
    updated: bool,
}

impl Apt {
    /// The configuration in `<cache_dir>/apt`: bookworm and
    /// bookworm-backports main for x86_64, bookworm main for arm64.
    pub fn new(cache_dir: &Path, arm64: bool) -> Result<Self> {
        let root = cache_dir.join("apt");
        for d in ["lists/partial", "archives/partial", "etc"] {
            fs::create_dir_all(root.join(d))
                .with_context(|| format!("creating {}", root.join(d).display()))?;
        }
        let m = mirror();
        let sources = if arm64 {
            format!("deb [arch=arm64 signed-by={KEYRING}] {m} bookworm main\n")
        } else {
            format!(
                "deb [signed-by={KEYRING}] {m} bookworm main\n\
                 deb [signed-by={KEYRING}] {m} bookworm-backports main\n"
            )
        };
        let list = root.join("etc/sources.list");
        super::write_atomic(&list, sources.as_bytes())?;
        Ok(Self {
            root,
            arm64,
            updated: false,
        })
    }

    /// `apt-get` or `apt-cache` with the private configuration.
    fn tool(&self, name: &str) -> Command {
        let r = self.root.display();
        let mut c = cmd(name);
        let mut opts = vec![
            format!("Dir::Etc::SourceList={r}/etc/sources.list"),
            "Dir::Etc::SourceParts=/dev/null".to_string(),
            format!("Dir::State::Lists={r}/lists"),
        ];
        if self.arm64 {
            // Nothing of the host's dpkg database applies to arm64.
            opts.push("Dir::State::status=/dev/null".to_string());
        }
        opts.push(format!("Dir::Cache={r}"));
        opts.push(format!("Dir::Cache::Archives={r}/archives"));
        if self.arm64 {
            opts.push("APT::Architecture=arm64".to_string());
            opts.push("APT::Architectures::=arm64".to_string());
        }
        opts.extend(
            [
                "APT::Get::List-Cleanup=false",
                "Debug::NoLocking=true",
                "APT::Sandbox::User=root",
            ]
            .map(String::from),
        );
        for o in opts {
            c.arg("-o").arg(o);
        }
        c
    }

    /// `apt-get update`, once per run.
    pub fn update(&mut self) -> Result<()> {
        if self.updated {
            return Ok(());
        }
        proc::run(self.tool("apt-get").args(["-qq", "update"]), proc::NETWORK)?;
        self.updated = true;
        Ok(())
    }

    /// Downloads `pkgs`' .debs into `dir`.
    pub fn download(&self, dir: &Path, pkgs: &[String]) -> Result<()> {
        proc::run(
            self.tool("apt-get")
                .current_dir(dir)
                .args(["-qq", "download"])
                .args(pkgs),
            proc::NETWORK,
        )
    }

    /// What `apt-cache show [--no-all-versions] PKG` prints.
    pub fn show(&self, pkg: &str, all_versions: bool) -> Result<String> {
        let mut c = self.tool("apt-cache");
        c.arg("show");
        if !all_versions {
            c.arg("--no-all-versions");
        }
        proc::read(c.arg(pkg), proc::SHORT, 16 << 20)
    }
}

/// The linux-headers-* and linux-kbuild-* packages in the first `Depends:`
/// of `apt-cache show` (the headers of a release need the common headers
/// and kbuild).
pub fn kernel_deps(show: &str) -> Vec<String> {
    let Some(deps) = show.lines().find_map(|l| l.strip_prefix("Depends: ")) else {
        return Vec::new();
    };
    deps.split(',')
        .map(|d| {
            let d = d.trim_start();
            d.split([' ', '(']).next().unwrap_or_default().to_string()
        })
        .filter(|d| d.starts_with("linux-headers-") || d.starts_with("linux-kbuild-"))
        .collect()
}

/// The newest release `linux-headers-cloud-amd64` depends on over all its
/// versions (bookworm's and bookworm-backports'), by version order.
pub fn newest_cloud_release(show: &str) -> Option<String> {
    show.lines()
        .filter_map(|l| l.strip_prefix("Depends: linux-headers-"))
        .filter_map(|rest| {
            let token = rest.split([' ', ',']).next()?;
            let end = token.rfind("-cloud-amd64")? + "-cloud-amd64".len();
            Some(token[..end].to_string())
        })
        .max_by(|a, b| version_cmp(a, b))
}

/// `sort -V`'s order: runs of digits compare as numbers, the rest as text.
fn version_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.is_empty(), b.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let (ra, rest_a) = chunk(a);
        let (rb, rest_b) = chunk(b);
        let ord = match (ra.parse::<u128>(), rb.parse::<u128>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            _ => ra.cmp(rb),
        };
        if ord != Ordering::Equal {
            return ord;
        }
        (a, b) = (rest_a, rest_b);
    }
}

/// The leading run of digits or of other characters, and the rest.
fn chunk(s: &str) -> (&str, &str) {
    let digit = s.starts_with(|c: char| c.is_ascii_digit());
    let end = s
        .find(|c: char| c.is_ascii_digit() != digit)
        .unwrap_or(s.len());
    s.split_at(end)
}

#[cfg(test)]
mod tests {
    /// `apt-cache show --no-all-versions linux-headers-6.1.0-50-cloud-amd64`.
    const HEADERS: &str = "\
Package: linux-headers-6.1.0-50-cloud-amd64
Source: linux
Version: 6.1.176-1
Installed-Size: 2639
Maintainer: Debian Kernel Team <debian-kernel@lists.debian.org>
Architecture: amd64
Depends: linux-headers-6.1.0-50-common (= 6.1.176-1), linux-kbuild-6.1 (>= 6.1.176-1), linux-compiler-gcc-12-x86
Description: Header files for Linux 6.1.0-50-cloud-amd64
Description-md5: 37a52777c26764489075ac05f08ce809
Homepage: https://www.kernel.org/
Section: kernel
Priority: optional
Filename: pool/main/l/linux/linux-headers-6.1.0-50-cloud-amd64_6.1.176-1_amd64.deb
Size: 1440280
";

    /// `apt-cache show linux-headers-cloud-amd64` (bookworm-backports' and
    /// bookworm's versions), fields shortened.
    const META: &str = "\
Package: linux-headers-cloud-amd64
Source: linux-signed-amd64 (6.12.95+1~bpo12+1)
Version: 6.12.95-1~bpo12+1
Architecture: amd64
Depends: linux-headers-6.12.95+deb12-cloud-amd64 (= 6.12.95-1~bpo12+1)
Homepage: https://www.kernel.org/

Package: linux-headers-cloud-amd64
Source: linux-signed-amd64 (6.1.176+1)
Version: 6.1.176-1
Architecture: amd64
Depends: linux-headers-6.1.0-50-cloud-amd64 (= 6.1.176-1)
Homepage: https://www.kernel.org/
Built-Using: linux (= 6.1.176-1)
";

    #[test]
    fn kernel_deps_of_the_headers() {
        assert_eq!(
            super::kernel_deps(HEADERS),
            ["linux-headers-6.1.0-50-common", "linux-kbuild-6.1"]
        );
        assert!(super::kernel_deps("Package: x\n").is_empty());
    }

    #[test]
    fn newest_cloud_release_by_version() {
        assert_eq!(
            super::newest_cloud_release(META).as_deref(),
            Some("6.12.95+deb12-cloud-amd64")
        );
        assert_eq!(super::newest_cloud_release(HEADERS), None);
        let two = "Depends: linux-headers-6.1.0-9-cloud-amd64\n\
                   Depends: linux-headers-6.1.0-10-cloud-amd64, foo\n";
        assert_eq!(
            super::newest_cloud_release(two).as_deref(),
            Some("6.1.0-10-cloud-amd64")
        );
    }
}
