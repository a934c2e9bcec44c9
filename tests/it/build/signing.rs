//! `build --signing-key/--signing-cert` in the bookworm builder root: the
//! real kbuild compile of `tests/fixtures/kmod-hello`, signed by the
//! headers' own `scripts/sign-file`; the signer in the result, the manifest
//! and the cache key. Keys come from the host's `openssl` (RSA, whose
//! PKCS#1 v1.5 signatures are deterministic, so bytes can be compared).

use std::fs;
use std::path::Path;
use std::process::Command;

use super::{COMPILE, Job, builder_root, message, reason, root_kernel_release, sha256, unpack};

const MAGIC: &[u8] = b"~Module signature appended~\n";

/// `openssl req`: an RSA key and its self-signed certificate (PEM) in `dir`.
fn key_pair(dir: &Path, name: &str) {
    let out = Command::new("openssl")
        .args([
            "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            &format!("/CN=gpu-driver test {name}/O=gpu-driver/"),
        ])
        .arg("-keyout")
        .arg(dir.join(format!("{name}.key")))
        .arg("-out")
        .arg(dir.join(format!("{name}.crt")))
        .output()
        .unwrap_or_else(|e| panic!("running openssl (the tests need it): {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The certificate's DER SHA-256, by openssl.
fn fingerprint(cert: &Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-outform", "DER", "-in"])
        .arg(cert)
        .output()
        .unwrap();
    assert!(out.status.success());
    sha256(&out.stdout)
}

/// `build` of the job's kmod-hello tree into `<job>/<out>` with `extra`
/// flags, and the file cache `<job>/cache` if `cached`.
fn build(
    job: &Job,
    release: &str,
    out: &str,
    extra: &[&str],
    cached: bool,
) -> crate::support::run::Run {
    let (src, out) = (job.inner("src"), job.inner(out));
    let cache_url = format!("file://{}", job.inner("cache"));
    let mut args = vec![
        "--log-level",
        "info",
        "build",
        "--source",
        &src,
        "--kernel",
        release,
        "--flavor",
        "open",
        "--driver-version",
        "1.0",
        "--out",
        &out,
    ];
    if cached {
        args.extend(["--cache-url", cache_url.as_str()]);
    }
    args.extend_from_slice(extra);
    job.run(&args)
}

fn artifact(job: &Job, out: &str, release: &str) -> std::path::PathBuf {
    job.outer(&job.inner(&format!("{out}/nvidia-1.0-open-{release}.tar.zst")))
}

#[test]
fn a_build_signs_every_module_as_the_headers_sign_file_does() {
    let Some(root) = builder_root("bookworm") else {
        return;
    };
    let _one = COMPILE.lock().unwrap_or_else(|e| e.into_inner());
    let release = root_kernel_release(&root);
    let job = Job::new(&root, "signing");
    copy_hello_module(&job);
    let keys = job.outer(&job.inner("keys"));
    fs::create_dir_all(&keys).unwrap();
    key_pair(&keys, "owner");
    key_pair(&keys, "other");
    let (key, cert) = (job.inner("keys/owner.key"), job.inner("keys/owner.crt"));
    let owner = [
        "--signing-key",
        key.as_str(),
        "--signing-cert",
        cert.as_str(),
    ];

    // Unsigned first: stored in the cache under the unsigned key.
    let plain = build(&job, &release, "plain", &[], true);
    assert_eq!(reason(&plain), "Built", "{}", plain.stderr);
    assert!(plain.doc["status"].get("signer").is_none(), "{}", plain.doc);
    // Signed: not the unsigned entry (the signer is in the key), compiled.
    let signed = build(&job, &release, "signed", &owner, true);
    assert_eq!(
        reason(&signed),
        "Built",
        "{}\n{}",
        signed.doc,
        signed.stderr
    );
    assert_eq!(
        signed.doc["status"]["cache"]["outcome"], "Miss",
        "{}",
        signed.doc
    );
    let fp = fingerprint(&keys.join("owner.crt"));
    let signer = &signed.doc["status"]["signer"];
    assert_eq!(signer["sha256"], fp.as_str(), "{}", signed.doc);
    assert_eq!(signer["subject"], "CN=gpu-driver test owner, O=gpu-driver");

    let plain_files = unpack(&artifact(&job, "plain", &release));
    let signed_files = unpack(&artifact(&job, "signed", &release));
    let manifest: serde_json::Value =
        serde_json::from_slice(&signed_files["manifest.json"]).unwrap();
    assert_eq!(&manifest["signer"], signer);
    let ko = &signed_files["modules/hello.ko"];
    assert!(ko.ends_with(MAGIC), "hello.ko is not signed");
    assert_eq!(manifest["modules"][0]["sha256"], sha256(ko).as_str());
    // The signed module is a stripped module with a signature appended,
    // byte for byte what the headers' sign-file makes of that module.
    let unsigned = &plain_files["modules/hello.ko"];
    assert!(!unsigned.ends_with(MAGIC));
    let n = ko.len();
    let sig_len = u32::from_be_bytes(ko[n - 32..n - 28].try_into().unwrap()) as usize;
    let body = &ko[..n - MAGIC.len() - 12 - sig_len];
    assert!(body.starts_with(b"\x7fELF"));
    fs::write(job.outer(&job.inner("by-hand.ko")), body).unwrap();
    let sign_file = format!("/usr/src/linux-headers-{release}/scripts/sign-file");
    let by_hand = job.run_tool(&[&sign_file, "sha256", &key, &cert, &job.inner("by-hand.ko")]);
    assert!(
        by_hand.status.success(),
        "{}",
        String::from_utf8_lossy(&by_hand.stderr)
    );
    assert!(
        fs::read(job.outer(&job.inner("by-hand.ko"))).unwrap() == *ko,
        "the build's signed hello.ko differs from sign-file's"
    );

    // Each has its own entry: the signed one's ends in the fingerprint.
    // (kmod-hello is no NVIDIA module, so a later lookup would refuse either
    // entry as incomplete: no modules/nvidia.ko. tests/it/cache.rs covers
    // hits; this covers the keys.)
    let key = |r: &crate::support::run::Run| {
        r.doc["status"]["cache"]["key"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        key(&signed).ends_with(&format!("-signer-{}", &fp[..16])),
        "{}",
        key(&signed)
    );
    assert!(!key(&plain).contains("signer"), "{}", key(&plain));
    assert_eq!(
        plain.doc["status"]["cache"]["stored"], true,
        "{}",
        plain.doc
    );
    assert_eq!(
        signed.doc["status"]["cache"]["stored"], true,
        "{}",
        signed.doc
    );

    // The other key with the owner's certificate: sign-file refuses it, and
    // nothing of the key shows in what the build printed.
    let other_key = job.inner("keys/other.key");
    let wrong = build(
        &job,
        &release,
        "wrong",
        &["--signing-key", &other_key, "--signing-cert", &cert],
        false,
    );
    assert_eq!(reason(&wrong), "SigningFailed", "{}", wrong.doc);
    assert!(message(&wrong).contains("sign-file"), "{}", wrong.doc);
    let key_pem = fs::read_to_string(keys.join("other.key")).unwrap();
    let key_line = key_pem.lines().nth(3).unwrap();
    assert!(!wrong.doc.to_string().contains(key_line) && !wrong.stderr.contains(key_line));
    job.remove();
}

/// The kmod-hello fixture as the job's kernel-open tree.
fn copy_hello_module(job: &Job) {
    let tree = job.outer(&job.inner("src/kernel-open"));
    fs::create_dir_all(&tree).unwrap();
    let fixture = crate::support::repo_root().join("tests/fixtures/kmod-hello");
    for f in ["hello.c", "Kbuild", "Makefile"] {
        fs::copy(fixture.join(f), tree.join(f)).unwrap();
    }
}
