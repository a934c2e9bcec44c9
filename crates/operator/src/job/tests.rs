//! The Jobs' shapes: privileges, Secrets, volumes, scheduling, memory.

use super::example::{EXAMPLE_DIGEST, EXAMPLE_ENTRY};
use super::layout::SIGNING_DIR;
use super::*;
use crate::crd::{CacheSpec, GpuDriver, GpuDriverSpec};
use crate::decide::JobRole;
use crate::keys;
use crate::outcome::MAIN_CONTAINER;
use k8s_openapi::api::core::v1::Toleration;

/// The Secrets a container takes its environment from.
fn secret_names(c: &k8s_openapi::api::core::v1::Container) -> Vec<&str> {
    c.env_from
        .iter()
        .flatten()
        .filter_map(|e| e.secret_ref.as_ref().map(|r| r.name.as_str()))
        .collect()
}

/// The example Job of `kind` in namespace `ns` for a Garden Linux 1877.3
/// node.
fn garden_job(g: &GpuDriver, ns: &str, kind: TemplateKind) -> k8s_openapi::api::batch::v1::Job {
    example(
        g,
        "n1",
        "Garden Linux 1877.3",
        "6.12.44-cloud-amd64",
        ns,
        kind,
    )
    .unwrap()
}

/// The pod of the example Job of `kind` for a Garden Linux 1877.3 node.
fn example_pod(g: &GpuDriver, kind: TemplateKind) -> k8s_openapi::api::core::v1::PodSpec {
    garden_job(g, "ns", kind)
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
}

fn gd() -> GpuDriver {
    let mut gd = GpuDriver::new(
        "default",
        serde_json::from_value::<GpuDriverSpec>(serde_json::json!({
            "builderImages": [{"image": "builder:1"}],
            "installerImage": "installer:1",
            "startupTaint": "gpu-driver.gardenlinux.io/not-ready",
            "driver": {"version": "580.95.05", "flavor": "open"}
        }))
        .unwrap(),
    );
    gd.metadata.uid = Some("uid-1".into());
    gd
}

#[test]
fn the_install_job_is_pinned_privileged_only_where_needed_and_owned() {
    let mut g = gd();
    g.spec.cache = Some(CacheSpec {
        url: "s3://bucket/gpu".into(),
        secret_name: Some("cache-creds".into()),
        write_secret_name: Some("cache-writer".into()),
        allow_http: true,
    });
    let sha = "ab".repeat(32);
    let mut req = JobRequest::node_job(
        JobRole::Install,
        "gpu-install-n1-abc",
        "gpu-driver",
        "n1",
        "builder:1",
        "k",
    );
    req.expect_sha256 = Some(&sha);
    let entry = "artifacts/v1.1/x86_64/6.12.44-cloud-amd64/580.95.05/open/cc-0123456789abcdef";
    req.cache_entry = Some(entry);
    let job = build(&g, &req);
    let spec = job.spec.as_ref().unwrap();
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.node_name.as_deref(), Some("n1"));
    assert_eq!(pod.host_pid, Some(true));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        init.security_context.as_ref().unwrap().run_as_non_root,
        Some(true)
    );
    assert_eq!(init.image.as_deref(), Some("installer:1"));
    let main = &pod.containers[0];
    assert_eq!(main.image.as_deref(), Some("builder:1"));
    assert_eq!(
        main.security_context.as_ref().unwrap().privileged,
        Some(true)
    );
    let args = main.args.as_ref().unwrap().join(" ");
    assert!(
        args.contains(&format!("--host-root /proc/1/root --log-level info run --flavor open --driver-version 580.95.05 --cache-url s3://bucket/gpu --allow-http --cache-read-only --artifact-sha256 {sha} --cache-entry {entry}")),
        "{args}"
    );
    assert!(main.env_from.is_some());
    // Without the build Job's digest (its build failed, or the node's
    // OS has no build target) the install Job never looks into the
    // cache: no URL, no credentials; it compiles on the node.
    req.expect_sha256 = None;
    let unpinned = build(&g, &req);
    let main = &unpinned.spec.unwrap().template.spec.unwrap().containers[0];
    let args = main.args.as_ref().unwrap().join(" ");
    assert!(!args.contains("--cache"), "{args}");
    assert!(main.env_from.is_none(), "{:?}", main.env_from);
    // Only the emptyDir: no hostPath.
    assert!(
        pod.volumes
            .as_ref()
            .unwrap()
            .iter()
            .all(|v| v.host_path.is_none())
    );
    let o = &job.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((o.kind.as_str(), o.uid.as_str()), ("GpuDriver", "uid-1"));
    assert!(spec.backoff_limit.is_some());
    assert!(spec.active_deadline_seconds.is_some());
    assert!(spec.ttl_seconds_after_finished.is_some());
    let codes = &spec.pod_failure_policy.as_ref().unwrap().rules[0]
        .on_exit_codes
        .as_ref()
        .unwrap()
        .values;
    assert!(codes.contains(&3) && codes.contains(&13) && !codes.contains(&12));
    assert!(
        pod.tolerations
            .as_ref()
            .unwrap()
            .iter()
            .any(|t| t.key.as_deref() == Some("gpu-driver.gardenlinux.io/not-ready"))
    );
}

