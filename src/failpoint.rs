//! Crash points for the kill -9 tests: `GPU_DRIVER_FAILPOINT=NAME` makes the
//! process send itself SIGKILL when it reaches point NAME, so that a test
//! can prove what a crash at exactly that point leaves behind. Unset (as
//! always outside tests) it does nothing.

/// The environment variable naming the point to die at.
pub(crate) const ENV: &str = "GPU_DRIVER_FAILPOINT";

/// Dies with SIGKILL (no destructors, no cleanup: a real kill -9) when
/// `name` is the configured point.
pub(crate) fn hit(name: &str) {
    if std::env::var_os(ENV).is_some_and(|v| v == name) {
        tracing::warn!("{ENV}={name}: killing this process with SIGKILL");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
