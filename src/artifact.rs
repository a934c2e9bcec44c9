//! The build artifact: one `.tar.zst` holding `manifest.json`,
//! `modules/*.ko`, optional `firmware/*` and NVIDIA's user space at its place
//! in a root filesystem (`usr/bin`, `usr/lib/<arch>-linux-gnu`). This module
//! owns the format: the manifest (written by build, read by install and the
//! cache, its `schemaVersion` checked and every field that ends up in a path
//! validated before use), packing and unpacking.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Failure, Result};
use crate::node::{CpuArch, ModuleFlavor};

/// Bumped when the manifest's meaning changes.
/// 1: modules and firmware. 2: user space (`userSpace`, `links`) from a
/// `.run`'s `.manifest`. A reader accepts 1..=2: version 2 only added fields.
pub const MANIFEST_VERSION: u32 = 2;
const OLDEST_MANIFEST_VERSION: u32 = 1;

/// The manifest's name inside the artifact.
pub(crate) const MANIFEST_FILE: &str = "manifest.json";

/// `manifest.json` inside the artifact: what was built, for what, with what,
/// and the sha256 of every other file in the archive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default)]
    pub generator: String,
    pub driver_version: String,
    pub flavor: ModuleFlavor,
    pub kernel_release: String,
    /// `<cc> --version`, first line.
    #[serde(default)]
    pub compiler: String,
    /// The kernel's `CONFIG_CC_VERSION_TEXT`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_compiler: Option<String>,
    /// The CPU architecture the modules (and user space) are for. Absent
    /// in artifacts of earlier installers, which built natively only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<CpuArch>,
    /// RFC 3339, UTC.
    #[serde(default)]
    pub built_at: String,
    pub modules: Vec<ManifestModule>,
    #[serde(default)]
    pub firmware: Vec<ManifestFile>,
    /// Why `firmware` is empty, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware_note: Option<String>,
    /// NVIDIA's user space, at its place in a root filesystem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_space: Vec<ManifestUserFile>,
    /// SONAME and convenience links of the user space (not in the tar:
    /// install creates them, after checking each target is a plain name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<ManifestLink>,
    /// Who signed every module (`build --signing-key/--signing-cert`);
    /// absent when they are unsigned. Optional and additive, so readers of
    /// version 2 still read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<crate::node::Signer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestUserFile {
    pub file: String,
    pub size_bytes: u64,
    pub sha256: String,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestLink {
    /// The link, inside the artifact (`usr/lib/…/libcuda.so.1`).
    pub file: String,
    /// A name in the link's own directory.
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestModule {
    pub name: String,
    pub file: String,
    #[serde(default)]
    pub vermagic: String,
    #[serde(default)]
    pub depends: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default)]
    pub size_bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestFile {
    pub file: String,
    #[serde(default)]
    pub size_bytes: u64,
    pub sha256: String,
}

/// One file the archive carries, as the manifest lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    pub file: &'a str,
    pub sha256: &'a str,
    /// Permission bits to give the placed file (user space), if any.
    pub mode: Option<u32>,
}

/// The artifact's file name for a build.
pub fn file_name(driver_version: &str, flavor: ModuleFlavor, release: &str) -> String {
    format!("nvidia-{driver_version}-{flavor}-{release}.tar.zst")
}

fn invalid(message: String) -> Error {
    Error::new(Failure::ArtifactInvalid, message)
}

