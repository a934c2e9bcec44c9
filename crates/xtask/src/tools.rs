//! The programs the tests run beside ours, built once and cached by their
//! inputs: the Kubernetes control plane, helm, Prometheus's OpenMetrics
//! parser, NVIDIA's device plugin (all from the Go module proxy) and the S3
//! server (from crates.io).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::cache::{Cache, KeyInputs};
use crate::cmd::{cmd, is_executable, read, run};
use crate::go::{Go, required_version};

/// Bump to rebuild every cached control plane when the recipe changes.
const K8S_RECIPE: u32 = 1;
const K8S_BINS: [&str; 7] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kwok",
];
/// The newest 3.x the Go module proxy served when chosen.
const HELM_VERSION: &str = "v3.22.0";
/// The newest version the Go module proxy serves by exact version
/// (docs/gpu-double.md); its go.mod has no replace directives, so
/// `go install pkg@VERSION` builds with NVIDIA's own go.sum.
const DEVICE_PLUGIN_VERSION: &str = "v0.19.3";
const DEVICE_PLUGIN_MODULE: &str = "github.com/NVIDIA/k8s-device-plugin";
/// s3s-fs: a real S3 server over a directory (SigV4, ListObjectsV2,
/// conditional PUTs, which the cache's lease protocol uses); Apache-2.0.
const S3S_FS_VERSION: &str = "0.14.1";

