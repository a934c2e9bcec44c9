//! `detect`: what this node is. Reads os-release, the kernel, PCI devices,
//! loaded NVIDIA modules and Secure Boot through the host root.

use crate::catalog::Catalog;
use crate::error::{Error, Failure, Result, Success};
use crate::host_root::HostRoot;
use crate::node::{self, CpuArch, OsInfo, PciRole};
use crate::report::{Kind, Outcome};
use crate::step::{self, Done, StepStatus, Stopped};

pub use gpu_driver_contract::detect::{DetectSpec, Gpu, HostReport, HostStatus};

pub struct DetectOptions<'a> {
    pub root: &'a HostRoot,
    pub catalog: &'a Catalog,
    pub kernel_release: Option<String>,
    /// Target this CPU architecture instead of the running one.
    pub arch: Option<CpuArch>,
}

/// Reads everything and decides the outcome: `NoGpu` (Skipped) when there is
/// no NVIDIA GPU — whatever the OS, a node without a GPU needs nothing —
/// then `UnsupportedOs` (Failed), else `Detected`. A host read error ends the
/// report Failed with what was read so far.
pub fn detect(opts: &DetectOptions) -> HostReport {
    step::document(
        spec(opts.root, opts.kernel_release.clone(), opts.arch),
        step::attempt(HostStatus::unfinished(), |st| {
            fill(st, opts)?;
            decide(st, opts.catalog)
        }),
    )
}

/// What `detect` was asked.
pub fn spec(root: &HostRoot, kernel_release: Option<String>, arch: Option<CpuArch>) -> DetectSpec {
    DetectSpec {
        host_root: root.path().display().to_string(),
        host_root_source: root.source(),
        kernel_release_override: kernel_release,
        arch_override: arch,
    }
}

/// A report that ended before detection could start (e.g. a bad catalog).
pub(crate) fn detect_failed(spec: DetectSpec, error: Error) -> HostReport {
    step::document(spec, Err(Stopped::at_start(error)))
}

/// The report of a node that is not here: `prebuild`'s target, given as
/// the OS id and version a node of it reports (`gardenlinux` `1877.3`,
/// `debian` `12`, as [`node::os_info_from`] reads them from os-release),
/// its kernel and architecture. Nothing is read from a host; no GPU is
/// known. `Detected` when the catalog lists the OS version, else
/// `UnsupportedOs`.
pub(crate) fn target_report(
    spec: DetectSpec,
    catalog: &Catalog,
    os_id: &str,
    os_version: &str,
    kernel_release: &str,
    arch: CpuArch,
) -> HostReport {
    let os = OsInfo {
        id: os_id.to_string(),
        id_like: Vec::new(),
        version: Some(os_version.to_string()),
        version_codename: None,
        pretty_name: None,
        variant_id: None,
        source: "--os-id, --os-version".into(),
    };
    let work = |st: &mut HostStatus| {
        st.os_supported = Some(os_supported(catalog, &os));
        st.os = Some(os.clone());
        st.kernel_release = Some(kernel_release.to_string());
        st.arch = Some(arch);
        check_os(catalog, &os)?;
        Ok(Done::new(
            Success::Detected,
            format!(
                "target {os_id} {os_version} with kernel {kernel_release} on {arch}, as given (no host detected, no GPU known)"
            ),
        ))
    };
    step::document(spec, step::attempt(HostStatus::unfinished(), work))
}

