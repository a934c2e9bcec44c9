//! The test pipeline (`cargo xtask test`, behind `scripts/test`) and CI's
//! set-up before it (`cargo xtask ci-setup`, in `.ci/run`): lints, the tools the tests need,
//! the integration tests, real compiles, the VM tests and the real node, in
//! stages that time themselves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::apt;
use crate::cache::Cache;
use crate::cmd::{cmd, read, read_last_line, run};
use crate::stages::Stages;
use crate::static_build::{self, Arch};
use crate::tools;
use crate::toolsfile::Tools;

/// Groups a user may skip outside CI (`GPU_DRIVER_SKIP=cluster,helm`).
const GROUPS: [&str; 6] = ["cluster", "helm", "s3", "compile", "vm", "real-node"];
const SUITES: [&str; 3] = ["bookworm", "trixie", "bookworm-arm64"];

pub struct Run {
    repo: PathBuf,
    cache: Cache,
    stages: Stages,
    tools: Tools,
    tools_file: PathBuf,
    target: PathBuf,
}

impl Run {
    /// `stages` names the run's timings file under `target/xtask/`.
    pub fn new(repo: &Path, stages: &str) -> Result<Self> {
        let target = static_build::target_dir(repo)?;
        let xt = target.join("xtask");
        Ok(Self {
            repo: repo.to_path_buf(),
            cache: Cache::resolve()?,
            stages: Stages::new(&xt.join(format!("{stages}.json")))?,
            tools: Tools {
                skip: skipped()?,
                ..Tools::default()
            },
            tools_file: xt.join("tools.json"),
            target,
        })
    }

    pub fn table(&self) -> String {
        self.stages.table()
    }

    fn skips(&self, group: &str) -> bool {
        self.tools.skip.iter().any(|g| g == group)
    }

    fn save_tools(&self) -> Result<()> {
        self.tools.write(&self.tools_file)
    }

    /// `.ci/run`'s set-up before it runs `scripts/test`: every package,
    /// the toolchain, the cache's disk use.
    pub fn ci_setup(&mut self) -> Result<()> {
        self.stages.run("apt packages", || {
            apt::ensure(&[
                apt::TEST,
                apt::ROOTS,
                apt::VM,
                apt::CROSS_ARM64,
                apt::VM_ARM64,
            ])
        })?;
        self.stages.run("toolchain", || {
            run(cmd("cargo").arg("--version"))?;
            let _ = cmd("rustup")
                .args(["component", "add", "clippy", "rustfmt"])
                .output();
            Ok(())
        })?;
        let cache = &self.cache;
        self.stages.run("disk", || {
            // The CI machine's cache outlives the clone: before any stage
            // fills the disk, entries no run used for two days go.
            cache.prune_unused(
                &[
                    "k8s",
                    "helm",
                    "device-plugin",
                    "om-parser",
                    "s3s-fs",
                    "node",
                    "images",
                ],
                Duration::from_secs(2 * 24 * 3600),
            )?;
            let du = read(cmd("du").args(["-xsm"]).arg(cache.root()))?;
            let mib = du.split_whitespace().next().unwrap_or("?");
            eprintln!("cache: {mib} MiB in {}", cache.root().display());
            Ok(())
        })
    }

