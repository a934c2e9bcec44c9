//! Reads a kernel module's `.modinfo` section in Rust, without `modinfo(8)`
//! (kmod is not in every builder image, and the static installer must not
//! depend on it). Only what the installer needs: ELF64 little-endian (x86_64
//! and arm64 modules), the `.modinfo` section found by name through the
//! `object` crate, and its NUL-separated `key=value` strings.
//!
//! Everything read from the file is bounds-checked against the file's size
//! (`object` does that; the size limits below keep a corrupt header from
//! making us allocate gigabytes): a truncated or hostile `.ko` gives an
//! error, never a panic or a huge allocation.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use object::LittleEndian;
use object::ReadRef;
use object::elf::{FileHeader64, SHT_NOBITS};
use object::read::ReadCache;
use object::read::elf::{FileHeader, SectionHeader};

/// What a module says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModInfo {
    /// `name=` (the kernel writes it since 5.x); else the file name with
    /// `-` turned into `_`, as the kernel names modules.
    pub name: String,
    /// `vermagic=`: the kernel release first, then features
    /// (`6.1.0-50-cloud-amd64 SMP preempt mod_unload modversions `).
    pub vermagic: String,
    /// `depends=`, split on commas; empty when it depends on nothing.
    pub depends: Vec<String>,
    pub version: Option<String>,
    pub license: Option<String>,
    /// Every `key=value` in file order (keys repeat, e.g. `alias`, `parm`).
    pub fields: Vec<(String, String)>,
    /// The ELF header's `e_machine`: the CPU the module is for
    /// ([`EM_X86_64`], [`EM_AARCH64`]).
    pub machine: u16,
}

/// `e_machine` of x86_64 ELF files.
pub const EM_X86_64: u16 = object::elf::EM_X86_64;
/// `e_machine` of arm64 ELF files.
pub const EM_AARCH64: u16 = object::elf::EM_AARCH64;

impl ModInfo {
    /// The kernel release this module was built for: the first word of
    /// vermagic.
    pub fn vermagic_release(&self) -> &str {
        self.vermagic.split_whitespace().next().unwrap_or("")
    }
}

/// The file an error is about, printed as a `path: ` prefix; none for a
/// module parsed from memory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct At(pub Option<PathBuf>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(p) => write!(f, "{}: ", p.display()),
            None => Ok(()),
        }
    }
}

/// Why a file is not a readable kernel module; the caller decides the
/// reason (a bad build, an invalid artifact) with [`ModinfoError::into_error`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModinfoError {
    /// The file could not be opened or its size read.
    #[error("{at}{detail}")]
    Unreadable { at: At, detail: String },
    /// Not an ELF64 little-endian file (magic, class or byte order), or its
    /// headers or section table are cut short or inconsistent.
    #[error("{at}{detail}")]
    NotElf { at: At, detail: String },
    /// An ELF file without a `.modinfo` section: not a kernel module.
    #[error("{at}no .modinfo section: not a kernel module")]
    NoModinfo { at: At },
    /// `.modinfo` is there but unusable: no contents, implausibly large, an
    /// entry that is not `key=value`, no `vermagic`.
    #[error("{at}{detail}")]
    Malformed { at: At, detail: String },
}

impl ModinfoError {
    fn not_elf(detail: impl Into<String>) -> Self {
        ModinfoError::NotElf {
            at: At::default(),
            detail: detail.into(),
        }
    }

    fn malformed(detail: impl Into<String>) -> Self {
        ModinfoError::Malformed {
            at: At::default(),
            detail: detail.into(),
        }
    }

    /// The same error about the file at `path`.
    fn at(mut self, path: &Path) -> Self {
        let (ModinfoError::Unreadable { at, .. }
        | ModinfoError::NotElf { at, .. }
        | ModinfoError::NoModinfo { at }
        | ModinfoError::Malformed { at, .. }) = &mut self;
        at.0 = Some(path.to_path_buf());
        self
    }

    /// The installer's error with the reason the caller gives (a module it
    /// built is a bad build, one from an artifact an invalid artifact).
    pub(crate) fn into_error(self, reason: crate::error::Failure) -> crate::error::Error {
        crate::error::Error::new(reason, self.to_string())
    }
}

/// `.modinfo` holds a few KiB of strings (aliases can make it tens of KiB).
const MAX_MODINFO_BYTES: u64 = 16 << 20;
/// The section table of a module never needs more than this; anything
/// bigger is malformed.
const MAX_SECTION_HEADERS: usize = 1 << 16;
const ELF64_EHDR_SIZE: u64 = 64;

