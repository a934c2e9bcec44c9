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
pub(super) mod tests {
    use super::*;
    use crate::decide::tests::{gl_node, installed, spec};
    use crate::decide::{Plan, desired_key, plan};

    /// A node as the controller leaves it after a verified install: the
    /// annotations record what was installed, label on, no startup taint.
    pub(crate) fn ready_node() -> (GpuDriverSpec, NodeFacts) {
        let s = spec();
        let mut n = gl_node("Garden Linux 1592.4", "6.6.71-cloud-amd64");
        let key = desired_key(&s, &n);
        installed(&mut n, &key);
        n.annotations
            .insert(keys::BOOT_ID.into(), n.boot_id.clone());
        n.annotations.insert(keys::KERNEL.into(), n.kernel.clone());
        n.annotations
            .insert(keys::OS_IMAGE.into(), n.os_image.clone());
        n.labels.insert(keys::READY_LABEL.into(), "true".into());
        n.taints.push("other.example.com/maintenance".into());
        (s, n)
    }

    const UNREADY: Marks = Marks {
        ready_label: Some(false),
        startup_taint: Some(true),
    };

    #[test]
    fn a_new_boot_kernel_or_os_image_puts_the_taint_back_and_the_label_off() {
        let (s, n) = ready_node();
        assert!(verified_driver_loaded(&n));
        assert_eq!(marks(&s, &n, true), Marks::default());
        type Change = fn(&mut NodeFacts);
        let changes: [(&str, Change); 3] = [
            ("reboot", |n| n.boot_id = "boot-2".into()),
            ("kernel", |n| n.kernel = "6.6.72-cloud-amd64".into()),
            ("OS image", |n| n.os_image = "Garden Linux 1592.5".into()),
        ];
        for (what, change) in changes {
            let mut m = n.clone();
            change(&mut m);
            assert!(!verified_driver_loaded(&m), "{what}");
            assert!(matches!(plan(&s, &m, 0), Plan::Install { .. }), "{what}");
            assert_eq!(marks(&s, &m, false), UNREADY, "{what}");
            // Once written, nothing more to write (no patch storm).
            m.labels.remove(keys::READY_LABEL);
            m.taints.push(s.startup_taint.clone().unwrap());
            assert_eq!(marks(&s, &m, false), Marks::default(), "{what}");
            // The reinstall for the new boot, verified: both undone.
            let key = desired_key(&s, &m);
            installed(&mut m, &key);
            assert_eq!(
                plan(&s, &m, 0),
                Plan::Ready {
                    marks: Marks {
                        ready_label: Some(true),
                        startup_taint: Some(false)
                    }
                },
                "{what}"
            );
        }
    }

    #[test]
    fn the_taint_stays_on_while_the_reinstall_fails_or_has_no_builder() {
        let (s, mut n) = ready_node();
        n.boot_id = "boot-2".into();
        let key = desired_key(&s, &n);
        // A failed reinstall for the new boot: backing off, still gone.
        n.annotations.insert(keys::STATE.into(), "Failed".into());
        n.annotations.insert(keys::FAILURE_KEY.into(), key);
        n.annotations.insert(keys::FAILURES.into(), "1".into());
        n.annotations
            .insert(keys::FAILED_AT.into(), "2026-01-01T00:00:00Z".into());
        assert!(matches!(plan(&s, &n, 0), Plan::Backoff { .. }));
        assert_eq!(marks(&s, &n, false), UNREADY);
        // An upgrade to an OS nobody builds for.
        let (mut s, mut n) = ready_node();
        s.builder_images
            .retain(|b| b.garden_linux_version.is_some());
        n.os_image = "Garden Linux 2000.0".into();
        assert_eq!(plan(&s, &n, 0), Plan::NoBuilderImage);
        assert_eq!(marks(&s, &n, false), UNREADY);
    }

    #[test]
    fn nodes_never_installed_get_the_taint_until_their_first_install() {
        let s = spec();
        let mut n = gl_node("Garden Linux 1592.4", "6.6.71-cloud-amd64");
        assert!(!verified_driver_loaded(&n));
        // A node pool that cannot keep a taint off once removed (Gardener's
        // machine-controller-manager puts its pool taints back) cannot give
        // it: the operator does, as soon as it knows the node has a GPU.
        assert_eq!(
            marks(&s, &n, false),
            Marks {
                ready_label: None,
                startup_taint: Some(true)
            }
        );
        // Given by the pool already: nothing to write.
        n.taints.push(s.startup_taint.clone().unwrap());
        assert_eq!(marks(&s, &n, false), Marks::default());
        // A failed first install leaves no label behind.
        n.labels.insert(keys::READY_LABEL.into(), "true".into());
        assert_eq!(
            marks(&s, &n, false),
            Marks {
                ready_label: Some(false),
                startup_taint: None
            }
        );
        // No GPU, or not known yet: the plan never gets to the marks.
        let mut cpu = gl_node("Garden Linux 1592.4", "6.6.71-cloud-amd64");
        cpu.labels.clear();
        assert_eq!(plan(&s, &cpu, 0), Plan::NoGpu);
    }

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

    #[test]
    fn a_new_driver_policy_alone_takes_the_label_not_the_node() {
        // The old driver is still loaded and serving until the new one
        // replaces it: only the label goes.
        let (mut s, n) = ready_node();
        s.driver.version = Some("580.95.05".into());
        assert!(matches!(plan(&s, &n, 0), Plan::Install { .. }));
        assert_eq!(
            marks(&s, &n, false),
            Marks {
                ready_label: Some(false),
                startup_taint: None
            }
        );
    }
}
