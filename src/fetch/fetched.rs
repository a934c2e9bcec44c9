//! What a download gives: the verified file and the attempts made, or the
//! failure with them.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// One try at one URL, for the result.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub url: String,
    /// Where the bytes of this attempt came from, after redirects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// Bytes received in this attempt.
    pub bytes: u64,
    /// Whether it continued a partial file (server answered 206).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Fetched {
    pub path: PathBuf,
    pub size: u64,
    pub cache_hit: bool,
    pub source_url: Option<String>,
    pub attempts: Vec<Attempt>,
}

/// A failure that carries the attempts made, for the result.
#[derive(Debug)]
pub struct FetchError {
    pub error: Error,
    pub attempts: Vec<Attempt>,
}

impl From<Error> for FetchError {
    fn from(error: Error) -> Self {
        FetchError {
            error,
            attempts: Vec::new(),
        }
    }
}