/// Reads `.modinfo` of the module at `path`. The file is read piecewise
/// (an unstripped `nvidia.ko` is 180 MB): headers, section table, names,
/// `.modinfo`.
pub fn read_modinfo(path: &Path) -> Result<ModInfo, ModinfoError> {
    let unreadable = |what: &str, e: std::io::Error| {
        ModinfoError::Unreadable {
            at: At::default(),
            detail: format!("{what}: {e}"),
        }
        .at(path)
    };
    let file = File::open(path).map_err(|e| unreadable("opening", e))?;
    file.metadata()
        .map_err(|e| unreadable("reading metadata", e))?;
    let cache = ReadCache::new(file);
    let mut info = parse(&cache).map_err(|e| e.at(path))?;
    if info.name.is_empty() {
        info.name = file_module_name(path);
    }
    Ok(info)
}

/// Parses `.modinfo` from a module held in memory. Without a `name=` field
/// the name stays empty (there is no file name to take it from).
pub fn parse_modinfo(bytes: &[u8]) -> Result<ModInfo, ModinfoError> {
    parse(bytes)
}

/// `nvidia-uvm.ko` → `nvidia_uvm`.
fn file_module_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default()
        .trim_end_matches(".ko")
        .replace('-', "_")
}

type Header = FileHeader64<LittleEndian>;

/// "`what` lies beyond the end of the file": the message for any read
/// outside the file, whichever step it was.
fn beyond_end<'a, R: ReadRef<'a>>(data: R, what: &str) -> ModinfoError {
    let len = data.len().map_or_else(|()| "?".into(), |n| n.to_string());
    ModinfoError::not_elf(format!(
        "{what} lies beyond the end of the file ({len} bytes): truncated or not a module"
    ))
}

fn parse<'a, R: ReadRef<'a>>(data: R) -> Result<ModInfo, ModinfoError> {
    let header = elf_header(data)?;
    let endian = LittleEndian;
    let section = modinfo_section(header, data)?;
    if section.sh_type(endian) == SHT_NOBITS {
        return Err(ModinfoError::malformed(
            ".modinfo has no contents (SHT_NOBITS)",
        ));
    }
    let size = section.sh_size(endian);
    if size > MAX_MODINFO_BYTES {
        return Err(ModinfoError::malformed(format!(
            ".modinfo of {size} bytes is implausible"
        )));
    }
    let bytes = section
        .data(endian, data)
        .map_err(|_| beyond_end(data, "the .modinfo section"))?;
    let mut info = from_fields(parse_fields(bytes)?)?;
    info.machine = header.e_machine(endian);
    Ok(info)
}

/// The ELF header, once its identification says ELF64 little-endian (the
/// checks `object` makes too, done first for messages that say which).
fn elf_header<'a, R: ReadRef<'a>>(data: R) -> Result<&'a Header, ModinfoError> {
    let ident = data
        .read_bytes_at(0, ELF64_EHDR_SIZE)
        .map_err(|()| beyond_end(data, "the ELF header (offset 0, 64 bytes)"))?;
    if ident[..4] != object::elf::ELFMAG {
        return Err(ModinfoError::not_elf("not an ELF file (bad magic)"));
    }
    if ident[4] != object::elf::ELFCLASS64 {
        return Err(ModinfoError::not_elf(format!(
            "ELF class {} is not ELF64; only 64-bit modules are supported",
            ident[4]
        )));
    }
    if ident[5] != object::elf::ELFDATA2LSB {
        return Err(ModinfoError::not_elf(
            "big-endian ELF; only little-endian modules (x86_64, arm64) are supported",
        ));
    }
    Header::parse(data).map_err(|e| ModinfoError::not_elf(format!("the ELF header: {e}")))
}

/// The `.modinfo` section's header, found by name in the section table.
fn modinfo_section<'a, R: ReadRef<'a>>(
    header: &'a Header,
    data: R,
) -> Result<&'a <Header as FileHeader>::SectionHeader, ModinfoError> {
    let endian = LittleEndian;
    if header.e_shoff(endian) == 0 {
        return Err(ModinfoError::not_elf("no section header table"));
    }
    let count = header
        .shnum(endian, data)
        .map_err(|_| beyond_end(data, "section header 0"))?;
    if count == 0 || count > MAX_SECTION_HEADERS {
        return Err(ModinfoError::not_elf(format!(
            "implausible section count {count}"
        )));
    }
    let names_at = header
        .shstrndx(endian, data)
        .map_err(|e| ModinfoError::not_elf(format!("section name table index: {e}")))?;
    if names_at as usize >= count {
        return Err(ModinfoError::not_elf(format!(
            "section name table index {names_at} is not below the section count {count}"
        )));
    }
    let table = header
        .sections(endian, data)
        .map_err(|e| beyond_end(data, &format!("the section header table ({e})")))?;
    table
        .section_by_name(endian, b".modinfo")
        .map(|(_, s)| s)
        .ok_or(ModinfoError::NoModinfo { at: At::default() })
}