fn fill(st: &mut HostStatus, opts: &DetectOptions) -> Result<()> {
    let root = opts.root;
    let os = node::read_os(root)?;
    st.os_supported = Some(os_supported(opts.catalog, &os));
    st.os = Some(os);
    st.kernel_release = Some(match &opts.kernel_release {
        Some(k) => k.clone(),
        None => node::read_kernel_release(root)?,
    });
    st.arch = Some(match opts.arch {
        Some(a) => a,
        None => crate::node::running_arch()?,
    });
    st.boot_id = node::read_boot_id(root)?;
    for dev in node::read_pci_devices(&node::pci_devices_dir(root))? {
        match dev.role() {
            PciRole::Gpu => {
                let arch = opts.catalog.architecture_of(dev.device);
                st.gpus.push(Gpu {
                    pci_address: dev.address.clone(),
                    device_id: format!("0x{:04x}", dev.device),
                    subsystem_id: dev
                        .subsystem_vendor
                        .zip(dev.subsystem_device)
                        .map(|(v, d)| format!("0x{v:04x}:0x{d:04x}")),
                    pci_class: format!("0x{:06x}", dev.class),
                    architecture: arch.map(|a| a.name.clone()),
                    open_modules_supported: arch.map(|a| a.open_modules),
                });
            }
            PciRole::NvSwitch => st.nvswitches.push(dev.address.clone()),
            PciRole::OtherNvidia | PciRole::NotNvidia => {}
        }
    }
    let modules_path = root.kernel_path("/proc/modules");
    if let Some(text) = node::read_optional(&modules_path)? {
        st.loaded_modules = node::parse_proc_modules(&text)?;
    }
    let version_path = root.kernel_path("/proc/driver/nvidia/version");
    st.loaded_driver = node::read_optional(&version_path)?
        .as_deref()
        .and_then(node::parse_nvidia_version);
    let policy = node::SignaturePolicy::read(root)?;
    st.secure_boot = Some(policy.secure_boot);
    st.lockdown = policy.lockdown;
    st.module_signatures_required = policy.required();
    Ok(())
}

pub(crate) fn os_supported(catalog: &Catalog, os: &OsInfo) -> bool {
    match (catalog.os(&os.id), &os.version) {
        (Some(entry), Some(v)) => entry.release_for(v).is_some(),
        _ => false,
    }
}

fn decide(st: &HostStatus, catalog: &Catalog) -> Result<Done> {
    let Some(os) = &st.os else {
        return Err(Error::new(
            Failure::Internal,
            "detection finished without an OS",
        ));
    };
    if st.gpus.is_empty() {
        return Err(Error::new(
            Failure::NoGpu,
            "no NVIDIA GPU (vendor 0x10de, display class 0x03xxxx) on this node; nothing to install",
        ));
    }
    check_os(catalog, os)?;
    let archs: Vec<String> = st
        .gpus
        .iter()
        .map(|g| {
            g.architecture
                .clone()
                .unwrap_or_else(|| format!("unknown {}", g.device_id))
        })
        .collect();
    Ok(Done::new(
        Success::Detected,
        format!(
            "{} {} with kernel {} and {} NVIDIA GPU(s): {}",
            os.id,
            os.version.as_deref().unwrap_or("(no version)"),
            st.kernel_release.as_deref().unwrap_or("?"),
            st.gpus.len(),
            archs.join(", ")
        ),
    ))
}

/// `UnsupportedOs` with what is supported, or Ok.
pub(crate) fn check_os(catalog: &Catalog, os: &OsInfo) -> Result<()> {
    let Some(entry) = catalog.os(&os.id) else {
        let ids: Vec<&str> = catalog.os.iter().map(|o| o.id.as_str()).collect();
        return Err(Error::new(
            Failure::UnsupportedOs,
            format!(
                "{} ({}) is detectable but not installable: the catalog supports {}",
                os.pretty_name.as_deref().unwrap_or(&os.id),
                os.id,
                ids.join(", ")
            ),
        )
        .with_hint(
            "run on a Garden Linux or Debian node, or pass a --catalog that lists this OS",
        ));
    };
    let version = os.version.as_deref().unwrap_or("");
    if entry.release_for(version).is_none() {
        let known: Vec<&str> = entry.releases.iter().map(|r| r.version.as_str()).collect();
        return Err(Error::new(
            Failure::UnsupportedOs,
            format!(
                "{} version {:?} is not in the catalog (known: {})",
                entry.name,
                version,
                known.join(", ")
            ),
        )
        .with_hint("upgrade the node, or pass a --catalog that lists this version"));
    }
    Ok(())
}

impl StepStatus for HostStatus {
    const KIND: Kind = Kind::HostReport;
    fn unfinished() -> Self {
        HostStatus::unfinished()
    }
    fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}
