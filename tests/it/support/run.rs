//! One installer run's exit code, result document and stderr, for tests
//! that run the binary. Included with `#[path]` by the tests that use it.

use serde_json::Value;

pub struct Run {
    pub code: i32,
    pub doc: Value,
    pub stderr: String,
}

/// Reads a finished run: stdout must be exactly one JSON document.
pub fn finish(out: std::process::Output) -> Run {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("stdout is not one JSON document ({e}):\n{stdout}\nstderr:\n{stderr}")
    });
    Run {
        code: out.status.code().unwrap_or(-1),
        doc,
        stderr,
    }
}