#[test]
fn the_detect_job_is_not_privileged() {
    let job = build(
        &gd(),
        &JobRequest::node_job(
            JobRole::Detect,
            "gpu-detect-n1-abc",
            "gpu-driver",
            "n1",
            "installer:1",
            "boot",
        ),
    );
    let pod = job.spec.unwrap().template.spec.unwrap();
    let main = &pod.containers[0];
    assert_eq!(
        main.security_context.as_ref().unwrap().privileged,
        Some(false)
    );
    assert!(
        main.args
            .as_ref()
            .unwrap()
            .ends_with(&["detect".to_string()])
    );
}

#[test]
fn the_build_job_is_unprivileged_scheduled_and_alone_holds_the_write_secret() {
    let g = gd_with_two_secrets();
    let job = garden_job(&g, "gpu-driver", TemplateKind::Build);
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.node_name, None, "scheduled, not pinned");
    assert_eq!(pod.host_pid, Some(false));
    assert_eq!(
        pod.node_selector.as_ref().unwrap()["kubernetes.io/arch"],
        "amd64"
    );
    assert!(
        pod.volumes
            .as_ref()
            .unwrap()
            .iter()
            .all(|v| v.host_path.is_none() && v.empty_dir.is_some())
    );
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        let sc = c.security_context.as_ref().unwrap();
        assert_ne!(sc.privileged, Some(true), "{}", c.name);
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
    }
    let main = &pod.containers[0];
    let secrets = secret_names(main);
    assert_eq!(secrets, ["cache-writer"]);
    let args = main.args.as_ref().unwrap().join(" ");
    assert_eq!(
        args,
        "--host-root / --log-level info prebuild --os-id gardenlinux --os-version 1877.3 \
         --kernel-release 6.12.44-cloud-amd64 --arch amd64 --flavor open \
         --driver-version 580.95.05 --cache-url s3://bucket/gpu"
    );
    let labels = job.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[keys::ROLE_LABEL], "build");
    assert!(
        job.metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(keys::TARGET)
    );
}

fn gd_with_two_secrets() -> GpuDriver {
    let mut g = gd();
    g.spec.cache = Some(CacheSpec {
        url: "s3://bucket/gpu".into(),
        secret_name: Some("cache-reader".into()),
        write_secret_name: Some("cache-writer".into()),
        allow_http: false,
    });
    g.spec.extra_args = vec!["--peermem".into()];
    g
}

#[test]
fn the_install_job_beside_builds_reads_the_cache_only() {
    let mut g = gd_with_two_secrets();
    // The install Job: the read-only Secret only, and read-only cache use.
    g.spec.build.compile_on_node = false;
    let job = garden_job(&g, "gpu-driver", TemplateKind::CachedInstall);
    let main = &job.spec.unwrap().template.spec.unwrap().containers[0];
    let secrets = secret_names(main);
    assert_eq!(secrets, ["cache-reader"]);
    // Cached: the installer image alone, as root, never compiling.
    assert_eq!(main.image.as_deref(), Some("installer:1"));
    let sc = main.security_context.as_ref().unwrap();
    assert_eq!((sc.privileged, sc.run_as_user), (Some(true), Some(0)));
    let args = main.args.as_ref().unwrap().join(" ");
    assert!(
        args.ends_with(&format!(
            "--cache-url s3://bucket/gpu --cache-read-only --artifact-sha256 {EXAMPLE_DIGEST} --cache-entry {EXAMPLE_ENTRY} --no-compile --peermem"
        )),
        "{args}"
    );
    // An OS without a build recipe has no build Job.
    assert!(matches!(
        example(&g, "n1", "Ubuntu 24.04", "6.8.0", "ns", TemplateKind::Build),
        Err(NoJob::Build { .. })
    ));
}

