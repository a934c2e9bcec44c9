//! OpenPGP signatures of apt repositories' Release files: `InRelease`
//! (clearsigned) or `Release` with a detached `Release.gpg`, verified
//! against a trusted keyring before anything in the Release is used.
//!
//! The keyrings are the ones shipped in `keyrings/` (compiled in: Debian's
//! archive keys for bookworm and trixie from `debian-archive-keyring`, and
//! Garden Linux's repository key; `keyrings/README.md` says where each file
//! came from), or a keyring file given for another repository
//! (`--apt-keyring`). The cryptography is rpgp's (the `pgp` crate), pure
//! Rust, so the static binary links no C crypto library.
//!
//! A Release is accepted when at least one of its signatures verifies with
//! a key of the keyring (Debian signs with the archive keys of two releases
//! and the stable release key; a keyring need only hold one of them).
//! Signatures with MD5, SHA-1 or RIPEMD-160 do not count (apt refuses them
//! too). A subkey counts only with a valid signing binding to its primary
//! key; a key or subkey with a revocation signature does not count. Key
//! expiry and `Valid-Until` are not evaluated (see docs/headers.md).

use std::path::Path;

use pgp::composed::{
    CleartextSignedMessage, Deserializable, DetachedSignature, SignedPublicKey, SignedPublicSubKey,
};
use pgp::crypto::hash::HashAlgorithm;
use pgp::packet::{Signature, SignatureType};
use pgp::types::KeyDetails;

use crate::error::{Error, Failure, Result};

/// Debian's archive keys (`debian-archive-keyring` 2025.1): the automatic
/// and security signing keys and the stable release key of bookworm and
/// trixie.
const DEBIAN_KEYS: &[(&str, &[u8])] = &[
    (
        "debian-archive-bookworm-automatic.pgp",
        include_bytes!("../keyrings/debian/debian-archive-bookworm-automatic.pgp"),
    ),
    (
        "debian-archive-bookworm-security-automatic.pgp",
        include_bytes!("../keyrings/debian/debian-archive-bookworm-security-automatic.pgp"),
    ),
    (
        "debian-archive-bookworm-stable.pgp",
        include_bytes!("../keyrings/debian/debian-archive-bookworm-stable.pgp"),
    ),
    (
        "debian-archive-trixie-automatic.pgp",
        include_bytes!("../keyrings/debian/debian-archive-trixie-automatic.pgp"),
    ),
    (
        "debian-archive-trixie-security-automatic.pgp",
        include_bytes!("../keyrings/debian/debian-archive-trixie-security-automatic.pgp"),
    ),
    (
        "debian-archive-trixie-stable.pgp",
        include_bytes!("../keyrings/debian/debian-archive-trixie-stable.pgp"),
    ),
];

/// Garden Linux's repository key (`keyring.gpg` of gardenlinux/gardenlinux,
/// the key its builder bootstraps packages.gardenlinux.io with).
const GARDENLINUX_KEYS: &[(&str, &[u8])] = &[(
    "gardenlinux-keyring.gpg",
    include_bytes!("../keyrings/gardenlinux/gardenlinux-keyring.gpg"),
)];

/// More signatures than this on one Release is not a Release (Debian's
/// carry three); it bounds the work an attacker can ask for.
const MAX_SIGNATURES: usize = 16;

/// The keyrings shipped with the project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    Debian,
    GardenLinux,
}

impl Builtin {
    /// The shipped keyring for a repository URL: Garden Linux's for a host
    /// under `gardenlinux.io` or a URL whose last path segment is
    /// `gardenlinux` (mirrors keep that layout), Debian's for any other
    /// (deb.debian.org and its mirrors).
    pub(crate) fn for_repository(url: &str) -> Builtin {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        // user@host:port → host
        let host = host.rsplit('@').next().unwrap_or(host);
        let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
        let last = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        if host == "gardenlinux.io" || host.ends_with(".gardenlinux.io") || last == "gardenlinux" {
            Builtin::GardenLinux
        } else {
            Builtin::Debian
        }
    }

    fn name(self) -> &'static str {
        match self {
            Builtin::Debian => {
                "Debian's archive keyring (bookworm, trixie) shipped with gpu-driver"
            }
            Builtin::GardenLinux => "Garden Linux's repository keyring shipped with gpu-driver",
        }
    }

    fn files(self) -> &'static [(&'static str, &'static [u8])] {
        match self {
            Builtin::Debian => DEBIAN_KEYS,
            Builtin::GardenLinux => GARDENLINUX_KEYS,
        }
    }
}

