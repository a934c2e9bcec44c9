//! The build step's parsers and checks, on outputs captured from the real
//! builder roots (Debian bookworm with gcc 12 and kernel 6.1, trixie with
//! gcc 14 and kernel 6.12) and on a real compiled module; no compiles.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use gpu_driver_installer::Reason;
use gpu_driver_installer::build::{
    self, CompilerMatch, EXCERPT_LINES, Target, check_disk, check_machine, check_proc, check_tools,
    check_vermagic, choose_compiler, classify_log, compare_compilers, make_args,
    parse_nv_version_string, parse_version_first_line, parse_version_mk, target_arch,
};
use gpu_driver_installer::headers::{
    self, find_common_dir, parse_kconfig_arch, parse_kconfig_string, parse_makefile_include,
    parse_uts_release,
};
use gpu_driver_installer::host_root::{HostRoot, HostRootSource};
use gpu_driver_installer::modinfo::{parse_modinfo, read_modinfo};
use gpu_driver_installer::node::CpuArch;
use gpu_driver_installer::text::rfc3339_utc;

fn fixture(rel: &str) -> PathBuf {
    crate::support::repo_root().join("tests/fixtures").join(rel)
}

fn text(rel: &str) -> String {
    fs::read_to_string(fixture(rel)).unwrap_or_else(|e| panic!("reading fixture {rel}: {e}"))
}

fn root() -> HostRoot {
    HostRoot::new("/", HostRootSource::Flag)
}

// ---------------------------------------------------------------- compiler

#[test]
fn gcc_version_first_lines() {
    assert_eq!(
        parse_version_first_line(&text("build/toolchain/gcc-12-bookworm.version")).as_deref(),
        Some("gcc (Debian 12.2.0-14+deb12u1) 12.2.0")
    );
    assert_eq!(
        parse_version_first_line(&text("build/toolchain/gcc-14-trixie.version")).as_deref(),
        Some("gcc (Debian 14.2.0-19) 14.2.0")
    );
    assert_eq!(
        parse_version_first_line(&text(
            "build/toolchain/aarch64-linux-gnu-gcc-12-bookworm.version"
        ))
        .as_deref(),
        Some("aarch64-linux-gnu-gcc-12 (Debian 12.2.0-14) 12.2.0")
    );
    assert_eq!(parse_version_first_line("\n\n"), None);
}

#[test]
fn kernel_compiler_from_auto_conf_and_config() {
    let key = "CONFIG_CC_VERSION_TEXT";
    // auto.conf writes the value bare, .config quoted: both must read the same.
    for (file, want) in [
        (
            "auto.conf-bookworm",
            "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0",
        ),
        (
            "config-bookworm",
            "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0",
        ),
        (
            "auto.conf-trixie",
            "x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0",
        ),
        (
            "config-trixie",
            "x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0",
        ),
        (
            "config-bookworm-arm64",
            "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0",
        ),
    ] {
        let t = text(&format!("build/toolchain/{file}"));
        assert_eq!(
            parse_kconfig_string(&t, key).as_deref(),
            Some(want),
            "{file}"
        );
    }
    assert_eq!(
        parse_kconfig_string("CONFIG_X=\"a \\\"b\\\" \\\\c\"\n", "CONFIG_X").as_deref(),
        Some("a \"b\" \\c")
    );
    // A key that only starts the same is another key.
    assert_eq!(
        parse_kconfig_string("CONFIG_CC_VERSION_TEXT_X=1\n", key),
        None
    );
    assert_eq!(
        parse_kconfig_string("# CONFIG_CC_VERSION_TEXT is not set\n", key),
        None
    );
}

