//! deb822 parsing: `InRelease`'s fields and `Packages` stanzas, and
//! `Depends`/`Provides` relations.

use std::io::BufRead;

use super::records::{Dependency, Package, Relation, Release, ReleaseFile};
use crate::error::{Error, Failure, Result};
use crate::fetch;

/// A deb822 paragraph as (field, value) pairs; continuation lines are
/// joined with '\n' to their field's value.
fn paragraph_fields(lines: &[String]) -> Result<Vec<(String, String)>> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for line in lines {
        if line.starts_with(' ') || line.starts_with('\t') {
            match fields.last_mut() {
                Some((_, v)) => {
                    v.push('\n');
                    v.push_str(line.trim());
                }
                None => {
                    return Err(Error::new(
                        Failure::ArchiveInvalid,
                        format!("continuation line before any field: {line:?}"),
                    ));
                }
            }
        } else if line.starts_with('#') {
            continue;
        } else {
            let (k, v) = line.split_once(':').ok_or_else(|| {
                Error::new(
                    Failure::ArchiveInvalid,
                    format!("malformed line (no 'Field:'): {line:?}"),
                )
            })?;
            fields.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok(fields)
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Parses a Release file (the signed text of an InRelease).
pub(crate) fn parse_release(text: &str) -> Result<Release> {
    let lines: Vec<String> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    let fields = paragraph_fields(&lines)?;
    let words = |name: &str| -> Vec<String> {
        field(&fields, name)
            .map(|v| v.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let mut sha256 = Vec::new();
    for line in field(&fields, "SHA256").unwrap_or("").lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            [] => {}
            [sum, size, path] if fetch::is_sha256_hex(sum) => sha256.push(ReleaseFile {
                path: (*path).to_string(),
                size: size.parse().map_err(|_| {
                    Error::new(
                        Failure::ArchiveInvalid,
                        format!("Release SHA256 line with a bad size: {line:?}"),
                    )
                })?,
                sha256: sum.to_ascii_lowercase(),
            }),
            _ => {
                return Err(Error::new(
                    Failure::ArchiveInvalid,
                    format!("malformed Release SHA256 line: {line:?}"),
                ));
            }
        }
    }
    if sha256.is_empty() {
        return Err(Error::new(
            Failure::ArchiveInvalid,
            "the Release file has no SHA256 list; nothing in it could be verified",
        ));
    }
    Ok(Release {
        suite: field(&fields, "Suite").map(str::to_string),
        codename: field(&fields, "Codename").map(str::to_string),
        components: words("Components"),
        architectures: words("Architectures"),
        sha256,
    })
}

/// Parses `Packages` stanzas from a stream, keeping those whose `Package:`
/// `keep` accepts. A stanza without Package, Version or Filename is
/// malformed.
pub(crate) fn parse_packages<R: BufRead>(
    mut reader: R,
    keep: &mut dyn FnMut(&str) -> bool,
) -> Result<Vec<Package>> {
    let mut out = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    let mut wanted: Option<bool> = None;
    let mut raw = Vec::new();
    loop {
        raw.clear();
        let n = reader.read_until(b'\n', &mut raw).map_err(|e| {
            Error::new(
                Failure::ArchiveInvalid,
                format!("reading the Packages index (truncated or corrupt): {e}"),
            )
        })?;
        let line = String::from_utf8_lossy(&raw);
        let line = line.trim_end_matches(['\n', '\r']);
        if n == 0 || line.trim().is_empty() {
            if wanted == Some(true) {
                out.push(package_of(&paragraph_fields(&lines)?)?);
            }
            lines.clear();
            wanted = None;
            if n == 0 {
                return Ok(out);
            }
            continue;
        }
        if wanted.is_none()
            && let Some(name) = line.strip_prefix("Package:")
        {
            wanted = Some(keep(name.trim()));
        }
        // Stanzas nobody wants are skipped without keeping their lines.
        if wanted != Some(false) {
            lines.push(line.to_string());
        }
    }
}

fn package_of(fields: &[(String, String)]) -> Result<Package> {
    let need = |name: &str| {
        field(fields, name).map(str::to_string).ok_or_else(|| {
            Error::new(
                Failure::ArchiveInvalid,
                format!(
                    "Packages stanza {} has no {name} field",
                    field(fields, "Package").unwrap_or("?")
                ),
            )
        })
    };
    let name = need("Package")?;
    let size = match field(fields, "Size") {
        Some(s) => Some(s.parse().map_err(|_| {
            Error::new(
                Failure::ArchiveInvalid,
                format!("Packages stanza {name}: bad Size {s:?}"),
            )
        })?),
        None => None,
    };
    let sha256 = match field(fields, "SHA256") {
        Some(s) if fetch::is_sha256_hex(s) => Some(s.to_ascii_lowercase()),
        Some(s) => {
            return Err(Error::new(
                Failure::ArchiveInvalid,
                format!("Packages stanza {name}: SHA256 {s:?} is not 64 hex digits"),
            ));
        }
        None => None,
    };
    Ok(Package {
        version: need("Version")?,
        architecture: field(fields, "Architecture").unwrap_or("").to_string(),
        filename: need("Filename")?,
        size,
        sha256,
        depends: parse_depends(field(fields, "Depends").unwrap_or(""))?,
        provides: parse_depends(field(fields, "Provides").unwrap_or(""))?
            .into_iter()
            .flatten()
            .map(|d| d.name)
            .collect(),
        name,
    })
}

/// Parses a `Depends:`-style field: comma-separated groups of `|`
/// alternatives.
pub(crate) fn parse_depends(s: &str) -> Result<Vec<Vec<Dependency>>> {
    let mut groups = Vec::new();
    for group in s.split(',') {
        if group.trim().is_empty() {
            continue;
        }
        let mut alts = Vec::new();
        for alt in group.split('|') {
            alts.push(parse_dependency(alt)?);
        }
        groups.push(alts);
    }
    Ok(groups)
}

fn parse_dependency(s: &str) -> Result<Dependency> {
    let bad = || {
        Error::new(
            Failure::ArchiveInvalid,
            format!("malformed dependency {s:?}"),
        )
    };
    // Drop architecture restrictions `[…]` and build profiles `<…>`; inside
    // the version constraint `<` and `>` are operators.
    let mut text = String::new();
    let mut in_constraint = false;
    let mut skip_to: Option<char> = None;
    for ch in s.chars() {
        if let Some(close) = skip_to {
            if ch == close {
                skip_to = None;
            }
            continue;
        }
        match ch {
            '(' => in_constraint = true,
            ')' => in_constraint = false,
            '[' if !in_constraint => {
                skip_to = Some(']');
                continue;
            }
            '<' if !in_constraint => {
                skip_to = Some('>');
                continue;
            }
            _ => {}
        }
        text.push(ch);
    }
    let text = text.trim();
    let (name, constraint) = match text.split_once('(') {
        None => (text, None),
        Some((name, rest)) => {
            let inner = rest.trim().strip_suffix(')').ok_or_else(bad)?.trim();
            let split = inner
                .find(|c: char| !matches!(c, '<' | '>' | '='))
                .ok_or_else(bad)?;
            let (op, version) = inner.split_at(split);
            let rel = match op {
                "<<" | "<" => Relation::Less,
                "<=" => Relation::LessEq,
                "=" => Relation::Eq,
                ">=" => Relation::GreaterEq,
                ">>" | ">" => Relation::Greater,
                _ => return Err(bad()),
            };
            let version = version.trim();
            if version.is_empty() {
                return Err(bad());
            }
            (name, Some((rel, version.to_string())))
        }
    };
    // `name:any`, `name:amd64`: the architecture qualifier does not change
    // which package is meant here.
    let name = name.trim().split(':').next().unwrap_or("").trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(bad());
    }
    Ok(Dependency {
        name: name.to_string(),
        constraint,
    })
}

#[cfg(test)]
mod tests {
    use super::super::AptSource;
    use super::*;
    use crate::aptsig::{self, Builtin, Keyring};
    use crate::error::Reason;

    #[test]
    fn depends_with_alternatives_and_constraints() {
        // trixie's linux-headers-*-cloud-amd64
        let d = parse_depends(
            "linux-base (>= 4.12~), linux-headers-6.12.117+deb13-common (= 6.12.117-1), \
             linux-image-6.12.117+deb13-cloud-amd64 (= 6.12.117-1) | linux-image-6.12.117+deb13-cloud-amd64-unsigned (= 6.12.117-1), \
             linux-kbuild-6.12.117+deb13, gcc-14, libc6:any [amd64] <!nocheck>",
        )
        .unwrap();
        assert_eq!(d.len(), 6);
        assert_eq!(d[1][0].name, "linux-headers-6.12.117+deb13-common");
        assert_eq!(
            d[1][0].constraint,
            Some((Relation::Eq, "6.12.117-1".to_string()))
        );
        assert_eq!(d[2].len(), 2);
        assert_eq!(d[3][0].name, "linux-kbuild-6.12.117+deb13");
        assert_eq!(d[3][0].constraint, None);
        assert_eq!(d[5][0].name, "libc6");
        assert!(d[0][0].allows("4.12"));
        assert!(!d[0][0].allows("4.11"));
        assert!(d[1][0].allows("6.12.117-1"));
        assert!(!d[1][0].allows("6.12.117-2"));
        assert!(parse_depends("a (>= )").is_err());
        assert!(parse_depends("a (~ 1)").is_err());
        assert_eq!(parse_depends(" ").unwrap().len(), 0);
    }

    #[test]
    fn release_is_parsed() {
        let sum = "a".repeat(64);
        let text = format!(
            "Origin: Debian\nCodename: bookworm\nComponents: main contrib\nArchitectures: all amd64\n\
             SHA256:\n {sum}  1234 main/binary-amd64/Packages.xz\n"
        );
        let r = parse_release(&text).unwrap();
        assert_eq!(r.codename.as_deref(), Some("bookworm"));
        assert_eq!(r.components, ["main", "contrib"]);
        let f = r.file("main/binary-amd64/Packages.xz").unwrap();
        assert_eq!((f.size, f.sha256.as_str()), (1234, sum.as_str()));
        assert!(parse_release("Origin: x\n").is_err());
    }

    #[test]
    fn a_real_debian_inrelease_is_verified_and_parsed() {
        let inrelease = include_str!("../../tests/fixtures/apt/debian-bookworm-InRelease");
        let keyring = Keyring::builtin(Builtin::Debian).unwrap();
        let v = aptsig::verify_inrelease(inrelease, &keyring).unwrap();
        let r = parse_release(&v.text).unwrap();
        assert_eq!(r.codename.as_deref(), Some("bookworm"));
        assert!(r.components.iter().any(|c| c == "main"));
        assert!(r.file("main/binary-amd64/Packages.xz").is_some());
        // The shipped keyring is the default for deb.debian.org.
        let source = AptSource::new("https://deb.debian.org/debian", "bookworm");
        let v = aptsig::verify_inrelease(inrelease, &source.trusted_keys().unwrap()).unwrap();
        assert_eq!(v.signers.len(), 3);
    }

    #[test]
    fn packages_stanzas_are_parsed_and_filtered() {
        let sum = "B".repeat(64);
        let text = format!(
            "Package: linux-headers-6.1.0-50-cloud-amd64\nSource: linux\nVersion: 6.1.176-1\n\
             Architecture: amd64\nDepends: linux-headers-6.1.0-50-common (= 6.1.176-1), linux-kbuild-6.1 (>= 6.1.176-1)\n\
             Description: Header files\n long text\n .\n more\nFilename: pool/main/l/linux/h.deb\nSize: 10\nSHA256: {sum}\n\n\
             Package: other\nVersion: 1\nFilename: pool/o.deb\n\n\
             Package: virt-maker\nVersion: 2\nFilename: pool/v.deb\nProvides: virt (= 2), virt2\n"
        );
        let mut seen = Vec::new();
        let pkgs = parse_packages(text.as_bytes(), &mut |n: &str| {
            seen.push(n.to_string());
            n != "other"
        })
        .unwrap();
        assert_eq!(
            seen,
            ["linux-headers-6.1.0-50-cloud-amd64", "other", "virt-maker"]
        );
        assert_eq!(pkgs.len(), 2);
        assert_eq!(pkgs[0].version, "6.1.176-1");
        assert_eq!(pkgs[0].size, Some(10));
        assert_eq!(pkgs[0].sha256.as_deref(), Some("b".repeat(64).as_str()));
        assert_eq!(pkgs[0].depends.len(), 2);
        assert_eq!(pkgs[1].provides, ["virt", "virt2"]);
        assert_eq!(pkgs[1].sha256, None);
        let bad = parse_packages("Package: x\nVersion: 1\n".as_bytes(), &mut |_: &str| true);
        assert_eq!(bad.unwrap_err().reason, Reason::ArchiveInvalid);
    }
}
