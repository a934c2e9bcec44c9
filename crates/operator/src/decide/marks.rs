//! The ready label and the startup taint: what a GPU node's should be.

use super::node::NodeFacts;
use crate::crd::GpuDriverSpec;
use crate::keys;

/// Is the driver of the node's last verified install still loaded? Its
/// annotations record the boot, kernel and OS image of that install; a new
/// `bootID` (a reboot empties the kernel of its modules), another kernel or
/// another OS image means it is gone, and a node never installed has
/// nothing recorded. Only a new driver policy on the same boot keeps it.
pub(crate) fn verified_driver_loaded(node: &NodeFacts) -> bool {
    [
        (keys::BOOT_ID, &node.boot_id),
        (keys::KERNEL, &node.kernel),
        (keys::OS_IMAGE, &node.os_image),
    ]
    .iter()
    .all(|(key, now)| node.annotation(key) == Some(now.as_str()))
}

/// Changes to a GPU node's ready label and startup taint; `None` leaves
/// that one as it is. Computed against the node as it is, so a node that
/// already looks right gets no write at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// `Some(true)`: set the ready label to `true`; `Some(false)`: remove it.
    pub ready_label: Option<bool>,
    /// `Some(true)`: add the startup taint (effect [`STARTUP_TAINT_EFFECT`]);
    /// `Some(false)`: remove it.
    pub startup_taint: Option<bool>,
}

impl Marks {
    pub fn is_empty(&self) -> bool {
        self.ready_label.is_none() && self.startup_taint.is_none()
    }
}

/// The effect of the startup taint when the operator adds it.
/// NoSchedule keeps new pods off until the driver is back, without
/// evicting what runs (the install Job tolerates it anyway).
pub(crate) const STARTUP_TAINT_EFFECT: &str = "NoSchedule";

/// What the ready label and the startup taint of a GPU node should become.
/// `installed`: a verified install for the node's current key (kernel, OS
/// image, boot, policy). Installed: label on, taint off. Not installed:
/// label off, and the taint on whenever no verified driver is loaded
/// ([`verified_driver_loaded`]): a new node, or one rebooted or upgraded
/// since its install. A new driver policy alone keeps the taint off: the
/// old driver is still loaded and serving what runs. Only the configured
/// `startupTaint` key is ever touched, and a taint of that key with any
/// effect counts as present (a node pool's own stays as it is).
pub(crate) fn marks(spec: &GpuDriverSpec, node: &NodeFacts, installed: bool) -> Marks {
    let label = node.labels.get(keys::READY_LABEL).map(String::as_str);
    let tainted = spec.startup_taint.as_ref().map(|t| node.taints.contains(t));
    if installed {
        return Marks {
            ready_label: (label != Some("true")).then_some(true),
            startup_taint: (tainted == Some(true)).then_some(false),
        };
    }
    Marks {
        ready_label: label.is_some().then_some(false),
        startup_taint: (tainted == Some(false) && !verified_driver_loaded(node)).then_some(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::ready_node;

    #[test]
    fn without_a_startup_taint_only_the_label_moves() {
        let (mut s, mut n) = ready_node();
        s.startup_taint = None;
        n.boot_id = "boot-2".into();
        assert_eq!(
            marks(&s, &n, false),
            Marks {
                ready_label: Some(false),
                startup_taint: None
            }
        );
        // Another controller's taint of another key is never touched, even
        // one that looks like ours.
        n.taints.push("gpu-driver.gardenlinux.io/not-ready".into());
        n.labels.remove(keys::READY_LABEL);
        assert_eq!(marks(&s, &n, false), Marks::default());
        assert_eq!(
            marks(&s, &n, true),
            Marks {
                ready_label: Some(true),
                startup_taint: None
            }
        );
    }
}