#[test]
fn the_kernels_architecture_comes_from_its_config() {
    for (file, want) in [
        ("config-bookworm", Some(CpuArch::X86_64)),
        ("config-trixie", Some(CpuArch::X86_64)),
        ("config-bookworm-arm64", Some(CpuArch::Aarch64)),
        // auto.conf excerpts without the symbol: unknown.
        ("auto.conf-bookworm", None),
    ] {
        let t = text(&format!("build/toolchain/{file}"));
        assert_eq!(parse_kconfig_arch(&t), want, "{file}");
    }
    assert_eq!(parse_kconfig_arch("# CONFIG_ARM64 is not set\n"), None);
    assert_eq!(parse_kconfig_arch("CONFIG_ARM64_4K_PAGES=y\n"), None);
}

#[test]
fn compilers_compare_without_their_program_name() {
    let gcc12 = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0";
    let gcc14 = "gcc (Debian 14.2.0-19) 14.2.0";
    let k12 = "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0";
    let k14 = "x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0";
    assert_eq!(compare_compilers(gcc12, k12), CompilerMatch::Same);
    assert_eq!(compare_compilers(gcc14, k14), CompilerMatch::Same);
    let cross = parse_version_first_line(&text(
        "build/toolchain/x86_64-linux-gnu-gcc-14-trixie.version",
    ))
    .unwrap();
    assert_eq!(compare_compilers(&cross, k14), CompilerMatch::Same);
    // The cross gcc of bookworm against the arm64 kernel's (built natively
    // with gcc-12 of a later point release): the same gcc, a warning only.
    let arm = parse_version_first_line(&text(
        "build/toolchain/aarch64-linux-gnu-gcc-12-bookworm.version",
    ))
    .unwrap();
    assert_eq!(compare_compilers(&arm, k12), CompilerMatch::SameVersion);
    // A Debian point release of the same gcc: compatible.
    assert_eq!(
        compare_compilers("gcc (Debian 12.2.0-14+deb12u2) 12.2.0", k12),
        CompilerMatch::SameVersion
    );
    assert_eq!(compare_compilers(gcc14, k12), CompilerMatch::Different);
    assert_eq!(compare_compilers(gcc12, k14), CompilerMatch::Different);
    assert_eq!(
        compare_compilers(gcc12, "Debian clang version 16.0.6 (15)"),
        CompilerMatch::Different
    );
}

#[test]
fn check_compiler_reports_both_strings_on_mismatch() {
    // The host's own gcc against a kernel text that cannot be it.
    let native = Target::new(CpuArch::X86_64, CpuArch::X86_64);
    if choose_compiler(None, &native, &std::env::var_os("PATH").unwrap_or_default()).is_none() {
        eprintln!("no gcc on this machine: only the parsers are checked");
        return;
    }
    let e = build::check_compiler("gcc", Some("gcc-4 (Ancient 4.9.2-1) 4.9.2")).unwrap_err();
    assert_eq!(e.reason, Reason::CompilerMismatch);
    assert!(
        e.to_string().contains("4.9.2") && e.to_string().contains("gcc ("),
        "{}",
        e.to_string()
    );
    let ok = build::check_compiler("gcc", None).unwrap();
    assert!(ok.version.starts_with("gcc"), "{ok:?}");
}

