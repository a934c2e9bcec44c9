//! `resolve`: what should be installed on this node — driver version,
//! module flavor, kernel headers and the package to download.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::catalog::{self, Architecture, Catalog};
use crate::detect::{Gpu, HostReport};
use crate::error::{Error, Failure, Result, Success};
use crate::headers::installed_headers;
use crate::host_root::HostRoot;
use crate::node::{self, CpuArch, KernelVersion, ModuleFlavor};
use crate::report::{Document, Kind, Outcome, Reason, StatusOutcome};
use crate::step::{self, Done, StepStatus, Stopped};

mod flavor;

pub use flavor::FlavorChoice;
pub(crate) use flavor::choose_flavor;
use flavor::flavor_by_rule;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolveSpec {
    pub host_root: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    pub flavor: FlavorChoice,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_release_override: Option<String>,
    /// `embedded` or the `--catalog` path.
    pub catalog: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum VersionSource {
    /// `--driver-version`
    Flag,
    /// A catalog policy for this OS version and kernel.
    Policy,
    /// The catalog's default branch.
    Default,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum HeadersSource {
    /// Already on the host.
    Installed,
    /// To be downloaded from an apt repository.
    Package,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Headers {
    pub source: HeadersSource,
    pub kernel_release: String,
    /// Host path of the headers directory (source = installed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `linux-headers-<release>` (source = package).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suite: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Package {
    pub url: String,
    pub file_name: String,
    /// Expected sha256 of the file, when the catalog knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// False when no checksum is known: the fetch step then needs one from a
    /// trusted companion file (`<url>.sha256sum`, NVIDIA's redistrib
    /// manifest) or an explicit insecure opt-in.
    pub checksum_known: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub os: Option<node::OsInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_branch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version_source: Option<VersionSource>,
    /// The catalog policy that chose the version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module_flavor: Option<ModuleFlavor>,
    /// Why this flavor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flavor_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<Package>,
    /// The CPU architecture the package is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<CpuArch>,
    /// What will likely go wrong later, and why (e.g. Secure Boot).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Module parameters the catalog sets for these GPUs, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub module_params: Vec<PlannedParams>,
    /// The host loads only signed modules (Secure Boot, lockdown or
    /// `module.sig_enforce`): the artifact must be signed with a key it
    /// trusts (`--signing-key/--signing-cert`), or install refuses it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub signed_modules: bool,
    /// Why the GPUs' IOMMU groups go to passthrough before loading, when
    /// they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_passthrough: Option<String>,
    /// Fabric Manager for the NVSwitches, when the host has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_manager: Option<FabricManagerPlan>,
    /// Why nvidia-persistenced runs as a host service, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistenced: Option<String>,
}

/// Fabric Manager, planned on hosts with NVSwitches.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FabricManagerPlan {
    /// Always the driver's: Fabric Manager refuses another driver version.
    pub version: String,
    /// NVIDIA's redistributable archive; its sha256 comes from the
    /// release's `redistrib_<version>.json` at fetch time.
    pub package: Package,
    /// Why it is needed here.
    pub reason: String,
    /// NVLink 5 (Blackwell) fabrics also need NVLink Subnet Manager, which
    /// is not planned: why, when it applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlsm: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedParams {
    pub module: String,
    pub params: String,
    pub reason: String,
}

impl StepStatus for PlanStatus {
    const KIND: Kind = Kind::InstallPlan;
    fn unfinished() -> Self {
        PlanStatus {
            outcome: Outcome::new(Reason::Internal, "resolve did not finish"),
            os: None,
            kernel_release: None,
            gpus: Vec::new(),
            driver_version: None,
            driver_branch: None,
            driver_version_source: None,
            policy: None,
            module_flavor: None,
            flavor_reason: None,
            headers: None,
            package: None,
            arch: None,
            warnings: Vec::new(),
            module_params: Vec::new(),
            signed_modules: false,
            iommu_passthrough: None,
            fabric_manager: None,
            persistenced: None,
        }
    }
    fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

/// A plan that ended before resolution could start (e.g. a bad catalog).
pub(crate) fn plan_failed(spec: ResolveSpec, error: Error) -> InstallPlan {
    step::document(spec, Err(Stopped::at_start(error)))
}

pub(crate) type InstallPlan = Document<ResolveSpec, PlanStatus>;

impl StatusOutcome for PlanStatus {
    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

pub(crate) struct ResolveOptions<'a> {
    pub root: &'a HostRoot,
    pub catalog: &'a Catalog,
    pub catalog_label: String,
    pub kernel_release: Option<String>,
    pub driver_version: Option<String>,
    pub flavor: FlavorChoice,
}

/// The plan for a host already detected (`run` detects once).
pub(crate) fn resolve_report(opts: &ResolveOptions, report: &HostReport) -> InstallPlan {
    let spec = ResolveSpec {
        host_root: opts.root.path().display().to_string(),
        driver_version: opts.driver_version.clone(),
        flavor: opts.flavor,
        kernel_release_override: opts.kernel_release.clone(),
        catalog: opts.catalog_label.clone(),
    };
    let mut st = PlanStatus::unfinished();
    st.os = report.status.os.clone();
    st.kernel_release = report.status.kernel_release.clone();
    st.gpus = report.status.gpus.clone();
    step::document(
        spec,
        step::attempt(st, |st| {
            // Detection already decided NoGpu / UnsupportedOs / read errors.
            step::succeeded(&report.status.outcome)?;
            plan(st, report, opts).map(|msg| Done::new(Success::Resolved, msg))
        }),
    )
}

fn plan(st: &mut PlanStatus, report: &HostReport, opts: &ResolveOptions) -> Result<String> {
    let cat = opts.catalog;
    let (os, release, kernel) = detected_target(report)?;
    let arch = match report.status.arch {
        Some(a) => a,
        None => crate::node::running_arch()?,
    };
    st.arch = Some(arch);
    let signing_warning = secure_boot_warning(report);
    st.signed_modules = signing_warning.is_some();
    st.warnings.extend(signing_warning);

    // 1. Driver version.
    let (version, source) = choose_version(st, opts, &os.id, os.version.as_deref(), kernel, arch)?;
    let branch = catalog::branch_of(&version)
        .ok_or_else(|| Error::new(Failure::Internal, format!("no branch in {version}")))?;
    st.driver_version = Some(version.clone());
    st.driver_branch = Some(branch.to_string());
    st.driver_version_source = Some(source);

    // 2. Every GPU must be driven by this branch.
    let archs = gpu_architectures(cat, report);
    check_gpus(&archs, branch)?;

    // 3. Module flavor (a kernel may allow only one).
    let (flavor, why) = match cat.flavor_rule_for(&os.id, kernel) {
        Some(rule) => flavor_by_rule(rule, opts.flavor, branch, &archs, &release)?,
        None => choose_flavor(opts.flavor, branch, &archs)?,
    };
    st.module_flavor = Some(flavor);
    st.flavor_reason = Some(why);

    // 4. Known-broken pairs.
    refuse_excluded(cat, &version, kernel, flavor, &release)?;

    // 5. Headers.
    let headers = find_headers(opts.root, cat, os, &release, kernel)?;
    st.headers = Some(headers.clone());

    // 6. Package.
    st.package = Some(package_for(cat, &version, arch));

    // 7. Host tuning: module parameters for these GPUs, IOMMU passthrough.
    let families: Vec<&str> = archs
        .iter()
        .filter_map(|(_, a)| a.map(|a| a.name.as_str()))
        .collect();
    plan_tuning(st, cat, os, &families);

    // 8. The daemons: Fabric Manager for NVSwitches, persistenced for
    //    data-center GPUs.
    st.fabric_manager = fabric_manager_for(report, cat, &version, arch, &families);
    st.persistenced = persistenced_for(&report.status.gpus);
    st.warnings.extend(nvlink5_warning(report));

    Ok(plan_message(st, cat, source, &headers, &release))
}

/// The OS, kernel release and its version that detect reported.
fn detected_target(report: &HostReport) -> Result<(&node::OsInfo, String, KernelVersion)> {
    let os = report
        .status
        .os
        .as_ref()
        .ok_or_else(|| Error::new(Failure::Internal, "detected without os"))?;
    let release = report
        .status
        .kernel_release
        .clone()
        .ok_or_else(|| Error::new(Failure::Internal, "detected without kernel release"))?;
    let kernel = KernelVersion::parse(&release).ok_or_else(|| {
        Error::new(
            Failure::InvalidArgument,
            format!("kernel release {release:?} does not start with a version like 6.12.0"),
        )
        .with_hint("check --kernel-release or the host's /proc/sys/kernel/osrelease")
    })?;
    Ok((os, release, kernel))
}

/// IncompatibleKernel where the catalog lists the pair as broken.
fn refuse_excluded(
    cat: &Catalog,
    version: &str,
    kernel: KernelVersion,
    flavor: ModuleFlavor,
    release: &str,
) -> Result<()> {
    match cat.exclusion_for(version, kernel, Some(flavor)) {
        Some(x) => Err(Error::new(
            Failure::IncompatibleKernel,
            format!(
                "driver {version} ({flavor}) is known not to work with kernel {release}: {}",
                x.reason
            ),
        )
        .with_hint("choose another --driver-version or kernel")),
        None => Ok(()),
    }
}

/// Module parameters for these GPU families, IOMMU passthrough for the OS.
fn plan_tuning(st: &mut PlanStatus, cat: &Catalog, os: &node::OsInfo, families: &[&str]) {
    st.module_params = cat
        .module_params_for(families)
        .into_iter()
        .map(|m| PlannedParams {
            module: m.module.clone(),
            params: m.params.clone(),
            reason: m.reason.clone(),
        })
        .collect();
    st.iommu_passthrough = cat
        .iommu_passthrough_for(&os.id, os.variant_id.as_deref())
        .map(|r| r.reason.clone());
}

/// The Resolved message: version and where it came from, flavor, kernel,
/// headers, and whether the package's checksum is known.
fn plan_message(
    st: &PlanStatus,
    cat: &Catalog,
    source: VersionSource,
    headers: &Headers,
    release: &str,
) -> String {
    let version = st.driver_version.as_deref().unwrap_or_default();
    let flavor = st.module_flavor.map(|f| f.to_string()).unwrap_or_default();
    let headers_text = match headers.source {
        HeadersSource::Installed => {
            format!(
                "installed headers {}",
                headers.path.clone().unwrap_or_default()
            )
        }
        HeadersSource::Package => format!(
            "package {} from {} {}",
            headers.package.clone().unwrap_or_default(),
            headers.repository.clone().unwrap_or_default(),
            headers.suite.clone().unwrap_or_default()
        ),
    };
    let checksum_note = if st.package.as_ref().is_some_and(|p| p.checksum_known) {
        ""
    } else {
        "; no checksum known for the package: fetching needs one from a trusted companion file or an explicit opt-in"
    };
    format!(
        "driver {version} ({flavor} modules, version from {}) for kernel {release} with {headers_text}{checksum_note}",
        match source {
            VersionSource::Flag => "--driver-version".to_string(),
            VersionSource::Policy => format!("policy {}", st.policy.as_deref().unwrap_or("?")),
            VersionSource::Default => format!("default branch {}", cat.default_branch),
        }
    )
}

/// `--driver-version` (a release, or a branch: its default release), else
/// the catalog policy for this OS and kernel, else the default branch's
/// release.
fn choose_version(
    st: &mut PlanStatus,
    opts: &ResolveOptions,
    os_id: &str,
    os_version: Option<&str>,
    kernel: KernelVersion,
    arch: CpuArch,
) -> Result<(String, VersionSource)> {
    let cat = opts.catalog;
    Ok(match &opts.driver_version {
        Some(v) if node::is_driver_version(v) => (v.clone(), VersionSource::Flag),
        Some(v) if is_branch(v) => (branch_version(cat, v, arch)?, VersionSource::Flag),
        Some(v) => {
            return Err(Error::new(
                Failure::InvalidArgument,
                format!(
                    "--driver-version {v:?} is neither a driver version like 580.126.09 nor a branch like 580"
                ),
            ));
        }
        None => match cat.policy_for(os_id, os_version, Some(kernel)) {
            Some(p) => {
                st.policy = Some(p.name.clone());
                (branch_version(cat, &p.branch, arch)?, VersionSource::Policy)
            }
            None => (
                branch_version(cat, &cat.default_branch, arch)?,
                VersionSource::Default,
            ),
        },
    })
}

/// A branch as Helm values and users write it: `580`.
fn is_branch(v: &str) -> bool {
    !v.is_empty() && v.len() <= 4 && v.bytes().all(|b| b.is_ascii_digit())
}

/// On a host that loads only signed modules (Secure Boot, lockdown,
/// `sig_enforce`), the artifact must be signed with a key the host trusts.
fn secure_boot_warning(report: &HostReport) -> Option<String> {
    let st = &report.status;
    let required = st.module_signatures_required == Some(true)
        || st.secure_boot == Some(node::SecureBoot::Enabled);
    required.then(|| {
        "Secure Boot is enabled (or the kernel is locked down): it loads only signed modules. Build with --signing-key and --signing-cert (the operator: spec.build.signingSecretName) and enroll that certificate on the node (mokutil --import); an unsigned artifact is refused with ModuleSignatureRequired before anything is loaded, one signed with a key the node does not trust fails with ModuleKeyRejected".to_string()
    })
}

/// Each detected GPU with its catalog architecture, where known.
fn gpu_architectures<'a>(
    cat: &'a Catalog,
    report: &'a HostReport,
) -> Vec<(&'a Gpu, Option<&'a Architecture>)> {
    report
        .status
        .gpus
        .iter()
        .map(|g| {
            let arch = g
                .architecture
                .as_deref()
                .and_then(|name| cat.architectures.iter().find(|a| a.name == name));
            (g, arch)
        })
        .collect()
}

/// Every GPU must be driven by the branch.
fn check_gpus(archs: &[(&Gpu, Option<&Architecture>)], branch: u32) -> Result<()> {
    for (gpu, arch) in archs {
        if let Some(a) = arch {
            if !a.supports_branch(branch) {
                return Err(Error::new(
                    Failure::GpuNotSupported,
                    format!(
                        "GPU {} ({} {}) is not supported by driver branch {branch}{}",
                        gpu.pci_address,
                        a.name,
                        gpu.device_id,
                        branch_bounds(a)
                    ),
                )
                .with_hint("pick a supported version with --driver-version"));
            }
        }
    }
    Ok(())
}

/// The version's package for `arch`: the catalog's URL and sha256 where it
/// lists them, else NVIDIA's URL for the channel.
fn package_for(cat: &Catalog, version: &str, arch: CpuArch) -> Package {
    let entry = cat.driver_for_version(version);
    let url = cat.url_for(entry, version, arch);
    let sha256 = entry.and_then(|d| d.sha256_for(arch)).map(str::to_string);
    let file_name = url.rsplit('/').next().unwrap_or(&url).to_string();
    Package {
        url,
        file_name,
        checksum_known: sha256.is_some(),
        sha256,
        mirrors: cat.mirrors.clone(),
    }
}

/// The PCI class of a 3D controller: data-center GPUs (Tesla, A100, H100,
/// L4, T4, …) have no display outputs and enumerate as one; GeForce and
/// workstation boards are VGA controllers (0x0300). The catalog's
/// families cannot tell them apart (Ampere holds A100 and RTX 3090).
const DATA_CENTER_CLASS: &str = "0x0302";

fn is_data_center(g: &Gpu) -> bool {
    g.pci_class.starts_with(DATA_CENTER_CLASS)
}

/// Fabric Manager of the driver's version, from NVIDIA's redist, when the
/// host has NVSwitches.
fn fabric_manager_for(
    report: &HostReport,
    cat: &Catalog,
    version: &str,
    arch: CpuArch,
    families: &[&str],
) -> Option<FabricManagerPlan> {
    let switches = &report.status.nvswitches;
    if switches.is_empty() {
        return None;
    }
    let url = crate::fabric::archive_url(version, arch);
    let file_name = url.rsplit('/').next().unwrap_or(&url).to_string();
    Some(FabricManagerPlan {
        version: version.to_string(),
        package: Package {
            url,
            file_name,
            sha256: None,
            checksum_known: false,
            mirrors: cat.mirrors.clone(),
        },
        reason: format!(
            "{} NVSwitch(es) ({}): CUDA fails with error 802 (system not ready) until Fabric Manager has configured the NVLink fabric",
            switches.len(),
            switches.join(", ")
        ),
        nvlsm: families.contains(&"blackwell").then(nvlsm_note),
    })
}

fn nvlsm_note() -> String {
    "NVLink 5 systems (HGX/DGX B200, B300) also need NVLink Subnet Manager (nvlsm): NVIDIA ships it only as a package of its CUDA apt repository (versioned apart from the driver, with infiniband-diags and ib_umad), not as a redist archive with a manifest checksum, so it is not installed here; install nvlsm on the host".to_string()
}

/// Blackwell data-center GPUs without NVSwitches on the PCI bus: on HGX
/// B200/B300 the NVSwitches sit behind a ConnectX-7 bridge and are not
/// PCI devices, so they cannot be seen here.
fn nvlink5_warning(report: &HostReport) -> Option<String> {
    let blackwell_dc = report
        .status
        .gpus
        .iter()
        .any(|g| g.architecture.as_deref() == Some("blackwell") && is_data_center(g));
    (blackwell_dc && report.status.nvswitches.is_empty()).then(|| {
        format!(
            "Blackwell data-center GPUs and no NVSwitch on the PCI bus: on an HGX/DGX B200 or B300 the NVSwitches are reached through a ConnectX-7 bridge and are invisible here, so Fabric Manager is not planned; such a system needs Fabric Manager and NVLink Subnet Manager running on the host ({})",
            nvlsm_note()
        )
    })
}

/// nvidia-persistenced keeps the driver initialized while no client holds
/// it (NVIDIA recommends it for data-center GPUs: without it every CUDA or
/// NVML start pays the GPU's initialization, and settings such as ECC or
/// clocks are lost between clients).
fn persistenced_for(gpus: &[Gpu]) -> Option<String> {
    let dc: Vec<&str> = gpus
        .iter()
        .filter(|g| is_data_center(g))
        .map(|g| g.pci_address.as_str())
        .collect();
    (!dc.is_empty()).then(|| {
        format!(
            "{} data-center GPU(s) (PCI class 3D controller, {DATA_CENTER_CLASS}): persistence mode keeps the driver initialized between CUDA clients",
            dc.len()
        )
    })
}

fn branch_version(cat: &Catalog, branch: &str, arch: CpuArch) -> Result<String> {
    cat.default_release(branch, arch)
        .map(|d| d.version.clone())
        .ok_or_else(|| {
            let listed: Vec<String> = cat
                .drivers
                .iter()
                .map(|d| d.branch.clone())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            Error::new(
                Failure::InvalidArgument,
                format!(
                    "catalog {} has no release of driver branch {branch} (it lists {})",
                    cat.origin,
                    listed.join(", ")
                ),
            )
            .with_hint("name a listed branch, or an exact version with --driver-version")
        })
}

fn branch_bounds(a: &Architecture) -> String {
    match (&a.min_branch, &a.max_branch) {
        (Some(lo), Some(hi)) => format!(" ({} needs {lo}–{hi})", a.name),
        (Some(lo), None) => format!(" ({} needs {lo} or newer)", a.name),
        (None, Some(hi)) => format!(" ({} is supported up to {hi})", a.name),
        (None, None) => String::new(),
    }
}

/// Headers already on the host first, then the OS's apt repository.
pub(crate) fn find_headers(
    root: &HostRoot,
    cat: &Catalog,
    os: &node::OsInfo,
    release: &str,
    kernel: KernelVersion,
) -> Result<Headers> {
    if let Some(found) = installed_headers(root, release) {
        let host_path = found
            .strip_prefix(root.path())
            .map(|p| format!("/{}", p.display()))
            .unwrap_or_else(|_| found.display().to_string());
        return Ok(Headers {
            source: HeadersSource::Installed,
            kernel_release: release.to_string(),
            path: Some(host_path),
            package: None,
            repository: None,
            suite: None,
        });
    }
    let entry = cat.os(&os.id).ok_or_else(|| {
        Error::new(
            Failure::UnsupportedOs,
            format!("no catalog entry for {}", os.id),
        )
    })?;
    let version = os.version.as_deref().unwrap_or("");
    let rel = entry.release_for(version).ok_or_else(|| {
        Error::new(
            Failure::UnsupportedOs,
            format!("{} {version} is not in the catalog", entry.name),
        )
    })?;
    if !rel.kernel_series.is_empty() && !rel.kernel_series.contains(&kernel.series()) {
        tracing::warn!(
            "kernel {release} is not of a series the catalog expects for {} {version} ({})",
            entry.name,
            rel.kernel_series.join(", ")
        );
    }
    let suite = match &rel.backports_suite {
        Some(bpo) if release.contains("bpo") => bpo.clone(),
        _ => rel.suite.replace("{version}", version),
    };
    Ok(Headers {
        source: HeadersSource::Package,
        kernel_release: release.to_string(),
        path: None,
        package: Some(format!("linux-headers-{release}")),
        repository: Some(entry.headers_repository.clone()),
        suite: Some(suite),
    })
}
