//! Real headers from the apt repository: found, verified, unpacked and
//! building a module; tampered, missing and malformed packages and indexes.

use super::*;

#[test]
fn real_headers_are_found_verified_and_unpacked() {
    let (server, repo) = Repo::real().serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    let tree = fetch_headers_from(
        &signed_source(&server.url(""), SUITE),
        &repo.release,
        &options(cache.path()),
        &root,
    )
    .unwrap();
    assert_eq!(tree.release, repo.release);
    assert_eq!(tree.root, root);
    assert_usable_tree(&tree);

    // The headers, its -common and linux-kbuild; not the compiler package
    // it also depends on.
    let names: Vec<&str> = tree.packages.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(names[0], format!("linux-headers-{}", repo.release));
    assert!(names.iter().any(|n| n.ends_with("-common")), "{names:?}");
    assert!(names.contains(&"linux-kbuild-6.1"), "{names:?}");
    for p in &tree.packages {
        let file = repo.deb(&format!("{}_", p.name));
        assert_eq!(p.sha256, sha256_hex(&repo.read(&file)), "{}", p.name);
        assert!(file.contains(&p.version), "{file} {}", p.version);
    }
    let log = requested(&server);
    assert_eq!(log[0], "/dists/bookworm/InRelease", "{log:?}");
    assert!(
        log.contains(&format!("/{INDEX_DIR}/Packages.xz")),
        "{log:?}"
    );
    assert!(!log.iter().any(|p| p.contains("compiler")), "{log:?}");

    // Each .deb is in the package cache, verified: an offline fetch of
    // its sha256 is a cache hit (a second headers run downloads no .deb).
    for p in &tree.packages {
        let mut opts = options(cache.path());
        opts.offline = true;
        let req = FetchRequest {
            urls: Vec::new(),
            sha256: p.sha256.clone(),
        };
        let hit = gpu_driver_installer::fetch::fetch(&opts, &req).unwrap();
        assert!(hit.cache_hit, "{}", p.name);
    }

    // A non-empty scratch root is refused, the existing tree untouched.
    let err = fetch_headers_from(
        &signed_source(&server.url(""), SUITE),
        &repo.release,
        &options(cache.path()),
        &root,
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::Internal, "{err}");
    assert!(tree.arch_dir.join("Makefile").is_file());
}

#[test]
fn unpacked_headers_build_a_kernel_module() {
    // Debian's headers build with the kernel's own compiler: bookworm's
    // .kernelvariables sets CC = gcc-12 (Debian 12's gcc).
    require_tool("gcc-12");
    require_tool("make");
    let (server, repo) = Repo::real().serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    // The tree is built in one place and used from another: nothing in it
    // may depend on where it was unpacked.
    let tree = fetch_headers_from(
        &signed_source(&server.url(""), SUITE),
        &repo.release,
        &options(cache.path()),
        &scratch.path().join("unpacked"),
    )
    .unwrap();
    let moved = scratch.path().join("moved");
    fs::rename(&tree.root, &moved).unwrap();
    let arch = moved.join(tree.arch_dir.strip_prefix(&tree.root).unwrap());
    let common = moved.join(tree.common_dir.strip_prefix(&tree.root).unwrap());

    // The usual external-module build: make -C <arch dir>.
    let m = build_hello(&["-C".into(), arch.display().to_string()]);
    assert!(
        m.join("hello.ko").is_file(),
        "no hello.ko in {}",
        m.display()
    );
    let modinfo = fs::read(m.join("hello.ko")).unwrap();
    let vermagic = format!("vermagic={} ", repo.release);
    assert!(
        modinfo
            .windows(vermagic.len())
            .any(|w| w == vermagic.as_bytes()),
        "hello.ko lacks {vermagic:?}"
    );
    fs::remove_dir_all(&m).unwrap();

    // NVIDIA's way: sources from the common dir, output from the arch dir
    // (SYSSRC/SYSOUT become make -C <src> O=<out>).
    let m = build_hello(&[
        "-C".into(),
        common.display().to_string(),
        format!("O={}", arch.display()),
    ]);
    assert!(
        m.join("hello.ko").is_file(),
        "no hello.ko in {}",
        m.display()
    );
    fs::remove_dir_all(&m).unwrap();
}

