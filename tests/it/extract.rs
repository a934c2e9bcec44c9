//! Package extraction against real archives: makeself `.run` files built by
//! Debian's `makeself` from real files, tarballs written with the `tar`
//! crate (also to craft the hostile entries tar tools refuse to write), and
//! Debian's real `nvidia-open-kernel-source` tarball.
//!
//! Needs `makeself`, `xz`, `bzip2`, `zstd`, `md5sum`, `sha256sum` and `cksum`
//! on PATH and `GPU_DRIVER_TEST_DATA` from `scripts/fetch-test-data`
//! (`scripts/test` provides both; `bash .ci/run` installs the tools). A
//! missing one fails the test that needs it, saying so.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gpu_driver_installer::Reason;
use gpu_driver_installer::extract::{
    Checksum, Compression, Limits, PackageKind, extract_package, extract_package_with,
    module_source_dir,
};
use gpu_driver_installer::host::ModuleFlavor;

// ---------------------------------------------------------------- helpers

fn require_tool(tool: &str) {
    crate::support::tools::require_tool(
        tool,
        "these tests need Debian's makeself, xz-utils, bzip2 and zstd \
         (`apt-get install makeself xz-utils bzip2 zstd`, or run `bash .ci/run`)",
    );
}

fn makeself_help() -> String {
    require_tool("makeself");
    let out = Command::new("makeself")
        .arg("--help")
        .output()
        .expect("running makeself --help");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `makeself FLAGS DIR OUT label ./nvidia-installer`.
fn makeself(flags: &[&str], dir: &Path, out: &Path) {
    require_tool("makeself");
    let status = Command::new("makeself")
        .arg("--quiet")
        .args(flags)
        .arg(dir)
        .arg(out)
        .arg("NVIDIA Accelerated Graphics Driver for Linux-x86_64 (test)")
        .arg("./nvidia-installer")
        .stdout(Stdio::null())
        .status()
        .expect("running makeself");
    assert!(status.success(), "makeself {flags:?} failed: {status}");
}

/// A small tree shaped like NVIDIA's: both module source trees, an
/// executable, a relative symlink, a real binary file.
fn driver_tree(dir: &Path) {
    for (path, body) in [
        ("kernel-open/Kbuild", "obj-m += nvidia.o\n"),
        (
            "kernel-open/Makefile",
            "all:\n\t$(MAKE) -C $(SYSSRC) M=$(CURDIR)\n",
        ),
        (
            "kernel-open/nvidia/nv.c",
            "int nv_init(void) { return 0; }\n",
        ),
        ("kernel/Kbuild", "obj-m += nvidia.o\n"),
        ("kernel/Makefile", "all:\n"),
        ("kernel/common/inc/nv.h", "#define NV 1\n"),
        ("README.txt", "NVIDIA driver test tree\n"),
    ] {
        let p = dir.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, body).unwrap();
    }
    let installer = dir.join("nvidia-installer");
    fs::copy("/bin/true", &installer).unwrap();
    fs::set_permissions(&installer, fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("../README.txt", dir.join("kernel/README.txt")).unwrap();
}

fn assert_driver_tree(root: &Path) {
    assert_eq!(
        fs::read_to_string(root.join("kernel-open/nvidia/nv.c")).unwrap(),
        "int nv_init(void) { return 0; }\n"
    );
    assert_eq!(
        fs::read(root.join("nvidia-installer")).unwrap(),
        fs::read("/bin/true").unwrap()
    );
    let mode = fs::metadata(root.join("nvidia-installer"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "executable bits are kept");
    assert_eq!(
        fs::read_link(root.join("kernel/README.txt")).unwrap(),
        Path::new("../README.txt")
    );
    assert_eq!(
        module_source_dir(root, ModuleFlavor::Open).unwrap(),
        root.join("kernel-open")
    );
    assert_eq!(
        module_source_dir(root, ModuleFlavor::Proprietary).unwrap(),
        root.join("kernel")
    );
}

/// Asserts that a failed extraction left neither the target nor a
/// temporary directory beside it.
fn assert_nothing_left(dest: &Path) {
    assert!(
        !dest.exists(),
        "{} must not exist after a failure",
        dest.display()
    );
    let parent = dest.parent().unwrap();
    for e in fs::read_dir(parent).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !name.contains(".partial-"),
            "temporary directory {name} left behind"
        );
    }
}

fn tool_stdout(tool: &str, input: &[u8]) -> String {
    require_tool(tool);
    let mut child = Command::new(tool)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {tool}: {e}"));
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{tool} failed");
    String::from_utf8(out.stdout).unwrap()
}

fn first_field(s: &str) -> String {
    s.split_whitespace().next().unwrap().to_string()
}

/// Byte offset after the first `n` lines.
fn after_lines(bytes: &[u8], n: usize) -> usize {
    let mut seen = 0;
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    panic!("fewer than {n} lines");
}

