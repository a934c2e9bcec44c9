//! The module flavor: open or proprietary, from `--flavor`, the GPUs'
//! families, the driver branch and the OS's flavor rules.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::catalog::{self, Architecture, FlavorRule};
use crate::detect::Gpu;
use crate::error::{Error, Failure, Result};
use crate::node::ModuleFlavor;

/// `--flavor`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FlavorChoice {
    #[default]
    Auto,
    Open,
    Proprietary,
}

/// Auto picks the open modules from this branch on (NVIDIA's default since 560).
pub(crate) const OPEN_DEFAULT_FROM_BRANCH: u32 = catalog::OPEN_BY_DEFAULT_FROM;

/// Open for Turing and newer with drivers from 560 on, proprietary otherwise;
/// open is refused for GPUs that cannot use it (Volta and older), and
/// proprietary for GPUs only the open modules drive (Blackwell).
pub(crate) fn choose_flavor(
    choice: FlavorChoice,
    branch: u32,
    archs: &[(&Gpu, Option<&Architecture>)],
) -> Result<(ModuleFlavor, String)> {
    let not_open: Vec<String> = archs
        .iter()
        .filter(|(_, a)| !a.is_some_and(|a| a.open_modules))
        .map(|(g, a)| describe(g, *a))
        .collect();
    let open_only: Vec<String> = archs
        .iter()
        .filter(|(_, a)| a.is_some_and(|a| a.open_only))
        .map(|(g, a)| describe(g, *a))
        .collect();
    let refuse = |msg: String| Err(Error::new(Failure::FlavorNotSupported, msg));
    if !open_only.is_empty() && !not_open.is_empty() {
        return refuse(format!(
            "no module flavor drives every GPU: {} need the open modules, {} cannot use them",
            open_only.join(", "),
            not_open.join(", ")
        ));
    }
    match choice {
        FlavorChoice::Open if !not_open.is_empty() => refuse(format!(
            "the open kernel modules cannot drive {} (they need Turing or newer)",
            not_open.join(", ")
        ))
        .map_err(|e: Error| e.with_hint("use --flavor proprietary or auto")),
        FlavorChoice::Proprietary if !open_only.is_empty() => refuse(format!(
            "the proprietary kernel modules cannot drive {}",
            open_only.join(", ")
        ))
        .map_err(|e: Error| e.with_hint("use --flavor open or auto")),
        FlavorChoice::Open => Ok((ModuleFlavor::Open, "requested with --flavor open".into())),
        FlavorChoice::Proprietary => Ok((
            ModuleFlavor::Proprietary,
            "requested with --flavor proprietary".into(),
        )),
        FlavorChoice::Auto if !open_only.is_empty() => Ok((
            ModuleFlavor::Open,
            format!("{} only work with the open modules", open_only.join(", ")),
        )),
        FlavorChoice::Auto if !not_open.is_empty() => Ok((
            ModuleFlavor::Proprietary,
            format!("{} cannot use the open modules", not_open.join(", ")),
        )),
        FlavorChoice::Auto if branch >= OPEN_DEFAULT_FROM_BRANCH => Ok((
            ModuleFlavor::Open,
            format!(
                "all GPUs are Turing or newer and branch {branch} defaults to open (>= {OPEN_DEFAULT_FROM_BRANCH})"
            ),
        )),
        FlavorChoice::Auto => Ok((
            ModuleFlavor::Proprietary,
            format!("branch {branch} predates open-by-default ({OPEN_DEFAULT_FROM_BRANCH})"),
        )),
    }
}

/// On a kernel where only `rule.flavor` works: auto takes it, the other
/// flavor is refused with the rule's reason, and so are GPUs that cannot
/// use it.
pub(super) fn flavor_by_rule(
    rule: &FlavorRule,
    choice: FlavorChoice,
    branch: u32,
    archs: &[(&Gpu, Option<&Architecture>)],
    release: &str,
) -> Result<(ModuleFlavor, String)> {
    let only = match rule.flavor {
        ModuleFlavor::Open => FlavorChoice::Open,
        ModuleFlavor::Proprietary => FlavorChoice::Proprietary,
    };
    let refused = |what: String| {
        Error::new(
            Failure::FlavorNotSupported,
            format!(
                "{what}, but only the {} modules work on kernel {release}: {}",
                rule.flavor, rule.reason
            ),
        )
    };
    if choice != FlavorChoice::Auto && choice != only {
        return Err(
            refused(format!("{choice:?} modules were asked for").to_lowercase())
                .with_hint("use --flavor auto, or a kernel where both flavors work"),
        );
    }
    let (flavor, _) = choose_flavor(only, branch, archs).map_err(|e| refused(e.to_string()))?;
    Ok((
        flavor,
        format!(
            "only the {flavor} modules work on kernel {release}: {}",
            rule.reason
        ),
    ))
}

fn describe(g: &Gpu, a: Option<&Architecture>) -> String {
    format!(
        "{} ({} {})",
        g.pci_address,
        a.map_or("unknown architecture", |a| a.name.as_str()),
        g.device_id
    )
}
