//! The result documents a real installer writes, built by the installer's
//! own code, as the operator reads them from its Jobs' termination
//! messages. One builder per document, so a change of the contract is
//! made once here.

use gpu_driver_installer::report::{Kind, Reason, termination_message};
use gpu_driver_installer::run::{BuiltArtifact, Installed, RunSpec, Steps};
use gpu_driver_installer::step::Done;
use gpu_driver_installer::{Error, Success};

/// The driver the fixtures' installs report.
pub const DRIVER: &str = "580.95.05";

/// A RunResult ending after `steps`: `reason` with `message`, as a
/// termination message.
fn run_result_doc(steps: Steps, host_root: &str, reason: Reason, message: &str) -> String {
    let spec = RunSpec {
        host_root: host_root.into(),
        artifact: None,
        driver_version: None,
        target: None,
    };
    let doc = match reason.split() {
        Ok(success) => steps.succeed(spec, Done::new(success, message)),
        Err(failure) => steps.stop(spec, &Error::new(failure, message)),
    };
    termination_message(Kind::RunResult, &doc).unwrap()
}

/// What a real `gpu-driver-installer run` writes on success or failure.
pub fn run_result(reason: Reason, message: &str) -> String {
    run_result_of(reason, message, DRIVER)
}

/// [`run_result`] of an installer that installed driver `version`.
pub fn run_result_of(reason: Reason, message: &str, version: &str) -> String {
    let mut steps = Steps::new();
    if reason == Reason::Verified {
        steps.set_installed(Installed {
            driver_version: Some(version.into()),
            flavor: Some(gpu_driver_installer::node::ModuleFlavor::Open),
            kernel_release: Some("6.6.63-cloud-amd64".into()),
        });
    }
    run_result_doc(steps, "/proc/1/root", reason, message)
}

/// What a real `gpu-driver-installer prebuild` writes once the artifact is
/// in the store.
pub fn build_result(sha: &str, kernel: &str) -> String {
    let mut steps = Steps::new();
    steps.set_built(BuiltArtifact {
        driver_version: DRIVER.into(),
        flavor: gpu_driver_installer::node::ModuleFlavor::Open,
        kernel_release: kernel.into(),
        arch: gpu_driver_installer::node::CpuArch::X86_64,
        cache_key: format!("artifacts/v1.1/x86_64/{kernel}/{DRIVER}/open/cc-0123456789abcdef"),
        artifact_sha256: sha.into(),
    });
    let built = Reason::from(Success::Built);
    run_result_doc(steps, "/", built, "stored")
}

/// What a real `gpu-driver-installer detect` writes for a fixture host
/// (tests/fixtures/hosts/`fixture`).
pub fn host_report(fixture: &str) -> String {
    let root = gpu_driver_installer::host_root::HostRoot::new(
        super::repo_root()
            .join("tests/fixtures/hosts")
            .join(fixture),
        gpu_driver_installer::host_root::HostRootSource::Flag,
    );
    let catalog = gpu_driver_installer::catalog::Catalog::embedded().unwrap();
    let doc = gpu_driver_installer::detect::detect(&gpu_driver_installer::detect::DetectOptions {
        root: &root,
        catalog: &catalog,
        kernel_release: None,
        arch: None,
    });
    termination_message(Kind::HostReport, &doc).unwrap()
}