/// A directory of fake executables, for PATH lookups.
fn fake_path(tools: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for t in tools {
        let p = dir.path().join(t);
        fs::write(&p, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

#[test]
fn the_kernels_compiler_is_preferred_and_tools_are_required() {
    let k12 = Some("gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0");
    let t = &Target::new(CpuArch::X86_64, CpuArch::X86_64);
    let all = fake_path(&["gcc", "gcc-12", "make", "ld", "strip"]);
    let path = all.path().as_os_str();
    assert_eq!(choose_compiler(k12, t, path).as_deref(), Some("gcc-12"));
    assert_eq!(check_tools(k12, t, path).unwrap(), "gcc-12");
    // Without the kernel's named compiler, plain gcc.
    let plain = fake_path(&["gcc", "make", "ld", "strip"]);
    assert_eq!(
        check_tools(k12, t, plain.path().as_os_str()).unwrap(),
        "gcc"
    );

    let no_cc = fake_path(&["make", "ld", "strip"]);
    let e = check_tools(k12, t, no_cc.path().as_os_str()).unwrap_err();
    assert_eq!(e.reason, Reason::CompilerMissing);
    assert!(e.to_string().contains("gcc not found"), "{}", e.to_string());
    assert!(
        e.to_string().contains("apt-get install"),
        "{}",
        e.to_string()
    );

    let no_make = fake_path(&["gcc", "ld"]);
    let e = check_tools(None, t, no_make.path().as_os_str()).unwrap_err();
    assert!(
        e.to_string().contains("make, strip not found"),
        "{}",
        e.to_string()
    );

    // Not executable does not count.
    let dir = fake_path(&["make", "ld", "strip"]);
    let gcc = dir.path().join("gcc");
    fs::write(&gcc, "").unwrap();
    assert_eq!(
        check_tools(None, t, dir.path().as_os_str())
            .unwrap_err()
            .reason,
        Reason::CompilerMissing
    );
}

#[test]
fn a_cross_build_uses_the_targets_tools() {
    let k12 = Some("gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0");
    let arm = Target::new(CpuArch::Aarch64, CpuArch::X86_64);
    assert!(arm.is_cross());
    assert_eq!(arm.cross_prefix, "aarch64-linux-gnu-");
    assert_eq!(arm.tool("strip"), "aarch64-linux-gnu-strip");
    assert_eq!(arm.make_arch(), "arm64");
    // The root of `scripts/builder-root bookworm-arm64`: the cross gcc of
    // the kernel's major, the cross binutils, and a native gcc besides.
    let cross = fake_path(&[
        "gcc",
        "gcc-12",
        "make",
        "ld",
        "strip",
        "aarch64-linux-gnu-gcc",
        "aarch64-linux-gnu-gcc-12",
        "aarch64-linux-gnu-ld",
        "aarch64-linux-gnu-strip",
    ]);
    let path = cross.path().as_os_str();
    assert_eq!(
        check_tools(k12, &arm, path).unwrap(),
        "aarch64-linux-gnu-gcc-12"
    );
    // A kernel built by another cross gcc names its triplet: ours replaces it.
    let k14 = Some("x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0");
    assert_eq!(
        choose_compiler(k14, &arm, path).as_deref(),
        Some("aarch64-linux-gnu-gcc")
    );
    // The native tools do not count for a cross build.
    let native_only = fake_path(&["gcc", "gcc-12", "make", "ld", "strip"]);
    let e = check_tools(k12, &arm, native_only.path().as_os_str()).unwrap_err();
    assert_eq!(e.reason, Reason::CompilerMissing);
    assert!(
        e.to_string().contains(
            "aarch64-linux-gnu-gcc, aarch64-linux-gnu-ld, aarch64-linux-gnu-strip not found"
        ),
        "{}",
        e.to_string()
    );
    assert!(
        e.to_string().contains("binutils-aarch64-linux-gnu"),
        "{}",
        e.to_string()
    );
    // An x86_64 build on an arm64 builder.
    let x86 = Target::new(CpuArch::X86_64, CpuArch::Aarch64);
    assert_eq!(x86.cross_prefix, "x86_64-linux-gnu-");
    assert_eq!(x86.make_arch(), "x86_64");
    let native = Target::new(CpuArch::Aarch64, CpuArch::Aarch64);
    assert!(!native.is_cross());
    assert_eq!(native.tool("strip"), "strip");
}

#[test]
fn make_gets_arch_and_cross_compile_only_for_a_cross_build() {
    let h = gpu_driver_installer::headers::KernelHeaders {
        arch_dir: PathBuf::from("/usr/src/linux-headers-6.1.0-50-cloud-arm64"),
        common_dir: PathBuf::from("/usr/src/linux-headers-6.1.0-50-common"),
        release: "6.1.0-50-cloud-arm64".into(),
        cc_version_text: None,
        arch: Some(CpuArch::Aarch64),
    };
    let args = |t: &Target| -> Vec<String> {
        make_args(Path::new("/t"), 2, &h.release, &h, "cc", t)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    };
    let cross = args(&Target::new(CpuArch::Aarch64, CpuArch::X86_64));
    assert_eq!(
        cross,
        [
            "-j2",
            "-C",
            "/t",
            "KERNEL_UNAME=6.1.0-50-cloud-arm64",
            "SYSSRC=/usr/src/linux-headers-6.1.0-50-common",
            "SYSOUT=/usr/src/linux-headers-6.1.0-50-cloud-arm64",
            "CC=cc",
            "ARCH=arm64",
            "CROSS_COMPILE=aarch64-linux-gnu-",
            "modules"
        ]
    );
    let native = args(&Target::new(CpuArch::Aarch64, CpuArch::Aarch64));
    assert!(
        !native
            .iter()
            .any(|a| a.starts_with("ARCH=") || a.starts_with("CROSS_COMPILE="))
    );
    assert_eq!(native.last().map(String::as_str), Some("modules"));
}

#[test]
fn the_target_architecture_is_the_headers_and_the_flag_must_agree() {
    let mut h = gpu_driver_installer::headers::KernelHeaders {
        arch_dir: PathBuf::from("/usr/src/linux-headers-6.1.0-50-cloud-arm64"),
        common_dir: PathBuf::from("/usr/src/linux-headers-6.1.0-50-common"),
        release: "6.1.0-50-cloud-arm64".into(),
        cc_version_text: None,
        arch: Some(CpuArch::Aarch64),
    };
    assert_eq!(target_arch(None, &h).unwrap(), CpuArch::Aarch64);
    assert_eq!(
        target_arch(Some(CpuArch::Aarch64), &h).unwrap(),
        CpuArch::Aarch64
    );
    let e = target_arch(Some(CpuArch::X86_64), &h).unwrap_err();
    assert_eq!(e.reason, Reason::KernelHeadersMismatch);
    assert!(
        e.to_string().contains("--arch x86_64") && e.to_string().contains("are for aarch64"),
        "{}",
        e.to_string()
    );
    // Headers whose configuration names no architecture: the flag, else
    // the builder's own.
    h.arch = None;
    assert_eq!(
        target_arch(Some(CpuArch::Aarch64), &h).unwrap(),
        CpuArch::Aarch64
    );
    assert_eq!(
        target_arch(None, &h).unwrap(),
        gpu_driver_installer::node::running_arch().unwrap()
    );
}

// ---------------------------------------------------------------- headers

#[test]
fn headers_release_and_common_dir_files() {
    assert_eq!(
        parse_uts_release(&text("build/toolchain/utsrelease.h-bookworm")).as_deref(),
        Some("6.1.0-50-cloud-amd64")
    );
    assert_eq!(
        parse_uts_release(&text("build/toolchain/utsrelease.h-trixie")).as_deref(),
        Some("6.12.117+deb13-cloud-amd64")
    );
    assert_eq!(
        parse_uts_release(&text("build/toolchain/utsrelease.h-bookworm-arm64")).as_deref(),
        Some("6.1.0-50-cloud-arm64")
    );
    assert_eq!(parse_uts_release("#define UTS_RELEASE_X \"1\"\n"), None);
    assert_eq!(
        parse_makefile_include(&text("build/toolchain/Makefile-bookworm")).as_deref(),
        Some("/usr/src/linux-headers-6.1.0-50-common/Makefile")
    );
    assert_eq!(
        parse_makefile_include(&text("build/toolchain/Makefile-trixie")).as_deref(),
        Some("/usr/src/linux-headers-6.12.117+deb13-common/Makefile")
    );
    assert_eq!(parse_makefile_include("includes x\n"), None);
    assert_eq!(parse_makefile_include("include $(srctree)/x\n"), None);
}

/// Debian's split layout: an arch dir whose Makefile includes a common dir
/// by absolute path.
fn debian_headers(base: &Path, release: &str, uts: &str, kernel_release_file: &str) -> PathBuf {
    let arch = crate::support::kernel_headers::debian_split(base, release, uts);
    fs::create_dir_all(arch.join("include/config")).unwrap();
    fs::write(
        arch.join("include/config/kernel.release"),
        kernel_release_file,
    )
    .unwrap();
    fs::write(
        arch.join("include/config/auto.conf"),
        "CONFIG_CC_VERSION_TEXT=gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0\n",
    )
    .unwrap();
    arch
}

#[test]
fn common_dir_is_found_inside_the_host_root_or_beside_the_arch_dir() {
    let host = tempfile::tempdir().unwrap();
    let rel = "6.1.0-50-cloud-amd64";
    let arch = debian_headers(host.path(), rel, rel, "6.1.176\n");
    let common = host.path().join("usr/src/linux-headers-common");
    // Through the host root: the absolute include is resolved inside it.
    let hr = HostRoot::new(host.path(), HostRootSource::Flag);
    assert_eq!(find_common_dir(&arch, &hr, rel), Some(common.clone()));
    // Without the right root (--headers from a container that mounts the
    // host elsewhere): the sibling of the arch dir.
    assert_eq!(find_common_dir(&arch, &root(), rel), Some(common.clone()));

    // Debian bookworm's kernel.release holds 6.1.176: UTS_RELEASE decides.
    let h = headers::inspect_headers(&arch, &hr, rel).unwrap();
    assert_eq!(h.release, rel);
    assert_eq!(h.common_dir, common);
    assert_eq!(
        h.cc_version_text.as_deref(),
        Some("gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0")
    );

    // Another release's headers.
    let e = headers::inspect_headers(&arch, &hr, "6.1.0-51-cloud-amd64").unwrap_err();
    assert_eq!(e.reason, Reason::KernelHeadersMismatch);
    assert!(
        e.to_string()
            .contains("are for 6.1.0-50-cloud-amd64, not for 6.1.0-51-cloud-amd64"),
        "{}",
        e.to_string()
    );

    // No common part anywhere: incomplete.
    fs::remove_dir_all(&common).unwrap();
    let e = headers::inspect_headers(&arch, &hr, rel).unwrap_err();
    assert_eq!(e.reason, Reason::KernelHeadersMismatch);
    assert!(e.to_string().contains("incomplete"), "{}", e.to_string());
}

#[test]
fn a_full_tree_is_its_own_common_dir() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("include/linux")).unwrap();
    fs::create_dir_all(dir.path().join("include/config")).unwrap();
    fs::write(dir.path().join("Makefile"), "VERSION = 6\n").unwrap();
    fs::write(dir.path().join("include/config/kernel.release"), "6.6.1\n").unwrap();
    let h = headers::inspect_headers(dir.path(), &root(), "6.6.1").unwrap();
    assert_eq!(h.common_dir, dir.path());
    assert_eq!(h.cc_version_text, None);
}

#[test]
fn headers_lookup_under_the_host_root() {
    let host = tempfile::tempdir().unwrap();
    let rel = "6.1.0-50-cloud-amd64";
    let hr = HostRoot::new(host.path(), HostRootSource::Flag);
    let e = headers::locate_headers(None, &hr, rel).unwrap_err();
    assert_eq!(e.reason, Reason::KernelHeadersNotFound);
    assert!(
        e.to_string().contains("linux-headers-6.1.0-50-cloud-amd64"),
        "{}",
        e.to_string()
    );
    let arch = debian_headers(host.path(), rel, rel, "6.1.176\n");
    assert_eq!(headers::locate_headers(None, &hr, rel).unwrap(), arch);
    let missing = host.path().join("nope");
    assert_eq!(
        headers::locate_headers(Some(&missing), &hr, rel)
            .unwrap_err()
            .reason,
        Reason::KernelHeadersNotFound
    );
}

// ---------------------------------------------------------------- environment

#[test]
fn proc_and_disk_checks() {
    check_proc(Path::new("/proc")).unwrap();
    let empty = tempfile::tempdir().unwrap();
    let e = check_proc(empty.path()).unwrap_err();
    assert_eq!(e.reason, Reason::ProcNotMounted);
    assert!(e.to_string().contains("mount -t proc"), "{}", e.to_string());

    let dir = tempfile::tempdir().unwrap();
    assert!(check_disk(dir.path(), 1).unwrap() >= 1);
    let e = check_disk(dir.path(), u64::MAX).unwrap_err();
    assert_eq!(e.reason, Reason::InsufficientDisk);
    assert!(e.to_string().contains("MiB free"), "{}", e.to_string());
}

// ---------------------------------------------------------------- sources

#[test]
fn driver_version_from_the_source_tree() {
    assert_eq!(
        parse_nv_version_string("ccflags-y += -DNV_VERSION_STRING=\\\"535.261.03\\\"\n").as_deref(),
        Some("535.261.03")
    );
    assert_eq!(
        parse_version_mk("NVIDIA_VERSION = 550.163.01\n").as_deref(),
        Some("550.163.01")
    );
    assert_eq!(parse_version_mk("NVIDIA_VERSION_X = 1.2\n"), None);

    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("kernel-open");
    fs::create_dir_all(&tree).unwrap();
    let e = build::driver_version_of(&tree, None).unwrap_err();
    assert_eq!(e.reason, Reason::InvalidArgument);
    assert_eq!(
        build::driver_version_of(&tree, Some("580.95.05")).unwrap(),
        "580.95.05"
    );
    fs::write(
        dir.path().join("version.mk"),
        "NVIDIA_VERSION = 580.95.05\n",
    )
    .unwrap();
    assert_eq!(build::driver_version_of(&tree, None).unwrap(), "580.95.05");
    fs::write(
        tree.join("Kbuild"),
        "ccflags-y += -DNV_VERSION_STRING=\\\"580.95.05\\\"\n",
    )
    .unwrap();
    let e = build::driver_version_of(&tree, Some("570.1.2")).unwrap_err();
    assert!(e.to_string().contains("570.1.2") && e.to_string().contains("580.95.05"));
}

#[test]
fn gsp_firmware_is_found_in_a_run_layout_only() {
    let dir = tempfile::tempdir().unwrap();
    assert!(build::find_firmware(dir.path()).unwrap().is_empty());
    fs::create_dir_all(dir.path().join("firmware")).unwrap();
    fs::write(dir.path().join("firmware/gsp_tu10x.bin"), "x").unwrap();
    fs::write(dir.path().join("firmware/gsp_ga10x.bin"), "y").unwrap();
    fs::write(dir.path().join("firmware/README"), "z").unwrap();
    let fw = build::find_firmware(dir.path()).unwrap();
    let names: Vec<_> = fw
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["gsp_ga10x.bin", "gsp_tu10x.bin"]);
}

