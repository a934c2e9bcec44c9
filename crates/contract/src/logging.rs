//! The diagnostics set-up every binary shares: `tracing` to stderr, filtered
//! by `RUST_LOG` or the given level, with credentials masked. Stdout stays
//! data only.

/// Installs the subscriber once; later calls do nothing. `ansi` colours the
/// output (a terminal).
pub fn init_tracing(level: &str, ansi: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::redact::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .try_init();
}
