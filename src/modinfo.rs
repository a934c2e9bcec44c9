//! Reads a kernel module's `.modinfo` section in Rust, without `modinfo(8)`
//! (kmod is not in every builder image, and the static installer must not
//! depend on it). Only what the installer needs: ELF64 little-endian (x86_64
//! and arm64 modules), section headers, the `.modinfo` section, and its
//! NUL-separated `key=value` strings.
//!
//! Everything read from the file is bounds-checked against the file's size:
//! a truncated or hostile `.ko` gives an error, never a panic or a huge
//! allocation.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

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
pub const EM_X86_64: u16 = 62;
/// `e_machine` of arm64 ELF files.
pub const EM_AARCH64: u16 = 183;

impl ModInfo {
    /// The kernel release this module was built for: the first word of
    /// vermagic.
    pub fn vermagic_release(&self) -> &str {
        self.vermagic.split_whitespace().next().unwrap_or("")
    }
}

/// Why a file is not a readable kernel module; the caller decides the
/// reason (a bad build, an invalid artifact).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ModinfoError(pub String);

impl From<String> for ModinfoError {
    fn from(s: String) -> Self {
        ModinfoError(s)
    }
}

impl From<&str> for ModinfoError {
    fn from(s: &str) -> Self {
        ModinfoError(s.to_string())
    }
}

/// The section table of a module never needs more than this; anything
/// bigger is malformed, and the bound keeps a corrupt header from making
/// us allocate gigabytes.
const MAX_SECTION_HEADERS: u64 = 1 << 16;
/// `.modinfo` holds a few KiB of strings (aliases can make it tens of KiB).
const MAX_MODINFO_BYTES: u64 = 16 << 20;
/// `.shstrtab` holds section names only.
const MAX_SHSTRTAB_BYTES: u64 = 16 << 20;

const SHT_NOBITS: u32 = 8;
const SHN_XINDEX: u16 = 0xffff;
const ELF64_EHDR_SIZE: u64 = 64;
const ELF64_SHDR_SIZE: u64 = 64;

/// Random access to a module's bytes: a file on disk (read piecewise, an
/// unstripped `nvidia.ko` is 180 MB) or a slice in memory (tests).
trait Source {
    fn len(&self) -> u64;
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

impl Source for &[u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| std::io::ErrorKind::UnexpectedEof)?;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= <[u8]>::len(self))
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&self[start..end]);
        Ok(())
    }
}

struct FileSource {
    file: File,
    len: u64,
}

impl Source for FileSource {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
}

