//! Host tools the tests run (makeself, compressors, a compiler): a test
//! that needs one fails saying how to install it, never passes silently.

/// Panics unless `tool` is on `PATH`; `needs` says what needs it and how
/// to install it.
pub fn require_tool(tool: &str, needs: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(found, "`{tool}` is not installed; {needs}");
}
