//! Tarballs: hostile entries are refused, links inside kept; other
//! sources; Debian's real tarball; decompression bombs.

use super::*;

fn hostile(name: &str, entries: &[Raw], reason: Reason, needle: &str) {
    let work = tempfile::tempdir().unwrap();
    let tgz = work.path().join(format!("{name}.tar.gz"));
    fs::write(&tgz, gzip(&raw_tar(entries))).unwrap();
    expect_err(&tgz, &work.path().join("out"), reason, needle);
}

#[test]
fn tarball_parent_dir_entry_is_refused() {
    hostile(
        "slip",
        &[Raw::Dir("a"), Raw::File("a/../../evil", b"x")],
        Reason::UnsafeArchive,
        "'..'",
    );
}

#[test]
fn tarball_absolute_entry_is_refused() {
    let target = std::env::temp_dir().join(format!("gpu-driver-abs-{}", std::process::id()));
    let name = target.to_str().unwrap().to_string();
    hostile(
        "abs",
        &[Raw::File(&name, b"x")],
        Reason::UnsafeArchive,
        "absolute",
    );
    assert!(!target.exists(), "absolute entry was written");
}

#[test]
fn tarball_symlinks_leading_out_are_refused() {
    hostile(
        "up",
        &[Raw::Dir("kernel"), Raw::Symlink("kernel/etc", "../../etc")],
        Reason::UnsafeArchive,
        "kernel/etc",
    );
    hostile(
        "abs-link",
        &[Raw::Symlink("passwd", "/etc/passwd")],
        Reason::UnsafeArchive,
        "absolute",
    );
    // Each link stays inside on its own, together they climb out.
    hostile(
        "chain",
        &[Raw::Symlink("here", "."), Raw::Symlink("up", "here/..")],
        Reason::UnsafeArchive,
        "'up'",
    );
}

#[test]
fn tarball_writing_through_a_symlink_is_refused() {
    hostile(
        "through",
        &[
            Raw::Dir("sub"),
            Raw::Symlink("lnk", "sub"),
            Raw::File("lnk/file", b"x"),
        ],
        Reason::UnsafeArchive,
        "through the symlink",
    );
}

#[test]
fn tarball_hardlink_out_and_devices_are_refused() {
    hostile(
        "hardlink",
        &[Raw::Hardlink("passwd", "../../../../etc/passwd")],
        Reason::UnsafeArchive,
        "hard link",
    );
    hostile("fifo", &[Raw::Fifo("pipe")], Reason::UnsafeArchive, "fifo");
}

#[test]
fn tarball_links_inside_are_kept() {
    let work = tempfile::tempdir().unwrap();
    let tgz = work.path().join("ok.tar.gz");
    fs::write(
        &tgz,
        gzip(&raw_tar(&[
            Raw::Dir("lib"),
            Raw::File("lib/libnvidia.so.1", b"elf"),
            Raw::Symlink("lib/libnvidia.so", "libnvidia.so.1"),
            Raw::Hardlink("lib/copy", "lib/libnvidia.so.1"),
        ])),
    )
    .unwrap();
    let dest = work.path().join("out");
    let report = extract_package(&tgz, &dest).unwrap();
    assert_eq!(report.kind, PackageKind::Tarball(Compression::Gzip));
    assert_eq!(report.entries, 4);
    assert_eq!(report.bytes, 3);
    assert_eq!(fs::read(dest.join("lib/libnvidia.so")).unwrap(), b"elf");
    assert_eq!(fs::read(dest.join("lib/copy")).unwrap(), b"elf");
}

#[test]
fn truncated_tarballs_are_invalid() {
    let (work, tree) = work_with_driver_tree();
    let tar = tar_of(&tree, "pkg");
    // Compressed and cut: the decompressor notices.
    for (name, bytes) in [
        ("gz", gzip(&tar)),
        ("bz2", bzip2_(&tar)),
        ("xz", xz(&tar)),
        ("zst", zstd::encode_all(&tar[..], 3).unwrap()),
    ] {
        let cut = work.path().join(format!("cut.tar.{name}"));
        fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        expect_invalid(&cut, work.path(), "out1", "cut.tar");
        // Only the compressor's trailer missing: the tar is whole, the
        // stream is not.
        fs::write(&cut, &bytes[..bytes.len() - 4]).unwrap();
        expect_invalid(&cut, work.path(), "out1", "cut.tar");
    }
    // Plain and cut at a block boundary after the first entries: only the
    // missing end-of-archive marker tells.
    let plain = work.path().join("cut.tar");
    fs::write(&plain, &tar[..2048]).unwrap();
    expect_invalid(&plain, work.path(), "out2", "truncated");
}

#[test]
fn redist_style_tarballs_of_each_compression() {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    driver_tree(&tree);
    let tar = tar_of(&tree, "nvidia_driver-linux-x86_64-550.0-archive");
    let compressed: Vec<(Compression, Vec<u8>)> = vec![
        (Compression::None, tar.clone()),
        (Compression::Gzip, gzip(&tar)),
        (Compression::Xz, xz(&tar)),
        (Compression::Zstd, zstd::encode_all(&tar[..], 3).unwrap()),
        (Compression::Bzip2, bzip2_(&tar)),
    ];
    for (c, bytes) in compressed {
        // The name says nothing: the kind comes from the content.
        let src = work.path().join(format!("archive-{c:?}"));
        fs::write(&src, bytes).unwrap();
        let dest = work.path().join(format!("out-{c:?}"));
        let report = extract_package(&src, &dest).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        assert_eq!(report.kind, PackageKind::Tarball(c));
        let top = dest.join("nvidia_driver-linux-x86_64-550.0-archive");
        assert_driver_tree(&top);
        // One directory down is found too.
        assert_eq!(
            module_source_dir(&dest, ModuleFlavor::Open).unwrap(),
            top.join("kernel-open")
        );
    }
}