/// A relative path of plain names: no `..`, no root, not empty.
fn relative_plain(p: &str) -> bool {
    !p.is_empty()
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// The release ends up in file and directory names: a plain release string.
pub(crate) fn is_release_name(release: &str) -> bool {
    !release.is_empty()
        && release.len() <= 128
        && release != "."
        && release != ".."
        && release
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+' | '~'))
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_module_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Manifest {
    /// Parses `manifest.json` (`origin` names it in errors) and validates it.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<Manifest> {
        // The version first, so that a newer format is named as such rather
        // than as whatever field it changed.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Version {
            schema_version: Option<u32>,
        }
        let v: Version = serde_json::from_slice(bytes)
            .map_err(|e| invalid(format!("{origin} is not a manifest: {e}")))?;
        match v.schema_version {
            Some(n) if (OLDEST_MANIFEST_VERSION..=MANIFEST_VERSION).contains(&n) => {}
            Some(n) => {
                return Err(invalid(format!(
                    "{origin} has schemaVersion {n}; this installer reads {OLDEST_MANIFEST_VERSION} to {MANIFEST_VERSION}"
                ))
                .with_hint("build the artifact with this installer's version, or upgrade the installer"));
            }
            None => return Err(invalid(format!("{origin} has no schemaVersion"))),
        }
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| invalid(format!("{origin} is not a valid manifest: {e}")))?;
        m.validate()
            .map_err(|e| invalid(format!("{origin}: {}", e)))?;
        Ok(m)
    }

    /// Checks every field that install or the cache uses in a path or a
    /// command: the driver version and kernel release name directories,
    /// entries name files inside the artifact, links stay in their directory.
    pub(crate) fn validate(&self) -> Result<()> {
        if !crate::node::is_driver_version(&self.driver_version) {
            return Err(invalid(format!(
                "driverVersion {:?} is not a driver version like 535.261.03",
                self.driver_version
            )));
        }
        if !is_release_name(&self.kernel_release) {
            return Err(invalid(format!(
                "kernelRelease {:?} is not a kernel release like 6.1.0-50-cloud-amd64",
                self.kernel_release
            )));
        }
        if let Some(signer) = &self.signer {
            if !is_sha256_hex(&signer.sha256) || signer.subject.len() > 1024 {
                return Err(invalid(format!(
                    "signer {:?} has no sha256 fingerprint of 64 hex digits (or an overlong subject)",
                    signer.sha256
                )));
            }
        }
        for e in self.entries() {
            if !relative_plain(e.file) || e.file == MANIFEST_FILE {
                return Err(invalid(format!(
                    "manifest entry {:?} is not a relative path",
                    e.file
                )));
            }
            if !is_sha256_hex(e.sha256) {
                return Err(invalid(format!(
                    "manifest entry {:?} has sha256 {:?}, not 64 hex digits",
                    e.file, e.sha256
                )));
            }
        }
        if self.modules.is_empty() {
            return Err(invalid("lists no modules".into()));
        }
        for m in &self.modules {
            if !is_module_name(&m.name) {
                return Err(invalid(format!(
                    "module name {:?} is not a module name",
                    m.name
                )));
            }
            if !m.file.starts_with("modules/") || !m.file.ends_with(".ko") {
                return Err(invalid(format!(
                    "module file {:?} is not modules/<name>.ko",
                    m.file
                )));
            }
        }
        if let Some(f) = self
            .firmware
            .iter()
            .find(|f| !f.file.starts_with("firmware/"))
        {
            return Err(invalid(format!(
                "firmware file {:?} is not under firmware/",
                f.file
            )));
        }
        for link in &self.links {
            if !relative_plain(&link.file)
                || link.target.contains('/')
                || link.target.is_empty()
                || link.target == ".."
                || link.target == "."
            {
                return Err(invalid(format!(
                    "manifest link {:?} -> {:?} would leave its directory",
                    link.file, link.target
                )));
            }
        }
        Ok(())
    }

    /// Every file the archive carries besides the manifest.
    pub fn entries(&self) -> Vec<Entry<'_>> {
        let modules = self.modules.iter().map(|m| Entry {
            file: &m.file,
            sha256: &m.sha256,
            mode: None,
        });
        let firmware = self.firmware.iter().map(|f| Entry {
            file: &f.file,
            sha256: &f.sha256,
            mode: None,
        });
        let user = self.user_space.iter().map(|u| Entry {
            file: &u.file,
            sha256: &u.sha256,
            mode: Some(u.mode),
        });
        modules.chain(firmware).chain(user).collect()
    }

    pub(crate) fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(self)
            .map_err(|e| Error::new(Failure::Internal, format!("serializing the manifest: {e}")))
    }
}

/// An artifact's `manifest.json`: a few KiB (a file list and digests).
pub(crate) const MANIFEST: crate::named_file::Named = crate::named_file::Named {
    what: "the artifact manifest",
    max: 4 << 20,
    reason: Failure::ArtifactInvalid,
    hint: "a build artifact holds manifest.json, modules/*.ko and optional firmware/",
};

/// Reads `<dir>/manifest.json` of an unpacked artifact and checks every
/// listed file against its sha256.
pub(crate) fn check_dir(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = MANIFEST.read(&path)?;
    let manifest = Manifest::parse(&bytes, &path.display().to_string())?;
    for entry in manifest.entries() {
        let file = dir.join(entry.file);
        if !file.is_file() {
            return Err(invalid(format!(
                "{} is listed in the manifest but missing",
                entry.file
            )));
        }
        let (sum, _) = crate::digest::sha256_file(&file, Failure::ArtifactInvalid)?;
        if !sum.eq_ignore_ascii_case(entry.sha256) {
            return Err(invalid(format!(
                "{}: sha256 {sum} differs from the manifest's {}",
                entry.file, entry.sha256
            )));
        }
    }
    Ok(manifest)
}

