//! makeself archives (NVIDIA's .run): every compression, checksums,
//! truncation, several payload chunks, NVIDIA's header.

use super::*;

#[test]
fn makeself_archives_of_every_supported_compression() {
    let help = makeself_help();
    let mut tested = Vec::new();
    for (flag, compression, tool) in [
        ("--gzip", Compression::Gzip, "gzip"),
        ("--bzip2", Compression::Bzip2, "bzip2"),
        ("--xz", Compression::Xz, "xz"),
        ("--zstd", Compression::Zstd, "zstd"),
        ("--nocomp", Compression::None, "cat"),
    ] {
        if !help.contains(flag) {
            // Older makeself (before 2.4.2) has no --zstd; everything else
            // is in every 2.x.
            assert_eq!(flag, "--zstd", "makeself --help does not list {flag}");
            eprintln!("makeself does not support {flag}; not tested");
            continue;
        }
        require_tool(tool);
        let work = tempfile::tempdir().unwrap();
        let tree = work.path().join("NVIDIA-Linux-x86_64-test");
        driver_tree(&tree);
        let run = work.path().join("driver.run");
        makeself(&[flag, "--sha256"], &tree, &run);
        let dest = work.path().join("out");
        let report = extract_package(&run, &dest).unwrap_or_else(|e| panic!("{flag}: {e}"));
        assert_eq!(report.kind, PackageKind::Makeself, "{flag}");
        assert_eq!(report.compression, Some(compression), "{flag}");
        for sum in [Checksum::Sha256, Checksum::Md5, Checksum::Cksum] {
            assert!(
                report.checksums_verified.contains(&sum),
                "{flag}: {report:?}"
            );
        }
        // makeself 2.4 archives files and links only (8 + 1), no directories.
        assert_eq!(report.entries, 9, "{flag}: {report:?}");
        assert_driver_tree(&dest);
        tested.push(flag);
    }
    eprintln!("tested makeself {tested:?}");
}

#[test]
fn makeself_without_embedded_checksums_still_extracts() {
    let (work, run) = packed_driver(&["--xz", "--nomd5", "--nocrc"]);
    let report = extract_package(&run, &work.path().join("out")).unwrap();
    assert!(report.checksums_verified.is_empty(), "{report:?}");
    assert_driver_tree(&work.path().join("out"));
}

#[test]
fn makeself_checksum_mismatch_names_the_checksum() {
    let (work, tree) = work_with_driver_tree();
    // Which checksum the header carries decides which one must fail.
    for (flags, name) in [
        (&["--gzip", "--sha256"][..], "SHA256"),
        (&["--gzip"][..], "MD5"),
        (&["--gzip", "--nomd5"][..], "CRC"),
    ] {
        let run = work.path().join(format!("{name}.run"));
        makeself(flags, &tree, &run);
        let mut bytes = fs::read(&run).unwrap();
        let n = bytes.len();
        bytes[n - 40] ^= 0x01;
        fs::write(&run, &bytes).unwrap();
        let dest = work.path().join(format!("out-{name}"));
        let msg = expect_err(&run, &dest, Reason::ArchiveInvalid, name);
        assert!(msg.contains("checksum"), "{msg}");
    }
}

#[test]
fn truncated_makeself_is_invalid() {
    let (work, run) = packed_driver(&["--xz"]);
    let bytes = fs::read(&run).unwrap();
    fs::write(&run, &bytes[..bytes.len() - 100]).unwrap();
    expect_invalid(&run, work.path(), "out", "truncated");
    // Cut inside the header: no payload at all.
    fs::write(&run, &bytes[..2000]).unwrap();
    expect_invalid(&run, work.path(), "out", "truncated");
}

#[test]
fn unsupported_makeself_encoding_is_named() {
    let (work, run) = packed_driver(&["--base64"]);
    expect_invalid(&run, work.path(), "out", "base64");
}

#[test]
fn makeself_tar_slip_is_refused_and_leaves_nothing() {
    let work = tempfile::tempdir().unwrap();
    let payload = gzip(&raw_tar(&[
        Raw::File("./kernel-open/Kbuild", b"obj-m += nvidia.o\n"),
        Raw::File("../evil", b"escaped\n"),
    ]));
    let run = makeself_with_payloads(work.path(), "--gzip", &[payload]);
    let dest = work.path().join("out");
    expect_err(&run, &dest, Reason::UnsafeArchive, "../evil");
    assert!(!work.path().join("evil").exists(), "../evil was written");
}

#[test]
fn makeself_with_several_payload_chunks() {
    let work = tempfile::tempdir().unwrap();
    let one = gzip(&raw_tar(&[
        Raw::Dir("kernel-open"),
        Raw::File("kernel-open/Kbuild", b"one\n"),
    ]));
    let two = gzip(&raw_tar(&[
        Raw::Dir("kernel-open"),
        Raw::File("kernel-open/Makefile", b"two\n"),
    ]));
    let run = makeself_with_payloads(work.path(), "--gzip", &[one, two]);
    let dest = work.path().join("out");
    let report = extract_package(&run, &dest).unwrap();
    assert_eq!(report.checksums_verified.len(), 3, "{report:?}");
    assert_eq!(
        fs::read_to_string(dest.join("kernel-open/Kbuild")).unwrap(),
        "one\n"
    );
    assert_eq!(
        fs::read_to_string(dest.join("kernel-open/Makefile")).unwrap(),
        "two\n"
    );
}

