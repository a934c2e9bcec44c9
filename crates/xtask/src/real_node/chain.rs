//! The chain on the node: the control plane, deploy/ and the device
//! plugin, the observer pod, the cold join (GpuDriver, build Job, install
//! Job), the Node's GPUs, the exporter and a GPU pod.

use std::fs;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::jobs::{flatten, s};
use super::kube::{ClusterEnv, Ctx, Kube, node};
use super::package::{ACCESS_KEY, Package, SECRET_KEY};
use super::vm::Images;
use super::{Args, Clock, Live, NODE, NS, log, manifests, now, secs};
use crate::cmd::{cmd, run};

/// Starts the control plane for the node's kubelet; it goes down by itself
/// once this process has exited.
pub(super) fn up(
    repo: &Path,
    args: &Args,
    out: &Path,
    bin: &Path,
    live: &mut Live,
    st: &mut Clock,
) -> Result<ClusterEnv> {
    st.stage(&format!(
        "control plane (scripts/local-cluster --kubelet {NODE})"
    ))?;
    let cluster = out.join("cluster");
    live.cluster = Some(cluster.clone());
    let status = cmd(repo.join("scripts/local-cluster"))
        .arg("up")
        .arg("--dir")
        .arg(&cluster)
        .args(["--port-base", &args.port_base.to_string(), "--k8s-bin"])
        .arg(bin)
        .args([
            "--kubelet",
            NODE,
            "--watch-pid",
            &std::process::id().to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .status()
        .context("starting scripts/local-cluster")?;
    if !status.success() {
        bail!("scripts/local-cluster up failed ({status})");
    }
    ClusterEnv::read(&cluster.join("cluster.env"))
}

/// What the cold join left to check and report.
#[derive(Default)]
pub(super) struct Cold {
    pub(super) node_ready_s: Value,
    pub(super) ready_at: f64,
    pub(super) selected_at: f64,
    pub(super) annotated_at: f64,
    pub(super) job_s: Value,
    pub(super) job_image: String,
    pub(super) job_args: String,
    /// The Node after the first install (node.json).
    pub(super) node: Value,
    pub(super) annotations: serde_json::Map<String, Value>,
    pub(super) outcome: String,
    pub(super) build_job_s: i64,
    pub(super) build_cache: &'static str,
    pub(super) package_from: String,
    pub(super) signer_sha256: String,
    pub(super) stored_signer: String,
    pub(super) install_mounts: String,
    pub(super) observer: Value,
    pub(super) seen: String,
    pub(super) allocatable_at: f64,
    pub(super) gpus_offered: String,
}

/// deploy/, the node Ready, the observer pod, the cold join and the
/// Node's GPUs.
pub(super) fn cold(
    ctx: &mut Ctx,
    repo: &Path,
    images: &Images,
    pkg: &Package,
    boot_start: f64,
    st: &mut Clock,
) -> Result<Cold> {
    deploy(ctx, repo, images, st)?;
    st.stage("node Ready")?;
    ctx.wait_for(&format!("Node {NODE} to be Ready"), |k| {
        Ok(k.node().is_some_and(|n| node::ready(&n)))
    })?;
    let ready_at = now();
    let node_ready_s = secs(boot_start, ready_at);
    log(&format!("node Ready {node_ready_s}s after QEMU started"));
    ctx.kube.run(&["get", "node", NODE, "-o", "wide"])?;

    st.stage("operator running on the node")?;
    let rollout = [
        "-n",
        NS,
        "rollout",
        "status",
        "deploy/gpu-driver-operator",
        "--timeout=5s",
    ];
    ctx.wait_for("the operator's pods", |k| Ok(k.succeeds(&rollout)))?;
    observer(ctx, images, st)?;
    st.stage("GpuDriver selects the node; the operator's install Job")?;
    let signer_sha256 = secrets(ctx, pkg)?;
    let mut c = super::jobs::join(ctx, images, signer_sha256)?;
    c.node_ready_s = node_ready_s;
    c.ready_at = ready_at;

    let observer_done = |k: &Kube| {
        Ok(k.poll(&["get", "pod", "driver-root-observer"])
            .is_some_and(|p| {
                !s(&p, "/status/containerStatuses/0/state/terminated/reason").is_empty()
            }))
    };
    ctx.wait_for("the observer pod to report", observer_done)?;
    c.observer = ctx.kube.json_to(
        &["get", "pod", "driver-root-observer"],
        &ctx.out.join("observer.json"),
    )?;
    c.seen = flatten(s(
        &c.observer,
        "/status/containerStatuses/0/state/terminated/message",
    ));
    log(&format!(
        "the observer pod sees /run/nvidia/driver: {}",
        c.seen
    ));

    st.stage("NVIDIA's device plugin registers; the Node offers nvidia.com/gpu")?;
    ctx.wait_for("nvidia.com/gpu in the Node's allocatable", |k| {
        Ok(k.node().is_some_and(|n| node::gpus(&n) == "1"))
    })?;
    c.allocatable_at = now();
    c.gpus_offered = node::gpus(&ctx.kube.json(&["get", "node", NODE])?).to_string();
    let plugins = ctx.kube.json(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=nvidia-device-plugin",
    ])?;
    log(&format!(
        "allocatable nvidia.com/gpu={} (plugin pod {})",
        c.gpus_offered,
        s(&plugins, "/items/0/metadata/name")
    ));
    Ok(c)
}

/// deploy/ with the built images, and NVIDIA's device plugin, which waits
/// for the ready label as beside the GPU Operator
/// (tests/real-node/nvidia-device-plugin.yaml says what differs).
fn deploy(ctx: &Ctx, repo: &Path, images: &Images, st: &mut Clock) -> Result<()> {
    st.stage(&format!(
        "deploy/ (operator from {})",
        images.name("operator")?
    ))?;
    let overlay = ctx.out.join("overlay");
    fs::create_dir_all(&overlay)?;
    let rel = relative(
        &fs::canonicalize(repo.join("deploy"))?,
        &fs::canonicalize(&overlay)?,
    );
    let k = manifests::overlay(
        &rel.to_string_lossy(),
        images.name("operator")?,
        images.name("exporter")?,
    );
    fs::write(overlay.join("kustomization.yaml"), k)?;
    let deploy_yaml = ctx.out.join("deploy.yaml");
    let rendered = ctx.kube.read(&["kustomize", &overlay.to_string_lossy()])?;
    fs::write(&deploy_yaml, format!("{rendered}\n"))?;
    ctx.kube.run(&[
        "apply",
        "--server-side",
        "-f",
        &deploy_yaml.to_string_lossy(),
    ])?;
    let plugin = fs::read_to_string(repo.join("tests/real-node/nvidia-device-plugin.yaml"))?
        .replace("@IMAGE@", images.name("nvidia-device-plugin")?);
    let plugin_yaml = ctx.out.join("device-plugin.yaml");
    fs::write(&plugin_yaml, plugin)?;
    ctx.kube
        .run(&["apply", "-f", &plugin_yaml.to_string_lossy()])
}

/// `path` relative to the directory `base` (both absolute).
fn relative(path: &Path, base: &Path) -> PathBuf {
    let p: Vec<Component> = path.components().collect();
    let b: Vec<Component> = base.components().collect();
    let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut r: PathBuf = b[common..].iter().map(|_| "..").collect();
    r.extend(&p[common..]);
    r
}

/// The observer pod (/run/nvidia/driver, HostToContainer), started before
/// any install.
fn observer(ctx: &mut Ctx, images: &Images, st: &mut Clock) -> Result<()> {
    st.stage("observer pod (/run/nvidia/driver, HostToContainer)")?;
    let f = ctx.out.join("observer.yaml");
    fs::write(&f, manifests::observer(images.name("builder-bookworm")?))?;
    ctx.kube.run(&["apply", "-f", &f.to_string_lossy()])?;
    let wait = [
        "wait",
        "--for=condition=Ready",
        "pod/driver-root-observer",
        "--timeout=5s",
    ];
    ctx.wait_for("the observer pod", |k| Ok(k.succeeds(&wait)))?;
    let pod = ctx.kube.json(&["get", "pod", "driver-root-observer"])?;
    log(&format!(
        "observer running since {}",
        s(&pod, "/status/containerStatuses/0/state/running/startedAt")
    ));
    Ok(())
}

/// The NFD label, the catalog ConfigMap, the store's Secrets and the
/// module-signing key pair; returns the certificate's SHA-256.
fn secrets(ctx: &Ctx, pkg: &Package) -> Result<String> {
    let k = &ctx.kube;
    // As NFD's master labels a node with an NVIDIA PCI device (vendor 10de).
    k.run(&[
        "label",
        "node",
        NODE,
        "feature.node.kubernetes.io/pci-10de.present=true",
    ])?;
    let catalog = format!(
        "--from-file=catalog.toml={}",
        ctx.out.join("catalog.toml").display()
    );
    k.run(&[
        "-n",
        NS,
        "create",
        "configmap",
        "real-node-catalog",
        &catalog,
    ])?;
    // The store's credentials: the build Job writes, install Jobs read (one
    // key pair on this test server; --cache-read-only is what keeps
    // installs from writing). Pods reach the host's loopback at 10.0.2.2.
    let endpoint = format!(
        "--from-literal=AWS_ENDPOINT_URL=http://10.0.2.2:{}",
        pkg.s3_port
    );
    let (id, key) = (
        format!("--from-literal=AWS_ACCESS_KEY_ID={ACCESS_KEY}"),
        format!("--from-literal=AWS_SECRET_ACCESS_KEY={SECRET_KEY}"),
    );
    for secret in ["cache-writer", "cache-reader"] {
        let region = "--from-literal=AWS_REGION=us-east-1";
        k.run(&[
            "-n", NS, "create", "secret", "generic", secret, &endpoint, &id, &key, region,
        ])?;
    }
    signing_secret(ctx)
}

/// The module-signing key pair as a `kubernetes.io/tls` Secret; returns
/// the certificate's SHA-256.
fn signing_secret(ctx: &Ctx) -> Result<String> {
    let k = &ctx.kube;
    // The module-signing key pair (Secure Boot, docs/secure-boot.md): only
    // the build Job mounts it. The VM does not boot with Secure Boot, so
    // the signed module loads as any other; what this proves is the
    // Secret's way into a real build pod (non-root, fsGroup) and sign-file
    // in the builder image. scripts/vm-test-secureboot proves the signature.
    let dir = ctx.out.join("signing");
    fs::create_dir_all(&dir)?;
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    run(cmd("openssl")
        .args([
            "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=gpu-driver real-node signing/", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .stderr(std::process::Stdio::null()))?;
    let der = cmd("openssl")
        .args(["x509", "-in"])
        .arg(&crt)
        .args(["-outform", "DER"])
        .output()
        .context("starting openssl x509")?;
    if !der.status.success() || der.stdout.is_empty() {
        bail!("openssl x509 -in {} -outform DER failed", crt.display());
    }
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&der.stdout));
    let (c, kf) = (
        format!("--cert={}", crt.display()),
        format!("--key={}", key.display()),
    );
    k.run(&[
        "-n",
        NS,
        "create",
        "secret",
        "tls",
        "module-signing",
        &c,
        &kf,
    ])?;
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    #[test]
    fn relates_paths() {
        let r = |p: &str, b: &str| super::relative(Path::new(p), Path::new(b));
        assert_eq!(
            r("/work/main/deploy", "/work/main/target/real-node/overlay"),
            PathBuf::from("../../../deploy")
        );
        assert_eq!(
            r("/work/main/deploy", "/tmp/rn-port/overlay"),
            PathBuf::from("../../../work/main/deploy")
        );
    }
}
