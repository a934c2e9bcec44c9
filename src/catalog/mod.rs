//! The catalog: which OS versions are installable, which driver each gets,
//! which GPU families each branch drives, and which pairs are known broken.
//! It is data (`catalog/catalog.toml`), embedded at build time and
//! replaceable with `--catalog PATH`.

use std::path::Path;

use crate::error::{Error, Failure, Result};

mod check;
mod matrix;
mod model;
mod validate;
mod versions;

pub use check::CatalogCheck;

pub use check::{CatalogCheckSpec, CatalogCheckStatus};

pub use check::DefaultChoice;

pub(crate) use check::check_document;
pub(crate) use matrix::matrix_exclusions;
pub use model::{
    Architecture, Catalog, Channel, DriverEntry, Exclusion, FlavorRule, IommuPassthrough,
    ModuleParams, OsEntry, OsRelease, Policy, UrlTemplates,
};
pub use versions::version_matches;
pub(crate) use versions::{OPEN_BY_DEFAULT_FROM, branch_of};

pub(crate) const EMBEDDED: &str = include_str!("../../catalog/catalog.toml");
/// `--catalog`: the embedded one is tens of KiB.
const CATALOG_FILE: crate::named_file::Named = crate::named_file::Named {
    what: "the catalog (--catalog)",
    max: 4 << 20,
    reason: Failure::CatalogInvalid,
    hint: "fix the file or omit --catalog to use the embedded one",
};

impl Catalog {
    pub fn embedded() -> Result<Self> {
        Self::parse(EMBEDDED, "the embedded catalog")
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text = CATALOG_FILE.read_text(path)?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let invalid = |msg: String| {
            Error::new(Failure::CatalogInvalid, format!("catalog {origin}: {msg}"))
                .with_hint("fix the file or omit --catalog to use the embedded one")
        };
        // The parser's message and line, not its Display: that quotes the
        // offending line of a file that may not be a catalog at all.
        let mut cat: Catalog = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| {
                    let before = &text.as_bytes()[..s.start.min(text.len())];
                    format!(
                        "line {}: ",
                        1 + before.iter().filter(|&&b| b == b'\n').count()
                    )
                })
                .unwrap_or_default();
            invalid(format!("{line}{}", e.message()))
        })?;
        cat.origin = origin.to_string();
        cat.validate().map_err(|e| invalid(e.to_string()))?;
        Ok(cat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;
    use crate::node::{CpuArch, KernelVersion, ModuleFlavor};
    use versions::version_key;

    /// `--catalog /dev/zero` (or a FIFO, or a secret) neither hangs, nor
    /// fills memory, nor shows up in a message.
    #[test]
    fn the_catalog_file_is_read_bounded() {
        crate::named_file::hostile::assert_refused(CATALOG_FILE.max, Catalog::load);
    }

    #[test]
    fn embedded_catalog_is_valid() {
        let c = Catalog::embedded().unwrap();
        assert!(
            c.default_release(&c.default_branch, CpuArch::X86_64)
                .is_some()
        );
        assert_eq!(c.architecture_of(0x1eb8).unwrap().name, "turing");
        assert_eq!(c.architecture_of(0x1db1).unwrap().name, "volta");
        assert_eq!(c.architecture_of(0x15f8).unwrap().name, "pascal");
        assert_eq!(c.architecture_of(0x20b2).unwrap().name, "ampere");
        assert_eq!(c.architecture_of(0x2330).unwrap().name, "hopper");
        assert_eq!(c.architecture_of(0x27b8).unwrap().name, "ada");
        assert_eq!(c.architecture_of(0x2901).unwrap().name, "blackwell");
        assert!(c.architecture_of(0x0001).is_none());
    }

    #[test]
    fn version_matching() {
        assert!(version_matches("1592.4", "1592"));
        assert!(version_matches("2150.0.0", "2150"));
        assert!(version_matches("12", "12"));
        assert!(!version_matches("15920.1", "1592"));
        assert!(!version_matches("120", "12"));
        assert_eq!(branch_of("570.195.03"), Some(570));
        assert!(version_key("580.95.05") < version_key("580.105.08"));
    }

    #[test]
    fn policies_match_on_os_version_and_kernel() {
        let c = Catalog::embedded().unwrap();
        let k61 = KernelVersion::parse("6.1.0-50-cloud-amd64");
        let k612 = KernelVersion::parse("6.12.57+deb13-cloud-amd64");
        assert_eq!(
            c.policy_for("debian", Some("12"), k61).unwrap().branch,
            "580"
        );
        assert!(c.policy_for("debian", Some("12"), k612).is_none());
        assert_eq!(
            c.policy_for("debian", Some("13"), k612).unwrap().branch,
            "580"
        );
        let k66 = KernelVersion::parse("6.6.63-cloud-amd64");
        assert_eq!(
            c.policy_for("gardenlinux", Some("1592.4"), k66)
                .unwrap()
                .branch,
            "570"
        );
    }

    #[test]
    fn exclusions_match_branch_kernel_range_and_flavor() {
        let c = Catalog::parse(
            &format!(
                "{EMBEDDED}\n[[exclusions]]\ndriver = \"535\"\nkernelMin = \"6.12\"\nflavor = \"open\"\nreason = \"kernel API\"\nevidence = \"measured: here\"\n"
            ),
            "test",
        )
        .unwrap();
        let k = |s| KernelVersion::parse(s).unwrap();
        let open = Some(ModuleFlavor::Open);
        assert!(c.exclusion_for("535.274.02", k("6.12.57"), open).is_some());
        assert!(c.exclusion_for("535.274.02", k("6.11.0"), open).is_none());
        assert!(
            c.exclusion_for("535.274.02", k("6.12.0"), Some(ModuleFlavor::Proprietary))
                .is_none()
        );
        assert!(c.exclusion_for("550.163.01", k("6.12.0"), open).is_none());
    }

    #[test]
    fn invalid_catalogs_are_refused_with_the_reason() {
        let cases = [
            ("schemaVersion = 1", "schemaVersion 1"),
            ("nonsense", "catalog test"),
            ("defaultBranch = \"999\"", "defaultBranch 999"),
        ];
        for (patch, want) in cases {
            let text = EMBEDDED
                .replace(
                    "schemaVersion = 2",
                    if patch.starts_with("schema") {
                        patch
                    } else {
                        "schemaVersion = 2"
                    },
                )
                .replace(
                    "defaultBranch = \"580\"",
                    if patch.starts_with("default") {
                        patch
                    } else {
                        "defaultBranch = \"580\""
                    },
                );
            let text = if patch == "nonsense" {
                format!("{text}\nnonsense\n")
            } else {
                text
            };
            let err = Catalog::parse(&text, "test").unwrap_err();
            assert_eq!(err.reason, Reason::CatalogInvalid);
            assert!(err.to_string().contains(want), "{}", err.to_string());
        }
        let bad_range = EMBEDDED.replace("\"0x2900-0x2fff\"", "\"0x2fff-0x2900\"");
        assert!(
            Catalog::parse(&bad_range, "t")
                .unwrap_err()
                .message
                .contains("blackwell")
        );
        let bad_sum = EMBEDDED.replace(
            "version = \"580.95.05\"",
            "version = \"580.95.05\"\nsha256 = { x86_64 = \"abc\" }\ndigestSource = \"x\"",
        );
        // The key and line are named by the line's number, never quoted:
        // a file given as --catalog may not be a catalog at all.
        let e = Catalog::parse(&bad_sum, "t").unwrap_err();
        assert!(
            e.message.contains("line ") && e.message.contains("duplicate key"),
            "{}",
            e.message
        );
    }
}
