//! apt with a private configuration under the cache: its own sources list
//! (contrib and non-free are needed, the host's list usually has only
//! main), lists and archives, so the system's apt setup is neither needed
//! nor changed. Also the parsers of what apt prints.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::cmd::cmd;
use crate::deadline;

const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// apt's own timeouts bound each connection; this bounds the whole call.
const APT_LIMIT: Duration = Duration::from_secs(30 * 60);

pub use crate::apt::debian_mirror as mirror;

pub struct Apt {
    root: PathBuf,
    /// Keep lists of other mirrors (`APT::Get::List-Cleanup=false`).
    keep_lists: bool,
}

impl Apt {
    /// The configuration in `root` for `suite` of `mirror`.
    pub fn new(root: &Path, mirror: &str, suite: &str, keep_lists: bool) -> Result<Self> {
        for d in ["lists/partial", "archives/partial", "etc"] {
            let p = root.join(d);
            std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        }
        let list = root.join("etc/sources.list");
        let line = format!("deb [signed-by={KEYRING}] {mirror} {suite} main contrib non-free\n");
        std::fs::write(&list, line).with_context(|| format!("writing {}", list.display()))?;
        Ok(Self {
            root: root.to_path_buf(),
            keep_lists,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn opts(&self) -> Vec<OsString> {
        let at = |k: &str, p: PathBuf| {
            let mut s = OsString::from(k);
            s.push("=");
            s.push(p);
            s
        };
        let mut o = vec![
            at("Dir::Etc::SourceList", self.root.join("etc/sources.list")),
            "Dir::Etc::SourceParts=/dev/null".into(),
            at("Dir::State::Lists", self.root.join("lists")),
            at("Dir::Cache", self.root.clone()),
            at("Dir::Cache::Archives", self.root.join("archives")),
        ];
        if self.keep_lists {
            o.push("APT::Get::List-Cleanup=false".into());
        }
        o.push("Debug::NoLocking=true".into());
        o.push("APT::Sandbox::User=root".into());
        o.into_iter()
            .flat_map(|v| [OsString::from("-o"), v])
            .collect()
    }

    fn apt(&self, tool: &str) -> Command {
        let mut c = cmd(tool);
        c.args(self.opts());
        c
    }

    /// `apt-get update`, its stderr in `log` when one is given.
    pub fn update(&self, log: Option<&Path>) -> Result<()> {
        let mut c = self.apt("apt-get");
        c.args(["-qq", "update"]);
        if let Some(log) = log {
            let f = std::fs::File::create(log)
                .with_context(|| format!("creating {}", log.display()))?;
            c.stderr(f);
        }
        deadline::run(&mut c, APT_LIMIT)
    }

    /// Field `name` of `pkg`'s newest version; `None` if apt does not know
    /// the package (e.g. the lists for this mirror could not be downloaded).
    pub fn field(&self, pkg: &str, name: &str) -> Option<String> {
        let mut c = self.apt("apt-cache");
        c.args(["show", "--no-all-versions", pkg])
            .stderr(Stdio::null());
        let out = deadline::read(&mut c, APT_LIMIT).ok()?;
        parse_field(&out, name)
    }

    /// `apt-get download SPECS` into `dir`.
    pub fn download(&self, dir: &Path, specs: &[String]) -> Result<()> {
        let mut c = self.apt("apt-get");
        c.args(["-qq", "download"]).args(specs).current_dir(dir);
        deadline::run(&mut c, APT_LIMIT)
    }
}

/// The value of the first `Name: value` line of `apt-cache show`'s output.
pub fn parse_field(show: &str, name: &str) -> Option<String> {
    show.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
        .map(str::to_string)
        .filter(|v| !v.is_empty())
}

/// The headers package of the current ABI that the meta package
/// linux-headers-cloud-amd64 depends on (linux-headers-6.1.0-NN-cloud-amd64).
pub fn abi_headers(depends: &str) -> Option<String> {
    depends.split(',').find_map(|d| {
        let name = d.trim_start().split(' ').next()?;
        (name.starts_with("linux-headers-") && name.ends_with("-cloud-amd64") && name.len() >= 26)
            .then(|| name.to_string())
    })
}

/// The package names of a Depends field, alternatives included.
pub fn dep_names(depends: &str) -> Vec<String> {
    depends
        .split([',', '|'])
        .map(|d| d.trim_start().split(' ').next().unwrap_or("").to_string())
        .filter(|d| !d.is_empty())
        .collect()
}

/// Of a headers package's dependencies, the -common headers and the
/// linux-kbuild package an external module build needs (linux-image, the
/// compiler and linux-base are not needed).
pub fn headers_parts(deps: &[String]) -> Option<(String, String)> {
    let common = deps.iter().find(|d| {
        d.starts_with("linux-headers-") && d["linux-headers-".len()..].contains("-common")
    })?;
    let kbuild = deps.iter().find(|d| d.starts_with("linux-kbuild-"))?;
    Some((common.clone(), kbuild.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `apt-cache show --no-all-versions` of bookworm's packages.
    const META: &str = "Package: linux-headers-cloud-amd64
Source: linux-signed-amd64 (6.1.176+1)
Version: 6.1.176-1
Installed-Size: 13
Maintainer: Debian Kernel Team <debian-kernel@lists.debian.org>
Architecture: amd64
Depends: linux-headers-6.1.0-50-cloud-amd64 (= 6.1.176-1)
Description: Header files for Linux cloud-amd64 configuration (meta-package)
Description-md5: 1ecc6813d72a208f2bd83ca51c00d93e
Homepage: https://www.kernel.org/
Built-Using: linux (= 6.1.176-1)
Section: kernel
Priority: optional
Filename: pool/main/l/linux-signed-amd64/linux-headers-cloud-amd64_6.1.176-1_amd64.deb
Size: 1416
SHA256: 9e94d84c15cef96e56386b3a5a69f3242fb6edb121001efc974089c4a2e59e6c

";
    const HEADERS: &str = "Package: linux-headers-6.1.0-50-cloud-amd64
Source: linux
Version: 6.1.176-1
Installed-Size: 2639
Architecture: amd64
Depends: linux-headers-6.1.0-50-common (= 6.1.176-1), linux-kbuild-6.1 (>= 6.1.176-1), linux-compiler-gcc-12-x86
Description: Header files for Linux 6.1.0-50-cloud-amd64
Section: kernel
";
    const SMI: &str = "Package: nvidia-smi
Source: nvidia-graphics-drivers
Version: 535.261.03-1
Depends: nvidia-alternative (= 535.261.03-1), libnvidia-ml1 (= 535.261.03-1), libc6 (>= 2.34)
Recommends: nvidia-kernel-dkms (= 535.261.03-1) | nvidia-kernel-535.261.03 | nvidia-open-kernel-535.261.03
Description: NVIDIA System Management Interface
Section: non-free/utils
";

    #[test]
    fn fields() {
        assert_eq!(parse_field(SMI, "Version").as_deref(), Some("535.261.03-1"));
        assert_eq!(parse_field(META, "Version").as_deref(), Some("6.1.176-1"));
        // Description-md5 is not Description.
        assert_eq!(
            parse_field(META, "Description-md5").as_deref(),
            Some("1ecc6813d72a208f2bd83ca51c00d93e")
        );
        assert_eq!(parse_field(SMI, "Pre-Depends"), None);
        assert_eq!(parse_field("", "Version"), None);
    }

    #[test]
    fn the_abi_headers_and_their_parts() {
        let dep = parse_field(META, "Depends").unwrap();
        assert_eq!(
            abi_headers(&dep).as_deref(),
            Some("linux-headers-6.1.0-50-cloud-amd64")
        );
        assert_eq!(abi_headers("linux-headers-cloud-amd64"), None);
        let deps = dep_names(&parse_field(HEADERS, "Depends").unwrap());
        assert_eq!(
            deps,
            [
                "linux-headers-6.1.0-50-common",
                "linux-kbuild-6.1",
                "linux-compiler-gcc-12-x86"
            ]
        );
        assert_eq!(
            headers_parts(&deps),
            Some((
                "linux-headers-6.1.0-50-common".to_string(),
                "linux-kbuild-6.1".to_string()
            ))
        );
        let alts = dep_names(&parse_field(SMI, "Recommends").unwrap());
        assert_eq!(alts.len(), 3);
        assert_eq!(headers_parts(&alts), None);
    }
}
