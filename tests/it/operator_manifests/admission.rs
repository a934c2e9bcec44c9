//! The admission policy: bound, failing closed, and refusing every
//! installer flag that moves sources or trust.

use super::*;

/// The policy's `deniedFlags` list.
fn denied_flags() -> BTreeSet<String> {
    let policy = &documents("deploy/admission-policy.yaml")[0];
    let vars = policy["spec"]["variables"].as_sequence().unwrap();
    let expr = vars
        .iter()
        .find(|v| v["name"] == "deniedFlags")
        .expect("variable deniedFlags")["expression"]
        .as_str()
        .unwrap();
    // A CEL list of single-quoted strings: the odd pieces between quotes.
    expr.split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Every long flag `gpu-driver-installer run` takes (its own and the
/// global ones) is either refused in extraArgs by the policy or known to be
/// harmless there: a new flag fails this test until someone decides.
#[test]
fn admission_policy_refuses_every_installer_flag_that_moves_sources_or_trust() {
    use clap::CommandFactory;
    let mut cli = gpu_driver_installer::cli::Cli::command();
    cli.build();
    let run = cli.find_subcommand("run").expect("run subcommand");
    let flags: BTreeSet<String> = run
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|l| format!("--{l}"))
        .collect();
    // Neither where bytes come from, nor how they are trusted, nor which
    // paths are written or run.
    let harmless: BTreeSet<String> = [
        "--help",
        "--log-level",
        "--kernel-release",
        "--driver-version",
        "--flavor",
        "--peermem",
        "--drm",
        "--force",
        "--offline",
        "--retries",
        "--backoff-ms",
        "--connect-timeout",
        "--read-timeout",
        "--cache-wait",
        "--cache-lease-ttl",
        "--cache-poll-ms",
        // Bounds of a download or an extraction: the worst a GpuDriver
        // writer can do with them is let a verified package take more
        // disk or time on the node.
        "--download-timeout",
        "--max-download-size",
        "--max-unpacked-size",
        "--max-unpacked-entries",
        // The package for another CPU is still digest-verified; the node
        // then refuses its modules (vermagic).
        "--arch",
        // Only narrow what the node accepts: never write the cache, never
        // compile.
        "--cache-read-only",
        "--no-compile",
    ]
    .map(String::from)
    .into();
    let denied = denied_flags();
    for f in [
        "--url",
        "--mirror",
        "--sha256",
        "--allow-http",
        "--ca-bundle",
        "--apt-keyring",
        "--catalog",
        "--cache-url",
        "--artifact-sha256",
        "--module-params",
        // The signing key is the build Jobs' alone.
        "--signing-key",
        "--signing-cert",
    ] {
        assert!(denied.contains(f), "the policy must refuse {f}: {denied:?}");
    }
    let unknown: Vec<_> = denied.difference(&flags).collect();
    assert!(unknown.is_empty(), "not installer flags: {unknown:?}");
    let both: Vec<_> = denied.intersection(&harmless).collect();
    assert!(both.is_empty(), "denied and harmless: {both:?}");
    let undecided: Vec<_> = flags
        .iter()
        .filter(|f| !denied.contains(*f) && !harmless.contains(*f))
        .collect();
    assert!(
        undecided.is_empty(),
        "installer flags neither refused by deploy/admission-policy.yaml (deniedFlags) \
         nor listed as harmless here: {undecided:?}"
    );
}