// ---------------------------------------------------------------- logs

#[test]
fn pci_resize_resource_is_a_kernel_api_mismatch() {
    for (log, tree, line) in [
        (
            "build-logs/b_trixie-root_550open_k6.12.log",
            "/build/b_trixie-root_550open_k6.12/modules/nvidia-open-kernel",
            237,
        ),
        (
            "build-logs/c_trixie-root_535open_k6.12.log",
            "/build/c_trixie-root_535open_k6.12/modules/nvidia-open-kernel",
            223,
        ),
    ] {
        let f = classify_log(&text(log), Path::new(tree));
        assert_eq!(f.reason, Reason::KernelApiMismatch, "{log}");
        // The module tree's prefix is gone; the error is quoted whole, with
        // ASCII quotes (this log was captured with gcc's UTF-8 ones).
        assert_eq!(
            f.errors[0],
            format!(
                "nvidia/nv-pci.c:{line}:9: error: too few arguments to function 'pci_resize_resource'"
            ),
            "{log}"
        );
        assert_eq!(f.errors.len(), 1, "{:?}", f.errors);
        let lines: Vec<&str> = f.excerpt.lines().collect();
        assert!(lines.len() <= EXCERPT_LINES);
        // It starts just before the error, with gcc's "In function" line.
        assert!(
            lines[..3].iter().any(|l| l.contains("In function")),
            "{}",
            f.excerpt
        );
        assert!(f.excerpt.contains("note: declared here"), "{}", f.excerpt);
    }
}