/// Splits `.modinfo` contents: NUL-separated `key=value` strings, with NUL
/// padding between them (sections are aligned).
pub(crate) fn parse_fields(data: &[u8]) -> Result<Vec<(String, String)>, ModinfoError> {
    let mut fields = Vec::new();
    for raw in data.split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let text = String::from_utf8_lossy(raw);
        let (k, v) = text.split_once('=').ok_or_else(|| {
            ModinfoError::malformed(format!(".modinfo entry {text:?} is not key=value"))
        })?;
        fields.push((k.to_string(), v.to_string()));
    }
    Ok(fields)
}

fn from_fields(fields: Vec<(String, String)>) -> Result<ModInfo, ModinfoError> {
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let vermagic =
        get("vermagic").ok_or_else(|| ModinfoError::malformed(".modinfo has no vermagic"))?;
    let depends = get("depends")
        .map(|d| {
            d.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Ok(ModInfo {
        name: get("name").unwrap_or_default(),
        vermagic,
        depends,
        version: get("version"),
        license: get("license"),
        fields,
        machine: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The builder the integration tests use too (one copy, in tests/).
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/support/elf.rs"
    ));

    #[test]
    fn parses_a_crafted_module() {
        let m = tiny_module(
            b"version=1.0\0license=GPL\0depends=a,b\0\0\0name=hello\0vermagic=6.1.0-50-cloud-amd64 SMP \0",
        );
        let info = parse_modinfo(&m).unwrap();
        assert_eq!(info.name, "hello");
        assert_eq!(info.vermagic_release(), "6.1.0-50-cloud-amd64");
        assert_eq!(info.depends, ["a", "b"]);
        assert_eq!(info.version.as_deref(), Some("1.0"));
        assert_eq!(info.license.as_deref(), Some("GPL"));
        assert_eq!(info.machine, 0);
    }

    #[test]
    fn the_elf_machine_is_reported() {
        let mut m = tiny_module(b"vermagic=6.1.0-50-cloud-arm64 SMP preempt mod_unload aarch64\0");
        m[0x12..0x14].copy_from_slice(&EM_AARCH64.to_le_bytes());
        let info = parse_modinfo(&m).unwrap();
        assert_eq!(info.machine, EM_AARCH64);
        assert_eq!(info.vermagic_release(), "6.1.0-50-cloud-arm64");
    }

    #[test]
    fn refuses_malformed_inputs() {
        let good = tiny_module(b"vermagic=6.1 SMP\0");
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", Vec::new(), "beyond the end"),
            ("not elf", b"#!/bin/sh\n".repeat(10), "bad magic"),
            (
                "elf32",
                {
                    let mut m = good.clone();
                    m[4] = 1;
                    m
                },
                "not ELF64",
            ),
            (
                "big endian",
                {
                    let mut m = good.clone();
                    m[5] = 2;
                    m
                },
                "big-endian",
            ),
            (
                "truncated",
                good[..good.len() - 10].to_vec(),
                "beyond the end",
            ),
            ("no vermagic", tiny_module(b"license=GPL\0"), "no vermagic"),
            ("no key=value", tiny_module(b"garbage\0"), "not key=value"),
            (
                "huge shnum",
                {
                    let mut m = good.clone();
                    m[0x3c..0x3e].copy_from_slice(&0u16.to_le_bytes());
                    m
                },
                "section count",
            ),
            (
                "bad shstrndx",
                {
                    let mut m = good.clone();
                    m[0x3e..0x40].copy_from_slice(&7u16.to_le_bytes());
                    m
                },
                "not below",
            ),
            (
                "huge offset",
                {
                    let mut m = good.clone();
                    m[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
                    m
                },
                "beyond the end",
            ),
        ];
        for (what, bytes, want) in cases {
            let err = parse_modinfo(&bytes).unwrap_err().to_string();
            assert!(err.contains(want), "{what}: {err}");
        }
        // A module without a .modinfo section.
        let mut m = good.clone();
        let pos = m.windows(8).position(|w| w == b".modinfo").unwrap();
        m[pos..pos + 8].copy_from_slice(b".modinfX");
        assert!(
            parse_modinfo(&m)
                .unwrap_err()
                .to_string()
                .contains("no .modinfo")
        );
    }
}
