// A minimal ELF64 with a section table [null, .shstrtab, .modinfo] whose
// `.modinfo` holds `modinfo`: enough for modinfo's parser and install's
// vermagic preflight, never loaded. Written once: the integration tests
// reach it as `support::elf`, src/modinfo.rs's unit tests `include!` it
// (plain comments only, so it can be included).

pub fn tiny_module(modinfo: &[u8]) -> Vec<u8> {
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