/// Trusted OpenPGP keys, each with the subkeys that may sign for it.
#[derive(Debug, Clone)]
pub(crate) struct Keyring {
    /// What it is, for messages: the shipped keyring's name or the file.
    pub name: String,
    keys: Vec<TrustedKey>,
}

#[derive(Debug, Clone)]
struct TrustedKey {
    primary: SignedPublicKey,
    /// Signing subkeys with a valid binding (not revoked).
    subkeys: Vec<SignedPublicSubKey>,
}

/// `--apt-keyring`: Debian's own keyrings are tens of KiB.
const KEYRING_FILE: crate::named_file::Named = crate::named_file::Named {
    what: "the apt keyring (--apt-keyring)",
    max: 4 << 20,
    reason: Failure::InvalidArgument,
    hint: "--apt-keyring takes an OpenPGP keyring file such as /usr/share/keyrings/debian-archive-keyring.gpg",
};

impl Keyring {
    /// One of the shipped keyrings. They are compiled in, so a failure to
    /// parse them is a bug.
    pub(crate) fn builtin(which: Builtin) -> Result<Keyring> {
        let mut keys = Vec::new();
        for (file, bytes) in which.files() {
            let mut ring = Keyring::parse(file, bytes).map_err(|e| {
                Error::new(
                    Failure::Internal,
                    format!("the shipped keyring {file}: {}", e),
                )
            })?;
            keys.append(&mut ring.keys);
        }
        Ok(Keyring {
            name: which.name().to_string(),
            keys,
        })
    }

    /// A keyring file: binary (`.gpg`, `.pgp`, as in /usr/share/keyrings)
    /// or ASCII-armored (`.asc`), one key or several. Unreadable, malformed
    /// or without a usable key: `InvalidArgument`.
    pub(crate) fn from_file(path: &Path) -> Result<Keyring> {
        let bytes = KEYRING_FILE.read(path)?;
        let mut ring = Keyring::parse(&path.display().to_string(), &bytes)?;
        ring.name = format!("the keyring {}", path.display());
        Ok(ring)
    }

    /// Parses OpenPGP public keys (binary or armored); `name` is for
    /// messages.
    pub(crate) fn parse(name: &str, bytes: &[u8]) -> Result<Keyring> {
        let invalid = |what: String| {
            Error::new(
                Failure::InvalidArgument,
                format!("the apt keyring {name}: {what}"),
            )
        };
        let (parsed, _) = SignedPublicKey::from_reader_many(bytes)
            .map_err(|e| invalid(format!("not an OpenPGP public keyring: {e}")))?;
        let mut keys = Vec::new();
        for key in parsed {
            let key = key.map_err(|e| invalid(format!("a key cannot be parsed: {e}")))?;
            if let Some(k) = trusted_key(key) {
                keys.push(k);
            }
        }
        if keys.is_empty() {
            return Err(invalid(
                "holds no usable public key (all revoked, or none at all)".into(),
            ));
        }
        Ok(Keyring {
            name: name.to_string(),
            keys,
        })
    }

    /// The primary keys' fingerprints (upper-case hex, as gpg prints them).
    pub(crate) fn fingerprints(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| hex_fingerprint(&k.primary))
            .collect()
    }
}

/// A key as trusted: `None` if it is revoked; its subkeys filtered to the
/// validly bound signing ones.
fn trusted_key(mut key: SignedPublicKey) -> Option<TrustedKey> {
    let revoked = key
        .details
        .revocation_signatures
        .iter()
        .any(|s| s.verify_key(&key.primary_key).is_ok());
    if revoked {
        tracing::warn!(
            "ignoring revoked key {} in an apt keyring",
            hex_fingerprint(&key)
        );
        return None;
    }
    let primary = &key.primary_key;
    let subkeys = std::mem::take(&mut key.public_subkeys)
        .into_iter()
        .filter(|sub| {
            let bound = sub.signatures.iter().any(|s| {
                s.typ() == Some(SignatureType::SubkeyBinding)
                    && s.key_flags().sign()
                    && s.verify_subkey_binding(primary, &sub.key).is_ok()
                    && s.embedded_signature()
                        .is_some_and(|b| b.verify_primary_key_binding(&sub.key, primary).is_ok())
            });
            let revoked = sub.signatures.iter().any(|s| {
                s.typ() == Some(SignatureType::SubkeyRevocation)
                    && s.verify_subkey_binding(primary, &sub.key).is_ok()
            });
            bound && !revoked
        })
        .collect();
    Some(TrustedKey {
        primary: key,
        subkeys,
    })
}

