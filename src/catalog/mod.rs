//! The catalog: which OS versions are installable, which driver each gets,
//! which GPU families each branch drives, and which pairs are known broken.
//! It is data (`catalog/catalog.toml`), embedded at build time and
//! replaceable with `--catalog PATH`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Failure, Result};
use crate::node::{CpuArch, KernelVersion, ModuleFlavor};

mod check;
mod matrix;
mod validate;

pub use check::CatalogCheck;

pub use check::{CatalogCheckSpec, CatalogCheckStatus};

pub use check::DefaultChoice;

pub(crate) use check::check_document;
pub(crate) use matrix::matrix_exclusions;

pub(crate) const EMBEDDED: &str = include_str!("../../catalog/catalog.toml");
/// 2: releases per branch, digests per CPU architecture, `{arch}` in URL
/// templates, exclusions bounded by driver version and citing evidence.
pub(crate) const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Catalog {
    pub schema_version: u32,
    pub default_branch: String,
    /// The CPU architectures the catalog serves; every default release
    /// needs a digest for each.
    pub cpu_architectures: Vec<CpuArch>,
    #[serde(default)]
    pub mirrors: Vec<String>,
    pub url_templates: UrlTemplates,
    #[serde(default)]
    pub os: Vec<OsEntry>,
    #[serde(default)]
    pub drivers: Vec<DriverEntry>,
    #[serde(default)]
    pub policies: Vec<Policy>,
    #[serde(default)]
    pub architectures: Vec<Architecture>,
    #[serde(default)]
    pub exclusions: Vec<Exclusion>,
    #[serde(default)]
    pub flavor_rules: Vec<FlavorRule>,
    #[serde(default)]
    pub module_params: Vec<ModuleParams>,
    #[serde(default)]
    pub iommu_passthrough: Vec<IommuPassthrough>,
    /// Where it came from, for messages.
    #[serde(skip)]
    pub origin: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UrlTemplates {
    pub datacenter: String,
    pub geforce: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OsEntry {
    pub id: String,
    pub name: String,
    pub headers_repository: String,
    #[serde(default)]
    pub releases: Vec<OsRelease>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OsRelease {
    pub version: String,
    #[serde(default)]
    pub codename: Option<String>,
    #[serde(default)]
    pub kernel_series: Vec<String>,
    pub suite: String,
    #[serde(default)]
    pub backports_suite: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    Datacenter,
    Geforce,
}

/// One driver release. A branch lists several; its default is the newest
/// with a digest for the node's CPU architecture.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DriverEntry {
    pub branch: String,
    pub version: String,
    pub channel: Channel,
    /// Instead of the channel's template; may use `{version}` and `{arch}`.
    #[serde(default)]
    pub url: Option<String>,
    /// The package's sha256 per CPU architecture.
    #[serde(default)]
    pub sha256: BTreeMap<CpuArch, String>,
    /// Where the digests come from, citable (required with `sha256`).
    #[serde(default)]
    pub digest_source: Option<String>,
}

impl DriverEntry {
    pub fn sha256_for(&self, arch: CpuArch) -> Option<&str> {
        self.sha256.get(&arch).map(String::as_str)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    pub name: String,
    pub os: String,
    #[serde(default)]
    pub os_versions: Vec<String>,
    #[serde(default)]
    pub kernel_series: Vec<String>,
    pub branch: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Architecture {
    pub name: String,
    pub device_ids: Vec<String>,
    pub open_modules: bool,
    #[serde(default)]
    pub open_only: bool,
    #[serde(default)]
    pub min_branch: Option<String>,
    #[serde(default)]
    pub max_branch: Option<String>,
    /// Parsed from `device_ids` by [`Catalog::validate`].
    #[serde(skip)]
    ranges: Vec<(u16, u16)>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Exclusion {
    /// A branch ("570") or a full version.
    pub driver: String,
    /// With a branch: only its releases older than this one.
    #[serde(default)]
    pub driver_before: Option<String>,
    #[serde(default)]
    pub kernel_min: Option<String>,
    #[serde(default)]
    pub kernel_max: Option<String>,
    #[serde(default)]
    pub flavor: Option<ModuleFlavor>,
    pub reason: String,
    /// How the break is known: `measured: …` (by this project, where) or
    /// `cited: …` (a source anyone can read).
    pub evidence: String,
}

/// Kernels of an OS on which only one module flavor works.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlavorRule {
    pub os: String,
    #[serde(default)]
    pub kernel_min: Option<String>,
    #[serde(default)]
    pub kernel_max: Option<String>,
    /// The flavor that works there.
    pub flavor: ModuleFlavor,
    pub reason: String,
    /// As for exclusions: `measured: …` or `cited: …`.
    pub evidence: String,
}

/// Module parameters real fleets need, for the GPUs they apply to.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModuleParams {
    /// `nvidia`, `nvidia_uvm`, …
    pub module: String,
    /// `key=value [key=value …]`
    pub params: String,
    /// GPU families (`[[architectures]]` names) it applies to; empty: all.
    #[serde(default)]
    pub gpu_architectures: Vec<String>,
    pub reason: String,
    pub evidence: String,
}

/// Hosts on which NVIDIA GPUs' IOMMU groups are switched to passthrough
/// (`identity`) before the modules load.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IommuPassthrough {
    pub os: String,
    /// os-release `VARIANT_ID` starts with this (`metal`).
    #[serde(default)]
    pub variant_prefix: Option<String>,
    pub reason: String,
    pub evidence: String,
}

/// Whether `kernel` lies in `[min, max)`; an absent bound is open.
fn in_kernel_range(kernel: KernelVersion, min: Option<&str>, max: Option<&str>) -> bool {
    min.and_then(KernelVersion::parse)
        .is_none_or(|m| kernel >= m)
        && max
            .and_then(KernelVersion::parse)
            .is_none_or(|m| kernel < m)
}

/// Evidence must say how a fact is known.
fn evidence_ok(evidence: &str) -> bool {
    ["measured:", "cited:"].iter().any(|p| {
        evidence
            .trim()
            .strip_prefix(p)
            .is_some_and(|rest| !rest.trim().is_empty())
    })
}

/// `"570.195.03"` → 570; `"580"` → 580.
pub(crate) fn branch_of(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// Compares driver versions numerically, part by part.
pub(crate) fn version_key(version: &str) -> Vec<u32> {
    version.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// An OS version matches a catalog version exactly, or as its leading
/// dot-separated parts ("1592" matches "1592.4", not "15920.1").
pub fn version_matches(host: &str, pattern: &str) -> bool {
    host == pattern
        || host
            .strip_prefix(pattern)
            .is_some_and(|rest| rest.starts_with('.'))
}

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

    pub fn os(&self, id: &str) -> Option<&OsEntry> {
        self.os.iter().find(|o| o.id == id)
    }

    /// The branch's releases, newest first.
    pub fn releases(&self, branch: &str) -> Vec<&DriverEntry> {
        let mut v: Vec<&DriverEntry> = self.drivers.iter().filter(|d| d.branch == branch).collect();
        v.sort_by_key(|d| std::cmp::Reverse(version_key(&d.version)));
        v
    }

    /// What a branch installs by default on `arch`: its newest release with
    /// a digest for it (a release without one stays out of the defaults),
    /// else, for a catalog that has none, its newest release.
    pub fn default_release(&self, branch: &str, arch: CpuArch) -> Option<&DriverEntry> {
        let releases = self.releases(branch);
        releases
            .iter()
            .find(|d| d.sha256_for(arch).is_some())
            .or(releases.first())
            .copied()
    }

    pub fn driver_for_version(&self, version: &str) -> Option<&DriverEntry> {
        self.drivers.iter().find(|d| d.version == version)
    }

    /// The first policy that matches the host's OS, OS version and kernel.
    pub(crate) fn policy_for(
        &self,
        os_id: &str,
        os_version: Option<&str>,
        kernel: Option<KernelVersion>,
    ) -> Option<&Policy> {
        self.policies.iter().find(|p| {
            p.os == os_id
                && (p.os_versions.is_empty()
                    || os_version
                        .is_some_and(|v| p.os_versions.iter().any(|pat| version_matches(v, pat))))
                && (p.kernel_series.is_empty()
                    || kernel.is_some_and(|k| p.kernel_series.contains(&k.series())))
        })
    }

    pub(crate) fn architecture_of(&self, device_id: u16) -> Option<&Architecture> {
        self.architectures.iter().find(|a| {
            a.ranges
                .iter()
                .any(|&(lo, hi)| (lo..=hi).contains(&device_id))
        })
    }

    /// The exclusion that forbids this driver on this kernel, if any.
    pub(crate) fn exclusion_for(
        &self,
        driver_version: &str,
        kernel: KernelVersion,
        flavor: Option<ModuleFlavor>,
    ) -> Option<&Exclusion> {
        self.exclusions.iter().find(|x| {
            let driver_hit = x.driver == driver_version
                || (!x.driver.contains('.')
                    && branch_of(driver_version).map(|b| b.to_string()).as_deref()
                        == Some(x.driver.as_str())
                    && x.driver_before
                        .as_deref()
                        .is_none_or(|b| version_key(driver_version) < version_key(b)));
            let kernel_hit =
                in_kernel_range(kernel, x.kernel_min.as_deref(), x.kernel_max.as_deref());
            let flavor_ok = x.flavor.is_none() || x.flavor == flavor;
            driver_hit && kernel_hit && flavor_ok
        })
    }

    /// The module parameters for a host with these GPU families.
    pub(crate) fn module_params_for<'a>(&'a self, families: &[&str]) -> Vec<&'a ModuleParams> {
        self.module_params
            .iter()
            .filter(|m| {
                m.gpu_architectures.is_empty()
                    || m.gpu_architectures
                        .iter()
                        .any(|a| families.contains(&a.as_str()))
            })
            .collect()
    }

    /// The IOMMU passthrough rule for this OS and variant, if any.
    pub(crate) fn iommu_passthrough_for(
        &self,
        os_id: &str,
        variant: Option<&str>,
    ) -> Option<&IommuPassthrough> {
        self.iommu_passthrough.iter().find(|r| {
            r.os == os_id
                && r.variant_prefix
                    .as_deref()
                    .is_none_or(|p| variant.is_some_and(|v| v.starts_with(p)))
        })
    }

    /// The rule that fixes the module flavor for this OS and kernel, if any.
    pub(crate) fn flavor_rule_for(
        &self,
        os_id: &str,
        kernel: KernelVersion,
    ) -> Option<&FlavorRule> {
        self.flavor_rules.iter().find(|r| {
            r.os == os_id
                && in_kernel_range(kernel, r.kernel_min.as_deref(), r.kernel_max.as_deref())
        })
    }

    /// The package URL of a release for `arch`: its own `url`, else its
    /// channel's template.
    pub(crate) fn url_for(
        &self,
        entry: Option<&DriverEntry>,
        version: &str,
        arch: CpuArch,
    ) -> String {
        let channel = entry.map_or(Channel::Datacenter, |d| d.channel);
        let template = entry
            .and_then(|d| d.url.as_deref())
            .unwrap_or(match channel {
                Channel::Datacenter => &self.url_templates.datacenter,
                Channel::Geforce => &self.url_templates.geforce,
            });
        template
            .replace("{version}", version)
            .replace("{arch}", arch.nvidia_name())
    }
}

/// Auto picks the open modules for Turing and newer from this branch on
/// (NVIDIA's default since 560).
pub(crate) const OPEN_BY_DEFAULT_FROM: u32 = 560;

impl OsEntry {
    pub(crate) fn release_for(&self, version: &str) -> Option<&OsRelease> {
        self.releases
            .iter()
            .find(|r| version_matches(version, &r.version))
    }
}

fn parse_range(s: &str) -> Option<(u16, u16)> {
    let hex = |p: &str| u16::from_str_radix(p.trim().trim_start_matches("0x"), 16).ok();
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (hex(a)?, hex(b)?),
        None => (hex(s)?, hex(s)?),
    };
    (lo <= hi).then_some((lo, hi))
}

impl Architecture {
    pub(crate) fn supports_branch(&self, branch: u32) -> bool {
        let bound = |b: &Option<String>| b.as_deref().and_then(|s| s.parse::<u32>().ok());
        bound(&self.min_branch).is_none_or(|m| branch >= m)
            && bound(&self.max_branch).is_none_or(|m| branch <= m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

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