/// A build Job holds the write Secret: it never lands on a GPU node it
/// serves (NVIDIA's PCI label, or this GpuDriver's selector) unless the
/// owner allows it, and takes its own tolerations, not the install
/// Jobs' (which let pods onto GPU nodes).
/// A GpuDriver naming a catalog ConfigMap: every Job mounts its
/// `catalog.toml` read-only and hands it to the installer as the
/// global `--catalog`; the key changes, so nodes reinstall by it.
#[test]
fn a_catalog_configmap_reaches_every_job_as_catalog() {
    let mut g = gd();
    let plain = g.clone();
    g.spec.driver.catalog_config_map = Some("drivers-2026-12".into());
    // Detect Jobs share the install pod's spec.
    for kind in [TemplateKind::Install, TemplateKind::Build] {
        let pod = |g: &GpuDriver| example_pod(g, kind);
        let p = pod(&g);
        let vol = p
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "catalog");
        let cm = vol
            .and_then(|v| v.config_map.as_ref())
            .expect("catalog volume");
        assert_eq!(cm.name, "drivers-2026-12");
        assert_eq!(cm.items.as_ref().unwrap()[0].key, "catalog.toml");
        let main = p
            .containers
            .iter()
            .find(|c| c.name == MAIN_CONTAINER)
            .unwrap();
        let mount = main
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "catalog");
        assert_eq!(
            mount.map(|m| (m.mount_path.as_str(), m.read_only)),
            Some(("/etc/gpu-driver/catalog", Some(true)))
        );
        let args = main.args.as_ref().unwrap().join(" ");
        assert!(
            args.starts_with("--host-root")
                && args
                    .contains(" --log-level info --catalog /etc/gpu-driver/catalog/catalog.toml "),
            "{kind:?}: {args}"
        );
        let p = pod(&plain);
        assert!(!p.volumes.unwrap().iter().any(|v| v.name == "catalog"));
        let main = p
            .containers
            .iter()
            .find(|c| c.name == MAIN_CONTAINER)
            .unwrap();
        assert!(!main.args.as_ref().unwrap().join(" ").contains("--catalog"));
    }
    let node = crate::decide::NodeFacts {
        kernel: "6.12.44-cloud-amd64".into(),
        ..Default::default()
    };
    assert_ne!(
        crate::decide::desired_key(&g.spec, &node),
        crate::decide::desired_key(&plain.spec, &node)
    );
}

/// The signing Secret's volume and mount in a pod, and whether its
/// main container's args name the key or the certificate.
fn signing_parts(
    p: &k8s_openapi::api::core::v1::PodSpec,
) -> (
    Vec<&k8s_openapi::api::core::v1::Volume>,
    Vec<&k8s_openapi::api::core::v1::VolumeMount>,
    bool,
) {
    let secret_volumes: Vec<_> = p
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.secret.is_some() || v.name == "signing")
        .collect();
    let mounts: Vec<_> = p
        .containers
        .iter()
        .chain(p.init_containers.iter().flatten())
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .filter(|m| m.name == "signing" || m.mount_path.starts_with(SIGNING_DIR))
        .collect();
    let args = p
        .containers
        .iter()
        .chain(p.init_containers.iter().flatten())
        .flat_map(|c| c.args.iter().flatten())
        .any(|a| a.starts_with("--signing") || a.contains(SIGNING_DIR));
    (secret_volumes, mounts, args)
}