fn hex_fingerprint(key: &impl KeyDetails) -> String {
    format!("{:X}", key.fingerprint())
}

/// A Release whose signature verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verified {
    /// Exactly the text the signature covers ('\n' line ends; for
    /// `InRelease` the clearsign framework undone), the only text to parse.
    pub text: String,
    /// Fingerprints of the keys (or subkeys) whose signature verified.
    pub signers: Vec<String>,
}

/// Why a Release was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejected {
    /// The issuers the signatures name (fingerprint, else key ID).
    pub signers: Vec<String>,
    /// A signature by a trusted key that does not verify: the text was
    /// changed after it was signed (or the signature damaged).
    pub tampered: bool,
    /// What was wrong, for the message.
    pub detail: String,
}

impl Rejected {
    fn malformed(detail: String) -> Rejected {
        Rejected {
            signers: Vec::new(),
            tampered: false,
            detail,
        }
    }
}

/// Verifies a clearsigned `InRelease`.
pub(crate) fn verify_inrelease(text: &str, keyring: &Keyring) -> Result<Verified, Rejected> {
    let (msg, _) = CleartextSignedMessage::from_string(text)
        .map_err(|e| Rejected::malformed(format!("not an OpenPGP clearsigned message ({e})")))?;
    let signed = msg.signed_text();
    let signers = check_signatures(msg.signatures(), signed.as_bytes(), keyring)?;
    Ok(Verified {
        text: signed.replace("\r\n", "\n"),
        signers,
    })
}

/// Verifies a `Release` against its detached `Release.gpg` (binary or
/// armored, one signature or several).
pub(crate) fn verify_detached(
    release: &[u8],
    signature: &[u8],
    keyring: &Keyring,
) -> Result<Verified, Rejected> {
    let malformed = |e: pgp::errors::Error| {
        Rejected::malformed(format!("Release.gpg is not an OpenPGP signature ({e})"))
    };
    let (parsed, _) = DetachedSignature::from_reader_many(signature).map_err(malformed)?;
    let mut sigs = Vec::new();
    for s in parsed.take(MAX_SIGNATURES + 1) {
        sigs.push(s.map_err(malformed)?.signature);
    }
    let signers = check_signatures(&sigs, release, keyring)?;
    let text = String::from_utf8(release.to_vec())
        .map_err(|_| Rejected::malformed("the signed Release is not UTF-8".into()))?;
    Ok(Verified { text, signers })
}

/// The fingerprints of the trusted keys whose signature over `data`
/// verifies; at least one, or why not.
fn check_signatures(
    sigs: &[Signature],
    data: &[u8],
    keyring: &Keyring,
) -> Result<Vec<String>, Rejected> {
    if sigs.is_empty() {
        return Err(Rejected::malformed("it carries no signature".into()));
    }
    if sigs.len() > MAX_SIGNATURES {
        return Err(Rejected::malformed(format!(
            "it carries more than {MAX_SIGNATURES} signatures"
        )));
    }
    let mut verified = Vec::new();
    let mut rejected = Rejected {
        signers: sigs.iter().map(issuer).collect(),
        tampered: false,
        detail: String::new(),
    };
    let mut notes = Vec::new();
    for sig in sigs {
        match check_one(sig, data, keyring) {
            Check::Verified(fp) => verified.push(fp),
            Check::Failed(fp) => {
                rejected.tampered = true;
                notes.push(format!("the signature by {fp} does not verify"));
            }
            Check::Unknown => {}
            Check::Unusable(why) => notes.push(format!("the signature by {} {why}", issuer(sig))),
        }
    }
    if !verified.is_empty() {
        return Ok(verified);
    }
    rejected.detail = if notes.is_empty() {
        format!("no signature is by a key of {}", keyring.name)
    } else {
        format!(
            "no signature verifies with {}: {}",
            keyring.name,
            notes.join("; ")
        )
    };
    Err(rejected)
}

