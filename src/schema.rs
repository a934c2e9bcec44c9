//! The JSON Schema of every result document, generated from the Rust types.
//! `schema/results.v1alpha1.json` is its committed copy; a test fails when
//! the two drift (regenerate with `gpu-driver-installer schema`).

use schemars::JsonSchema;

use crate::build::BuildResult;
use crate::catalog::CatalogCheck;
use crate::detect::HostReport;
use crate::error::{Error, Failure, Result};
use crate::fetch::FetchResult;
use crate::install::InstallResult;
use crate::resolve::InstallPlan;
use crate::run::RunResult;
use crate::verify::VerifyResult;

/// Any result document; the `kind` field tells which.
#[allow(dead_code, clippy::large_enum_variant)] // only its schema is used
#[derive(JsonSchema)]
#[serde(untagged)]
enum AnyResult {
    HostReport(HostReport),
    InstallPlan(InstallPlan),
    FetchResult(FetchResult),
    BuildResult(BuildResult),
    InstallResult(InstallResult),
    VerifyResult(VerifyResult),
    RunResult(RunResult),
    CatalogCheck(CatalogCheck),
}

pub(crate) fn results_schema_json() -> Result<String> {
    let mut schema = schemars::schema_for!(AnyResult);
    schema.insert(
        "title".into(),
        serde_json::Value::String(format!(
            "gpu-driver result ({})",
            crate::report::API_VERSION
        )),
    );
    let mut s = serde_json::to_string_pretty(&schema)
        .map_err(|e| Error::new(Failure::Internal, format!("serializing schema: {e}")))?;
    s.push('\n');
    Ok(s)
}
