//! The cache on a `file://` store: the same contract as S3, plus forged,
//! huge and FIFO manifests.

use super::*;

#[test]
fn file_store_miss_hit_corrupt_and_stale_lease() {
    let fx = Fixture::new(0);
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}/cache", store.path().display());

    let a = finish(fx.build("a", &url, &[]).output().unwrap());
    assert_eq!(a.reason(), "Built", "{}\n{}", a.doc, a.stderr);
    assert_eq!(a.outcome(), "Miss", "{}", a.doc);
    assert_eq!(a.cache()["stored"], true);
    let b = finish(fx.build("b", &url, &[]).output().unwrap());
    assert_eq!(b.outcome(), "Hit", "{}\n{}", b.doc, b.stderr);
    assert_eq!(fx.compiles(), 1);

    let obj = find(store.path(), "artifact-");
    let bytes = fs::read(&obj).unwrap();
    fs::write(&obj, &bytes[..bytes.len() - 1]).unwrap();
    let c = finish(fx.build("c", &url, &[]).output().unwrap());
    assert_eq!(c.outcome(), "Corrupt", "{}\n{}", c.doc, c.stderr);
    assert_eq!(fx.compiles(), 2);
    let d = finish(fx.build("d", &url, &[]).output().unwrap());
    assert_eq!(d.outcome(), "Hit", "{}", d.doc);

    // Stale lease on the file store: taken over by delete + create.
    let manifest = find(store.path(), "manifest.json");
    fs::remove_file(&manifest).unwrap();
    fs::write(
        manifest.with_file_name("lease.json"),
        r#"{"owner":"gone/1/0","acquiredAtUnix":1,"ttlSeconds":60}"#,
    )
    .unwrap();
    let e = finish(fx.build("e", &url, &[]).output().unwrap());
    assert_eq!(e.outcome(), "Miss", "{}\n{}", e.doc, e.stderr);
    assert_eq!(
        e.cache()["lease"],
        "took over the expired lease of gone/1/0"
    );
    assert!(!manifest.with_file_name("lease.json").exists());
    assert_eq!(fx.compiles(), 3);
}

/// An entry whose manifest.json was rewritten for a forged artifact (the
/// same files, one module's bytes changed): size and sha256 agree with it,
/// so only the check of every file inside, which reads the download as it
/// streams in, can refuse it. It does, and the key is compiled again.
#[test]
fn file_store_a_forged_artifact_that_matches_its_entry_is_corrupt() {
    use std::io::Read;
    let (fx, store, url) = file_store_after_a_first_miss();

    let obj = find(store.path(), "artifact-");
    let dec = zstd::stream::read::Decoder::new(fs::File::open(&obj).unwrap()).unwrap();
    let mut archive = tar::Archive::new(dec);
    let mut out = tar::Builder::new(Vec::new());
    let mut changed = false;
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        let path = e.path().unwrap().into_owned();
        if path == Path::new("modules/nvidia.ko") {
            let mid = data.len() / 2;
            data[mid] ^= 0x55;
            changed = true;
        }
        let mut header = e.header().clone();
        out.append_data(&mut header, &path, &data[..]).unwrap();
    }
    assert!(changed, "the artifact holds no modules/nvidia.ko");
    let forged = zstd::encode_all(&out.into_inner().unwrap()[..], 3).unwrap();
    fs::write(&obj, &forged).unwrap();
    let manifest = find(store.path(), "manifest.json");
    let mut entry: Value = serde_json::from_slice(&fs::read(&manifest).unwrap()).unwrap();
    entry["artifactSha256"] = sha256(&forged).into();
    entry["artifactSizeBytes"] = forged.len().into();
    fs::write(&manifest, serde_json::to_vec(&entry).unwrap()).unwrap();

    let b = finish(fx.build("b", &url, &[]).output().unwrap());
    assert_eq!(b.outcome(), "Corrupt", "{}\n{}", b.doc, b.stderr);
    let warning = b.cache()["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("modules/nvidia.ko has sha256"),
        "{warning}"
    );
    assert_eq!(fx.compiles(), 2);
}

/// The store is not trusted to be small or sane: a 3 GiB `manifest.json`
/// (sparse, so the test costs no disk) is refused by its size, never read
/// whole; a FIFO in its place is refused, not waited on. Either way the
/// build goes on without the cache.
#[test]
fn file_store_a_huge_or_fifo_manifest_is_refused_unread() {
    let (fx, store, url) = file_store_after_a_first_miss();
    let manifest = find(store.path(), "manifest.json");
    let deadline = std::time::Duration::from_secs(300);

    fs::remove_file(&manifest).unwrap();
    fs::File::create(&manifest)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    let b = finish(run_support::output_within(
        fx.build("b", &url, &[]),
        deadline,
    ));
    assert_eq!(b.reason(), "Built", "{}\n{}", b.doc, b.stderr);
    assert_eq!(b.outcome(), "Unavailable", "{}", b.doc);
    let warnings = b.cache()["warnings"].to_string();
    assert!(warnings.contains("is over 4096 KiB; not read"), "{}", b.doc);

    fs::remove_file(&manifest).unwrap();
    nix::unistd::mkfifo(&manifest, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let c = finish(run_support::output_within(
        fx.build("c", &url, &[]),
        deadline,
    ));
    assert_eq!(c.reason(), "Built", "{}\n{}", c.doc, c.stderr);
    assert_eq!(c.outcome(), "Unavailable", "{}", c.doc);
    let warnings = c.cache()["warnings"].to_string();
    assert!(warnings.contains("is not a regular file"), "{}", c.doc);
    assert_eq!(fx.compiles(), 3);
}

#[test]
fn file_store_two_builders_racing_build_it_once() {
    let fx = Fixture::new(3);
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let children: Vec<Child> = ["a", "b"]
        .iter()
        .map(|out| {
            fx.build(out, &url, &["--cache-poll-ms", "200"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outcomes: Vec<String> = children
        .into_iter()
        .map(|c| {
            let r = finish(c.wait_with_output().unwrap());
            assert_eq!(r.reason(), "Built", "{}\n{}", r.doc, r.stderr);
            r.outcome().to_string()
        })
        .collect();
    outcomes.sort();
    assert_eq!(outcomes, ["Hit", "Miss"]);
    assert_eq!(fx.compiles(), 1);
}

#[test]
fn without_a_cache_url_the_cache_is_disabled() {
    let fx = Fixture::new(0);
    let mut c = bin();
    c.args(["build", "--source"])
        .arg(&fx.source)
        .args(["--kernel", REL, "--flavor", "open", "--headers"])
        .arg(&fx.headers)
        .arg("--out")
        .arg(fx.base.join("out"));
    let r = finish(c.output().unwrap());
    assert_eq!(r.reason(), "Built", "{}\n{}", r.doc, r.stderr);
    assert_eq!(r.outcome(), "Disabled", "{}", r.doc);
}