/// Unpacks an artifact (`.tar.zst`, or a directory holding an unpacked one)
/// into `dest` with the extractor's safety checks, then checks it.
pub fn unpack(artifact: &Path, dest: &Path) -> Result<Manifest> {
    crate::extract::extract_package(artifact, dest).map_err(|e| match e.reason {
        Failure::ArchiveInvalid | Failure::UnsafeArchive => invalid(e.to_string()),
        _ => e,
    })?;
    check_dir(dest)
}

/// Checks an artifact held in memory against the manifest it should carry
/// ([`check_reader`]).
#[cfg(test)]
pub(crate) fn check_bytes(bytes: &[u8], expected: &Manifest) -> Result<()> {
    check_reader(bytes, expected)
}

/// The most a `manifest.json` may hold (a real one is a few KiB).
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// Checks an artifact (the cache's download) as it streams past against
/// the manifest it should carry: each tar entry's sha256, nothing missing,
/// nothing extra, and its own `manifest.json` equal to `expected`. Entries
/// are hashed as they are read, never held in memory whole.
pub(crate) fn check_reader(reader: impl Read, expected: &Manifest) -> Result<()> {
    expected.validate()?;
    let tar_err = |e: std::io::Error| invalid(format!("reading the tar: {e}"));
    let mut want: BTreeMap<&str, &str> = expected
        .entries()
        .into_iter()
        .map(|e| (e.file, e.sha256))
        .collect();
    let dec =
        zstd::stream::read::Decoder::new(reader).map_err(|e| invalid(format!("zstd: {e}")))?;
    let mut tar = tar::Archive::new(dec);
    let mut inner = None;
    for e in tar.entries().map_err(tar_err)? {
        let mut e = e.map_err(tar_err)?;
        let name = e.path().map_err(tar_err)?.to_string_lossy().into_owned();
        let read_err = |err: std::io::Error| invalid(format!("reading {name} from the tar: {err}"));
        if name == MANIFEST_FILE {
            let mut data = Vec::new();
            (&mut e)
                .take(MAX_MANIFEST_BYTES + 1)
                .read_to_end(&mut data)
                .map_err(read_err)?;
            if data.len() as u64 > MAX_MANIFEST_BYTES {
                return Err(invalid(format!("its {MANIFEST_FILE} is over 1 MiB")));
            }
            inner = Some(data);
            continue;
        }
        let mut hasher = HashWriter(Sha256::new());
        std::io::copy(&mut e, &mut hasher).map_err(read_err)?;
        let got = hex::encode(hasher.0.finalize());
        match want.remove(name.as_str()) {
            Some(w) if w.eq_ignore_ascii_case(&got) => {}
            Some(w) => {
                return Err(invalid(format!(
                    "{name} has sha256 {got}, the manifest says {w}"
                )));
            }
            None => return Err(invalid(format!("{name} is not in the manifest"))),
        }
    }
    if let Some(missing) = want.keys().next() {
        return Err(invalid(format!("{missing} is missing from the artifact")));
    }
    let inner = inner.ok_or_else(|| invalid("the artifact has no manifest.json".into()))?;
    if &Manifest::parse(&inner, "its manifest.json")? != expected {
        return Err(invalid(
            "the artifact's manifest.json differs from the entry's".into(),
        ));
    }
    Ok(())
}

/// A sink that hashes what is written to it.
struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One file to pack: its name in the archive, where it is now, its mode.
#[derive(Debug, Clone)]
pub struct PackFile {
    pub name: String,
    pub path: PathBuf,
    pub mode: u32,
}

