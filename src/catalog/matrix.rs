//! `matrix-exclusions`: the catalog `[[exclusions]]` that the build matrix
//! (`docs/matrix.json`, written by `scripts/matrix`) suggests. For each pair
//! that failed with KernelApiMismatch: driver = the branch, flavor = the
//! module flavor, kernelMin = the measured kernel's version, kernelMax = the
//! next minor series. Pairs an exclusion of the catalog already covers
//! ([`Catalog::exclusion_for`], resolve's own rule) are listed as comments
//! only. The lower bound is what was measured; lower it by hand when the
//! kernel change is known to be older.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

use super::model::{Catalog, Exclusion};
use crate::error::{Error, Failure, Result};
use crate::node::{KernelVersion, ModuleFlavor};

/// The fields of one matrix result that matter here; the rest is ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct MatrixResult {
    pair: Option<String>,
    reason: Option<String>,
    message: Option<String>,
    driver_version: Option<String>,
    kernel: Option<String>,
    flavor: Option<String>,
    gcc: Option<String>,
    source_package: Option<String>,
    measured: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Matrix {
    results: Vec<MatrixResult>,
}

/// One suggestion per (branch, flavor, kernel series): the lowest measured
/// kernel of that series wins.
type Key = (String, Option<String>, (u32, u32));

/// The suggestions for the matrix at `path`, as TOML for the catalog with
/// `#` comments; nothing to suggest is not an error.
pub(crate) fn matrix_exclusions(catalog: &Catalog, path: &Path) -> Result<String> {
    let text = crate::named_file::Named {
        what: "the build matrix",
        max: 64 << 20,
        reason: Failure::InvalidArgument,
        hint: "pass the JSON that scripts/build-matrix writes",
    }
    .read_text(path)?;
    let matrix: Matrix = serde_json::from_str(&text).map_err(|e| {
        Error::new(
            Failure::InvalidArgument,
            format!("{}: not a build matrix: {e}", path.display()),
        )
    })?;
    let label = path.display().to_string();
    let mut out = String::new();
    let suggestions = collect(catalog, &matrix.results, &mut out);
    if suggestions.is_empty() {
        let _ = writeln!(
            out,
            "# nothing to add: every KernelApiMismatch pair in {label} is already excluded (or there is none)"
        );
        return Ok(out);
    }
    for ((branch, flavor, series), (kernel, r)) in &suggestions {
        suggestion(
            &mut out,
            &label,
            branch,
            flavor.as_deref(),
            *series,
            *kernel,
            r,
        );
    }
    Ok(out)
}

/// The uncovered KernelApiMismatch results by key; comments for the
/// covered and unreadable ones go to `out`.
fn collect<'a>(
    catalog: &Catalog,
    results: &'a [MatrixResult],
    out: &mut String,
) -> BTreeMap<Key, (KernelVersion, &'a MatrixResult)> {
    let mut suggestions: BTreeMap<Key, (KernelVersion, &MatrixResult)> = BTreeMap::new();
    for r in results {
        if r.reason.as_deref() != Some("KernelApiMismatch") {
            continue;
        }
        let kernel = r.kernel.as_deref().and_then(KernelVersion::parse);
        let branch = r.driver_version.as_deref().and_then(branch);
        let (Some(kernel), Some(branch), Some(driver)) = (kernel, branch, &r.driver_version) else {
            let _ = writeln!(
                out,
                "# {}: cannot read driver {} or kernel {}",
                shown(&r.pair),
                quoted(&r.driver_version),
                quoted(&r.kernel)
            );
            continue;
        };
        let flavor = r.flavor.as_deref().and_then(module_flavor);
        if let Some(hit) = catalog.exclusion_for(driver, kernel, flavor) {
            let _ = writeln!(out, "{}", covered(r, hit));
            continue;
        }
        let key = (branch, r.flavor.clone(), (kernel.0, kernel.1));
        match suggestions.get(&key) {
            Some((lowest, _)) if *lowest <= kernel => {}
            _ => {
                suggestions.insert(key, (kernel, r));
            }
        }
    }
    suggestions
}

