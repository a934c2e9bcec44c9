//! Reading what apt, dpkg and the kernel headers say, and the root's
//! record: pure functions, tested on captured output.

use std::cmp::Ordering;

use crate::pyjson::J;

/// The versioned headers package that `apt-cache depends` of the
/// `linux-headers-cloud-<arch>` meta package names first.
pub(super) fn abi_headers(depends: &str) -> Option<String> {
    depends.lines().find_map(|l| {
        let rest = l.trim_start().strip_prefix("Depends: ")?;
        let name = rest.split(':').next()?.trim();
        name.starts_with("linux-headers-").then(|| name.to_string())
    })
}

/// The first `Field: value` of `apt-cache show` output.
pub(super) fn field(show: &str, name: &str) -> Option<String> {
    let prefix = format!("{name}: ");
    show.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(|v| v.trim().to_string()))
}

/// From a headers package's Depends: its -common headers, its kbuild and
/// the gcc major it was built with.
pub(super) fn cross_needs(depends: &str) -> Option<(String, String, String)> {
    let parts: Vec<&str> = depends.split(',').map(str::trim_start).collect();
    let named = |pre: &str, suffix: &str| {
        parts.iter().find_map(|p| {
            let (name, rest) = p.split_once(' ')?;
            (name.starts_with(pre) && name.ends_with(suffix) && !rest.is_empty())
                .then(|| name.to_string())
        })
    };
    let common = named("linux-headers-", "-common")?;
    let kbuild = named("linux-kbuild-", "")?;
    let gcc = parts.iter().find_map(|p| {
        let digits: String = p
            .strip_prefix("gcc-")?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let after = p.get(4 + digits.len()..).and_then(|r| r.chars().next());
        (!digits.is_empty() && !after.is_some_and(|c| c.is_alphanumeric() || c == '_'))
            .then_some(digits)
    })?;
    Some((common, kbuild, gcc))
}

/// The gcc major a kernel's `.config` was built with.
pub(super) fn cc_major(config: &str) -> Option<String> {
    config.lines().find_map(|l| {
        let v = l.strip_prefix("CONFIG_CC_VERSION_TEXT=\"gcc-")?;
        let major: String = v.chars().take_while(char::is_ascii_digit).collect();
        (!major.is_empty() && v[major.len()..].starts_with(' ')).then_some(major)
    })
}

/// The newest kernel release among `/usr/src` entries named
/// `linux-headers-<release>` with `-cloud-<arch>` at the end.
pub(super) fn newest_release<'a>(
    names: impl Iterator<Item = &'a str>,
    arch: &str,
) -> Option<String> {
    let suffix = format!("-cloud-{arch}");
    names
        .filter_map(|n| n.strip_prefix("linux-headers-"))
        .filter(|r| r.ends_with(&suffix))
        .max_by(|a, b| version_cmp(a, b))
        .map(String::from)
}

/// `sort -V`'s order for kernel releases: runs of digits compare as numbers.
fn version_cmp(a: &str, b: &str) -> Ordering {
    let chunks = |s: &str| -> Vec<(bool, String)> {
        let mut v: Vec<(bool, String)> = Vec::new();
        for c in s.chars() {
            let d = c.is_ascii_digit();
            match v.last_mut() {
                Some((kind, run)) if *kind == d => run.push(c),
                _ => v.push((d, c.to_string())),
            }
        }
        v
    };
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(&cb) {
        let o = match (x.0, y.0) {
            (true, true) => {
                let (p, q) = (x.1.trim_start_matches('0'), y.1.trim_start_matches('0'));
                p.len().cmp(&q.len()).then_with(|| p.cmp(q))
            }
            _ => x.1.cmp(&y.1),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    ca.len().cmp(&cb.len())
}

/// `dpkg-query -W -f '${db:Status-Abbrev}\t${Package}\t${Version}\n'`: the
/// installed packages and their versions.
pub(super) fn installed(query: &str) -> Vec<(String, String)> {
    query
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (status, pkg) = (f.next()?, f.next()?);
            let version: Vec<&str> = f.collect();
            status
                .starts_with("ii")
                .then(|| (pkg.to_string(), version.join("\t")))
        })
        .collect()
}

/// `dpkg-deb -f DEB Package Version Architecture`.
pub(super) fn deb_fields(out: &str) -> Option<(String, String, String)> {
    Some((
        field(out, "Package")?,
        field(out, "Version")?,
        field(out, "Architecture")?,
    ))
}

