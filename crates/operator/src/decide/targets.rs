//! Build targets: what a build Job compiles for, its key and Job name,
//! and whether a node's install may start (the install gate).

use super::naming::{JobRole, job_name, short_hash};
use super::node::{NodeFacts, OsImage, is_dotted_version};
use crate::crd::{BuildPhase, GpuDriverSpec, TargetStatus};

/// What a build Job compiles for: the OS (it picks the builder image and
/// the headers' repository), the kernel release and the architecture.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// Normalized: `Garden Linux 1877.3` or `Debian GNU/Linux 12`.
    pub os_image: String,
    pub kernel: String,
    /// Kubernetes' name: `amd64`, `arm64`.
    pub arch: String,
}

impl Target {
    fn new(os: &OsImage, kernel: &str, arch: &str) -> Option<Target> {
        let os_image = match os {
            OsImage::GardenLinux { version } => format!("Garden Linux {version}"),
            OsImage::Debian { version } => format!("Debian GNU/Linux {version}"),
            OsImage::Other(_) => return None,
        };
        let arch = if arch.is_empty() { "amd64" } else { arch };
        (!kernel.is_empty()).then(|| Target {
            os_image,
            kernel: kernel.to_string(),
            arch: arch.to_string(),
        })
    }

    /// The node's target; `None` for an OS the installer has no build
    /// recipe for, or a node that reports no kernel yet.
    pub(crate) fn of_node(node: &NodeFacts) -> Option<Target> {
        Target::new(&node.os(), &node.kernel, &node.arch)
    }

    /// A `spec.prebuild` entry's target; `None` when it names neither a
    /// Garden Linux nor a Debian version.
    pub(crate) fn of_prebuild(t: &crate::crd::PrebuildTarget) -> Option<Target> {
        let os = match (&t.garden_linux_version, &t.debian_version) {
            (Some(v), _) if is_dotted_version(v) => OsImage::GardenLinux {
                version: v.to_string(),
            },
            (None, Some(v)) if is_dotted_version(v) => OsImage::Debian {
                version: v.split('.').next().unwrap_or(v).to_string(),
            },
            _ => return None,
        };
        Target::new(&os, &t.kernel_release, &t.arch)
    }

    /// The facts the builder image rules match on.
    pub(crate) fn facts(&self) -> NodeFacts {
        NodeFacts {
            kernel: self.kernel.clone(),
            os_image: self.os_image.clone(),
            arch: self.arch.clone(),
            ..Default::default()
        }
    }

    /// The installer's `--os-id` and `--os-version`.
    pub(crate) fn os_release(&self) -> (&'static str, String) {
        match OsImage::parse(&self.os_image) {
            OsImage::GardenLinux { version } => ("gardenlinux", version),
            OsImage::Debian { version } => ("debian", version),
            OsImage::Other(o) => ("unknown", o),
        }
    }
}

/// Build Jobs run when the GpuDriver has a cache to store into.
pub(crate) fn builds_enabled(spec: &GpuDriverSpec) -> bool {
    spec.cache.is_some()
}

/// The target's key under the current driver policy: a new driver version
/// or flavor is a new target, and so is another signing Secret (modules
/// signed with another key, or unsigned, are another artifact).
pub(crate) fn target_key(spec: &GpuDriverSpec, t: &Target) -> String {
    let mut parts = vec![
        t.os_image.as_str(),
        &t.kernel,
        &t.arch,
        spec.driver.version.as_deref().unwrap_or("auto"),
        spec.driver.flavor.as_str(),
    ];
    parts.extend(spec.driver.catalog_config_map.as_deref());
    // Prefixed, so that a Secret never hashes like a catalog of that name;
    // without one, keys stay what they were.
    let signer = spec
        .build
        .signing_secret_name
        .as_ref()
        .map(|s| format!("signing-secret={s}"));
    parts.extend(signer.as_deref());
    short_hash(&parts)
}

