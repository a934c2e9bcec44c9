//! Signing test apt repositories with the committed test-only key
//! (`tests/fixtures/apt/test-key.*`), as a repository's maintainer would:
//! a clearsigned `InRelease` or a detached `Release.gpg`. rpgp signs, so
//! the tests need no gpg.

#![allow(dead_code)]

use std::path::PathBuf;

use pgp::composed::{
    ArmorOptions, CleartextSignedMessage, Deserializable, DetachedSignature, SignedSecretKey,
};
use pgp::crypto::hash::HashAlgorithm;
use pgp::types::Password;

/// The test key's fingerprint.
pub const TEST_FP: &str = "5A1B8FD2F2D90BA33025062F62ED44E0DB7FEF5F";
/// A second test key's fingerprint: one no keyring trusts.
pub const UNKNOWN_FP: &str = "35BCBFC37C1ED86093CB046C775CC81C091024AD";

fn fixture(name: &str) -> PathBuf {
    crate::support::repo_root()
        .to_path_buf()
        .join("tests/fixtures/apt")
        .join(name)
}

/// The test key's public keyring, for `--apt-keyring` / `AptSource::keyring`.
pub fn test_keyring() -> PathBuf {
    fixture("test-key.pub.asc")
}

fn secret(name: &str) -> SignedSecretKey {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    SignedSecretKey::from_string(&text).unwrap().0
}

fn clearsign_with(release: &str, key: &str) -> Vec<u8> {
    let key = secret(key);
    CleartextSignedMessage::sign(
        rand::thread_rng(),
        release,
        &key.primary_key,
        &Password::empty(),
    )
    .unwrap()
    .to_armored_bytes(ArmorOptions::default())
    .unwrap()
}

/// `InRelease` for `release`, signed by the test key.
pub fn clearsign(release: &str) -> Vec<u8> {
    clearsign_with(release, "test-key.sec.asc")
}

/// `InRelease` for `release`, signed by the key no keyring trusts.
pub fn clearsign_unknown(release: &str) -> Vec<u8> {
    clearsign_with(release, "unknown-key.sec.asc")
}

/// `Release.gpg` for `release` (armored), signed by the test key.
pub fn detach_sign(release: &[u8]) -> Vec<u8> {
    let key = secret("test-key.sec.asc");
    DetachedSignature::sign_binary_data(
        rand::thread_rng(),
        &key.primary_key,
        &Password::empty(),
        HashAlgorithm::Sha512,
        release,
    )
    .unwrap()
    .to_armored_bytes(ArmorOptions::default())
    .unwrap()
}