#[test]
fn other_failures_are_build_failed() {
    // A real kbuild run with a header the kernel does not have.
    let f = classify_log(
        &text("build-logs/missing-header_bookworm.log"),
        Path::new("/build-dev/hello"),
    );
    assert_eq!(f.reason, Reason::BuildFailed, "{:?}", f.errors);
    assert_eq!(
        f.errors,
        ["hello.c:2:10: fatal error: linux/nv_missing_header.h: No such file or directory"]
    );
    assert!(
        f.excerpt.contains("compilation terminated."),
        "{}",
        f.excerpt
    );

    // A real make failure without any compiler message: make's own lines.
    let f = classify_log(
        &text("build-logs/no-kernel-tree_bookworm.log"),
        Path::new("/x"),
    );
    assert_eq!(f.reason, Reason::BuildFailed);
    assert!(f.errors.iter().any(|e| e.contains("***")), "{:?}", f.errors);

    // Each API pattern on its own, in gcc's ASCII (LC_ALL=C) form.
    for msg in [
        "too many arguments to function 'x'",
        "implicit declaration of function 'x'",
        "'struct drm_driver' has no member named 'dumb_destroy'",
        "passing argument 1 of 'x' from incompatible pointer type",
        "'VM_RESERVED' undeclared (first use in this function)",
        "conflicting types for 'x'",
        "unknown type name 'x'",
    ] {
        let log = format!("a.c:1:2: error: {msg}\nmake: *** [x] Error 2\n");
        assert_eq!(
            classify_log(&log, Path::new("/x")).reason,
            Reason::KernelApiMismatch,
            "{msg}"
        );
    }
    let log = "ERROR: modpost: \"follow_pfn\" [nvidia.ko] undefined!\n";
    assert_eq!(
        classify_log(log, Path::new("/x")).reason,
        Reason::KernelApiMismatch
    );
    let log = "a.c:1:10: fatal error: foo.h: No such file or directory\n";
    assert_eq!(
        classify_log(log, Path::new("/x")).reason,
        Reason::BuildFailed
    );
    // Huge logs are cut to the excerpt's bound.
    let long = format!(
        "{}a.c:1:1: error: x\n{}",
        "l\n".repeat(100),
        "y\n".repeat(100)
    );
    assert_eq!(
        classify_log(&long, Path::new("/x")).excerpt.lines().count(),
        EXCERPT_LINES
    );
}