/// The build Job's name: one per target and attempt, cluster-wide (a
/// second operator or a restart finds the same name).
pub(crate) fn build_job_name(t: &Target, key: &str, attempt: u32) -> String {
    job_name(JobRole::Build, &t.kernel, key, attempt)
}

/// How many cached targets no selected node runs a GpuDriver keeps.
pub(crate) const MAX_IDLE_TARGETS: usize = 32;

/// Which cached targets to keep although no selected node runs them (a
/// pool scaled to zero, a node replaced): their artifact is in the store,
/// and the next node of that kind installs from it at once instead of
/// waiting for a build Job, whose pod may be gone with the old node. At
/// most [`MAX_IDLE_TARGETS`], the last in (OS image, kernel, arch) order;
/// targets of an old driver policy are kept the same way (a rollback finds
/// them).
pub(crate) fn idle_targets_kept<'a>(
    records: impl IntoIterator<Item = &'a TargetStatus>,
    wanted: &std::collections::HashSet<String>,
) -> std::collections::HashSet<String> {
    let mut idle: Vec<(&str, &str, &str, &str)> = records
        .into_iter()
        .filter(|r| r.phase == BuildPhase::Cached && r.artifact_sha256.is_some())
        .filter(|r| !wanted.contains(&r.key))
        .map(|r| (&*r.os_image, &*r.kernel_release, &*r.arch, &*r.key))
        .collect();
    idle.sort_unstable();
    idle.dedup();
    let skip = idle.len().saturating_sub(MAX_IDLE_TARGETS);
    idle.into_iter()
        .skip(skip)
        .map(|(_, _, _, key)| key.to_string())
        .collect()
}

/// Where a target's artifact stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TargetPhase {
    /// No build Job yet: waiting for a slot under `build.maxParallel`.
    Pending,
    Building,
    /// In the store, with the sha256 the build Job reported and the entry
    /// it stored it in (install Jobs read that entry directly).
    Cached {
        sha256: String,
        entry: Option<String>,
    },
    /// The last build failed; the next one is due in `retry_in` seconds.
    Failed {
        reason: String,
        message: String,
        retry_in: u64,
    },
}

/// May the node's install Job start, and how?
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Start it. `expect_sha256`: the artifact it must find in the cache,
    /// in the store's `entry`; `compile`: whether it may compile on a miss.
    Go {
        expect_sha256: Option<String>,
        entry: Option<String>,
        compile: bool,
    },
    /// The target's build Job has not finished.
    Wait,
    /// Nothing to install from, and compiling on the node is forbidden.
    Refuse { reason: String, message: String },
}

/// The install gate for a node whose target is in `phase` (`None`: the
/// node has no build target, e.g. an OS without a build recipe).
pub(crate) fn install_gate(spec: &GpuDriverSpec, phase: Option<&TargetPhase>) -> Gate {
    if !builds_enabled(spec) {
        // No store to build into: the node compiles, as without build Jobs.
        return Gate::Go {
            expect_sha256: None,
            entry: None,
            compile: true,
        };
    }
    let compile = spec.build.compile_on_node;
    match phase {
        Some(TargetPhase::Pending | TargetPhase::Building) => Gate::Wait,
        Some(TargetPhase::Cached { sha256, entry }) => Gate::Go {
            expect_sha256: Some(sha256.clone()),
            entry: entry.clone(),
            compile,
        },
        Some(TargetPhase::Failed {
            reason, message, ..
        }) if !compile => Gate::Refuse {
            reason: reason.clone(),
            message: format!(
                "the build Job failed ({message}) and compileOnNode is false; \
                 the build is retried with backoff"
            ),
        },
        None if !compile => Gate::Refuse {
            reason: "NoBuildTarget".into(),
            message: "no build Job can serve this node's OS (only Garden Linux and Debian \
                      targets are built) and compileOnNode is false"
                .into(),
        },
        Some(TargetPhase::Failed { .. }) | None => Gate::Go {
            expect_sha256: None,
            entry: None,
            compile: true,
        },
    }
}