/// Reads `.modinfo` of the module at `path`.
pub fn read_modinfo(path: &Path) -> Result<ModInfo, ModinfoError> {
    let err = |what: String| ModinfoError(format!("{}: {what}", path.display()));
    let file = File::open(path).map_err(|e| err(format!("opening: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| err(format!("reading metadata: {e}")))?
        .len();
    let mut info = parse(&FileSource { file, len }).map_err(|e| err(e.0))?;
    if info.name.is_empty() {
        info.name = file_module_name(path);
    }
    Ok(info)
}

/// Parses `.modinfo` from a module held in memory. Without a `name=` field
/// the name stays empty (there is no file name to take it from).
pub fn parse_modinfo(bytes: &[u8]) -> Result<ModInfo, ModinfoError> {
    parse(&bytes)
}

/// `nvidia-uvm.ko` → `nvidia_uvm`.
fn file_module_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default()
        .trim_end_matches(".ko")
        .replace('-', "_")
}

fn read_vec(src: &dyn Source, offset: u64, len: u64, what: &str) -> Result<Vec<u8>, ModinfoError> {
    offset
        .checked_add(len)
        .filter(|&e| e <= src.len())
        .ok_or_else(|| {
            format!(
                "{what} (offset {offset}, {len} bytes) lies beyond the end of the file ({} bytes): truncated or not a module",
                src.len()
            )
        })?;
    let n = usize::try_from(len).map_err(|_| format!("{what} is too large"))?;
    let mut buf = vec![0u8; n];
    src.read_at(offset, &mut buf)
        .map_err(|e| format!("reading {what}: {e}"))?;
    Ok(buf)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// One section header, the fields we use.
struct Section {
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
}

fn section(table: &[u8], index: u64, entsize: u64) -> Section {
    // Callers checked that the table holds `index + 1` entries of `entsize`
    // (≥ 64) bytes.
    let at = (index * entsize) as usize;
    let h = &table[at..at + ELF64_SHDR_SIZE as usize];
    Section {
        name: u32_at(h, 0),
        kind: u32_at(h, 4),
        offset: u64_at(h, 24),
        size: u64_at(h, 32),
        link: u32_at(h, 40),
    }
}

fn parse(src: &dyn Source) -> Result<ModInfo, ModinfoError> {
    let ehdr = read_vec(src, 0, ELF64_EHDR_SIZE, "the ELF header")?;
    if ehdr[..4] != *b"\x7fELF" {
        return Err("not an ELF file (bad magic)".into());
    }
    if ehdr[4] != 2 {
        return Err(ModinfoError(format!(
            "ELF class {} is not ELF64; only 64-bit modules are supported",
            ehdr[4]
        )));
    }
    if ehdr[5] != 1 {
        return Err(
            "big-endian ELF; only little-endian modules (x86_64, arm64) are supported".into(),
        );
    }
    let shoff = u64_at(&ehdr, 0x28);
    let shentsize = u64::from(u16_at(&ehdr, 0x3a));
    let mut shnum = u64::from(u16_at(&ehdr, 0x3c));
    let mut shstrndx = u64::from(u16_at(&ehdr, 0x3e));
    if shoff == 0 {
        return Err("no section header table".into());
    }
    if shentsize < ELF64_SHDR_SIZE {
        return Err(ModinfoError(format!(
            "section header size {shentsize} is smaller than ELF64's {ELF64_SHDR_SIZE}"
        )));
    }
    // Extended numbering: with ≥ 0xff00 sections the real count and string
    // table index live in section 0's size and link fields.
    if shnum == 0 || shstrndx == u64::from(SHN_XINDEX) {
        let first = read_vec(src, shoff, shentsize, "section header 0")?;
        let s0 = section(&first, 0, shentsize);
        if shnum == 0 {
            shnum = s0.size;
        }
        if shstrndx == u64::from(SHN_XINDEX) {
            shstrndx = u64::from(s0.link);
        }
    }
    if shnum == 0 || shnum > MAX_SECTION_HEADERS {
        return Err(ModinfoError(format!("implausible section count {shnum}")));
    }
    if shstrndx >= shnum {
        return Err(ModinfoError(format!(
            "section name table index {shstrndx} is not below the section count {shnum}"
        )));
    }
    let table = read_vec(src, shoff, shnum * shentsize, "the section header table")?;
    let strtab_hdr = section(&table, shstrndx, shentsize);
    if strtab_hdr.size > MAX_SHSTRTAB_BYTES {
        return Err(ModinfoError(format!(
            "section name table of {} bytes is implausible",
            strtab_hdr.size
        )));
    }
    let names = read_vec(
        src,
        strtab_hdr.offset,
        strtab_hdr.size,
        "the section name table",
    )?;
    let mut modinfo = None;
    for i in 0..shnum {
        let s = section(&table, i, shentsize);
        let start = s.name as usize;
        if start >= names.len() {
            continue;
        }
        let end = names[start..]
            .iter()
            .position(|&b| b == 0)
            .map_or(names.len(), |p| start + p);
        if &names[start..end] == b".modinfo" {
            modinfo = Some(s);
            break;
        }
    }
    let s = modinfo.ok_or("no .modinfo section: not a kernel module")?;
    if s.kind == SHT_NOBITS {
        return Err(".modinfo has no contents (SHT_NOBITS)".into());
    }
    if s.size > MAX_MODINFO_BYTES {
        return Err(ModinfoError(format!(
            ".modinfo of {} bytes is implausible",
            s.size
        )));
    }
    let data = read_vec(src, s.offset, s.size, "the .modinfo section")?;
    let mut info = from_fields(parse_fields(&data)?)?;
    info.machine = u16_at(&ehdr, 0x12);
    Ok(info)
}

/// Splits `.modinfo` contents: NUL-separated `key=value` strings, with NUL
/// padding between them (sections are aligned).
pub fn parse_fields(data: &[u8]) -> Result<Vec<(String, String)>, ModinfoError> {
    let mut fields = Vec::new();
    for raw in data.split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let text = String::from_utf8_lossy(raw);
        let (k, v) = text
            .split_once('=')
            .ok_or_else(|| format!(".modinfo entry {text:?} is not key=value"))?;
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
    let vermagic = get("vermagic").ok_or(".modinfo has no vermagic")?;
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

    /// A minimal ELF64 with a section table: [null, .shstrtab, .modinfo].
    pub(crate) fn tiny_module(modinfo: &[u8]) -> Vec<u8> {
        let shstrtab = b"\0.shstrtab\0.modinfo\0";
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[6] = 1;
        let strtab_off = out.len() as u64;
        out.extend_from_slice(shstrtab);
        let modinfo_off = out.len() as u64;
        out.extend_from_slice(modinfo);
        while !out.len().is_multiple_of(8) {
            out.push(0);
        }
        let shoff = out.len() as u64;
        let mut sh = |name: u32, kind: u32, off: u64, size: u64| {
            let mut h = [0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&off.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&h);
        };
        sh(0, 0, 0, 0);
        sh(1, 3, strtab_off, shstrtab.len() as u64);
        sh(11, 1, modinfo_off, modinfo.len() as u64);
        out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        out[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        out
    }

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
            let err = parse_modinfo(&bytes).unwrap_err().0;
            assert!(err.contains(want), "{what}: {err}");
        }
        // A module without a .modinfo section.
        let mut m = good.clone();
        let pos = m.windows(8).position(|w| w == b".modinfo").unwrap();
        m[pos..pos + 8].copy_from_slice(b".modinfX");
        assert!(parse_modinfo(&m).unwrap_err().0.contains("no .modinfo"));
    }
}
