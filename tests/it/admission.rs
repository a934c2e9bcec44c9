//! The GpuDriver admission policy (deploy/admission-policy.yaml) in a real
//! kube-apiserver (tests/it/support/cluster.rs). Whoever may write a GpuDriver
//! is root on every node it selects; the policy holds GpuDrivers to the
//! images, cache and installer flags the cluster owner allows. Without the
//! policy the apiserver admits every GpuDriver below (checked first, so a
//! policy that does nothing fails this test); with it, only the one with
//! allowed, digest-pinned images and harmless flags, and each refusal
//! carries the policy's reason. The owner's lists, edited the way
//! docs/operator.md says, take effect. Fails (does not skip) under CI=true
//! without the binaries.

use std::time::{Duration, Instant};

use crate::support::cluster::Cluster;
use crate::support::deploy::{install_crd, repo_file};
use serde_json::{Value, json};

const POLICY: &str = "gpudriver-sources.gpu-driver.gardenlinux.io";
/// A new or edited policy is enforced asynchronously; this long at most.
const SETTLE: Duration = Duration::from_secs(60);

/// `@sha256:` and 64 hex digits.
fn digest() -> String {
    format!("@sha256:{}", "0123456789abcdef".repeat(4))
}

fn builder() -> String {
    format!(
        "ghcr.io/gardenlinux/gardenlinux/kmodbuild:1877.3{}",
        digest()
    )
}

fn installer() -> String {
    format!("ghcr.io/gardenlinux/gpu-driver-installer{}", digest())
}

fn gpudriver(name: &str, builder_image: &str, installer: &str, extra_args: &[&str]) -> Value {
    crate::support::manifests::gpudriver(
        name,
        json!({
            "nodeSelector": {"pool": "gpu"},
            "builderImages": [
                {"gardenLinuxVersion": "1877", "image": builder_image},
                {"image": builder()},
            ],
            "installerImage": installer,
            "extraArgs": extra_args,
        }),
    )
}

fn with_cache(mut gd: Value, cache: Value) -> Value {
    gd["spec"]["cache"] = cache;
    gd
}