/// Which image an install Job runs in, and whether it may compile. A
/// node whose target's artifact is cached (the gate hands over the build
/// Job's digest) needs no compiler: it installs from the installer image
/// alone (a few MiB, instead of a builder image of hundreds) with
/// `--no-compile`. After a failed attempt for this key (a damaged or
/// vanished entry, say) it goes back to the builder image and compiles
/// where `compile` allows, as before.
pub(crate) fn install_image<'a>(
    spec: &'a GpuDriverSpec,
    builder_image: &'a str,
    cached: bool,
    compile: bool,
    failures: u32,
) -> (&'a str, bool) {
    if cached && failures == 0 {
        (spec.installer_image.as_str(), false)
    } else {
        (builder_image, compile)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_cached_targets_are_kept_up_to_a_limit_and_nothing_else() {
        let rec = |key: &str, kernel: &str, cached: bool| TargetStatus {
            key: key.into(),
            os_image: "Garden Linux 1877.3".into(),
            kernel_release: kernel.into(),
            arch: "amd64".into(),
            phase: if cached {
                BuildPhase::Cached
            } else {
                BuildPhase::Failed
            },
            artifact_sha256: cached.then(|| "ab".repeat(32)),
            ..Default::default()
        };
        let wanted: std::collections::HashSet<String> = ["now".to_string()].into();
        let records = [
            rec("now", "6.6.1", true),
            rec("gone", "6.6.0", true),
            rec("failed", "6.6.2", false),
        ];
        assert_eq!(
            idle_targets_kept(&records, &wanted),
            ["gone".to_string()].into()
        );
        let many: Vec<TargetStatus> = (0..MAX_IDLE_TARGETS + 5)
            .map(|i| rec(&format!("k{i:03}"), &format!("6.6.{i:03}"), true))
            .collect();
        let kept = idle_targets_kept(&many, &wanted);
        assert_eq!(kept.len(), MAX_IDLE_TARGETS);
        assert!(kept.contains("k036") && !kept.contains("k004"), "{kept:?}");
    }

    use crate::decide::fixtures::{gl_node, spec};

    #[test]
    fn targets_come_from_nodes_and_prebuild_entries_alike() {
        let node = gl_node("Garden Linux 1877.3.1", "6.12.44-cloud-amd64");
        let t = Target::of_node(&node).unwrap();
        assert_eq!(t.os_image, "Garden Linux 1877.3.1");
        assert_eq!(t.os_release(), ("gardenlinux", "1877.3.1".to_string()));
        let p = Target::of_prebuild(&crate::crd::PrebuildTarget {
            garden_linux_version: Some("1877.3.1".into()),
            debian_version: None,
            kernel_release: "6.12.44-cloud-amd64".into(),
            arch: "amd64".into(),
        })
        .unwrap();
        assert_eq!(p, t, "a prebuild entry is the same target as the node");
        let s = spec();
        assert_eq!(target_key(&s, &t), target_key(&s, &p));
        let deb = Target::of_node(&gl_node(
            "Debian GNU/Linux 12 (bookworm)",
            "6.1.0-50-cloud-amd64",
        ))
        .unwrap();
        assert_eq!(deb.os_release(), ("debian", "12".to_string()));
        assert!(Target::of_node(&gl_node("Ubuntu 24.04", "6.8.0")).is_none());
        // A new driver policy is a new target key and a new build Job.
        let mut s2 = spec();
        s2.driver.version = Some("580.95.05".into());
        assert_ne!(target_key(&s, &t), target_key(&s2, &t));
        let name = build_job_name(&t, &target_key(&s, &t), 0);
        assert!(name.starts_with("gpu-build-6-12-44-cloud-amd64-"), "{name}");
        assert!(name.len() <= 63);
    }

    /// Signing on (or another Secret) is a new target and a new build
    /// Job, never an unsigned artifact taken for a signed one; the nodes'
    /// desired key stays (no reinstall, no drain: a node picks the signed
    /// build at its next install).
    #[test]
    fn a_signing_secret_is_a_new_target_but_no_reinstall() {
        let node = gl_node("Garden Linux 1877.3", "6.12.44-cloud-amd64");
        let t = Target::of_node(&node).unwrap();
        let plain = spec();
        let mut signed = spec();
        signed.build.signing_secret_name = Some("module-signing".into());
        let mut other = spec();
        other.build.signing_secret_name = Some("module-signing-2".into());
        let keys = [&plain, &signed, &other].map(|s| target_key(s, &t));
        assert!(
            keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2],
            "{keys:?}"
        );
        assert_ne!(
            build_job_name(&t, &keys[0], 0),
            build_job_name(&t, &keys[1], 0)
        );
        // Not the catalog ConfigMap of the same name.
        let mut catalog = spec();
        catalog.driver.catalog_config_map = Some("module-signing".into());
        assert_ne!(target_key(&catalog, &t), keys[1]);
        assert_eq!(
            crate::decide::naming::desired_key(&plain, &node),
            crate::decide::naming::desired_key(&signed, &node)
        );
    }

    #[test]
    fn install_waits_for_the_build_and_carries_its_digest() {
        let mut s = spec();
        // No cache: nothing to build into, the node compiles.
        assert_eq!(
            install_gate(&s, Some(&TargetPhase::Building)),
            Gate::Go {
                expect_sha256: None,
                entry: None,
                compile: true
            }
        );
        s.cache = Some(crate::crd::CacheSpec {
            url: "s3://b/p".into(),
            ..Default::default()
        });
        assert_eq!(install_gate(&s, Some(&TargetPhase::Pending)), Gate::Wait);
        assert_eq!(install_gate(&s, Some(&TargetPhase::Building)), Gate::Wait);
        let sha = "ab".repeat(32);
        let entry = Some("artifacts/v1.1/x86_64/k/580.95.05/open/cc-0123456789abcdef".to_string());
        let cached = TargetPhase::Cached {
            sha256: sha.clone(),
            entry: entry.clone(),
        };
        assert_eq!(
            install_gate(&s, Some(&cached)),
            Gate::Go {
                expect_sha256: Some(sha.clone()),
                entry: entry.clone(),
                compile: true
            }
        );
        let failed = TargetPhase::Failed {
            reason: "BuildFailed".into(),
            message: "make: error".into(),
            retry_in: 60,
        };
        // A failed build: the node compiles for itself if allowed ...
        assert_eq!(
            install_gate(&s, Some(&failed)),
            Gate::Go {
                expect_sha256: None,
                entry: None,
                compile: true
            }
        );
        // ... and is refused with the build's reason if not.
        s.build.compile_on_node = false;
        assert!(matches!(
            install_gate(&s, Some(&failed)),
            Gate::Refuse { reason, .. } if reason == "BuildFailed"
        ));
        assert_eq!(
            install_gate(&s, Some(&cached)),
            Gate::Go {
                expect_sha256: Some(sha),
                entry,
                compile: false
            }
        );
        assert!(matches!(
            install_gate(&s, None),
            Gate::Refuse { reason, .. } if reason == "NoBuildTarget"
        ));
    }

    #[test]
    fn a_cached_artifact_installs_from_the_installer_image_until_it_fails() {
        let mut s = spec();
        s.installer_image = "installer:1".into();
        assert_eq!(
            install_image(&s, "builder:1", true, true, 0),
            ("installer:1", false)
        );
        assert_eq!(
            install_image(&s, "builder:1", true, true, 1),
            ("builder:1", true)
        );
        assert_eq!(
            install_image(&s, "builder:1", true, false, 2),
            ("builder:1", false)
        );
        assert_eq!(
            install_image(&s, "builder:1", false, true, 0),
            ("builder:1", true)
        );
    }
}
