//! `catalog-check`: whether every OS release and kernel series resolves to
//! a digest-pinned default that no exclusion forbids, as a result document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::model::{Catalog, OsEntry, OsRelease};
use super::versions::{OPEN_BY_DEFAULT_FROM, branch_of};
use crate::error::Result;
use crate::node::{CpuArch, KernelVersion, ModuleFlavor};
use crate::report::{Document, Kind, Outcome, Reason, StatusOutcome};

/// Evidence must say how a fact is known.
fn evidence_ok(evidence: &str) -> bool {
    ["measured:", "cited:"].iter().any(|p| {
        evidence
            .trim()
            .strip_prefix(p)
            .is_some_and(|rest| !rest.trim().is_empty())
    })
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CatalogCheckSpec {
    /// `embedded` or the `--catalog` path.
    pub catalog: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CatalogCheckStatus {
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Every inconsistency found, one line each.
    #[serde(default)]
    pub problems: Vec<String>,
    /// What each listed OS release installs by default.
    #[serde(default)]
    pub defaults: Vec<DefaultChoice>,
}

/// What an OS release installs by default on one kernel series and CPU.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefaultChoice {
    pub os: String,
    pub os_version: String,
    pub kernel_series: String,
    pub arch: CpuArch,
    pub driver_version: String,
    /// `policy <name>` or `default branch <branch>`.
    pub chosen_by: String,
    /// Auto's flavor for Turing and newer GPUs, at the series' first and
    /// a late patch release (two when a flavor rule ends within it).
    pub flavors_for_turing_and_newer: Vec<ModuleFlavor>,
}

pub type CatalogCheck = Document<CatalogCheckSpec, CatalogCheckStatus>;

impl StatusOutcome for CatalogCheckStatus {
    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

/// `catalog-check`: the catalog (already loaded, or the error loading it)
/// checked, as a result document.
pub(crate) fn check_document(label: String, catalog: Result<Catalog>) -> CatalogCheck {
    let (outcome, problems, defaults) = match catalog {
        Err(e) => (Outcome::from(&e), Vec::new(), Vec::new()),
        Ok(cat) => {
            let (problems, defaults) = cat.check_with_defaults();
            let outcome = if problems.is_empty() {
                Outcome::new(
                    Reason::CatalogChecked,
                    format!(
                        "{}: {} OS releases, {} driver releases, {} exclusions; every default resolves with a digest on {}",
                        cat.origin,
                        cat.os.iter().map(|o| o.releases.len()).sum::<usize>(),
                        cat.drivers.len(),
                        cat.exclusions.len(),
                        cat.cpu_architectures
                            .iter()
                            .map(|a| a.nvidia_name())
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ),
                )
            } else {
                Outcome::new(
                    Reason::CatalogInvalid,
                    format!(
                        "{}: {} problem(s): {}",
                        cat.origin,
                        problems.len(),
                        problems.join("; ")
                    ),
                )
            };
            (outcome, problems, defaults)
        }
    };
    Document::new(
        Kind::CatalogCheck,
        CatalogCheckSpec { catalog: label },
        CatalogCheckStatus {
            outcome,
            problems,
            defaults,
        },
    )
}

impl Catalog {
    /// Consistency beyond what parsing checks, for `catalog-check` and the
    /// tests: every OS release and kernel series it lists resolves, on every
    /// CPU architecture, to a default release that has a digest and is not
    /// excluded there; every exclusion says how the break is known.
    pub fn check(&self) -> Vec<String> {
        self.check_with_defaults().0
    }

    /// [`Catalog::check`], and what every listed OS release installs by
    /// default (the compatibility table).
    pub(crate) fn check_with_defaults(&self) -> (Vec<String>, Vec<DefaultChoice>) {
        let mut problems = Vec::new();
        let mut defaults = Vec::new();
        for os in &self.os {
            for rel in &os.releases {
                for series in &rel.kernel_series {
                    for &arch in &self.cpu_architectures {
                        defaults.extend(self.check_default(os, rel, series, arch, &mut problems));
                    }
                }
            }
        }
        for x in &self.exclusions {
            if !evidence_ok(&x.evidence) {
                problems.push(format!(
                    "exclusion for driver {} ({}): evidence must be \"measured: <where>\" or \"cited: <source>\", not {:?}",
                    x.driver, x.reason, x.evidence
                ));
            }
        }
        let others = self
            .module_params
            .iter()
            .map(|m| {
                (
                    format!("moduleParams {} {}", m.module, m.params),
                    &m.evidence,
                )
            })
            .chain(
                self.iommu_passthrough
                    .iter()
                    .map(|r| (format!("iommuPassthrough for {}", r.os), &r.evidence)),
            );
        for (what, evidence) in others {
            if !evidence_ok(evidence) {
                problems.push(format!(
                    "{what}: evidence must be \"measured: <where>\" or \"cited: <source>\", not {evidence:?}"
                ));
            }
        }
        for r in &self.flavor_rules {
            if !evidence_ok(&r.evidence) {
                problems.push(format!(
                    "flavor rule for {} ({}): evidence must be \"measured: <where>\" or \"cited: <source>\", not {:?}",
                    r.os, r.reason, r.evidence
                ));
            }
        }
        problems.sort();
        problems.dedup();
        (problems, defaults)
    }

    fn check_default(
        &self,
        os: &OsEntry,
        rel: &OsRelease,
        series: &str,
        arch: CpuArch,
        problems: &mut Vec<String>,
    ) -> Option<DefaultChoice> {
        let at = format!("{} {} on kernel {series} ({arch})", os.name, rel.version);
        // The series' first and a late patch release: exclusions often
        // start with a stable backport.
        let kernels: Vec<KernelVersion> = ["0", "255"]
            .iter()
            .filter_map(|p| KernelVersion::parse(&format!("{series}.{p}")))
            .collect();
        if kernels.is_empty() {
            problems.push(format!("{at}: {series:?} is not a kernel series like 6.12"));
            return None;
        }
        let policy = self.policy_for(&os.id, Some(&rel.version), kernels.first().copied());
        let branch = policy.map_or(self.default_branch.as_str(), |p| p.branch.as_str());
        let Some(release) = self.default_release(branch, arch) else {
            problems.push(format!("{at}: branch {branch} has no release"));
            return None;
        };
        if release.sha256_for(arch).is_none() {
            problems.push(format!(
                "{at}: default release {} has no {arch} digest",
                release.version
            ));
        }
        let mut flavors = Vec::new();
        for k in kernels {
            let flavor = match (self.flavor_rule_for(&os.id, k), branch_of(&release.version)) {
                (Some(rule), _) => rule.flavor,
                (None, Some(b)) if b >= OPEN_BY_DEFAULT_FROM => ModuleFlavor::Open,
                (None, _) => ModuleFlavor::Proprietary,
            };
            if let Some(x) = self.exclusion_for(&release.version, k, Some(flavor)) {
                problems.push(format!(
                    "{at}: default release {} ({flavor}) is excluded on {k}: {}",
                    release.version, x.reason
                ));
            }
            if !flavors.contains(&flavor) {
                flavors.push(flavor);
            }
        }
        Some(DefaultChoice {
            os: os.name.clone(),
            os_version: rel.version.clone(),
            kernel_series: series.to_string(),
            arch,
            driver_version: release.version.clone(),
            chosen_by: policy.map_or_else(
                || format!("default branch {branch}"),
                |p| format!("policy {}", p.name),
            ),
            flavors_for_turing_and_newer: flavors,
        })
    }
}
