//! `build`'s preflight failures, with the built binary and no compiler.

use super::*;

#[test]
fn missing_headers_dir_is_kernel_headers_not_found() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().display().to_string();
    let out = tmp.path().join("out").display().to_string();
    let r = run_build(&src, &out, &["--headers", "/nonexistent/headers"]);
    assert_eq!(reason(&r), "KernelHeadersNotFound", "{}", r.doc);
    assert_eq!(r.code, 13);
    assert!(
        message(&r).contains("/nonexistent/headers"),
        "{}",
        message(&r)
    );
    assert!(message(&r).contains("linux-headers-6.1.0-50-cloud-amd64"));
    assert_eq!(r.doc["kind"], "BuildResult");
    assert_eq!(r.doc["apiVersion"], "gpu-driver.gardenlinux.io/v1alpha1");
    assert_eq!(r.doc["status"]["phase"], "Failed");
    assert_eq!(r.doc["spec"]["kernelRelease"], REL);
    assert_eq!(r.doc["spec"]["flavor"], "open");

    // Not given and not installed under the host root.
    let host = tempfile::tempdir().unwrap();
    let r = finish(
        bin()
            .args(["--host-root", host.path().to_str().unwrap()])
            .args(build_args(&src, &out, &[]))
            .output()
            .unwrap(),
    );
    assert_eq!(reason(&r), "KernelHeadersNotFound", "{}", r.doc);
    assert!(message(&r).contains("--headers"), "{}", message(&r));
}

#[test]
fn what_a_killed_build_left_in_its_work_dir_is_removed_by_the_next_one() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().display().to_string();
    let out = tmp.path().join("out");
    let work = out.join(format!("work-open-{REL}"));
    // The extractor's temporary tree, as a kill -9 during extraction
    // leaves it (900 MB for a real .run, enough to fail the next build's
    // disk check).
    let left = work.join(".source.partial-Xy12ab");
    fs::create_dir_all(left.join("kernel-open")).unwrap();
    fs::write(left.join("kernel-open/big.o"), vec![0u8; 1 << 20]).unwrap();
    let out_s = out.display().to_string();
    let r = run_build(&src, &out_s, &["--headers", "/nonexistent/headers"]);
    assert_eq!(reason(&r), "KernelHeadersNotFound", "{}", r.doc);
    assert!(!left.exists(), "the killed build's leftover is still there");
    assert!(work.is_dir());
}

#[test]
fn headers_of_another_release_are_a_mismatch() {
    let tmp = tempfile::tempdir().unwrap();
    let arch = headers(tmp.path(), REL, "6.1.0-49-cloud-amd64");
    let src = tmp.path().display().to_string();
    let out = tmp.path().join("out").display().to_string();
    let h = arch.display().to_string();
    let r = run_build(&src, &out, &["--headers", &h]);
    assert_eq!(reason(&r), "KernelHeadersMismatch", "{}", r.doc);
    assert_eq!(r.code, 13);
    assert!(
        message(&r).contains("are for 6.1.0-49-cloud-amd64, not for 6.1.0-50-cloud-amd64"),
        "{}",
        message(&r)
    );

    // The same through the host root (default lookup), with the release
    // from the global --kernel-release.
    let r = finish(
        bin()
            .args(["--host-root", &src, "--kernel-release", REL])
            .args(["build", "--source", &src, "--flavor", "open", "--out", &out])
            .output()
            .unwrap(),
    );
    assert_eq!(reason(&r), "KernelHeadersMismatch", "{}", r.doc);
    assert_eq!(r.doc["spec"]["kernelRelease"], REL);
}

#[test]
fn a_path_without_gcc_is_compiler_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let arch = headers(tmp.path(), REL, REL);
    let empty = tmp.path().join("empty-path");
    fs::create_dir(&empty).unwrap();
    let src = tmp.path().display().to_string();
    let out = tmp.path().join("out").display().to_string();
    let h = arch.display().to_string();
    let r = finish(
        bin()
            .args(build_args(&src, &out, &["--headers", &h]))
            .env("PATH", &empty)
            .output()
            .unwrap(),
    );
    assert_eq!(reason(&r), "CompilerMissing", "{}", r.doc);
    assert_eq!(r.code, 13);
    assert!(
        message(&r).contains("gcc, make, ld, strip not found"),
        "{}",
        message(&r)
    );
    // The headers that were checked are reported.
    assert_eq!(r.doc["status"]["headers"]["release"], REL);
    assert!(
        r.doc["status"]["headers"]["commonDir"]
            .as_str()
            .unwrap()
            .ends_with("linux-headers-common")
    );
}

#[test]
fn bad_arguments_are_invalid_argument() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out").display().to_string();
    let r = run_build("/nonexistent/driver.run", &out, &[]);
    assert_eq!(reason(&r), "InvalidArgument", "{}", r.doc);
    assert_eq!(r.code, 4);
    let src = tmp.path().display().to_string();
    let r = run_build(&src, &out, &["--driver-version", "latest"]);
    assert_eq!(reason(&r), "InvalidArgument", "{}", r.doc);
    let r = finish(
        bin()
            .args([
                "build",
                "--source",
                &src,
                "--kernel",
                "../../etc",
                "--flavor",
            ])
            .args(["open", "--out", &out])
            .output()
            .unwrap(),
    );
    assert_eq!(reason(&r), "InvalidArgument", "{}", r.doc);
    // clap refuses --flavor auto and --jobs 0: exit 2, no document.
    for bad in [["--flavor", "auto"], ["--jobs", "0"]] {
        let out = bin()
            .args(["build", "--source", &src, "--out", &out, "--flavor", "open"])
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}
