//! The tools and data the tests run with, from the one file the test
//! runner writes (`cargo xtask test`, or `scripts/test`): its path is in
//! `GPU_DRIVER_TOOLS`, a JSON object of optional fields. Unset means `{}`:
//! the tests that need a tool then fail saying how to get it (or skip, for
//! a group in `skip`). Host tools on `PATH` (makeself, compressors, a
//! compiler) are checked by [`require_tool`]: a test that needs one fails
//! saying how to install it, never passes silently.

use std::path::PathBuf;
use std::sync::OnceLock;

use serde::Deserialize;

/// The variable naming the tools file.
pub const VAR: &str = "GPU_DRIVER_TOOLS";

/// What a test says when a tool is missing: who writes the file.
pub const HOW: &str = "run `cargo xtask test` (or `scripts/test`), which writes GPU_DRIVER_TOOLS";

/// The file's fields. Strings keep the meaning the runner gives them; an
/// empty one counts as absent.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tools {
    k8s_bin: Option<String>,
    helm: Option<String>,
    s3_server: Option<String>,
    test_data: Option<String>,
    om_parser: Option<String>,
    device_plugin: Option<String>,
    builder_roots: Option<String>,
    test_runfile: Option<String>,
    static_bin: Option<String>,
    keep_artifacts: Option<String>,
    vm_release: Option<String>,
    vm_log: Option<String>,
    vm_foreign: Option<String>,
    vm_arm64_log: Option<String>,
    sb_log: Option<String>,
    sb_mok: Option<String>,
    sb_other: Option<String>,
    #[serde(default)]
    keep_failed_jobs: bool,
    #[serde(default)]
    skip: Vec<Group>,
}

/// The test groups the runner may ask to skip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    Cluster,
    Helm,
    S3,
    Compile,
}

/// The file, read once.
pub fn tools() -> &'static Tools {
    static TOOLS: OnceLock<Tools> = OnceLock::new();
    TOOLS.get_or_init(|| match std::env::var_os(VAR).filter(|p| !p.is_empty()) {
        None => Tools::default(),
        Some(p) => {
            let path = PathBuf::from(p);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{VAR}={}: {e}", path.display()));
            serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{VAR}={}: not the tools file: {e}", path.display()))
        }
    })
}

fn path(v: &Option<String>) -> Option<PathBuf> {
    v.as_deref().filter(|s| !s.is_empty()).map(PathBuf::from)
}

fn text(v: &Option<String>) -> String {
    v.clone().unwrap_or_default()
}

/// `CI=true`: tests that could skip must run.
pub fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

impl Tools {
    /// The control plane's binaries (etcd, kube-apiserver, kubectl, ...).
    pub fn k8s_bin(&self) -> Option<PathBuf> {
        path(&self.k8s_bin)
    }
    pub fn helm(&self) -> Option<PathBuf> {
        path(&self.helm)
    }
    /// The s3s-fs binary.
    pub fn s3_server(&self) -> Option<PathBuf> {
        path(&self.s3_server)
    }
    /// scripts/fetch-test-data's directory.
    pub fn test_data(&self) -> Option<PathBuf> {
        path(&self.test_data)
    }
    /// Prometheus's OpenMetrics parser (tools/om-parser).
    pub fn om_parser(&self) -> Option<PathBuf> {
        path(&self.om_parser)
    }
    /// The NVIDIA device plugin's directory (`cargo xtask tool device-plugin`).
    pub fn device_plugin(&self) -> Option<PathBuf> {
        path(&self.device_plugin)
    }
    /// The directory of the Debian builder roots.
    pub fn builder_roots(&self) -> Option<PathBuf> {
        path(&self.builder_roots)
    }
    /// scripts/test-runfile's `.run`.
    pub fn test_runfile(&self) -> Option<PathBuf> {
        path(&self.test_runfile)
    }
    /// The static installer for the builder roots' chroot.
    pub fn static_bin(&self) -> Option<PathBuf> {
        path(&self.static_bin)
    }
    /// Where the compile tests copy their artifacts.
    pub fn keep_artifacts(&self) -> Option<PathBuf> {
        path(&self.keep_artifacts)
    }
    /// Keep a failed compile job's directory for a look.
    pub fn keep_failed_jobs(&self) -> bool {
        self.keep_failed_jobs
    }
    /// The VM's kernel release (empty: any).
    pub fn vm_release(&self) -> String {
        text(&self.vm_release)
    }
    /// The VM's console log.
    pub fn vm_log(&self) -> Option<PathBuf> {
        path(&self.vm_log)
    }
    /// The foreign-kernel release the VM test expects refused (empty: none).
    pub fn vm_foreign(&self) -> String {
        text(&self.vm_foreign)
    }
    /// The arm64 VM's console log.
    pub fn vm_arm64_log(&self) -> Option<PathBuf> {
        path(&self.vm_arm64_log)
    }
    /// The Secure Boot VM's console log.
    pub fn sb_log(&self) -> Option<PathBuf> {
        path(&self.sb_log)
    }
    /// The signer document of the test MOK the Secure Boot VM enrolled.
    pub fn sb_mok(&self) -> Option<PathBuf> {
        path(&self.sb_mok)
    }
    /// The signer document of the key the Secure Boot VM must refuse.
    pub fn sb_other(&self) -> Option<PathBuf> {
        path(&self.sb_other)
    }
    /// Whether the runner asked to skip `group`, whatever `CI` says.
    pub fn skip_asked(&self, group: Group) -> bool {
        self.skip.contains(&group)
    }
    /// Whether to skip `group`: asked for, and not in CI (where every
    /// group must run).
    pub fn skipped(&self, group: Group) -> bool {
        self.skip_asked(group) && !ci()
    }
}

/// Panics naming the tools file's missing `field` (what it holds) and who
/// writes it.
pub fn missing(field: &str, what: &str) -> ! {
    panic!("{VAR} has no `{field}` ({what}): {HOW}")
}

/// scripts/fetch-test-data's directory (`testData`), or a panic.
pub fn test_data() -> PathBuf {
    tools()
        .test_data()
        .unwrap_or_else(|| missing("testData", "the directory scripts/fetch-test-data prints"))
}

/// Panics unless `tool` is on `PATH`; `needs` says what needs it and how
/// to install it.
pub fn require_tool(tool: &str, needs: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(found, "`{tool}` is not installed; {needs}");
}

/// What `cargo xtask tool NAME [ARGS]` prints: a tool the runner did not
/// name, built now (or found in the cache).
pub fn xtask_tool(name: &str, args: &[&str]) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["xtask", "tool", name])
        .args(args)
        .current_dir(super::repo_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo xtask tool {name}: {e}"))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || path.is_empty() {
        return Err(format!("cargo xtask tool {name} failed ({})", out.status));
    }
    Ok(PathBuf::from(path))
}