/// `kubectl create --dry-run=server`: admission runs in full, nothing is
/// stored. Ok(stdout) when admitted, Err(stderr) when refused.
fn admit(c: &Cluster, obj: &Value) -> Result<String, String> {
    let out = c.kubectl_output(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&obj.to_string()),
    );
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Polls `check` until it returns Ok, for at most [`SETTLE`].
fn eventually(what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + SETTLE;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => {
                panic!("{what}: not within {SETTLE:?}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// Refused by this policy, with every one of `want` in the message.
fn assert_refused(c: &Cluster, name: &str, obj: &Value, want: &[String]) {
    assert_refused_by(c, POLICY, name, obj, want);
}

/// Refused by `policy`, with every one of `want` in the message.
fn assert_refused_by(c: &Cluster, policy: &str, name: &str, obj: &Value, want: &[String]) {
    let err = match admit(c, obj) {
        Ok(out) => panic!("{name}: admitted ({}): {obj}", out.trim()),
        Err(e) => e,
    };
    let by_policy = format!("ValidatingAdmissionPolicy '{policy}'");
    assert!(
        err.contains(&by_policy),
        "{name}: not refused by {policy}: {err}"
    );
    for w in want {
        assert!(
            err.contains(w.as_str()),
            "{name}: message lacks {w:?}: {err}"
        );
    }
}

/// What the policy must refuse, and what its message must say.
fn disallowed() -> Vec<(&'static str, Value, Vec<String>)> {
    let d = digest();
    let registry = |img: &str| {
        vec![
            format!("image {img} is not from an allowed registry"),
            "run privileged on every node the GpuDriver selects".to_string(),
            "must start with one of [ghcr.io/gardenlinux/]".to_string(),
        ]
    };
    let unpinned = |img: &str| {
        vec![
            format!("image {img} is not pinned by digest"),
            "a tag can be moved to other content".to_string(),
        ]
    };
    let args = |arg: &str| {
        vec![
            format!("extraArgs {arg} refused"),
            "may not change where the driver, the modules or the catalog come from".to_string(),
        ]
    };
    let evil_builder = format!("docker.io/evil/kmodbuild{d}");
    let lookalike = format!("ghcr.io/gardenlinux-evil/kmodbuild{d}");
    let evil_installer = format!("quay.io/evil/gpu-driver-installer{d}");
    let tagged = "ghcr.io/gardenlinux/gpu-driver-installer:0.1.0";
    let latest = "ghcr.io/gardenlinux/gardenlinux/kmodbuild:latest";
    let untagged = "ghcr.io/gardenlinux/gardenlinux/kmodbuild";
    let url = "--url=https://evil.example/NVIDIA-Linux-x86_64-580.95.05.run";
    let mut cases = vec![
        (
            "builder from another registry",
            gpudriver("other-registry", &evil_builder, &installer(), &[]),
            registry(&evil_builder),
        ),
        (
            "builder from a look-alike prefix",
            gpudriver("lookalike", &lookalike, &installer(), &[]),
            registry(&lookalike),
        ),
        (
            "installer from another registry",
            gpudriver("other-installer", &builder(), &evil_installer, &[]),
            registry(&evil_installer),
        ),
        (
            "installer by tag, no digest",
            gpudriver("tagged", &builder(), tagged, &[]),
            unpinned(tagged),
        ),
        (
            "builder :latest",
            gpudriver("latest", latest, &installer(), &[]),
            unpinned(latest),
        ),
        (
            "builder untagged",
            gpudriver("untagged", untagged, &installer(), &[]),
            unpinned(untagged),
        ),
        (
            "extraArgs --url=",
            gpudriver("url", &builder(), &installer(), &["--peermem", url]),
            args(url),
        ),
        (
            "extraArgs --url URL",
            gpudriver(
                "url-separate",
                &builder(),
                &installer(),
                &["--url", "https://evil.example/x.run"],
            ),
            args("--url"),
        ),
        (
            "cache not allowed",
            with_cache(
                gpudriver("cache", &builder(), &installer(), &[]),
                json!({"url": "s3://evil/modules"}),
            ),
            vec!["cache.url s3://evil/modules is not an allowed cache".to_string()],
        ),
    ];
    // Every flag that moves where bytes come from or how they are trusted.
    for flag in [
        "--mirror",
        "--sha256",
        "--manifest",
        "--allow-http",
        "--ca-bundle",
        "--apt-keyring",
        "--catalog",
        "--cache-url",
        "--cache-dir",
        "--artifact",
        "--host-root",
        // Names a file the privileged container reads (/proc/self/environ).
        "--module-params",
        // The signing key is the build Jobs' alone.
        "--signing-key",
        "--signing-cert",
    ] {
        let arg = format!("{flag}=x");
        cases.push((
            "extraArgs flag",
            gpudriver(
                &format!("flag{}", flag.replace('-', "")),
                &builder(),
                &installer(),
                &[&arg],
            ),
            args(&arg),
        ));
    }
    cases
}

/// `kubectl patch --type=json` of the owner's lists, as docs/operator.md
/// shows it.
fn set_owner_list(c: &Cluster, index: usize, expression: &str) {
    let patch = json!([{
        "op": "replace",
        "path": format!("/spec/variables/{index}/expression"),
        "value": expression,
    }]);
    c.kubectl(&[
        "patch",
        "validatingadmissionpolicy",
        POLICY,
        "--type=json",
        "-p",
        &patch.to_string(),
    ]);
}

#[test]
fn admission_policy_holds_gpudrivers_to_the_owners_lists() {
    let Some(c) = Cluster::start() else { return };
    install_crd(&c);
    let cases = disallowed();

    // Without the policy, the apiserver admits all of them: the refusals
    // below are the policy's doing.
    for (name, obj, _) in &cases {
        if let Err(e) = admit(&c, obj) {
            panic!("{name}: refused without the policy: {e}");
        }
    }

    c.apply(&repo_file("deploy/admission-policy.yaml"));
    let (first, first_obj, _) = &cases[0];
    eventually("the policy is enforced", || match admit(&c, first_obj) {
        Ok(_) => Err(format!("{first} still admitted")),
        Err(e) if e.contains(POLICY) => Ok(()),
        Err(e) => Err(e),
    });

    for (name, obj, want) in &cases {
        assert_refused(&c, name, obj, want);
    }

    // Allowed: allowed registry, pinned by digest (a tag may stay next to
    // it), harmless flags. Created for real.
    let ok = gpudriver(
        "allowed",
        &builder(),
        &installer(),
        &["--peermem", "--log-level=debug", "--retries", "5"],
    );
    c.apply(&ok.to_string());
    // The operator's status writes are not held up by the policy.
    c.kubectl(&[
        "patch",
        "gpudriver",
        "allowed",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"gpuNodes":1}}"#,
    ]);
    // An update is checked like a create.
    let out = c.kubectl_output(
        &[
            "patch",
            "gpudriver",
            "allowed",
            "--type=merge",
            "-p",
            r#"{"spec":{"extraArgs":["--catalog=/tmp/catalog.toml"]}}"#,
        ],
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("extraArgs --catalog=/tmp/catalog.toml refused"),
        "update with --catalog: {err}"
    );

    assert_the_owner_widens_the_lists(&c);
    assert_caches_outside_the_lists_are_refused(&c);
}

/// The owner widens the lists: what they now name is admitted, what they
/// still do not is refused; a prefix still ends at a "/".
fn assert_the_owner_widens_the_lists(c: &Cluster) {
    // The owner widens the lists; a prefix still ends at a "/".
    let own = format!("registry.example.com/gpu-driver/builder-debian{}", digest());
    let own_gd = gpudriver("own-registry", &own, &installer(), &[]);
    // A read Secret for install Jobs, a write Secret for build Jobs.
    let cache = json!({"url": "s3://gpu-driver-cache/cluster-a", "secretName": "gpu-driver-cache",
        "writeSecretName": "gpu-driver-cache-writer"});
    let mut cached = with_cache(gpudriver("cached", &builder(), &installer(), &[]), cache);
    cached["spec"]["build"] = json!({"nodeSelector": {"pool": "build"}});
    // A catalog ConfigMap: it decides which drivers and digests the nodes
    // install, so only the names the owner lists.
    let mut catalog = gpudriver("own-catalog", &builder(), &installer(), &[]);
    catalog["spec"]["driver"] = json!({"catalogConfigMap": "drivers-2026-12"});
    // A module signing Secret: only the owner's, on trusted build nodes.
    let signing = |name: &str, secret: &str, build_nodes: bool| {
        let mut gd = gpudriver(name, &builder(), &installer(), &[]);
        gd["spec"]["build"] = json!({"signingSecretName": secret});
        if build_nodes {
            gd["spec"]["build"]["nodeSelector"] = json!({"pool": "build"});
        }
        gd
    };
    let signed = signing("signed", "gpu-driver-module-signing", true);
    assert_refused(
        c,
        "signing Secret, not yet allowed",
        &signed,
        &[
            "build.signingSecretName gpu-driver-module-signing is not an allowed signing Secret"
                .to_string(),
        ],
    );
    assert_refused(c, "own registry, not yet allowed", &own_gd, &[]);
    assert_refused(c, "own cache, not yet allowed", &cached, &[]);
    assert_refused(
        c,
        "catalog ConfigMap, not yet allowed",
        &catalog,
        &["driver.catalogConfigMap drivers-2026-12 is not an allowed catalog".to_string()],
    );
    set_owner_list(
        c,
        0,
        "['ghcr.io/gardenlinux/', 'registry.example.com/gpu-driver']",
    );
    set_owner_list(c, 1, "['s3://gpu-driver-cache/cluster-a']");
    set_owner_list(c, 2, "['gpu-driver-cache', 'shared']");
    set_owner_list(c, 4, "['gpu-driver-cache-writer', 'shared']");
    set_owner_list(c, 5, "['drivers-2026-12']");
    set_owner_list(c, 6, "['gpu-driver-module-signing', 'shared']");
    eventually("the edited lists are enforced", || {
        admit(c, &own_gd)?;
        admit(c, &catalog)?;
        admit(c, &signed)?;
        admit(c, &cached).map(|_| ())
    });
    for (gd, name, want) in [
        (
            signing("signing-other", "operator-token", true),
            "signing Secret not allowed",
            "build.signingSecretName operator-token is not an allowed signing Secret",
        ),
        (
            signing("signing-unplaced", "gpu-driver-module-signing", false),
            "signing Secret without build.nodeSelector",
            "build.signingSecretName gpu-driver-module-signing needs build.nodeSelector",
        ),
        (
            signing("signing-reader", "shared", true),
            "a cache read Secret as the signing Secret",
            "build.signingSecretName shared is a cache read Secret",
        ),
    ] {
        assert_refused(c, name, &gd, &[want.to_string()]);
    }
    catalog["spec"]["driver"] = json!({"catalogConfigMap": "drivers-2026-12-evil"});
    assert_refused(
        c,
        "another catalog ConfigMap",
        &catalog,
        &["must be one of [drivers-2026-12]".to_string()],
    );
    let sibling = format!("registry.example.com/gpu-driver-other/builder{}", digest());
    assert_refused(
        c,
        "sibling of an allowed prefix",
        &gpudriver("sibling", &sibling, &installer(), &[]),
        &[format!("image {sibling} is not from an allowed registry")],
    );
}

/// Caches outside the owner's lists, each refused naming why.
fn assert_caches_outside_the_lists_are_refused(c: &Cluster) {
    // Caches outside the lists: (object name, what the test is, spec.cache,
    // what the refusal names).
    let a = "s3://gpu-driver-cache/cluster-a";
    for (gd_name, name, cache, want) in [
        (
            "other-bucket",
            "cache sibling",
            json!({"url": "s3://gpu-driver-cache/cluster-a-other"}),
            "is not an allowed cache",
        ),
        (
            "other-secret",
            "cache secret not allowed",
            json!({"url": a, "secretName": "operator-token"}),
            "cache.secretName operator-token is not an allowed Secret",
        ),
        (
            "other-writer",
            "cache write secret not allowed",
            json!({"url": a, "secretName": "gpu-driver-cache",
                "writeSecretName": "operator-token"}),
            "cache.writeSecretName operator-token is not an allowed write Secret",
        ),
        (
            "reader-as-writer",
            "a read Secret as the write Secret",
            json!({"url": a, "secretName": "gpu-driver-cache",
                "writeSecretName": "gpu-driver-cache"}),
            "cache.writeSecretName gpu-driver-cache is not an allowed write Secret",
        ),
        (
            "writer-as-reader",
            "the write Secret given to install Jobs",
            json!({"url": a, "secretName": "gpu-driver-cache-writer"}),
            "cache.secretName gpu-driver-cache-writer is not an allowed Secret",
        ),
        (
            "shared-secret",
            "one Secret in both lists, for both",
            json!({"url": a, "secretName": "shared", "writeSecretName": "shared"}),
            "cache.secretName shared is a write Secret",
        ),
        (
            "unplaced-builds",
            "a write Secret without build.nodeSelector",
            json!({"url": a, "secretName": "gpu-driver-cache",
                "writeSecretName": "gpu-driver-cache-writer"}),
            "cache.writeSecretName gpu-driver-cache-writer needs build.nodeSelector",
        ),
        (
            "http-cache",
            "plain-http cache",
            json!({"url": a, "allowHttp": true}),
            "cache.allowHttp",
        ),
    ] {
        let gd = with_cache(gpudriver(gd_name, &builder(), &installer(), &[]), cache);
        assert_refused(c, name, &gd, &[want.to_string()]);
    }
}

const JOB_POLICY: &str = "gpu-driver-jobs.gpu-driver.gardenlinux.io";
const NS: &str = "gpu-driver";

/// The Job the operator makes of `gd` for `role` (a Garden Linux 1877.3
/// target or node; for an install, its cached form when `cached`), as JSON.
fn operator_job(
    gd: &gpu_driver_operator::crd::GpuDriver,
    role: gpu_driver_operator::decide::JobRole,
    cached: bool,
) -> Value {
    use gpu_driver_operator::decide::{JobRole, Target};
    use gpu_driver_operator::job::{JobRequest, build};
    let target = Target {
        os_image: "Garden Linux 1877.3".into(),
        kernel: "6.12.44-cloud-amd64".into(),
        arch: "amd64".into(),
    };
    let sha = "ab".repeat(32);
    let image = builder();
    let req = match role {
        JobRole::Build => JobRequest::build("gpu-build-x", NS, &image, "k", &target),
        _ => {
            let mut r = JobRequest::node_job(role, "gpu-install-x", NS, "n1", &image, "k");
            if cached {
                r.expect_sha256 = Some(&sha);
                r.compile = false;
            }
            r
        }
    };
    serde_json::to_value(build(gd, &req)).unwrap()
}

/// `job` with one more volume (`source`, e.g. `{"secret": {...}}`) that
/// its installer container mounts, read-only or not.
fn with_volume(mut job: Value, name: &str, source: Value, read_only: bool) -> Value {
    let pod = &mut job["spec"]["template"]["spec"];
    let mut volume = json!({"name": name});
    for (k, v) in source.as_object().unwrap() {
        volume[k] = v.clone();
    }
    pod["volumes"].as_array_mut().unwrap().push(volume);
    pod["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": name, "mountPath": "/run/x", "readOnly": read_only}));
    job
}