#[test]
fn directory_sources_are_copied_with_the_same_rules() {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("mirror");
    driver_tree(&tree);
    let dest = work.path().join("out");
    let report = extract_package(&tree, &dest).unwrap();
    assert_eq!(report.kind, PackageKind::Directory);
    assert_eq!(report.compression, None);
    assert_driver_tree(&dest);

    std::os::unix::fs::symlink("/etc", tree.join("kernel/etc")).unwrap();
    expect_err(
        &tree,
        &work.path().join("out2"),
        Reason::UnsafeArchive,
        "absolute",
    );
    fs::remove_file(tree.join("kernel/etc")).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(tree.join("sock")).unwrap();
    expect_err(
        &tree,
        &work.path().join("out3"),
        Reason::UnsafeArchive,
        "socket",
    );
}

#[test]
fn existing_target_and_unknown_files_are_errors() {
    let (work, tree) = work_with_driver_tree();
    let dest = work.path().join("out");
    fs::create_dir(&dest).unwrap();
    let err = extract_package(&tree, &dest).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");

    let junk = work.path().join("junk.run");
    fs::write(&junk, b"just some text\n").unwrap();
    expect_invalid(&junk, work.path(), "out2", "not a makeself");
}

fn test_data(name: &str) -> PathBuf {
    let dir = crate::support::tools::test_data();
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is missing: {}",
        p.display(),
        crate::support::tools::HOW
    );
    p
}

#[test]
fn debian_nvidia_open_kernel_source_tarball() {
    let src = test_data("nvidia-open-kernel.tar.xz");
    let work = tempfile::tempdir().unwrap();
    let dest = work.path().join("src");
    let report = extract_package(&src, &dest).unwrap();
    assert_eq!(report.kind, PackageKind::Tarball(Compression::Xz));
    assert!(report.entries > 400, "{report:?}");
    assert!(report.bytes > 100 << 20, "{report:?}");
    let dir = module_source_dir(&dest, ModuleFlavor::Open).unwrap();
    assert_eq!(dir, dest.join("modules/nvidia-open-kernel"));
    assert!(dir.join("Kbuild").is_file());
    assert!(dir.join("nvidia/nv.c").is_file() || dir.join("nvidia").is_dir());
    let err = module_source_dir(&dest, ModuleFlavor::Proprietary).unwrap_err();
    assert_eq!(err.reason, Reason::ArchiveInvalid);
    assert!(err.to_string().contains("modules/nvidia-kernel/"), "{err}");
}

/// A GNU sparse entry whose map says "16 GiB, all hole": a few hundred
/// bytes of tar.gz that unpack to 16 GiB of zeros.
fn sparse_bomb() -> Vec<u8> {
    const REAL: u64 = 16 << 30;
    let mut h = tar::Header::new_gnu();
    let octal = |field: &mut [u8], v: u64| {
        // All 12 digits, no terminator: 16 GiB needs them.
        let s = format!("{v:0width$o}", width = field.len());
        field.copy_from_slice(s.as_bytes());
    };
    {
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..8].copy_from_slice(b"bomb.bin");
        octal(&mut gnu.sparse[0].offset, REAL);
        octal(&mut gnu.sparse[0].numbytes, 0);
        octal(&mut gnu.realsize, REAL);
    }
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.set_size(0);
    h.set_mode(0o644);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &b""[..]).unwrap();
    gzip(&b.into_inner().unwrap())
}

/// Extraction of `src` within these limits is refused as unsafe and
/// leaves nothing at `dest`; returns the error's message.
fn refused_over_limits(src: &Path, dest: &Path, max_bytes: u64, max_entries: u64) -> String {
    let limits = Limits {
        max_bytes,
        max_entries,
    };
    let err = extract_package_with(src, dest, limits).expect_err("must be refused");
    assert_eq!(err.reason, Reason::UnsafeArchive, "{err}");
    assert_nothing_left(dest);
    err.to_string()
}

#[test]
fn a_decompression_bomb_stops_at_the_size_limit() {
    let work = tempfile::tempdir().unwrap();
    let bomb = work.path().join("bomb.tar.gz");
    let bytes = sparse_bomb();
    assert!(bytes.len() < 1024, "{} bytes", bytes.len());
    fs::write(&bomb, bytes).unwrap();
    let dest = work.path().join("out");
    let err = refused_over_limits(&bomb, &dest, 64 << 20, 1000);
    assert!(
        err.contains("64 MiB") && err.contains("--max-unpacked-size"),
        "{err}"
    );

    // Zeros that compress 1000:1 take the same road.
    let zeros = gzip(&raw_tar(&[Raw::File("z", &vec![0u8; 2 << 20])]));
    fs::write(&bomb, zeros).unwrap();
    refused_over_limits(&bomb, &dest, 1 << 20, 1000);
}

#[test]
fn an_archive_of_too_many_entries_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
    let entries: Vec<Raw> = names.iter().map(|n| Raw::File(n, b"")).collect();
    let src = work.path().join("many.tar.gz");
    fs::write(&src, gzip(&raw_tar(&entries))).unwrap();
    let dest = work.path().join("out");
    let err = refused_over_limits(&src, &dest, 1 << 20, 10);
    assert!(err.contains("--max-unpacked-entries"), "{err}");
    // Within the limit it unpacks.
    let ok = Limits {
        max_bytes: 1 << 20,
        max_entries: 20,
    };
    extract_package_with(&src, &dest, ok).unwrap();
}
