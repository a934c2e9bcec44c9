//! What a node is: its OS image, kernel and labels as the kubelet and NFD
//! report them, whether it has a GPU, which builder image serves it.

use std::collections::BTreeMap;

use crate::crd::{BuilderImage, GpuDriverSpec};
use crate::keys;

/// The operating system as the kubelet reports it in `status.nodeInfo.osImage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OsImage {
    /// `Garden Linux 1592.4`, `Garden Linux 1877.3.1`.
    GardenLinux {
        version: String,
    },
    /// `Debian GNU/Linux 12 (bookworm)`.
    Debian {
        version: String,
    },
    Other(String),
}

impl OsImage {
    pub fn parse(s: &str) -> OsImage {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("Garden Linux") {
            // The version is the first token of digits and dots; anything
            // after it (a codename, "(dev)") is not part of it.
            let v = rest.split_whitespace().next().unwrap_or("");
            if is_dotted_version(v) {
                return OsImage::GardenLinux {
                    version: v.to_string(),
                };
            }
        }
        if let Some(rest) = s.strip_prefix("Debian GNU/Linux") {
            let v = rest.split_whitespace().next().unwrap_or("");
            if !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.') {
                let major = v.split('.').next().unwrap_or(v);
                return OsImage::Debian {
                    version: major.to_string(),
                };
            }
        }
        OsImage::Other(s.to_string())
    }

    pub fn garden_linux_version(&self) -> Option<&str> {
        match self {
            OsImage::GardenLinux { version } => Some(version),
            _ => None,
        }
    }

    pub fn debian_version(&self) -> Option<&str> {
        match self {
            OsImage::Debian { version } => Some(version),
            _ => None,
        }
    }
}

pub(super) fn is_dotted_version(v: &str) -> bool {
    !v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// `1592` matches `1592.4` and `1592.4.1`, `1592.4` matches `1592.4.1`
/// but not `1592.40`: whole components, from the left.
pub(crate) fn version_matches(pattern: &str, version: &str) -> bool {
    let p: Vec<&str> = pattern.trim().split('.').collect();
    let v: Vec<&str> = version.split('.').collect();
    p.len() <= v.len() && p.iter().zip(&v).all(|(a, b)| a == b)
}

pub(super) fn kernel_matches(pattern: &str, kernel: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => kernel.starts_with(prefix),
        None => pattern == kernel,
    }
}

/// What the node says about itself, from its labels and `status.nodeInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub kernel: String,
    pub os_image: String,
    pub boot_id: String,
    pub arch: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Keys of the node's taints.
    pub taints: Vec<String>,
}

impl NodeFacts {
    pub(crate) fn os(&self) -> OsImage {
        OsImage::parse(&self.os_image)
    }

    pub(crate) fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// Does the selector pick this node? Every label must be present with
/// the same value.
pub(crate) fn selects(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gpu {
    Yes,
    No,
    /// Only a detect Job can tell.
    Unknown,
}

/// GPU presence before any driver exists: NFD's PCI vendor label, the
/// instance type, or an earlier detect Job's answer (an annotation).
pub(crate) fn gpu_presence(spec: &GpuDriverSpec, node: &NodeFacts) -> Gpu {
    gpu_presence_in(spec, &node.labels, &node.annotations)
}

/// [`gpu_presence`] from a node's labels and annotations as they are (a
/// cached Node's, without copying them into [`NodeFacts`]).
pub(crate) fn gpu_presence_in(
    spec: &GpuDriverSpec,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Gpu {
    let det = &spec.gpu_detection;
    if det.nfd && labels.get(keys::NFD_NVIDIA_LABEL).map(String::as_str) == Some("true") {
        return Gpu::Yes;
    }
    if let Some(t) = labels.get(keys::INSTANCE_TYPE_LABEL)
        && det.instance_types.iter().any(|i| i == t)
    {
        return Gpu::Yes;
    }
    match annotations.get(keys::GPU).map(String::as_str) {
        Some("true") => Gpu::Yes,
        Some("false") => Gpu::No,
        _ if det.detect_job => Gpu::Unknown,
        _ => Gpu::No,
    }
}

/// The most specific builder image for this node, with its placeholders
/// filled in. `None`: no entry matches (the node cannot be served).
pub fn builder_image(images: &[BuilderImage], node: &NodeFacts) -> Option<String> {
    let os = node.os();
    let mut best: Option<(u32, &BuilderImage)> = None;
    for img in images {
        let mut score = 0u32;
        if let Some(k) = &img.kernel_release {
            if !kernel_matches(k, &node.kernel) {
                continue;
            }
            score += if k.ends_with('*') {
                500 + k.len() as u32
            } else {
                2000
            };
        }
        if let Some(g) = &img.garden_linux_version {
            match os.garden_linux_version() {
                Some(v) if version_matches(g, v) => score += 100 * g.split('.').count() as u32,
                _ => continue,
            }
        }
        if let Some(d) = &img.debian_version {
            match os.debian_version() {
                Some(v) if version_matches(d, v) => score += 100,
                _ => continue,
            }
        }
        // Ties go to the earlier entry.
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, img));
        }
    }
    best.map(|(_, img)| {
        img.image
            .replace(
                "{gardenLinuxVersion}",
                os.garden_linux_version().unwrap_or(""),
            )
            .replace("{debianVersion}", os.debian_version().unwrap_or(""))
            .replace("{kernelRelease}", &node.kernel)
            .replace("{arch}", &node.arch)
    })
}