enum Check {
    /// By this trusted key or subkey, and it verifies.
    Verified(String),
    /// By this trusted key or subkey, and it does not verify.
    Failed(String),
    /// Not by a trusted key.
    Unknown,
    /// Not acceptable whoever made it.
    Unusable(&'static str),
}

fn check_one(sig: &Signature, data: &[u8], keyring: &Keyring) -> Check {
    if !matches!(sig.typ(), Some(SignatureType::Binary | SignatureType::Text)) {
        return Check::Unusable("is not a document signature");
    }
    if matches!(
        sig.hash_alg(),
        None | Some(
            HashAlgorithm::None
                | HashAlgorithm::Md5
                | HashAlgorithm::Sha1
                | HashAlgorithm::Ripemd160
                | HashAlgorithm::Private10
                | HashAlgorithm::Other(_)
        )
    ) {
        return Check::Unusable("uses a weak or unknown hash algorithm");
    }
    // A signature naming no issuer may be anyone's: tried with every key.
    let anonymous = sig.issuer_fingerprint().is_empty() && sig.issuer_key_id().is_empty();
    let mut failed = None;
    for key in &keyring.keys {
        let candidates = std::iter::once(&key.primary as &dyn Candidate)
            .chain(key.subkeys.iter().map(|s| s as &dyn Candidate));
        for c in candidates {
            let named = names(sig, c);
            if !named && !anonymous {
                continue;
            }
            if c.verify(sig, data) {
                return Check::Verified(c.hex());
            }
            if named {
                failed.get_or_insert_with(|| c.hex());
            }
        }
    }
    failed.map_or(Check::Unknown, Check::Failed)
}

/// A key that may have made a signature: a primary key or a subkey.
trait Candidate {
    fn hex(&self) -> String;
    fn fp(&self) -> pgp::types::Fingerprint;
    fn key_id(&self) -> pgp::types::KeyId;
    fn verify(&self, sig: &Signature, data: &[u8]) -> bool;
}

// Primary keys and subkeys alike: both are pgp's verifying keys.
impl<K: pgp::types::VerifyingKey> Candidate for K {
    fn hex(&self) -> String {
        hex_fingerprint(self)
    }
    fn fp(&self) -> pgp::types::Fingerprint {
        self.fingerprint()
    }
    fn key_id(&self) -> pgp::types::KeyId {
        self.legacy_key_id()
    }
    fn verify(&self, sig: &Signature, data: &[u8]) -> bool {
        sig.verify(self, data).is_ok()
    }
}

/// Whether `sig` names `key` as its issuer.
fn names(sig: &Signature, key: &dyn Candidate) -> bool {
    sig.issuer_fingerprint().iter().any(|f| **f == key.fp())
        || sig.issuer_key_id().iter().any(|i| **i == key.key_id())
}

/// The issuer a signature names: its fingerprint, else its key ID.
fn issuer(sig: &Signature) -> String {
    if let Some(fp) = sig.issuer_fingerprint().first() {
        return format!("{fp:X}");
    }
    match sig.issuer_key_id().first() {
        Some(id) => format!("key ID {}", hex::encode_upper(id.as_ref())),
        None => "an unnamed key".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;
    use pgp::composed::{ArmorOptions, SignedSecretKey};
    use pgp::types::Password;

    const TEST_KEY: &str = include_str!("../tests/fixtures/apt/test-key.pub.asc");
    const TEST_SECRET: &str = include_str!("../tests/fixtures/apt/test-key.sec.asc");
    const UNKNOWN_SECRET: &str = include_str!("../tests/fixtures/apt/unknown-key.sec.asc");
    const TEST_FP: &str = "5A1B8FD2F2D90BA33025062F62ED44E0DB7FEF5F";
    const UNKNOWN_FP: &str = "35BCBFC37C1ED86093CB046C775CC81C091024AD";
    /// Captured from deb.debian.org: signed by the bookworm and trixie
    /// archive keys (RSA subkeys) and bookworm's stable release key (Ed25519).
    const DEBIAN_INRELEASE: &str = include_str!("../tests/fixtures/apt/debian-bookworm-InRelease");
    const BOOKWORM_AUTOMATIC: &str = "4CB50190207B4758A3F73A796ED0E7B82643E131";
    const TRIXIE_AUTOMATIC: &str = "B8E5F13176D2A7A75220028078DBA3BC47EF2265";
    const BOOKWORM_STABLE: &str = "4D64FEC119C2029067D6E791F8D2585B8783D481";

    const RELEASE: &str = "Origin: test\nSuite: bookworm\nCodename: bookworm\n\
        Components: main\nArchitectures: amd64\nSHA256:\n \
        0000000000000000000000000000000000000000000000000000000000000000 0 main/binary-amd64/Packages\n\
        - a line that starts with a dash\n";

    fn secret(armored: &str) -> SignedSecretKey {
        SignedSecretKey::from_string(armored).unwrap().0
    }

    fn test_keyring() -> Keyring {
        Keyring::parse("test", TEST_KEY.as_bytes()).unwrap()
    }

    fn clearsign(text: &str, armored_secret: &str) -> String {
        let key = secret(armored_secret);
        CleartextSignedMessage::sign(
            rand::thread_rng(),
            text,
            &key.primary_key,
            &Password::empty(),
        )
        .unwrap()
        .to_armored_string(ArmorOptions::default())
        .unwrap()
    }

    fn detached(data: &[u8], hash: HashAlgorithm) -> DetachedSignature {
        let key = secret(TEST_SECRET);
        DetachedSignature::sign_binary_data(
            rand::thread_rng(),
            &key.primary_key,
            &Password::empty(),
            hash,
            data,
        )
        .unwrap()
    }

    #[test]
    fn debian_inrelease_verifies_with_the_shipped_keyring() {
        let debian = Keyring::builtin(Builtin::Debian).unwrap();
        assert_eq!(debian.fingerprints().len(), 6);
        let v = verify_inrelease(DEBIAN_INRELEASE, &debian).unwrap();
        assert_eq!(
            v.signers,
            [BOOKWORM_AUTOMATIC, TRIXIE_AUTOMATIC, BOOKWORM_STABLE]
        );
        assert!(v.text.starts_with("Origin: Debian\n"), "{}", &v.text[..80]);
        assert!(v.text.contains("\nCodename: bookworm\n"));
        assert!(!v.text.contains('\r') && !v.text.contains("PGP"));

        // One key is enough: the RSA subkey of trixie's archive key, or
        // bookworm's Ed25519 release key, each on its own.
        for (file, signer) in [
            ("debian-archive-trixie-automatic.pgp", TRIXIE_AUTOMATIC),
            ("debian-archive-bookworm-stable.pgp", BOOKWORM_STABLE),
        ] {
            let bytes = DEBIAN_KEYS.iter().find(|(f, _)| *f == file).unwrap().1;
            let one = Keyring::parse(file, bytes).unwrap();
            let v = verify_inrelease(DEBIAN_INRELEASE, &one).unwrap();
            assert_eq!(v.signers, [signer], "{file}");
        }
    }

    #[test]
    fn debian_inrelease_is_refused_with_another_keyring() {
        let gl = Keyring::builtin(Builtin::GardenLinux).unwrap();
        assert_eq!(
            gl.fingerprints(),
            ["DEFD381C63B6BCA7BCCA5E7AD29C802475EDA2FB"]
        );
        let r = verify_inrelease(DEBIAN_INRELEASE, &gl).unwrap_err();
        assert!(!r.tampered);
        assert_eq!(
            r.signers,
            [BOOKWORM_AUTOMATIC, TRIXIE_AUTOMATIC, BOOKWORM_STABLE]
        );
        assert!(
            r.detail.contains("no signature is by a key of"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn a_changed_byte_in_a_debian_inrelease_is_refused() {
        let changed = DEBIAN_INRELEASE.replacen("Codename: bookworm", "Codename: bookwork", 1);
        assert_ne!(changed, DEBIAN_INRELEASE);
        let debian = Keyring::builtin(Builtin::Debian).unwrap();
        let r = verify_inrelease(&changed, &debian).unwrap_err();
        assert!(r.tampered, "{r:?}");
        assert!(r.detail.contains("does not verify"), "{}", r.detail);
        assert!(r.detail.contains(BOOKWORM_AUTOMATIC), "{}", r.detail);
    }

    #[test]
    fn clearsigned_by_the_test_key_verifies_and_unescapes() {
        let signed = clearsign(RELEASE, TEST_SECRET);
        assert!(signed.contains("\n- - a line that starts"), "{signed}");
        let v = verify_inrelease(&signed, &test_keyring()).unwrap();
        assert_eq!(v.signers, [TEST_FP]);
        assert_eq!(v.text, RELEASE);

        // One byte of the text changed, the signature kept.
        let tampered = signed.replacen("Suite: bookworm", "Suite: bookwork", 1);
        let r = verify_inrelease(&tampered, &test_keyring()).unwrap_err();
        assert!(r.tampered, "{r:?}");
        assert_eq!(r.signers, [TEST_FP]);
        // Lines added before the armor are not part of the message.
        let prefixed = format!("Origin: evil\n{signed}");
        assert!(verify_inrelease(&prefixed, &test_keyring()).is_err());
    }

    #[test]
    fn clearsigned_by_an_unknown_key_is_refused() {
        let signed = clearsign(RELEASE, UNKNOWN_SECRET);
        let r = verify_inrelease(&signed, &test_keyring()).unwrap_err();
        assert!(!r.tampered);
        assert_eq!(r.signers, [UNKNOWN_FP]);
    }

    #[test]
    fn unsigned_or_malformed_releases_are_refused() {
        let kr = test_keyring();
        for text in [
            RELEASE,
            "",
            "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\nA: b\n",
            "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\nA: b\n\
             -----BEGIN PGP SIGNATURE-----\n\nbm90IGEgc2lnbmF0dXJl\n-----END PGP SIGNATURE-----\n",
        ] {
            let r = verify_inrelease(text, &kr).unwrap_err();
            assert!(r.signers.is_empty() && !r.tampered, "{text:?}: {r:?}");
        }
        assert!(verify_detached(RELEASE.as_bytes(), b"garbage", &kr).is_err());
        assert!(verify_detached(RELEASE.as_bytes(), b"", &kr).is_err());
    }

    #[test]
    fn detached_signatures_verify_binary_or_armored() {
        let kr = test_keyring();
        let sig = detached(RELEASE.as_bytes(), HashAlgorithm::Sha256);
        let armored = sig.to_armored_bytes(ArmorOptions::default()).unwrap();
        let mut binary = Vec::new();
        pgp::ser::Serialize::to_writer(&sig, &mut binary).unwrap();
        for bytes in [&armored, &binary] {
            let v = verify_detached(RELEASE.as_bytes(), bytes, &kr).unwrap();
            assert_eq!(v.signers, [TEST_FP]);
            assert_eq!(v.text, RELEASE);
        }
        let tampered = RELEASE.replacen("Suite: bookworm", "Suite: bookwork", 1);
        let r = verify_detached(tampered.as_bytes(), &armored, &kr).unwrap_err();
        assert!(r.tampered, "{r:?}");

        // A valid signature with a weak hash does not count (made with
        // gpg --digest-algo SHA1; rpgp refuses to make one).
        let r = verify_detached(
            include_bytes!("../tests/fixtures/apt/sha1-Release"),
            include_bytes!("../tests/fixtures/apt/sha1-Release.gpg"),
            &kr,
        )
        .unwrap_err();
        assert!(r.detail.contains("weak"), "{}", r.detail);
        assert_eq!(r.signers, [TEST_FP]);
    }

    #[test]
    fn keyrings_are_chosen_by_repository_and_parsed_strictly() {
        for (url, want) in [
            ("https://deb.debian.org/debian", Builtin::Debian),
            ("http://127.0.0.1:8080/", Builtin::Debian),
            (
                "https://packages.gardenlinux.io/gardenlinux",
                Builtin::GardenLinux,
            ),
            (
                "https://repo.gardenlinux.io/gardenlinux/",
                Builtin::GardenLinux,
            ),
            ("https://mirror.example/gardenlinux", Builtin::GardenLinux),
            ("https://gardenlinux.io.example/debian", Builtin::Debian),
        ] {
            assert_eq!(Builtin::for_repository(url), want, "{url}");
        }
        let e = Keyring::parse("x.gpg", b"not a key").unwrap_err();
        assert_eq!(e.reason, Reason::InvalidArgument);
        assert!(e.to_string().contains("x.gpg"), "{e}");
        // A secret key is not a public keyring.
        assert!(Keyring::parse("sec.asc", TEST_SECRET.as_bytes()).is_err());
        let e = Keyring::from_file(Path::new("/nonexistent/keyring.gpg")).unwrap_err();
        assert_eq!(e.reason, Reason::InvalidArgument);
        assert!(e.to_string().contains("/nonexistent/keyring.gpg"), "{e}");
    }

    /// `--apt-keyring /dev/zero` (or a FIFO, or a secret) neither hangs,
    /// nor fills memory, nor shows up in a message.
    #[test]
    fn the_keyring_file_is_read_bounded() {
        crate::named_file::hostile::assert_refused(KEYRING_FILE.max, Keyring::from_file);
    }
}