/// `build.signingSecretName`: the build Job mounts the tls Secret
/// read-only (owner-read files, key and certificate only) and passes
/// both files to `prebuild`, after its other options.
#[test]
fn the_build_job_alone_mounts_the_signing_secret_read_only() {
    let mut g = gd_with_two_secrets();
    g.spec.build.signing_secret_name = Some("module-signing".into());
    let p = example_pod(&g, TemplateKind::Build);
    let (volumes, mounts, _) = signing_parts(&p);
    let [v] = volumes.as_slice() else {
        panic!("{volumes:?}")
    };
    let secret = v.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("module-signing"));
    assert_eq!(secret.default_mode, Some(0o400));
    assert_eq!(secret.optional, Some(false));
    let items: Vec<(&str, &str)> = secret
        .items
        .iter()
        .flatten()
        .map(|i| (i.key.as_str(), i.path.as_str()))
        .collect();
    assert_eq!(items, [("tls.key", "tls.key"), ("tls.crt", "tls.crt")]);
    let [m] = mounts.as_slice() else {
        panic!("{mounts:?}")
    };
    assert_eq!(
        (m.name.as_str(), m.mount_path.as_str(), m.read_only),
        (v.name.as_str(), "/run/gpu-driver/signing", Some(true))
    );
    let main = &p.containers[0];
    assert!(
        main.volume_mounts.iter().flatten().any(|x| x == *m),
        "the installer container mounts it"
    );
    let init = &p.init_containers.as_ref().unwrap()[0];
    assert!(
        init.volume_mounts
            .iter()
            .flatten()
            .all(|x| x.name != v.name)
    );
    let args = main.args.as_ref().unwrap().join(" ");
    assert!(
        args.ends_with(
            " prebuild --os-id gardenlinux --os-version 1877.3 \
             --kernel-release 6.12.44-cloud-amd64 --arch amd64 --flavor open \
             --driver-version 580.95.05 --cache-url s3://bucket/gpu \
             --signing-key /run/gpu-driver/signing/tls.key \
             --signing-cert /run/gpu-driver/signing/tls.crt"
        ),
        "{args}"
    );
    // The write Secret stays the build's only environment Secret.
    assert_eq!(secret_names(main), ["cache-writer"]);
}

/// Install Jobs (compiling on the node, or from the cache) and detect
/// Jobs never mount the signing Secret nor name its files, whatever
/// the spec says; without a signing Secret the build Job is as before.
#[test]
fn install_jobs_never_see_the_signing_secret() {
    let mut g = gd_with_two_secrets();
    let unsigned = example_pod(&g, TemplateKind::Build);
    g.spec.build.signing_secret_name = Some("module-signing".into());
    for kind in [TemplateKind::Install, TemplateKind::CachedInstall] {
        let p = example_pod(&g, kind);
        let (volumes, mounts, args) = signing_parts(&p);
        assert!(volumes.is_empty(), "{kind:?}: {volumes:?}");
        assert!(mounts.is_empty(), "{kind:?}: {mounts:?}");
        assert!(!args, "{kind:?}: {:?}", p.containers[0].args);
    }
    let detect = build(
        &g,
        &JobRequest::node_job(JobRole::Detect, "d", "ns", "n1", "installer:1", "boot"),
    );
    let p = detect.spec.unwrap().template.spec.unwrap();
    let (volumes, mounts, args) = signing_parts(&p);
    assert!(volumes.is_empty() && mounts.is_empty() && !args);

    // No signing Secret: the build Job has none of it, and the signed
    // one differs from it only by the volume, the mount and the args.
    let (volumes, mounts, args) = signing_parts(&unsigned);
    assert!(volumes.is_empty() && mounts.is_empty() && !args);
    let mut signed = example_pod(&g, TemplateKind::Build);
    signed
        .volumes
        .as_mut()
        .unwrap()
        .retain(|v| v.name != "signing");
    let main = &mut signed.containers[0];
    main.volume_mounts
        .as_mut()
        .unwrap()
        .retain(|m| m.name != "signing");
    main.args
        .as_mut()
        .unwrap()
        .truncate(unsigned.containers[0].args.as_ref().unwrap().len());
    assert_eq!(signed, unsigned);
}

/// The keys of a pod's tolerations, in order.
fn toleration_keys(p: &k8s_openapi::api::core::v1::PodSpec) -> Vec<String> {
    p.tolerations
        .iter()
        .flatten()
        .map(|t| t.key.clone().unwrap_or_default())
        .collect()
}