    /// `scripts/test`.
    pub fn test(&mut self) -> Result<()> {
        let repo = self.repo.clone();
        self.stages.run("tools", || apt::ensure(&[apt::TEST]))?;
        self.stages.run("cargo fmt --check", || {
            run(cmd("cargo")
                .current_dir(&repo)
                .args(["fmt", "--all", "--check"]))
        })?;
        self.stages.run("cargo clippy", || {
            run(cmd("cargo").current_dir(&repo).args([
                "clippy",
                "--locked",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))
        })?;
        self.prepare_tools()?;
        self.unit_and_cluster_tests()?;
        self.compile_and_vm_tests()?;
        self.real_node()
    }

    fn prepare_tools(&mut self) -> Result<()> {
        let (repo, cache) = (self.repo.clone(), &self.cache);
        let optional = |group: &str| -> bool { self.tools.skip.iter().any(|g| g == group) };
        let (skip_s3, skip_cluster, skip_helm, skip_compile) = (
            optional("s3"),
            optional("cluster"),
            optional("helm"),
            optional("compile"),
        );
        if !skip_s3 {
            self.tools.s3_server = Some(
                self.stages
                    .run("S3 server (s3s-fs)", || tools::s3_server(cache))?,
            );
        }
        self.tools.test_data = Some(self.stages.run("test data", || {
            read_last_line(
                cmd(repo.join("scripts/fetch-test-data")).env("GPU_DRIVER_CACHE", cache.root()),
            )
            .map(PathBuf::from)
        })?);
        if !skip_cluster {
            self.tools.k8s_bin = Some(self.stages.run("kubernetes control plane", || {
                tools::k8s(&repo, cache, false)
            })?);
        }
        if !skip_helm {
            self.tools.helm = Some(self.stages.run("helm", || tools::helm(cache))?);
        }
        self.tools.om_parser = Some(self.stages.run("Prometheus's OpenMetrics parser", || {
            tools::om_parser(&repo, cache)
        })?);
        self.tools.device_plugin = Some(self.stages.run("NVIDIA's device plugin", || {
            tools::device_plugin(&repo, cache)
        })?);
        self.save_tools()?;
        if !skip_compile {
            let roots = self
                .stages
                .run("builder roots", || builder_roots(&repo, cache))?;
            self.tools.test_runfile = Some(self.stages.run("test .run", || {
                read_last_line(
                    cmd(repo.join("scripts/test-runfile"))
                        .arg(roots.join("bookworm"))
                        .env("GPU_DRIVER_CACHE", cache.root()),
                )
                .map(PathBuf::from)
            })?);
            self.tools.builder_roots = Some(roots);
        }
        let bin = self.stages.run("static release binaries", || {
            let bins = static_build::build(
                &repo,
                &["gpu-driver-installer", "gpu-driver-operator"],
                Arch::X86_64,
            )?;
            leak_check(&repo)?;
            Ok(bins[0].clone())
        })?;
        self.tools.static_bin = Some(bin);
        self.save_tools()
    }

    /// `cargo test ARGS` with the tools file and the cache root.
    fn cargo_test(&self) -> impl Fn(&[&str]) -> Result<()> + use<> {
        let (repo, tools, cache) = (
            self.repo.clone(),
            self.tools_file.clone(),
            self.cache.root().to_path_buf(),
        );
        move |args| {
            run(cmd("cargo")
                .current_dir(&repo)
                .args(["test", "--locked"])
                .args(args)
                .env("GPU_DRIVER_TOOLS", &tools)
                .env("GPU_DRIVER_CACHE", &cache))
        }
    }

    fn unit_and_cluster_tests(&mut self) -> Result<()> {
        let test = self.cargo_test();
        // Includes the operator's tests against the real control plane, the
        // admission policy, the manifest checks and the Helm chart.
        self.stages.run("cargo test", || {
            test(&["--workspace", "--", "--skip", "compile_"])
        })?;
        let (repo, bin, data, s3) = (
            self.repo.clone(),
            self.tools.static_bin.clone(),
            self.tools.test_data.clone(),
            self.tools.s3_server.clone(),
        );
        if !crate::apt::is_root() || s3.is_none() {
            return self.stages.skip(
                "static binary in an empty root",
                "needs root and the S3 server",
            );
        }
        self.stages.run("static binary in an empty root", || {
            let work = self.target.join("xtask/jail");
            crate::jail::check(
                &repo,
                &work,
                &bin.context("static binary")?,
                &s3.context("s3")?,
                &data.context("test data")?,
            )
        })
    }

    fn compile_and_vm_tests(&mut self) -> Result<()> {
        if self.skips("compile") {
            return self.stages.skip(
                "compile tests, matrix and VM tests",
                "GPU_DRIVER_SKIP=compile",
            );
        }
        let keep = self.target.join("compile-artifacts");
        crate::cache::remove(&keep)?;
        self.tools.keep_artifacts = Some(keep.clone());
        self.save_tools()?;
        let test = self.cargo_test();
        // Real NVIDIA compiles in the builder roots (minutes each), the arm64
        // cross compile among them: its artifact feeds the arm64 VM test.
        // `--workspace` as in the first run: `-p` alone would resolve other
        // dependency features and compile the test binary a second time.
        self.stages.run("compile tests (builder roots)", || {
            test(&[
                "--workspace",
                "--test",
                "it",
                "build::compile_",
                "--",
                "--nocapture",
            ])
        })?;
        let (repo, target) = (self.repo.clone(), self.target.clone());
        let roots = self.tools.builder_roots.clone().context("builder roots")?;
        let bin = self.tools.static_bin.clone().context("static binary")?;
        let (ko, signed, keys) = self.stages.run("build matrix (bookworm/open)", || {
            matrix(&repo, &target, &roots, &bin)
        })?;
        if self.skips("vm") {
            return self.stages.skip("VM tests", "GPU_DRIVER_SKIP=vm");
        }
        apt::ensure(&[apt::VM])?;
        let cache = self.cache.root().to_path_buf();
        self.stages
            .run("VM test (Debian's cloud kernel under QEMU)", || {
                run(cmd(repo.join("scripts/vm-test"))
                    .arg(&ko)
                    .env("GPU_DRIVER_CACHE", &cache))
            })?;
        self.stages.run("Secure Boot VM test", || {
            run(cmd(repo.join("scripts/vm-test-secureboot"))
                .arg(&signed)
                .arg(keys.join("mok.key"))
                .arg(keys.join("mok.crt"))
                .env("GPU_DRIVER_CACHE", &cache))
        })?;
        let arm64 = keep.join("bookworm-arm64-open.tar.zst");
        if !arm64.is_file() {
            bail!("the arm64 compile test left no {}", arm64.display());
        }
        apt::ensure(&[apt::VM_ARM64])?;
        self.stages.run("arm64 VM test (emulated arm64)", || {
            run(cmd(repo.join("scripts/vm-test-arm64"))
                .arg(&arm64)
                .env("GPU_DRIVER_CACHE", self.cache.root()))
        })
    }

    fn real_node(&mut self) -> Result<()> {
        if self.skips("real-node") {
            return self.stages.skip("real node", "GPU_DRIVER_SKIP=real-node");
        }
        let (repo, out) = (self.repo.clone(), self.target.join("real-node-result"));
        let cache = self.cache.root().to_path_buf();
        self.stages.run(
            "real node (the whole chain on a VM node over the GPU double)",
            || {
                std::fs::create_dir_all(&out)?;
                let result = read_last_line(
                    cmd(repo.join("scripts/real-node")).env("GPU_DRIVER_CACHE", &cache),
                )?;
                std::fs::write(out.join("result.json"), &result)?;
                eprintln!("{result}");
                Ok(())
            },
        )
    }
}

/// `GPU_DRIVER_SKIP`: ignored, with a warning, under CI, where nothing may
/// be skipped.
fn skipped() -> Result<Vec<String>> {
    let v = std::env::var("GPU_DRIVER_SKIP").unwrap_or_default();
    let groups: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(String::from)
        .collect();
    if let Some(bad) = groups.iter().find(|g| !GROUPS.contains(&g.as_str())) {
        bail!(
            "GPU_DRIVER_SKIP names an unknown group {bad:?} (known: {})",
            GROUPS.join(", ")
        );
    }
    if std::env::var("CI").as_deref() == Ok("true") && !groups.is_empty() {
        eprintln!("warning: GPU_DRIVER_SKIP={v} is ignored under CI=true");
        return Ok(Vec::new());
    }
    Ok(groups)
}

/// The builder roots (bookworm, trixie, the arm64 cross root), linked as
/// `<cache>/builder-roots/<suite>`; job directories a killed run left in
/// them are deleted once they are three hours old.
fn builder_roots(repo: &Path, cache: &Cache) -> Result<PathBuf> {
    apt::ensure(&[apt::ROOTS])?;
    let links = cache.dir("builder-roots")?;
    for suite in SUITES {
        run(cmd(repo.join("scripts/builder-root"))
            .arg("--link")
            .arg(&links)
            .arg(suite)
            .env("GPU_DRIVER_CACHE", cache.root()))?;
        let root = std::fs::canonicalize(links.join(suite))?;
        if !root.join(".gpu-driver-root.json").is_file() {
            bail!("{} is not a builder root", root.display());
        }
        let dev = root.join("build-dev");
        if dev.is_dir() {
            run(cmd("find").arg(&dev).args([
                "-mindepth",
                "1",
                "-maxdepth",
                "1",
                "-mmin",
                "+180",
                "-print",
                "-exec",
                "rm",
                "-rf",
                "--one-file-system",
                "{}",
                "+",
            ]))?;
        }
    }
    Ok(links)
}

/// The installer's crate links the wire contract only: none of the
/// operator's Kubernetes client, nor the exporter's NVML and gRPC crates.
fn leak_check(repo: &Path) -> Result<()> {
    const FORBIDDEN: &[&str] = &[
        "gpu-driver-operator",
        "gpu-driver-exporter",
        "gpu-driver-serve",
        "axum",
        "kube",
        "kube-client",
        "kube-runtime",
        "k8s-openapi",
        "nvml-wrapper",
        "libloading",
        "tonic",
        "prost",
        "protox",
        "tonic-prost-build",
    ];
    let tree = read(cmd("cargo").current_dir(repo).args([
        "tree",
        "--locked",
        "-p",
        "gpu-driver-installer",
        "--edges",
        "normal,build",
        "--prefix",
        "none",
    ]))?;
    let leaked: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| FORBIDDEN.contains(n))
        .collect();
    if !leaked.is_empty() {
        bail!("the installer depends on: {}", leaked.join(", "));
    }
    Ok(())
}

