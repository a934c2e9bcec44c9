//! Package extraction against real archives: makeself `.run` files built by
//! Debian's `makeself` from real files, tarballs written with the `tar`
//! crate (also to craft the hostile entries tar tools refuse to write), and
//! Debian's real `nvidia-open-kernel-source` tarball.
//!
//! Needs `makeself`, `xz`, `bzip2`, `zstd`, `md5sum`, `sha256sum` and `cksum`
//! on PATH and the tools file's `testData` (`scripts/fetch-test-data`)
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

use gpu_driver_installer::node::ModuleFlavor;

mod makeself;
mod tarballs;

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
