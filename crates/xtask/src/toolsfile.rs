//! The one input the integration tests get from the runner: a JSON file
//! named by `GPU_DRIVER_TOOLS` that says where each prepared tool is
//! (tests/it/support/tools.rs reads it). Rewritten after every stage that
//! adds to it, so a test run started by hand after a failed run finds what
//! was ready.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::Serialize;

#[derive(Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tools {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_bin: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub helm: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s3_server: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_data: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub om_parser: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_plugin: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub builder_roots: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_runfile: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub static_bin: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_artifacts: Option<PathBuf>,
    /// Groups of tests the user chose to skip (honoured outside CI only).
    pub skip: Vec<String>,
}

impl Tools {
    pub fn write(&self, path: &Path) -> Result<()> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    }
}
