//! Prometheus's own OpenMetrics parser (tools/om-parser, built by
//! `cargo xtask tool om-parser`): what a Prometheus server scraping our /metrics
//! accepts is decided by its code, not by the tests' reading of the spec.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The tools file's `omParser`, else what `cargo xtask tool om-parser`
/// prints (cached, or built now from the Go module proxy).
fn parser() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = super::tools::tools().om_parser() {
            return p;
        }
        super::tools::xtask_tool("om-parser", &[]).unwrap_or_else(|e| panic!("{e}"))
    })
    .clone()
}

/// The number of series Prometheus's parser reads in `text`; panics with
/// the parser's error when it refuses it.
pub fn series(text: &str) -> usize {
    let mut child = Command::new(parser())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting om-parser");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "Prometheus's OpenMetrics parser refuses it: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said.trim()
        .strip_prefix("series: ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("om-parser said {said:?}"))
}
