//! What the controller asks the Job builder for.

use crate::decide::{JobRole, Target};

/// What the controller decided to run.
#[derive(Debug, Clone)]
pub struct JobRequest<'a> {
    pub role: JobRole,
    pub name: &'a str,
    pub namespace: &'a str,
    /// The node an install or detect Job is pinned to (empty for a build
    /// Job: the scheduler places it).
    pub node: &'a str,
    /// The builder image (install, build) or the installer image (detect).
    pub image: &'a str,
    /// The desired-state key (install, detect) or the target key (build),
    /// recorded on the Job.
    pub key: &'a str,
    /// Install: the sha256 the cached artifact must have (the build Job's).
    pub expect_sha256: Option<&'a str>,
    /// The store entry holding it (`--cache-entry`).
    pub cache_entry: Option<&'a str>,
    /// Install: may the node compile when the cache cannot serve it?
    pub compile: bool,
    /// Build: what to build for.
    pub target: Option<&'a Target>,
}

impl<'a> JobRequest<'a> {
    /// An install or detect Job for `node`.
    pub fn node_job(
        role: JobRole,
        name: &'a str,
        namespace: &'a str,
        node: &'a str,
        image: &'a str,
        key: &'a str,
    ) -> Self {
        JobRequest {
            role,
            name,
            namespace,
            node,
            image,
            key,
            expect_sha256: None,
            cache_entry: None,
            compile: true,
            target: None,
        }
    }

    /// The build Job for `target`.
    pub fn build(
        name: &'a str,
        namespace: &'a str,
        image: &'a str,
        key: &'a str,
        target: &'a Target,
    ) -> Self {
        JobRequest {
            role: JobRole::Build,
            name,
            namespace,
            node: "",
            image,
            key,
            expect_sha256: None,
            cache_entry: None,
            compile: true,
            target: Some(target),
        }
    }
}