/// The comment for a pair an exclusion already covers.
fn covered(r: &MatrixResult, hit: &Exclusion) -> String {
    format!(
        "# {}: {} {} on {} already excluded (driver {}, flavor {}, {}..{})",
        shown(&r.pair),
        shown(&r.driver_version),
        shown(&r.flavor),
        shown(&r.kernel),
        hit.driver,
        hit.flavor
            .map_or_else(|| "any".to_string(), |f| f.to_string()),
        hit.kernel_min.as_deref().unwrap_or("-"),
        hit.kernel_max.as_deref().unwrap_or("-"),
    )
}

/// One `[[exclusions]]` block with the comment saying where it comes from.
fn suggestion(
    out: &mut String,
    label: &str,
    branch: &str,
    flavor: Option<&str>,
    series: (u32, u32),
    kernel: KernelVersion,
    r: &MatrixResult,
) {
    let measured: String = r
        .measured
        .as_deref()
        .unwrap_or("?")
        .chars()
        .take(10)
        .collect();
    let reason = format!(
        "{} (measured: build fails on {})",
        first_line(r.message.as_deref()),
        shown(&r.kernel)
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "# From {label}: {} ({}, {}),",
        shown(&r.pair),
        shown(&r.source_package),
        shown(&r.gcc)
    );
    let _ = writeln!(
        out,
        "# measured {measured}. kernelMin is the measured kernel;"
    );
    let _ = writeln!(out, "# lower it if the kernel change is known to be older.");
    let _ = writeln!(out, "[[exclusions]]");
    let _ = writeln!(out, "driver = {}", toml_str(branch));
    if let Some(f) = flavor.filter(|f| !f.is_empty()) {
        let _ = writeln!(out, "flavor = {}", toml_str(f));
    }
    let _ = writeln!(out, "kernelMin = {}", toml_str(&kernel.to_string()));
    let _ = writeln!(
        out,
        "kernelMax = {}",
        toml_str(&format!("{}.{}", series.0, series.1 + 1))
    );
    let _ = writeln!(out, "reason = {}", toml_str(&reason));
}

/// The branch of a full driver version: its leading digits before a dot
/// (`"570.195.03"` → `"570"`); a bare branch is not a measured version.
fn branch(version: &str) -> Option<String> {
    let (head, _) = version.split_once('.')?;
    (!head.is_empty() && head.bytes().all(|b| b.is_ascii_digit())).then(|| head.to_string())
}

fn module_flavor(s: &str) -> Option<ModuleFlavor> {
    match s {
        "open" => Some(ModuleFlavor::Open),
        "proprietary" => Some(ModuleFlavor::Proprietary),
        _ => None,
    }
}

/// A field as the comments show it, `None` when the matrix lacks it.
fn shown(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("None")
}

/// A field quoted for a comment about it being unreadable.
fn quoted(v: &Option<String>) -> String {
    v.as_deref()
        .map_or_else(|| "None".to_string(), |s| format!("'{s}'"))
}

/// A TOML basic string: a JSON string is one.
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// The message's first non-blank line, at most 200 characters.
fn first_line(message: Option<&str>) -> String {
    message
        .unwrap_or("")
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map_or_else(
            || "kernel API mismatch".to_string(),
            |l| l.chars().take(200).collect(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branches_need_a_full_version() {
        assert_eq!(branch("570.195.03").as_deref(), Some("570"));
        assert_eq!(branch("580"), None);
        assert_eq!(branch("unknown"), None);
    }

    #[test]
    fn the_reason_is_the_first_non_blank_line() {
        assert_eq!(first_line(Some("\n  a b  \nc")), "a b");
        assert_eq!(first_line(Some(" \n")), "kernel API mismatch");
        assert_eq!(first_line(None), "kernel API mismatch");
        assert_eq!(first_line(Some(&"x".repeat(300))).len(), 200);
    }
}
