//! The catalog's own consistency, checked when it is loaded: every entry
//! well-formed and every name it refers to defined. Problems of meaning
//! (a default that an exclusion forbids) are `catalog-check`'s
//! ([`super::check`]).

use super::model::Catalog;
use super::versions::branch_of;
use crate::error::{Error, Failure, Result};
use crate::node::{KernelVersion, is_driver_version};

/// 2: releases per branch, digests per CPU architecture, `{arch}` in URL
/// templates, exclusions bounded by driver version and citing evidence.
const SCHEMA_VERSION: u32 = 2;

fn parse_range(s: &str) -> Option<(u16, u16)> {
    let hex = |p: &str| u16::from_str_radix(p.trim().trim_start_matches("0x"), 16).ok();
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (hex(a)?, hex(b)?),
        None => (hex(s)?, hex(s)?),
    };
    (lo <= hi).then_some((lo, hi))
}

fn bad(m: String) -> Error {
    Error::new(Failure::CatalogInvalid, m)
}

impl Catalog {
    pub(super) fn validate(&mut self) -> Result<()> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(bad(format!(
                "schemaVersion {} is not supported (this installer reads {})",
                self.schema_version, SCHEMA_VERSION
            )));
        }
        self.validate_drivers()?;
        self.validate_branch_names()?;
        self.parse_architecture_ranges()?;
        self.validate_module_params()?;
        self.validate_flavor_rules()?;
        self.validate_exclusions()
    }

    /// Versions well-formed, under their branch, digests hex and sourced.
    fn validate_drivers(&self) -> Result<()> {
        for d in &self.drivers {
            if !is_driver_version(&d.version) {
                return Err(bad(format!("driver version {:?} is malformed", d.version)));
            }
            if branch_of(&d.version).map(|b| b.to_string()) != Some(d.branch.clone()) {
                return Err(bad(format!(
                    "driver {} is listed under branch {}",
                    d.version, d.branch
                )));
            }
            for (arch, sum) in &d.sha256 {
                if sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad(format!(
                        "driver {} ({arch}): sha256 is not 64 hex digits",
                        d.version
                    )));
                }
            }
            if !d.sha256.is_empty() && d.digest_source.as_deref().is_none_or(str::is_empty) {
                return Err(bad(format!(
                    "driver {}: sha256 without a digestSource saying where it comes from",
                    d.version
                )));
            }
        }
        Ok(())
    }

    /// The default branch and every policy's branch have releases.
    fn validate_branch_names(&self) -> Result<()> {
        let known_branch = |b: &str| self.drivers.iter().any(|d| d.branch == b);
        if !known_branch(&self.default_branch) {
            return Err(bad(format!(
                "defaultBranch {} has no [[drivers]] entry",
                self.default_branch
            )));
        }
        for p in &self.policies {
            if !known_branch(&p.branch) {
                return Err(bad(format!(
                    "policy {} names branch {}, which has no [[drivers]] entry",
                    p.name, p.branch
                )));
            }
        }
        Ok(())
    }

    /// Fills each architecture's `ranges` from its device id strings.
    fn parse_architecture_ranges(&mut self) -> Result<()> {
        for a in &mut self.architectures {
            a.ranges = a
                .device_ids
                .iter()
                .map(|r| {
                    parse_range(r).ok_or_else(|| {
                        bad(format!(
                            "architecture {}: bad device id range {r:?} (want \"0x1e00-0x1fff\")",
                            a.name
                        ))
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        Ok(())
    }

    /// A module name and `key=value` words: they end up in modprobe.d.
    fn validate_module_params(&self) -> Result<()> {
        for m in &self.module_params {
            let ok_module = !m.module.is_empty()
                && m.module
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            let ok_params = m.params.split_whitespace().all(|p| {
                p.split_once('=').is_some_and(|(k, _)| !k.is_empty()) && !p.contains('\0')
            });
            if !ok_module || !ok_params || m.params.trim().is_empty() {
                return Err(bad(format!(
                    "moduleParams {:?} {:?}: want a module name and key=value words",
                    m.module, m.params
                )));
            }
        }
        Ok(())
    }

    fn validate_flavor_rules(&self) -> Result<()> {
        for r in &self.flavor_rules {
            for k in [&r.kernel_min, &r.kernel_max].into_iter().flatten() {
                if KernelVersion::parse(k).is_none() {
                    return Err(bad(format!(
                        "flavor rule for {}: bad kernel version {k:?}",
                        r.os
                    )));
                }
            }
        }
        Ok(())
    }

    fn validate_exclusions(&self) -> Result<()> {
        for x in &self.exclusions {
            if let Some(before) = &x.driver_before {
                if x.driver.contains('.') || !is_driver_version(before) {
                    return Err(bad(format!(
                        "exclusion for driver {}: driverBefore {before:?} needs a branch in driver and a version",
                        x.driver
                    )));
                }
            }
            for k in [&x.kernel_min, &x.kernel_max].into_iter().flatten() {
                if KernelVersion::parse(k).is_none() {
                    return Err(bad(format!(
                        "exclusion for driver {}: bad kernel version {k:?}",
                        x.driver
                    )));
                }
            }
        }
        Ok(())
    }
}