#[test]
fn a_tampered_deb_is_a_checksum_mismatch() {
    let mut repo = Repo::real();
    let path = repo.deb("linux-kbuild-");
    let mut bytes = repo.read(&path);
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    repo.overrides.insert(path.clone(), bytes);
    let Refused {
        err,
        cache,
        scratch,
        root,
    } = refused_headers(repo);
    assert_eq!(err.reason, Reason::ChecksumMismatch, "{err}");
    assert!(err.to_string().contains("linux-kbuild-6.1"), "{err}");
    // Nothing half-done: no scratch root, and the bad bytes are not cached.
    assert!(!root.exists());
    assert_eq!(fs::read_dir(scratch.path()).unwrap().count(), 0);
    for e in fs::read_dir(cache.path()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".partial"), "{name}");
    }
}

#[test]
fn a_missing_package_is_kernel_headers_not_found() {
    let (server, _repo) = Repo::real().serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let url = server.url("");
    let err = fetch_headers_from(
        &signed_source(&url, SUITE),
        "6.1.0-999-cloud-amd64",
        &options(cache.path()),
        &scratch.path().join("root"),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::KernelHeadersNotFound, "{err}");
    for needle in [
        "linux-headers-6.1.0-999-cloud-amd64",
        url.as_str(),
        "suite bookworm",
        "install linux-headers",
    ] {
        assert!(err.to_string().contains(needle), "{needle:?} not in: {err}");
    }
    // Only the index was read.
    assert!(
        !requested(&server).iter().any(|p| p.ends_with(".deb")),
        "{:?}",
        requested(&server)
    );

    // A suite the repository does not have.
    let err = fetch_headers_from(
        &signed_source(&url, "1592.4"),
        "6.1.0-50-cloud-amd64",
        &options(cache.path()),
        &scratch.path().join("root"),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::KernelHeadersNotFound, "{err}");
    assert!(err.to_string().contains("no suite 1592.4"), "{err}");
}

#[test]
fn release_without_inrelease_and_index_fallback_to_gz() {
    let mut repo = Repo::real();
    let packages = repo.packages_text();
    repo.reindex(&packages, &["Packages.gz"]);
    let release = repo.release.clone();
    let (server, _repo) = repo.serve();
    let cache = tempfile::tempdir().unwrap();
    // A trailing slash on the repository URL is fine.
    let source = signed_source(&server.url("/"), SUITE);
    let index = apt::read_index(&source, &options(cache.path()), &mut |_: &str| true).unwrap();
    assert_eq!(index.release_url, server.url("/dists/bookworm/Release"));
    assert_eq!(
        index.index_urls,
        [server.url(&format!("/{INDEX_DIR}/Packages.gz"))]
    );
    assert_eq!(index.packages.len(), 3);
    let headers = index
        .best(&format!("linux-headers-{release}"), None)
        .unwrap();
    assert_eq!(headers.depends.len(), 3);
    let log = requested(&server);
    assert_eq!(
        log,
        [
            "/dists/bookworm/InRelease".to_string(),
            "/dists/bookworm/Release".to_string(),
            "/dists/bookworm/Release.gpg".to_string(),
            format!("/{INDEX_DIR}/Packages.gz"),
        ]
    );
}

#[test]
fn index_prefers_xz_and_falls_back_when_it_cannot_be_fetched() {
    let mut repo = Repo::real();
    let packages = repo.packages_text();
    repo.reindex(&packages, &["Packages.xz", "Packages.gz", "Packages"]);
    // Listed in the Release but not served (a mirror mid-sync).
    repo.overrides.remove(&format!("{INDEX_DIR}/Packages.xz"));
    repo.missing.push(format!("{INDEX_DIR}/Packages.xz"));
    let (server, _repo) = repo.serve();
    let cache = tempfile::tempdir().unwrap();
    let source = signed_source(&server.url(""), SUITE);
    let index = apt::read_index(&source, &options(cache.path()), &mut |_: &str| true).unwrap();
    assert_eq!(
        index.index_urls,
        [server.url(&format!("/{INDEX_DIR}/Packages.gz"))]
    );
    assert_eq!(index.packages.len(), 3);

    // An index whose bytes differ from the Release's sha256 is not used.
    let mut repo = Repo::real();
    repo.reindex(&packages, &["Packages"]);
    repo.overrides.insert(
        format!("{INDEX_DIR}/Packages"),
        packages
            .replace("linux-kbuild-6.1", "linux-kbuild-6.2")
            .into_bytes(),
    );
    let (server, _repo) = repo.serve();
    let source = signed_source(&server.url(""), SUITE);
    let err = apt::read_index(&source, &options(cache.path()), &mut |_: &str| true).unwrap_err();
    assert_eq!(err.reason, Reason::ChecksumMismatch, "{err}");
}

