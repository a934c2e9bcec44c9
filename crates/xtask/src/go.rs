//! Go builds of the test dependencies (the Kubernetes control plane, helm,
//! NVIDIA's device plugin, Prometheus's parser). Every build uses this
//! machine's Go (never a toolchain a go.mod asks for) and one module and
//! build cache under the cache root, so a version bump only compiles what
//! changed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::cache::Cache;
use crate::cmd::{cmd, is_executable, on_path, read};

pub struct Go {
    bin: PathBuf,
    home: PathBuf,
}

impl Go {
    /// `GO`, else `go` on PATH, else /usr/local/go/bin/go.
    pub fn find(cache: &Cache) -> Result<Self> {
        let bin = match std::env::var_os("GO").filter(|v| !v.is_empty()) {
            Some(g) => PathBuf::from(g),
            None if on_path("go") => PathBuf::from("go"),
            None => PathBuf::from("/usr/local/go/bin/go"),
        };
        if bin.components().count() > 1 && !is_executable(&bin) {
            bail!("no Go toolchain at {} (set GO=/path/to/go)", bin.display());
        }
        Ok(Self {
            bin,
            home: cache.dir("go")?,
        })
    }

    /// `go version`'s line, part of every Go build's cache key.
    pub fn version(&self) -> Result<String> {
        let v = read(&mut self.go(Path::new("."), false, &["version"]))?;
        Ok(v.lines().next().unwrap_or_default().to_string())
    }

    /// `go ARGS...` in `dir`.
    pub fn go(&self, dir: &Path, cgo: bool, args: &[&str]) -> Command {
        let mut c = cmd(&self.bin);
        c.current_dir(dir)
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", if cgo { "1" } else { "0" })
            .env("GOPATH", &self.home)
            .env("GOMODCACHE", self.home.join("mod"))
            .env("GOCACHE", self.home.join("build"))
            .env_remove("GOFLAGS")
            .args(args);
        c
    }
}

/// The version a go.mod requires `module` at (`module vX.Y.Z` on a line).
pub fn required_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        let first = w.next()?;
        let (m, v) = if first == "require" {
            (w.next()?, w.next()?)
        } else {
            (first, w.next()?)
        };
        (m == module && v.starts_with('v')).then(|| v.to_string())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_required_versions() {
        let m = "module x\n\ngo 1.24\n\nrequire k8s.io/kubernetes v1.35.4\n\nrequire (\n\tk8s.io/client-go v0.35.4 // indirect\n)\n";
        assert_eq!(
            super::required_version(m, "k8s.io/kubernetes").as_deref(),
            Some("v1.35.4")
        );
        assert_eq!(
            super::required_version(m, "k8s.io/client-go").as_deref(),
            Some("v0.35.4")
        );
        assert_eq!(super::required_version(m, "k8s.io/api"), None);
    }
}