/// Writes `manifest.json` and `files` into a `.tar.zst` under a temporary
/// name beside `artifact` (O_EXCL), fsyncs it and renames it into place, so
/// that a reader never sees half an artifact. Returns its sha256.
pub fn pack(artifact: &Path, manifest: &Manifest, files: &[PackFile]) -> Result<String> {
    const LOCAL_IO: Failure = Failure::Internal;
    manifest
        .validate()
        .map_err(|e| Error::new(Failure::Internal, format!("refusing to pack: {}", e)))?;
    let manifest_json = manifest.to_json()?;
    let dir = match artifact.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".artifact-")
        .suffix(".partial")
        .tempfile_in(dir)
        .map_err(|e| Error::io(LOCAL_IO, "creating a temporary file in", dir, e))?;
    let mtime = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let write_err = |e| Error::io(LOCAL_IO, "writing", tmp.path(), e);
    {
        let file = tmp.as_file().try_clone().map_err(write_err)?;
        let enc = zstd::stream::write::Encoder::new(std::io::BufWriter::new(file), 3)
            .map_err(write_err)?;
        let mut tar = tar::Builder::new(enc);
        let mut header = file_header(manifest_json.len() as u64, 0o644, mtime);
        tar.append_data(&mut header, MANIFEST_FILE, manifest_json.as_slice())
            .map_err(write_err)?;
        for f in files {
            append_file(&mut tar, f, mtime).map_err(|e| {
                Error::io(LOCAL_IO, &format!("packaging {} from", f.name), &f.path, e)
            })?;
        }
        let enc = tar.into_inner().map_err(write_err)?;
        let mut buf = enc.finish().map_err(write_err)?;
        buf.flush().map_err(write_err)?;
    }
    tmp.as_file().sync_all().map_err(write_err)?;
    let (sha256, _) = crate::digest::sha256_file(tmp.path(), LOCAL_IO)?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644))
        .map_err(|e| Error::io(LOCAL_IO, "setting permissions of", tmp.path(), e))?;
    tmp.persist(artifact)
        .map_err(|e| Error::io(LOCAL_IO, "renaming into place", artifact, e.error))?;
    crate::publish::sync_dir(dir);
    Ok(sha256)
}

fn file_header(len: u64, mode: u32, mtime: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_size(len);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(mtime);
    header.set_entry_type(tar::EntryType::Regular);
    header
}