// ---------------------------------------------------------------- modules

#[test]
fn modinfo_of_a_real_module() {
    let ko = fixture("modules/nvidia-peermem-535.261.03-open-6.1.0-50-cloud-amd64.ko");
    let info = read_modinfo(&ko).unwrap();
    assert_eq!(info.name, "nvidia_peermem");
    assert_eq!(
        info.vermagic,
        "6.1.0-50-cloud-amd64 SMP preempt mod_unload modversions "
    );
    assert_eq!(info.vermagic_release(), "6.1.0-50-cloud-amd64");
    assert!(info.depends.is_empty());
    assert_eq!(info.version.as_deref(), Some("535.261.03"));
    assert_eq!(info.license.as_deref(), Some("Dual BSD/GPL"));
    assert!(
        info.fields
            .iter()
            .any(|(k, v)| k == "parmtype" && v == "peerdirect_support:int")
    );
    check_vermagic("nvidia-peermem.ko", &info.vermagic, "6.1.0-50-cloud-amd64").unwrap();
    assert_eq!(info.machine, gpu_driver_installer::modinfo::EM_X86_64);
    check_machine("nvidia-peermem.ko", info.machine, CpuArch::X86_64).unwrap();
    let e = check_machine("nvidia-peermem.ko", info.machine, CpuArch::Aarch64).unwrap_err();
    assert_eq!(e.reason, Reason::BuildFailed);
    assert_eq!(
        e.to_string(),
        "nvidia-peermem.ko was built for x86_64, not for aarch64"
    );
    let e = check_vermagic("nvidia-peermem.ko", &info.vermagic, "6.1.0-5").unwrap_err();
    assert_eq!(e.reason, Reason::BuildFailed);
    assert!(
        e.to_string().contains("nvidia-peermem.ko"),
        "{}",
        e.to_string()
    );

    // The same module cross-built for arm64 (scripts/builder-root
    // bookworm-arm64, stripped by aarch64-linux-gnu-strip): ELF64
    // little-endian like x86_64, e_machine 183, arm64's vermagic.
    let arm = read_modinfo(&fixture(
        "modules/nvidia-peermem-535.261.03-open-6.1.0-50-cloud-arm64.ko",
    ))
    .unwrap();
    assert_eq!(arm.name, "nvidia_peermem");
    assert_eq!(arm.machine, gpu_driver_installer::modinfo::EM_AARCH64);
    assert_eq!(
        arm.vermagic,
        "6.1.0-50-cloud-arm64 SMP mod_unload modversions aarch64"
    );
    assert_eq!(arm.version.as_deref(), Some("535.261.03"));
    check_machine("nvidia-peermem.ko", arm.machine, CpuArch::Aarch64).unwrap();
    assert_eq!(
        check_machine("nvidia-peermem.ko", arm.machine, CpuArch::X86_64)
            .unwrap_err()
            .message,
        "nvidia-peermem.ko was built for aarch64, not for x86_64"
    );

    // Every truncation of the real module fails cleanly, never panics.
    let bytes = fs::read(&ko).unwrap();
    for n in (0..bytes.len()).step_by(97) {
        let _ = parse_modinfo(&bytes[..n]);
    }
    let missing = read_modinfo(Path::new("/nonexistent/x.ko")).unwrap_err();
    assert!(
        missing.to_string().contains("/nonexistent/x.ko"),
        "{missing}"
    );
}

