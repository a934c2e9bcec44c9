//! The repository's signatures: InRelease by a trusted key or refused,
//! the shipped keyring, a real Debian InRelease.

use super::*;

/// Reads the index of `repo` with `source`'s keyring; the error.
fn index_error(
    repo: Repo,
    source: impl Fn(&str) -> AptSource,
) -> (gpu_driver_installer::Error, Server) {
    let (server, _repo) = repo.serve();
    let cache = tempfile::tempdir().unwrap();
    let err = apt::read_index(
        &source(&server.url("")),
        &options(cache.path()),
        &mut |_: &str| true,
    )
    .unwrap_err();
    (err, server)
}

fn assert_nothing_but_the_release_read(server: &Server) {
    let log = requested(server);
    assert!(
        log.iter()
            .all(|p| p.starts_with("/dists/bookworm/") && !p.contains("Packages")),
        "{log:?}"
    );
}

/// A repository that drips its InRelease one byte every 50 ms (each read
/// well inside the read timeout) meets the download deadline
/// (`--download-timeout`, 2 s here) instead of holding the fetch for as
/// long as the file takes.
#[test]
fn a_dripping_release_meets_the_download_deadline() {
    let mut repo = Repo::real();
    repo.drip.push("dists/bookworm/InRelease".into());
    let release = repo.release.clone();
    let (server, _repo) = repo.serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path());
    opts.timeouts.total = Duration::from_secs(2);
    let err = fetch_headers_from(
        &signed_source(&server.url(""), SUITE),
        &release,
        &opts,
        &scratch.path().join("root"),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::DownloadFailed, "{err}");
    assert!(
        err.to_string()
            .contains("the download deadline of 2 s passed"),
        "{err}"
    );
}

#[test]
fn a_tampered_inrelease_is_signature_invalid() {
    // One byte of the Release text changed, the test key's signature kept.
    let mut repo = Repo::real();
    let signed = String::from_utf8(repo.overrides["dists/bookworm/InRelease"].clone()).unwrap();
    let sum = signed
        .lines()
        .find(|l| l.ends_with("main/binary-amd64/Packages.xz"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let mut evil = sum.clone().into_bytes();
    evil[0] = if evil[0] == b'0' { b'1' } else { b'0' };
    let tampered = signed.replacen(&sum, std::str::from_utf8(&evil).unwrap(), 1);
    assert_ne!(tampered, signed);
    repo.overrides
        .insert("dists/bookworm/InRelease".into(), tampered.into_bytes());
    let (err, server) = index_error(repo, |u| signed_source(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    for needle in [
        server.url("/dists/bookworm/InRelease").as_str(),
        "suite bookworm",
        TEST_FP,
        "does not verify",
        "changed after signing",
    ] {
        assert!(err.to_string().contains(needle), "{needle:?} not in: {err}");
    }
    assert_nothing_but_the_release_read(&server);
}

#[test]
fn an_inrelease_by_an_unknown_key_is_signature_invalid() {
    let mut repo = Repo::real();
    let text = String::from_utf8(repo.read("dists/bookworm/Release")).unwrap();
    repo.overrides.insert(
        "dists/bookworm/InRelease".into(),
        aptsign::clearsign_unknown(&text),
    );
    let (err, server) = index_error(repo, |u| signed_source(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    for needle in [
        server.url("").as_str(),
        "suite bookworm",
        UNKNOWN_FP,
        "--apt-keyring",
        TEST_FP,
    ] {
        assert!(err.to_string().contains(needle), "{needle:?} not in: {err}");
    }
    assert_nothing_but_the_release_read(&server);
}

#[test]
fn the_shipped_keyring_does_not_trust_the_test_repository() {
    // Without a keyring of its own, a repository outside Garden Linux is
    // checked against Debian's archive keys: the test key is not one.
    let (err, _server) = index_error(Repo::real(), |u| AptSource::new(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    assert!(
        err.to_string().contains("Debian's archive keyring"),
        "{err}"
    );
    assert!(err.to_string().contains(TEST_FP), "{err}");
    // fetch_headers (no keyring given) goes the same way.
    let (server, repo) = Repo::real().serve();
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let err = fetch_headers(
        &server.url(""),
        SUITE,
        &repo.release,
        &options(cache.path()),
        &scratch.path().join("root"),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
}

#[test]
fn a_release_without_release_gpg_is_refused() {
    let mut repo = Repo::real();
    let packages = repo.packages_text();
    repo.reindex(&packages, &["Packages.xz"]);
    repo.overrides.remove("dists/bookworm/Release.gpg");
    repo.missing.push("dists/bookworm/Release.gpg".into());
    let (err, server) = index_error(repo, |u| signed_source(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    assert!(err.to_string().contains("not signed"), "{err}");
    assert!(err.to_string().contains("Release.gpg"), "{err}");
    assert_nothing_but_the_release_read(&server);

    // A Release.gpg for other bytes (the Release changed after signing).
    let mut repo = Repo::real();
    repo.reindex(&packages, &["Packages.xz"]);
    let release = repo.overrides["dists/bookworm/Release"].clone();
    let other = String::from_utf8(release)
        .unwrap()
        .replacen("Origin: test", "Origin: tesT", 1);
    repo.overrides
        .insert("dists/bookworm/Release".into(), other.into_bytes());
    let (err, _server) = index_error(repo, |u| signed_source(u, SUITE));
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    assert!(err.to_string().contains("Release.gpg"), "{err}");
}

#[test]
fn a_real_debian_inrelease_verifies_with_the_shipped_keyring() {
    // Captured from deb.debian.org (bookworm, signed by the bookworm and
    // trixie archive keys and the bookworm release key), served on
    // loopback; the shipped keyring is the default.
    let fixture = crate::support::repo_root().join("tests/fixtures/apt/debian-bookworm-InRelease");
    let inrelease = fs::read(&fixture).unwrap();
    let server = Server::start(move |req| {
        if req.path() == "/debian/dists/bookworm/InRelease" {
            Reply::Full(200, vec![], inrelease.clone())
        } else {
            Reply::Full(404, vec![], b"not found".to_vec())
        }
    });
    let cache = tempfile::tempdir().unwrap();
    let source = AptSource::new(&server.url("/debian"), "bookworm");
    let (url, release) = apt::fetch_release(&source, &options(cache.path())).unwrap();
    assert_eq!(url, server.url("/debian/dists/bookworm/InRelease"));
    assert_eq!(release.codename.as_deref(), Some("bookworm"));
    assert!(release.file("main/binary-amd64/Packages.xz").is_some());

    // The same file with a keyring that lacks Debian's keys is refused,
    // naming the keys that did sign it.
    let err = apt::fetch_release(
        &source.clone().with_keyring(Some(aptsign::test_keyring())),
        &options(cache.path()),
    )
    .unwrap_err();
    assert_eq!(err.reason, Reason::SignatureInvalid, "{err}");
    for fp in [
        "4CB50190207B4758A3F73A796ED0E7B82643E131",
        "B8E5F13176D2A7A75220028078DBA3BC47EF2265",
        "4D64FEC119C2029067D6E791F8D2585B8783D481",
    ] {
        assert!(err.to_string().contains(fp), "{fp} not in: {err}");
    }
}