#[test]
fn build_jobs_stay_off_the_gpu_nodes_they_serve() {
    let mut g = gd_with_two_secrets();
    g.spec.node_selector = [("pool".to_string(), "gpu".to_string())].into();
    g.spec.tolerations = vec![Toleration {
        key: Some("nvidia.com/gpu".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }];
    g.spec.build.node_selector = [("pool".to_string(), "build".to_string())].into();
    let pod = |g: &GpuDriver| example_pod(g, TemplateKind::Build);
    let p = pod(&g);
    assert_eq!(p.tolerations, None, "the install Jobs' tolerations");
    let terms = p
        .affinity
        .unwrap()
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()
        .node_selector_terms;
    let exprs: Vec<String> = terms[0]
        .match_expressions
        .iter()
        .flatten()
        .map(|e| format!("{} {} {:?}", e.key, e.operator, e.values))
        .collect();
    assert_eq!(
        exprs,
        [
            format!("{} NotIn Some([\"true\"])", crate::keys::NFD_NVIDIA_LABEL),
            "pool NotIn Some([\"gpu\"])".to_string()
        ]
    );
    assert_eq!(terms.len(), 1);
    let sel = p.node_selector.unwrap();
    assert_eq!(sel["pool"], "build");
    assert_eq!(sel["kubernetes.io/arch"], "amd64");

    // The owner's say: build tolerations of its own, GPU nodes allowed.
    g.spec.build.allow_gpu_nodes = true;
    g.spec.build.tolerations = vec![Toleration {
        key: Some("build".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }];
    g.spec.startup_taint = None;
    let p = pod(&g);
    assert!(p.affinity.is_none());
    let keys: Vec<_> = p
        .tolerations
        .iter()
        .flatten()
        .map(|t| t.key.clone())
        .collect();
    assert_eq!(keys, [Some("build".to_string())], "no startup taint set");

    // On GPU nodes, the build tolerates the startup taint that waits
    // for it (a one-pool cluster would wait forever otherwise).
    g.spec.startup_taint = Some("gpu-driver.gardenlinux.io/driver-not-ready".into());
    let keys = toleration_keys(&pod(&g));
    assert_eq!(
        keys,
        ["build", "gpu-driver.gardenlinux.io/driver-not-ready"]
    );
    g.spec.build.allow_gpu_nodes = false;
    let keys = toleration_keys(&pod(&g));
    assert_eq!(
        keys,
        ["build"],
        "off GPU nodes, no startup taint to tolerate"
    );
}

/// Every container has memory requests and a limit (the node-critical
/// install Job was unbounded), no CPU limit, and a GpuDriver's own
/// resources replace the defaults.
#[test]
fn every_container_has_sized_memory_and_the_spec_overrides_it() {
    use k8s_openapi::api::core::v1::{Container, ResourceRequirements};
    let memory = |c: &Container, which: &str| {
        let r = c.resources.as_ref().unwrap();
        let m = if which == "limit" {
            &r.limits
        } else {
            &r.requests
        };
        m.as_ref().unwrap()["memory"].0.clone()
    };
    let no_cpu_limit = |c: &Container| {
        assert!(
            !c.resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()
                .contains_key("cpu")
        )
    };
    let mut g = gd_with_two_secrets();
    let req = |role, image| JobRequest::node_job(role, "j", "gpu-driver", "n1", image, "k");
    for (role, image, request, limit) in [
        (JobRole::Install, "builder:1", "512Mi", "2Gi"),
        (JobRole::Detect, "installer:1", "32Mi", "128Mi"),
    ] {
        let pod = build(&g, &req(role, image))
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let main = &pod.containers[0];
        assert_eq!(
            (memory(main, "request"), memory(main, "limit")),
            (request.into(), limit.into())
        );
        no_cpu_limit(main);
        let init = &pod.init_containers.as_ref().unwrap()[0];
        assert_eq!(memory(init, "limit"), "64Mi");
    }
    let build_pod = |g: &GpuDriver| {
        let job = garden_job(g, "gpu-driver", TemplateKind::Build);
        job.spec.unwrap().template.spec.unwrap().containers[0].clone()
    };
    let main = build_pod(&g);
    assert_eq!(
        (memory(&main, "request"), memory(&main, "limit")),
        ("1Gi".into(), "4Gi".into())
    );
    no_cpu_limit(&main);

    let own: ResourceRequirements = serde_json::from_value(serde_json::json!({
        "requests": {"memory": "3Gi"}, "limits": {"memory": "6Gi"}
    }))
    .unwrap();
    g.spec.job.resources = Some(own.clone());
    g.spec.build.resources = Some(own.clone());
    let pod = build(&g, &req(JobRole::Install, "builder:1"))
        .spec
        .unwrap()
        .template
        .spec
        .unwrap();
    assert_eq!(pod.containers[0].resources.as_ref(), Some(&own));
    assert_eq!(build_pod(&g).resources.as_ref(), Some(&own));
}
