//! The Jobs `job-template` prints: the install or build Job for a made-up
//! GPU node.

use k8s_openapi::api::batch::v1::Job;

use super::object::build;
use super::request::JobRequest;
use crate::crd::GpuDriver;
use crate::decide::{JobRole, Target};
use crate::keys;

/// The node's plan is not an install Job (no GPU, no builder image, …):
/// nothing for `job-template` to print.
#[derive(Debug, thiserror::Error)]
pub enum NoJob {
    #[error("no install Job for that node: {0:?}")]
    Install(crate::decide::Plan),
    #[error(
        "no build Job for OS {os:?}, kernel {kernel}: build Jobs serve Garden Linux and Debian \
         targets that a builder image matches"
    )]
    Build { os: String, kernel: String },
}

/// Which Job `job-template` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateKind {
    /// The install Job of a node whose artifact is not cached: the builder
    /// image, compiling on the node.
    Install,
    /// The install Job of a node whose target's build Job stored the
    /// artifact: the installer image alone, `--no-compile`.
    CachedInstall,
    Build,
}

/// The install or build Job for a made-up GPU node: what
/// `deploy/job-template.yaml`, `deploy/cached-job-template.yaml` and
/// `deploy/build-job-template.yaml` show.
pub(crate) fn example(
    gd: &GpuDriver,
    node: &str,
    os_image: &str,
    kernel: &str,
    namespace: &str,
    kind: TemplateKind,
) -> Result<Job, NoJob> {
    let facts = crate::decide::NodeFacts {
        name: node.to_string(),
        kernel: kernel.to_string(),
        os_image: os_image.to_string(),
        boot_id: "00000000-0000-0000-0000-000000000000".to_string(),
        arch: "amd64".to_string(),
        labels: [(keys::NFD_NVIDIA_LABEL.to_string(), "true".to_string())].into(),
        ..Default::default()
    };
    if kind == TemplateKind::Build {
        let no = || NoJob::Build {
            os: os_image.to_string(),
            kernel: kernel.to_string(),
        };
        let target = Target::of_node(&facts).ok_or_else(no)?;
        let image = crate::decide::builder_image(&gd.spec.builder_images, &target.facts())
            .ok_or_else(no)?;
        let key = crate::decide::target_key(&gd.spec, &target);
        let name = crate::decide::build_job_name(&target, &key, 0);
        return Ok(build(
            gd,
            &JobRequest::build(&name, namespace, &image, &key, &target),
        ));
    }
    match crate::decide::plan(&gd.spec, &facts, 0) {
        crate::decide::Plan::Install {
            job, image, key, ..
        } => {
            let mut req =
                JobRequest::node_job(JobRole::Install, &job, namespace, node, &image, &key);
            if kind == TemplateKind::CachedInstall {
                // What the operator passes once the target's build Job
                // stored the artifact: its digest and entry.
                req.expect_sha256 = Some(EXAMPLE_DIGEST);
                req.cache_entry = Some(EXAMPLE_ENTRY);
            }
            let compile = gd.spec.build.compile_on_node;
            let cached = req.expect_sha256.is_some();
            (req.image, req.compile) =
                crate::decide::install_image(&gd.spec, &image, cached, compile, 0);
            Ok(build(gd, &req))
        }
        other => Err(NoJob::Install(other)),
    }
}

/// The digest in an example install Job: the build Job's, in a real one.
pub(super) const EXAMPLE_DIGEST: &str = "SHA256-OF-THE-BUILD-JOBS-ARTIFACT";
/// The entry in an example install Job: the build Job's `cacheKey`.
pub(super) const EXAMPLE_ENTRY: &str = "artifacts/v1.1/THE-BUILD-JOBS-CACHE-KEY";