fn set_line(header: &str, key: &str, value: &str) -> String {
    header
        .lines()
        .map(|l| {
            if l.starts_with(&format!("{key}=")) {
                format!("{key}=\"{value}\"")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The header's `skip="N"`: its length in lines.
fn header_skip(text: &str) -> usize {
    text.lines()
        .find_map(|l| l.strip_prefix("skip=\""))
        .and_then(|v| v.trim_end_matches('"').parse().ok())
        .expect("makeself header has skip=\"N\"")
}

/// A genuine makeself header (from running makeself with `flag`) in front
/// of other payload chunks, with sizes and MD5/SHA256/CRC computed by
/// md5sum, sha256sum and cksum: for payloads makeself cannot be made to
/// produce (hostile tars, several chunks).
fn makeself_with_payloads(work: &Path, flag: &str, chunks: &[Vec<u8>]) -> PathBuf {
    let template = work.join("template");
    fs::create_dir_all(&template).unwrap();
    fs::write(template.join("README"), "template\n").unwrap();
    let run = work.join("template.run");
    let _ = fs::remove_file(&run);
    makeself(&[flag, "--sha256"], &template, &run);
    let bytes = fs::read(&run).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let skip = header_skip(&text);
    let mut header = String::from_utf8(bytes[..after_lines(&bytes, skip)].to_vec()).unwrap();
    let join =
        |f: &dyn Fn(&[u8]) -> String| chunks.iter().map(|c| f(c)).collect::<Vec<_>>().join(" ");
    header = set_line(&header, "filesizes", &join(&|c| c.len().to_string()));
    header = set_line(
        &header,
        "totalsize",
        &chunks.iter().map(Vec::len).sum::<usize>().to_string(),
    );
    header = set_line(
        &header,
        "MD5",
        &join(&|c| first_field(&tool_stdout("md5sum", c))),
    );
    header = set_line(
        &header,
        "SHA",
        &join(&|c| first_field(&tool_stdout("sha256sum", c))),
    );
    header = set_line(
        &header,
        "CRCsum",
        &join(&|c| first_field(&tool_stdout("cksum", c))),
    );
    let out = work.join("crafted.run");
    let mut f = fs::File::create(&out).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    for c in chunks {
        f.write_all(c).unwrap();
    }
    out
}

enum Raw<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    Fifo(&'a str),
}

/// A tar written header by header, names copied in raw: the `tar` crate's
/// own setters refuse `..` and absolute paths, which is what these tests
/// need to write.
fn raw_tar(entries: &[Raw]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (name, link, kind, data): (&str, Option<&str>, tar::EntryType, &[u8]) = match e {
            Raw::File(n, d) => (n, None, tar::EntryType::Regular, d),
            Raw::Dir(n) => (n, None, tar::EntryType::Directory, b""),
            Raw::Symlink(n, t) => (n, Some(t), tar::EntryType::Symlink, b""),
            Raw::Hardlink(n, t) => (n, Some(t), tar::EntryType::Link, b""),
            Raw::Fifo(n) => (n, None, tar::EntryType::Fifo, b""),
        };
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(t) = link {
            gnu.linkname[..t.len()].copy_from_slice(t.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn xz(data: &[u8]) -> Vec<u8> {
    let mut e = liblzma::write::XzEncoder::new(Vec::new(), 6);
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn bzip2_(data: &[u8]) -> Vec<u8> {
    let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A real tar of `dir`'s contents, as GNU tar would write it (prefix `./`
/// like makeself's).
fn tar_of(dir: &Path, prefix: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(prefix, dir).unwrap();
    b.into_inner().unwrap()
}

fn expect_err(src: &Path, dest: &Path, reason: Reason, needle: &str) -> String {
    let err = extract_package(src, dest).expect_err("extraction must fail");
    assert_eq!(err.reason, reason, "{err}");
    assert!(
        err.to_string().contains(needle),
        "message should mention {needle:?}: {err}"
    );
    assert!(
        err.to_string().contains(&src.display().to_string()),
        "message should name the file: {err}"
    );
    assert_nothing_left(dest);
    eprintln!("refused as expected: {err}");
    err.to_string()
}

/// A work directory holding a driver tree at `pkg`.
fn work_with_driver_tree() -> (tempfile::TempDir, PathBuf) {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("pkg");
    driver_tree(&tree);
    (work, tree)
}

/// A work directory with that tree packed by makeself (`flags`) into
/// `driver.run`; returns the work directory and the package.
fn packed_driver(flags: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let (work, tree) = work_with_driver_tree();
    let run = work.path().join("driver.run");
    makeself(flags, &tree, &run);
    (work, run)
}

/// [`expect_err`] for an invalid archive extracted to `<work>/<out>`.
fn expect_invalid(src: &Path, work: &Path, out: &str, needle: &str) -> String {
    expect_err(src, &work.join(out), Reason::ArchiveInvalid, needle)
}

// ------------------------------------------------------ makeself archives

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

// ------------------------------------------------------ hostile tarballs

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

// ------------------------------------------------------ other sources

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

// ------------------------------------------------------ Debian's real tarball

fn test_data(name: &str) -> PathBuf {
    let dir = std::env::var_os("GPU_DRIVER_TEST_DATA").unwrap_or_else(|| {
        panic!(
            "GPU_DRIVER_TEST_DATA is not set: run `scripts/test`, or \
             `export GPU_DRIVER_TEST_DATA=$(scripts/fetch-test-data)` before `cargo test`"
        )
    });
    let p = PathBuf::from(dir).join(name);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-test-data and point GPU_DRIVER_TEST_DATA at the directory it prints",
        p.display()
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