#[test]
fn makeself_header_naming_another_compression_is_invalid() {
    let work = tempfile::tempdir().unwrap();
    let payload = xz(&raw_tar(&[Raw::File("a", b"a\n")]));
    let run = makeself_with_payloads(work.path(), "--gzip", &[payload]);
    expect_invalid(&run, work.path(), "out", "gzip -cd");
}

/// makeself 2.1.x wrote the header size as a literal (`head -n 402 "$0"`);
/// rewrite a real 2.4.5 header into that form (same line count).
#[test]
fn makeself_2_1_style_literal_header_size() {
    let (work, run) = packed_driver(&["--gzip"]);
    let bytes = fs::read(&run).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let skip = header_skip(&text);
    let end = after_lines(&bytes, skip);
    let header = String::from_utf8(bytes[..end].to_vec()).unwrap();
    let header = header
        .replace(&format!("skip=\"{skip}\""), "# no skip variable in 2.1.x")
        .replace("head -n \"$skip\"", &format!("head -n {skip}"));
    assert!(header.contains(&format!("head -n {skip} \"$0\"")));
    let old = work.path().join("old.run");
    let mut out = header.into_bytes();
    out.extend_from_slice(&bytes[end..]);
    fs::write(&old, out).unwrap();
    let report = extract_package(&old, &work.path().join("out")).unwrap();
    assert_eq!(report.compression, Some(Compression::Gzip));
    assert_driver_tree(&work.path().join("out"));
}

/// NVIDIA's `.run` files come from its makeself 1.6.0-nv2: `skip=N` is the
/// line the payload starts on (`tail -n +$skip`), an embedded decompressor
/// binary may sit before it, and CRCsum/MD5 cover line 4 to the end. This
/// header follows that layout; the sums come from cksum and md5sum.
#[test]
fn nvidia_style_header() {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("NVIDIA-Linux-x86_64-test");
    driver_tree(&tree);
    let payload = xz(&tar_of(&tree, "."));
    let stub = [
        "#! /bin/sh",
        "CRCsum=@CRC@",
        "MD5=@MD5@",
        "skip=@SKIP@",
        "skip_decompress=8",
        "size_decompress=2",
        "label=\"NVIDIA Accelerated Graphics Driver for Linux-x86_64 test\"",
        "script=./nvidia-installer",
        "targetdir=NVIDIA-Linux-x86_64-test",
        "if [ \"$1\" = \"--list\" ]; then",
        "    tail -n +$skip $0  | xz -d | tar tvf - 2> /dev/null",
        "    exit 0;",
        "fi",
        "sum1=`tail -n +4 $0 | cksum | awk '{print $1}'`",
        "exit 0",
    ];
    // An "embedded decompressor": binary lines holding NULs.
    let decompressor: &[u8] = b"\x7fELF\x02\x01\x01\x00\x00\x00\nmore\x00binary\n";
    let stub_lines = stub.len();
    let skip = stub_lines + 2 + 1; // the payload starts on the line after them
    let build = |crc: &str, md5: &str| -> Vec<u8> {
        let mut v = stub
            .join("\n")
            .replace("@CRC@", crc)
            .replace("@MD5@", md5)
            .replace("@SKIP@", &skip.to_string())
            .into_bytes();
        v.push(b'\n');
        v.extend_from_slice(decompressor);
        v.extend_from_slice(&payload);
        v
    };
    // The sums cover line 4 onwards, which does not include the sums.
    let unsummed = build("0000000000", "00000000000000000000000000000000");
    let from4 = &unsummed[after_lines(&unsummed, 3)..];
    let crc = first_field(&tool_stdout("cksum", from4));
    let md5 = first_field(&tool_stdout("md5sum", from4));
    let run = work.path().join("NVIDIA-Linux-x86_64-test.run");
    fs::write(&run, build(&crc, &md5)).unwrap();

    let dest = work.path().join("out");
    let report = extract_package(&run, &dest).unwrap();
    assert_eq!(report.kind, PackageKind::Makeself);
    assert_eq!(report.compression, Some(Compression::Xz));
    assert_eq!(
        report.checksums_verified,
        vec![Checksum::Md5, Checksum::Cksum]
    );
    assert_driver_tree(&dest);

    // Flip one byte of the payload: MD5 fails first.
    let mut bad = build(&crc, &md5);
    let n = bad.len();
    bad[n - 10] ^= 0x10;
    fs::write(&run, bad).unwrap();
    expect_invalid(&run, work.path(), "out2", "MD5");
}
