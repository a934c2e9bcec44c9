//! What the catalog says: OS releases, driver releases, policies, GPU
//! families, exclusions, flavor rules, module parameters; and the lookups
//! on them.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::versions::{branch_of, version_key, version_matches};
use crate::node::{CpuArch, KernelVersion, ModuleFlavor};

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
    pub(super) ranges: Vec<(u16, u16)>,
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

impl Catalog {
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

impl OsEntry {
    pub(crate) fn release_for(&self, version: &str) -> Option<&OsRelease> {
        self.releases
            .iter()
            .find(|r| version_matches(version, &r.version))
    }
}

impl Architecture {
    pub(crate) fn supports_branch(&self, branch: u32) -> bool {
        let bound = |b: &Option<String>| b.as_deref().and_then(|s| s.parse::<u32>().ok());
        bound(&self.min_branch).is_none_or(|m| branch >= m)
            && bound(&self.max_branch).is_none_or(|m| branch <= m)
    }
}