/// Files under `dir` named like Go sources and module files, as
/// `./relative` paths in byte order (the control plane's key inputs).
fn go_inputs(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == "go.mod" || n == "go.sum" || n.ends_with(".go"))
            {
                let rel = p.strip_prefix(dir)?.to_string_lossy().into_owned();
                out.push(format!("./{rel}"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
/// the VM node's kubelet (tools/k8s/kubernetes) and KWOK: the directory
/// holding them. `cached_only` answers from a finished build or fails,
/// never compiling (20 minutes and more on 2 cores).
pub fn k8s(repo: &Path, cache: &Cache, cached_only: bool) -> Result<PathBuf> {
    let tools = repo.join("tools/k8s");
    let go = Go::find(cache)?;
    let key = KeyInputs::default()
        .line(format!("recipe {K8S_RECIPE}"))
        .line(go.version()?)
        .files(&tools, &go_inputs(&tools)?)?
        .key();
    let entry = cache.entry("k8s", &key)?;
    let complete = |d: &Path| K8S_BINS.iter().all(|b| is_executable(&d.join(b)));
    if entry.is_complete() && complete(entry.path()) {
        eprintln!("k8s binaries cached (key {key})");
        return Ok(entry.path().to_path_buf());
    }
    if cached_only {
        bail!("no finished k8s build for key {key}: run `cargo xtask tool k8s`");
    }
    let (kver, ldflags) = k8s_ldflags(&tools)?;
    entry.fill(|tmp| {
        eprintln!(
            "building k8s binaries (key {key}, kubernetes {kver}) into {}",
            entry.path().display()
        );
        for m in ["kubernetes", "etcd", "kwok"] {
            run(go
                .go(&tools.join(m), false, &["mod", "download"])
                .env("GOFLAGS", "-mod=readonly"))?;
        }
        // The control plane and the kubelet in one `go build`, so the
        // packages they share compile once; etcd and KWOK each from their
        // own wrapper module.
        let builds = [
            (
                "kubernetes",
                ldflags.as_str(),
                format!("{}/", tmp.display()),
                "./cmd/...",
            ),
            (
                "etcd",
                "-s -w",
                tmp.join("etcd").display().to_string(),
                "go.etcd.io/etcd/server/v3",
            ),
            (
                "kwok",
                "-s -w",
                tmp.join("kwok").display().to_string(),
                "sigs.k8s.io/kwok/cmd/kwok",
            ),
        ];
        for (module, flags, out, pkg) in &builds {
            let args = ["build", "-trimpath", "-ldflags", flags, "-o", out, pkg];
            run(&mut go.go(&tools.join(module), false, &args))?;
        }
        run(cmd(tmp.join("kube-apiserver")).arg("--version"))?;
        if !complete(tmp) {
            bail!("the k8s build left out one of {}", K8S_BINS.join(", "));
        }
        Ok(())
    })
}

/// The Kubernetes release the wrapper module pins, and the linker flags
/// that stamp it: tools parse --version and /version, and need the real
/// release rather than v0.0.0-master.
fn k8s_ldflags(tools: &Path) -> Result<(String, String)> {
    let go_mod = std::fs::read_to_string(tools.join("kubernetes/go.mod"))?;
    let kver = required_version(&go_mod, "k8s.io/kubernetes")
        .context("no k8s.io/kubernetes version in tools/k8s/kubernetes/go.mod")?;
    let mut parts = kver.trim_start_matches('v').split('.');
    let (major, minor) = (parts.next().unwrap_or("1"), parts.next().unwrap_or("0"));
    let v = "k8s.io/component-base/version";
    let ldflags = format!(
        "-s -w -X {v}.gitVersion={kver} -X {v}.gitMajor={major} -X {v}.gitMinor={minor} \
         -X {v}.gitTreeState=clean -X {v}.buildDate=1970-01-01T00:00:00Z"
    );
    Ok((kver, ldflags))
}

/// A real helm 3, built with Helm's own go.mod and go.sum and the ldflags
/// of its Makefile (the version, and the Kubernetes version `lint` and
/// `template` assume: client-go's minor).
pub fn helm(cache: &Cache) -> Result<PathBuf> {
    let go = Go::find(cache)?;
    let key = KeyInputs::default()
        .line(format!("helm {HELM_VERSION}"))
        .line(go.version()?)
        .key();
    let entry = cache.entry("helm", &key)?;
    let dir = entry.fill(|tmp| {
        let json = read(&mut go.go(
            Path::new("."),
            false,
            &[
                "mod",
                "download",
                "-json",
                &format!("helm.sh/helm/v3@{HELM_VERSION}"),
            ],
        ))?;
        let dir: serde_json::Value =
            serde_json::from_str(&json).context("go mod download -json")?;
        let src = PathBuf::from(
            dir["Dir"]
                .as_str()
                .context("go mod download named no Dir")?,
        );
        let go_mod = std::fs::read_to_string(src.join("go.mod"))?;
        let client_go = required_version(&go_mod, "k8s.io/client-go")
            .context("no k8s.io/client-go in helm's go.mod")?;
        let minor = client_go
            .trim_start_matches("v0.")
            .split('.')
            .next()
            .unwrap_or_default()
            .to_string();
        let mut ldflags = format!(
            "-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION} \
             -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
        );
        for p in [
            "helm.sh/helm/v3/pkg/lint/rules",
            "helm.sh/helm/v3/pkg/chartutil",
        ] {
            ldflags.push_str(&format!(
                " -X {p}.k8sVersionMajor=1 -X {p}.k8sVersionMinor={minor}"
            ));
        }
        let pkg = format!("helm.sh/helm/v3/cmd/helm@{HELM_VERSION}");
        run(go
            .go(
                Path::new("."),
                false,
                &["install", "-trimpath", "-ldflags", &ldflags, &pkg],
            )
            .env("GOBIN", tmp))?;
        run(cmd(tmp.join("helm")).arg("version"))
    })?;
    Ok(dir.join("helm"))
}

/// tools/om-parser: Prometheus's own OpenMetrics parser behind a small
/// main, so that what a Prometheus server accepts is checked by its code.
pub fn om_parser(repo: &Path, cache: &Cache) -> Result<PathBuf> {
    let go = Go::find(cache)?;
    let src = repo.join("tools/om-parser");
    let key = KeyInputs::default()
        .line(go.version()?)
        .files(&src, &["go.mod".into(), "go.sum".into(), "main.go".into()])?
        .key();
    let entry = cache.entry("om-parser", &key)?;
    let dir = entry.fill(|tmp| {
        let out = tmp.join("om-parser").to_string_lossy().into_owned();
        run(&mut go.go(
            &src,
            false,
            &["build", "-mod=readonly", "-trimpath", "-o", &out, "."],
        ))
    })?;
    Ok(dir.join("om-parser"))
}

/// NVIDIA's device plugin and the kubelet double of tools/device-plugin:
/// the directory holding bin/nvidia-device-plugin and bin/kubelet-double.
pub fn device_plugin(repo: &Path, cache: &Cache) -> Result<PathBuf> {
    let go = Go::find(cache)?;
    let src = repo.join("tools/device-plugin");
    let key = KeyInputs::default()
        .line(format!("{DEVICE_PLUGIN_MODULE} {DEVICE_PLUGIN_VERSION}"))
        .line(go.version()?)
        .files(
            &src,
            &[
                "go.mod".into(),
                "go.sum".into(),
                "kubelet-double/main.go".into(),
            ],
        )?
        .key();
    let entry = cache.entry("device-plugin", &key)?;
    entry.fill(|tmp| {
        let bin = tmp.join("bin");
        std::fs::create_dir_all(&bin)?;
        // As NVIDIA's Makefile: the version stamp and its extldflags; go-nvml
        // dlopens NVML through cgo.
        let ldflags = format!(
            "-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files' \
             -X {DEVICE_PLUGIN_MODULE}/internal/info.version={DEVICE_PLUGIN_VERSION}"
        );
        let pkg = format!("{DEVICE_PLUGIN_MODULE}/cmd/nvidia-device-plugin@{DEVICE_PLUGIN_VERSION}");
        run(go.go(tmp, true, &["install", "-trimpath", "-ldflags", &ldflags, &pkg]).env("GOBIN", &bin))?;
        let double = bin.join("kubelet-double").to_string_lossy().into_owned();
        run(&mut go.go(&src, false, &["build", "-mod=readonly", "-trimpath", "-ldflags", "-s -w", "-o", &double, "./kubelet-double"]))?;
        run(cmd(bin.join("nvidia-device-plugin")).arg("--version"))
    })
}

/// The S3 server the cache tests run against.
pub fn s3_server(cache: &Cache) -> Result<PathBuf> {
    let key = KeyInputs::default()
        .line(format!(
            "s3s-fs {S3S_FS_VERSION} --features binary --locked"
        ))
        .key();
    let entry = cache.entry("s3s-fs", &key)?;
    let dir = entry.fill(|tmp| {
        let target = tmp.join("build");
        // Its own target dir: the project's build cache is not mixed with it.
        run(cmd("cargo")
            .args(["install", "--quiet", "--locked", "--root"])
            .arg(tmp)
            .arg("--target-dir")
            .arg(&target)
            .args([
                "s3s-fs",
                "--version",
                &format!("={S3S_FS_VERSION}"),
                "--features",
                "binary",
            ]))?;
        crate::cache::remove(&target)
    })?;
    Ok(dir.join("bin/s3s-fs"))
}