/// The packages a root's record lists: those requested and what they
/// resolved to (the headers of the exact release, the versioned gcc,
/// kbuild), in name order, then the unpacked foreign ones.
pub(super) fn recorded_packages(
    requested: &[String],
    krel: &str,
    installed: &[(String, String)],
    unpacked: &[(String, String, String)],
) -> J {
    let resolved = |n: &str| {
        let gcc = n
            .strip_prefix("gcc-")
            .map(|r| r.trim_end_matches("-aarch64-linux-gnu"))
            .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()));
        gcc || (n.starts_with("linux-headers-") && n.ends_with("-common"))
            || n.starts_with("linux-kbuild-")
    };
    let mut wanted: Vec<String> = requested.to_vec();
    wanted.push(format!("linux-headers-{krel}"));
    let kver = krel.split('-').next().unwrap_or(krel);
    wanted.push(format!("linux-kbuild-{kver}"));
    wanted.extend(
        installed
            .iter()
            .filter(|(n, _)| resolved(n))
            .map(|(n, _)| n.clone()),
    );
    wanted.sort();
    wanted.dedup();
    let mut out: Vec<(String, J)> = wanted
        .iter()
        .filter_map(|w| {
            let v = installed.iter().find(|(n, _)| n == w)?;
            Some((w.clone(), J::str(&v.1)))
        })
        .collect();
    for (name, version, arch) in unpacked {
        let v = J::str(format!("{version} ({arch}, unpacked)"));
        match out.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 = v,
            None => out.push((name.clone(), v)),
        }
    }
    J::Obj(out)
}

/// What a root's record says, for the log.
pub(super) fn summary(meta: &J) -> String {
    let mut s = format!(
        "builder root {} (key {}), made {}: kernel {}, {}\n",
        meta.get("suite").py_str(),
        meta.get("key").py_str(),
        meta.get("created").py_str(),
        meta.get("kernelRelease").py_str(),
        meta.get("gcc").py_str()
    );
    if let J::Obj(kv) = meta.get("packages") {
        let mut kv: Vec<&(String, J)> = kv.iter().collect();
        kv.sort_by(|a, b| a.0.cmp(&b.0));
        for (k, v) in kv {
            s.push_str(&format!("  {k} {}\n", v.py_str()));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPENDS: &str =
        "linux-headers-cloud-arm64:arm64\n  Depends: linux-headers-6.1.0-50-cloud-arm64:arm64\n";
    const SHOW: &str = "Package: linux-headers-6.1.0-50-cloud-arm64\nVersion: 6.1.158-1\nDepends: linux-headers-6.1.0-50-common (= 6.1.158-1), linux-kbuild-6.1 (= 6.1.158-1), linux-compiler-gcc-12-arm, gcc-12\n";

    #[test]
    fn arm64_headers_and_what_they_need() {
        assert_eq!(
            abi_headers(DEPENDS).as_deref(),
            Some("linux-headers-6.1.0-50-cloud-arm64")
        );
        assert_eq!(field(SHOW, "Version").as_deref(), Some("6.1.158-1"));
        let deps = field(SHOW, "Depends").unwrap();
        assert_eq!(
            cross_needs(&deps),
            Some((
                "linux-headers-6.1.0-50-common".into(),
                "linux-kbuild-6.1".into(),
                "12".into()
            ))
        );
        assert_eq!(cross_needs("gcc-12, make"), None);
    }

    #[test]
    fn kernel_config_and_releases() {
        let config = "CONFIG_CC_VERSION_TEXT=\"gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0\"\n";
        assert_eq!(cc_major(config).as_deref(), Some("12"));
        let names = [
            "linux-headers-6.1.0-9-cloud-amd64",
            "linux-headers-6.1.0-50-cloud-amd64",
            "linux-headers-6.1.0-50-common",
            "linux-kbuild-6.1",
        ];
        assert_eq!(
            newest_release(names.into_iter(), "amd64").as_deref(),
            Some("6.1.0-50-cloud-amd64")
        );
        assert_eq!(newest_release(names.into_iter(), "arm64"), None);
    }

    #[test]
    fn records_what_the_packages_resolved_to() {
        let q = "ii \tgcc\t4:12.2.0-3\nii \tgcc-12\t12.2.0-14\nrc \tgcc-11\t11.3.0-1\n\
                 ii \tlinux-headers-6.1.0-50-cloud-amd64\t6.1.158-1\nii \tlinux-kbuild-6.1\t6.1.158-1\n\
                 ii \tlinux-headers-6.1.0-50-common\t6.1.158-1\nii \tlibc6\t2.36-9\n";
        let inst = installed(q);
        assert_eq!(inst.len(), 6);
        let unpacked = vec![(
            "nvidia-open-kernel-source".to_string(),
            "535.261.03-1".to_string(),
            "arm64".to_string(),
        )];
        let p = recorded_packages(
            &["gcc".to_string(), "nvidia-open-kernel-source".to_string()],
            "6.1.0-50-cloud-amd64",
            &inst,
            &unpacked,
        );
        assert_eq!(
            p.dump_line(false),
            r#"{"gcc": "4:12.2.0-3", "gcc-12": "12.2.0-14", "linux-headers-6.1.0-50-cloud-amd64": "6.1.158-1", "linux-headers-6.1.0-50-common": "6.1.158-1", "linux-kbuild-6.1": "6.1.158-1", "nvidia-open-kernel-source": "535.261.03-1 (arm64, unpacked)"}"#
        );
        let deb =
            "Package: nvidia-open-kernel-source\nVersion: 535.261.03-1\nArchitecture: arm64\n";
        assert_eq!(deb_fields(deb), Some(unpacked[0].clone()));
    }
}