fn append_file<W: Write>(
    tar: &mut tar::Builder<W>,
    f: &PackFile,
    mtime: u64,
) -> std::io::Result<()> {
    let mut file = File::open(&f.path)?;
    let len = file.metadata()?.len();
    let mut header = file_header(len, f.mode, mtime);
    tar.append_data(&mut header, &f.name, &mut file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;
    use std::fs;

    #[test]
    fn artifact_checks() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(check_dir(d).unwrap_err().reason, Reason::ArtifactInvalid);
        fs::create_dir(d.join("modules")).unwrap();
        fs::write(d.join("modules/a.ko"), b"abc").unwrap();
        let good = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let manifest = |sum: &str, file: &str| {
            format!(
                r#"{{"schemaVersion":1,"driverVersion":"1.0","flavor":"open","kernelRelease":"6.1.0","modules":[{{"name":"a","file":"{file}","sha256":"{sum}"}}],"firmware":[]}}"#
            )
        };
        fs::write(d.join("manifest.json"), manifest(good, "modules/a.ko")).unwrap();
        assert_eq!(check_dir(d).unwrap().driver_version, "1.0");
        fs::write(
            d.join("manifest.json"),
            manifest(&"0".repeat(64), "modules/a.ko"),
        )
        .unwrap();
        assert!(check_dir(d).unwrap_err().message.contains("differs"));
        fs::write(d.join("manifest.json"), manifest(good, "../a.ko")).unwrap();
        assert!(check_dir(d).unwrap_err().message.contains("relative"));
        fs::write(d.join("manifest.json"), manifest(good, "modules/b.ko")).unwrap();
        assert!(check_dir(d).unwrap_err().message.contains("missing"));

        // User-space links must stay in their directory.
        let with_link = |file: &str, target: &str| {
            manifest(good, "modules/a.ko").replace(
                r#""firmware":[]"#,
                &format!(r#""firmware":[],"links":[{{"file":"{file}","target":"{target}"}}]"#),
            )
        };
        fs::write(
            d.join("manifest.json"),
            with_link("usr/lib/libcuda.so.1", "libcuda.so.1.0"),
        )
        .unwrap();
        assert_eq!(check_dir(d).unwrap().links.len(), 1);
        for (file, target) in [
            ("usr/lib/libcuda.so.1", "../../../etc/shadow"),
            ("usr/lib/libcuda.so.1", ".."),
            ("../libcuda.so.1", "libcuda.so.1.0"),
        ] {
            fs::write(d.join("manifest.json"), with_link(file, target)).unwrap();
            let e = check_dir(d).unwrap_err();
            assert_eq!(e.reason, Reason::ArtifactInvalid, "{file} -> {target}");
            assert!(e.to_string().contains("would leave"), "{}", e.to_string());
        }
    }

    fn sample(dir: &Path) -> (Manifest, Vec<PackFile>) {
        let files = [
            ("modules/nvidia.ko", "ko"),
            ("firmware/gsp_ga10x.bin", "fw"),
            ("usr/bin/nvidia-smi", "smi"),
        ];
        let mut packed = Vec::new();
        for (name, body) in files {
            let p = dir.join(name.replace('/', "_"));
            fs::write(&p, body).unwrap();
            packed.push(PackFile {
                name: name.into(),
                path: p,
                mode: if name.starts_with("usr/") {
                    0o755
                } else {
                    0o644
                },
            });
        }
        let sum = |b: &str| crate::digest::sha256_bytes(b.as_bytes());
        let m = Manifest {
            schema_version: MANIFEST_VERSION,
            generator: "test".into(),
            driver_version: "580.95.05".into(),
            flavor: ModuleFlavor::Open,
            kernel_release: "6.1.0-50-cloud-amd64".into(),
            compiler: "gcc 12".into(),
            kernel_compiler: None,
            arch: None,
            built_at: "2026-12-03T00:00:00Z".into(),
            modules: vec![ManifestModule {
                name: "nvidia".into(),
                file: "modules/nvidia.ko".into(),
                vermagic: "6.1.0-50-cloud-amd64 SMP".into(),
                depends: vec![],
                version: None,
                size_bytes: 2,
                sha256: sum("ko"),
            }],
            firmware: vec![ManifestFile {
                file: "firmware/gsp_ga10x.bin".into(),
                size_bytes: 2,
                sha256: sum("fw"),
            }],
            firmware_note: None,
            user_space: vec![ManifestUserFile {
                file: "usr/bin/nvidia-smi".into(),
                size_bytes: 3,
                sha256: sum("smi"),
                mode: 0o755,
            }],
            links: vec![],
            signer: None,
        };
        (m, packed)
    }

    #[test]
    fn packed_artifacts_unpack_and_check_with_their_user_space() {
        let dir = tempfile::tempdir().unwrap();
        let (m, files) = sample(dir.path());
        let art = dir
            .path()
            .join(file_name(&m.driver_version, m.flavor, &m.kernel_release));
        let sha = pack(&art, &m, &files).unwrap();
        let bytes = fs::read(&art).unwrap();
        assert_eq!(crate::digest::sha256_bytes(&bytes), sha);
        // The cache's in-memory check covers user space too.
        check_bytes(&bytes, &m).unwrap();
        let out = dir.path().join("out");
        assert_eq!(unpack(&art, &out).unwrap(), m);
        // Another manifest than the one inside is refused.
        let mut other = m.clone();
        other.user_space[0].sha256 = "0".repeat(64);
        let e = check_bytes(&bytes, &other).unwrap_err();
        assert_eq!(e.reason, Reason::ArtifactInvalid);
        assert!(
            e.to_string().contains("usr/bin/nvidia-smi has sha256"),
            "{e}"
        );
    }

    #[test]
    fn path_bearing_fields_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let (m, _) = sample(dir.path());
        let mut bad = m.clone();
        bad.driver_version = "../../../../tmp/x".into();
        let e = Manifest::parse(&bad.to_json().unwrap(), "m.json").unwrap_err();
        assert_eq!(e.reason, Reason::ArtifactInvalid);
        assert!(e.to_string().contains("driverVersion"), "{e}");
        let mut bad = m.clone();
        bad.kernel_release = "6.1.0/../../etc".into();
        let e = Manifest::parse(&bad.to_json().unwrap(), "m.json").unwrap_err();
        assert!(e.to_string().contains("kernelRelease"), "{e}");
        let mut bad = m.clone();
        bad.modules[0].name = "nvidia/../x".into();
        assert!(Manifest::parse(&bad.to_json().unwrap(), "m.json").is_err());
        let mut bad = m.clone();
        bad.firmware[0].file = "etc/passwd".into();
        let e = Manifest::parse(&bad.to_json().unwrap(), "m.json").unwrap_err();
        assert!(e.to_string().contains("not under firmware/"), "{e}");
        // pack refuses to write what parse would refuse to read.
        let e = pack(&dir.path().join("x.tar.zst"), &bad, &[]).unwrap_err();
        assert!(e.to_string().starts_with("refusing to pack"), "{e}");
        assert!(!dir.path().join("x.tar.zst").exists());
    }

    #[test]
    fn schema_versions_outside_the_known_range_are_named() {
        for (v, want) in [
            ("3", "schemaVersion 3; this installer reads 1 to 2"),
            ("0", "schemaVersion 0"),
        ] {
            let text = format!(r#"{{"schemaVersion":{v},"driverVersion":"1.0"}}"#);
            let e = Manifest::parse(text.as_bytes(), "m.json").unwrap_err();
            assert_eq!(e.reason, Reason::ArtifactInvalid);
            assert!(e.to_string().contains(want), "{e}");
        }
        let e = Manifest::parse(br#"{"driverVersion":"1.0"}"#, "m.json").unwrap_err();
        assert!(e.to_string().contains("no schemaVersion"), "{e}");
    }
}