/// The Job policy: the build Job of a GpuDriver with a signing Secret
/// (its tls Secret mounted read-only) is admitted, and so are its install
/// Jobs, which mount no Secret; an install Job that mounts one (a secret
/// volume, or a projected one with a secret source) is refused, and so is
/// a build Job whose Secret mount is writable. Jobs without the
/// operator's label are not its business. Without the policy all of them
/// are admitted.
#[test]
fn admission_policy_keeps_secret_volumes_to_build_jobs() {
    use gpu_driver_operator::decide::JobRole;
    let Some(c) = Cluster::start() else { return };
    c.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ));
    let mut spec = gpudriver("default", &builder(), &installer(), &[]);
    spec["spec"]["cache"] = json!({"url": "s3://gpu-driver-cache/cluster-a",
        "secretName": "gpu-driver-cache", "writeSecretName": "gpu-driver-cache-writer"});
    spec["spec"]["build"] = json!({"nodeSelector": {"pool": "build"},
        "signingSecretName": "gpu-driver-module-signing"});
    let mut gd: gpu_driver_operator::crd::GpuDriver = serde_json::from_value(spec).unwrap();
    gd.metadata.uid = Some("0b5c8f1e-0000-4000-8000-000000000000".into());

    let build_job = operator_job(&gd, JobRole::Build, false);
    let signing = &build_job["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v.get("secret").is_some())
        .expect("the build Job's signing volume")["secret"];
    assert_eq!(signing["secretName"], "gpu-driver-module-signing");
    let install = operator_job(&gd, JobRole::Install, false);
    let cached = operator_job(&gd, JobRole::Install, true);
    let secret = json!({"secret": {"secretName": "gpu-driver-module-signing"}});
    let projected = json!({"projected": {"sources": [
        {"secret": {"name": "gpu-driver-module-signing"}}]}});
    let refused = [
        (
            "install Job with a secret volume",
            with_volume(install.clone(), "signing", secret.clone(), true),
            "mounts Secret volumes [signing]",
        ),
        (
            "cached install Job with a projected secret",
            with_volume(cached.clone(), "keys", projected, true),
            "mounts Secret volumes [keys]",
        ),
        (
            "build Job with a writable Secret mount",
            with_volume(build_job.clone(), "more", secret.clone(), false),
            "containers [installer] mount a Secret volume without readOnly: true",
        ),
    ];
    let mut foreign = with_volume(install.clone(), "signing", secret, true);
    foreign["metadata"]["labels"] = json!({"app": "someone-else"});
    foreign["spec"]["template"]["metadata"]["labels"] = json!({"app": "someone-else"});
    let admitted = [
        ("build Job with the signing Secret", &build_job),
        ("install Job", &install),
        ("cached install Job", &cached),
        ("someone else's Job", &foreign),
    ];
    for (name, job, _) in &refused {
        if let Err(e) = admit(&c, job) {
            panic!("{name}: refused without the policy: {e}");
        }
    }

    c.apply(&repo_file("deploy/admission-policy.yaml"));
    let (first, first_job, _) = &refused[0];
    eventually("the Job policy is enforced", || {
        match admit(&c, first_job) {
            Ok(_) => Err(format!("{first} still admitted")),
            Err(e) if e.contains(JOB_POLICY) => Ok(()),
            Err(e) => Err(e),
        }
    });
    for (name, job, want) in &refused {
        assert_refused_by(&c, JOB_POLICY, name, job, &[want.to_string()]);
    }
    for (name, job) in admitted {
        if let Err(e) = admit(&c, job) {
            panic!("{name}: refused: {e}");
        }
    }
}