/// One real compile through the matrix, signed with a fresh test key that
/// the Secure Boot VM test enrolls as its Machine Owner Key. Returns the
/// unpacked modules, the signed artifact and the key directory.
fn matrix(
    repo: &Path,
    target: &Path,
    roots: &Path,
    bin: &Path,
) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let keys = target.join("secureboot-keys");
    crate::cache::remove(&keys)?;
    std::fs::create_dir_all(&keys)?;
    run(cmd("openssl")
        .args([
            "req",
            "-new",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=gpu-driver CI test MOK/",
        ])
        .arg("-keyout")
        .arg(keys.join("mok.key"))
        .arg("-out")
        .arg(keys.join("mok.crt"))
        .stderr(std::process::Stdio::null()))?;
    run(cmd(repo.join("scripts/matrix"))
        .args([
            "--suites",
            "bookworm",
            "--flavors",
            "open",
            "--keep",
            "--binary",
        ])
        .arg(bin)
        .arg("--signing-key")
        .arg(keys.join("mok.key"))
        .arg("--signing-cert")
        .arg(keys.join("mok.crt"))
        .arg("--out")
        .arg(target.join("matrix")))?;
    let out = std::fs::canonicalize(roots.join("bookworm"))?.join("matrix-out/bookworm-open");
    let artifact = std::fs::read_dir(&out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".tar.zst"))
        .with_context(|| format!("no artifact in {}", out.display()))?;
    let signed = keys.join("nvidia-signed.tar.zst");
    std::fs::copy(&artifact, &signed)?;
    let ko = target.join("vm-nvidia");
    crate::cache::remove(&ko)?;
    std::fs::create_dir_all(&ko)?;
    unpack_modules(&artifact, &ko)?;
    Ok((ko, signed, keys))
}

/// The artifact's `modules/*.ko`, flat in `dest`.
pub fn unpack_modules(artifact: &Path, dest: &Path) -> Result<()> {
    let zstd = cmd("zstd")
        .arg("-dc")
        .arg(artifact)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let st = cmd("tar")
        .arg("-x")
        .arg("-C")
        .arg(dest)
        .args(["--strip-components=1", "modules/"])
        .stdin(zstd.stdout.context("zstd's stdout")?)
        .status()?;
    if !st.success() {
        bail!(
            "unpacking the modules of {} failed ({st})",
            artifact.display()
        );
    }
    Ok(())
}
