//! Writable host roots for install tests that must never reach the kernel
//! of the machine running them. Included with `#[path]` by the tests that
//! use it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn t4_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts/debian-12-t4-headers")
}

/// A copy (at `dir/host`) of the T4 fixture host root (one GPU on its PCI
/// bus) that install can complete in: `/dev`, this machine's own static
/// ldconfig, an `ld.so.conf` that includes `ld.so.conf.d`.
pub fn installable_host(dir: &Path) -> PathBuf {
    let host = dir.join("host");
    let st = Command::new("cp")
        .arg("-a")
        .arg(t4_fixture())
        .arg(&host)
        .status()
        .unwrap();
    assert!(st.success());
    for d in ["dev", "sbin", "etc/ld.so.conf.d"] {
        fs::create_dir_all(host.join(d)).unwrap();
    }
    fs::copy("/sbin/ldconfig", host.join("sbin/ldconfig")).unwrap();
    fs::write(
        host.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    host
}

/// A module install must find loaded already: its name and the identity
/// the kernel shows in `/sys/module/<name>/`.
pub struct Loaded<'a> {
    pub name: &'a str,
    pub version: Option<&'a str>,
    pub srcversion: Option<&'a str>,
}

/// Lists `modules` as loaded in the host root's `/proc/modules` (after
/// the fixture's own) with their `version`/`srcversion`, so that install
/// finds them loaded (`AlreadyInstalled`) and never calls finit_module.
pub fn mark_loaded(host: &Path, modules: &[Loaded]) {
    let mut text = fs::read_to_string(t4_fixture().join("proc/modules")).unwrap();
    for m in modules {
        // Without an identity install would try a real load: never here.
        assert!(
            m.version.is_some() || m.srcversion.is_some(),
            "{} has no version or srcversion",
            m.name
        );
        let dir = host.join("sys/module").join(m.name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        if let Some(v) = m.version {
            fs::write(dir.join("version"), format!("{v}\n")).unwrap();
        }
        if let Some(v) = m.srcversion {
            fs::write(dir.join("srcversion"), format!("{v}\n")).unwrap();
        }
        text.push_str(&format!("{} 16384 0 - Live 0x0000000000000000\n", m.name));
    }
    fs::write(host.join("proc/modules"), text).unwrap();
}

/// The host root's `ld.so.cache` as `ldconfig -p` lists it.
pub fn ld_cache(host: &Path) -> String {
    let out = Command::new("/sbin/ldconfig")
        .arg("-C")
        .arg(host.join("etc/ld.so.cache"))
        .arg("-p")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