#[test]
fn a_malformed_deb_is_archive_invalid() {
    // The repository is consistent (the index has the broken file's
    // sha256), but the .deb itself is cut short: not a download problem.
    let mut repo = Repo::real();
    let path = repo.deb("linux-kbuild-");
    let good = repo.read(&path);
    let cut = good[..good.len() / 2].to_vec();
    let packages = repo.packages_text().replace(
        &format!("SHA256: {}", sha256_hex(&good)),
        &format!("SHA256: {}", sha256_hex(&cut)),
    );
    let packages = packages.replace(
        &format!("Size: {}\n", good.len()),
        &format!("Size: {}\n", cut.len()),
    );
    repo.reindex(&packages, &["Packages.xz"]);
    repo.overrides.insert(path, cut);
    let Refused {
        err,
        cache: _,
        scratch,
        root,
    } = refused_headers(repo);
    assert_eq!(err.reason, Reason::ArchiveInvalid, "{err}");
    assert!(err.to_string().contains("linux-kbuild-6.1"), "{err}");
    assert!(!root.exists());
    assert_eq!(fs::read_dir(scratch.path()).unwrap().count(), 0);
}

#[test]
fn deb_reader_refuses_malformed_ar_archives() {
    let repo = Repo::real();
    let good = repo.read(&repo.deb("linux-headers-"));
    assert!(good.starts_with(b"!<arch>\ndebian-binary"));
    let work = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not ar", b"PK\x03\x04 not an ar archive at all".to_vec()),
        ("magic only", b"!<arch>\n".to_vec()),
        ("cut in a header", good[..8 + 30].to_vec()),
        ("cut in the data member", good[..good.len() - 1000].to_vec()),
        ("bad header terminator", {
            let mut b = good.clone();
            b[8 + 58] = b'X';
            b
        }),
        ("wrong first member", {
            let mut b = good.clone();
            b[8..8 + 13].copy_from_slice(b"control-xxxxx");
            b
        }),
        ("bad size", {
            let mut b = good.clone();
            b[8 + 48..8 + 50].copy_from_slice(b"zz");
            b
        }),
        ("format 3.0", {
            let mut b = good.clone();
            b[8 + 60] = b'3';
            b
        }),
    ];
    for (what, bytes) in cases {
        let deb = work.path().join("x.deb");
        fs::write(&deb, &bytes).unwrap();
        let root = work.path().join(what.replace(' ', "-"));
        fs::create_dir(&root).unwrap();
        let err = gpu_driver_installer::deb::unpack_data(&deb, &root).unwrap_err();
        assert_eq!(err.reason, Reason::ArchiveInvalid, "{what}: {err}");
        assert!(err.to_string().contains("x.deb"), "{what}: {err}");
    }

    // The real one unpacks, and its absolute symlinks stay inside.
    let deb = work.path().join("good.deb");
    fs::write(&deb, &good).unwrap();
    let root = work.path().join("good");
    fs::create_dir(&root).unwrap();
    let report = gpu_driver_installer::deb::unpack_data(&deb, &root).unwrap();
    assert_eq!(report.data_member, "data.tar.xz");
    let build = root.join(format!("lib/modules/{}/build", repo.release));
    assert_eq!(
        fs::read_link(&build).unwrap(),
        Path::new(&format!("../../../usr/src/linux-headers-{}", repo.release))
    );
}