#[test]
fn timestamps_are_rfc3339_utc() {
    assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // leap day 2000
    assert_eq!(rfc3339_utc(t), "2000-02-29T00:00:00Z");
    let t = UNIX_EPOCH + Duration::from_secs(1_798_200_065);
    assert_eq!(rfc3339_utc(t), "2026-12-25T12:01:05Z");
}

#[test]
fn modules_of_nvidia_and_other_trees() {
    use gpu_driver_installer::build::collect_modules;
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // An NVIDIA tree without nvidia.ko failed, whatever else it built.
    std::fs::create_dir(t.join("nvidia")).unwrap();
    std::fs::write(t.join("other.ko"), "").unwrap();
    assert_eq!(
        collect_modules(t).unwrap_err().reason,
        gpu_driver_installer::Reason::BuildFailed
    );
    std::fs::write(t.join("nvidia.ko"), "").unwrap();
    std::fs::write(t.join("nvidia-uvm.ko"), "").unwrap();
    assert_eq!(
        collect_modules(t).unwrap(),
        [t.join("nvidia.ko"), t.join("nvidia-uvm.ko")]
    );
    // Another tree (the VM test's module): its own modules.
    let o = tempfile::tempdir().unwrap();
    assert!(collect_modules(o.path()).is_err());
    std::fs::write(o.path().join("hello.ko"), "").unwrap();
    assert_eq!(
        collect_modules(o.path()).unwrap(),
        [o.path().join("hello.ko")]
    );
}
