//! Runs the command the arguments name.

use std::path::Path;

use super::args::{Command, GlobalArgs};
use super::config::{build_options, config, host_root, with_fetch, with_load, with_plan};
use super::deliver::{deliver, emit_raw};
use crate::build;
use crate::confined_fs::HostRootFs;
use crate::error::{Error, Failure, Result};
use crate::install::{self, UninstallOptions};
use crate::publish::write_atomic;
use crate::report::Kind;
use crate::run;

/// The commands that print something other than a step's result
/// document, or hand over to another program; `None` for the others.
pub(super) fn execute_tool(g: &GlobalArgs, command: &Command) -> Result<Option<u8>> {
    match command {
        Command::Schema => {
            emit_raw(g, &crate::schema::results_schema_json()?)?;
            Ok(Some(0))
        }
        Command::CatalogCheck => {
            let cfg = config(g);
            let doc =
                crate::catalog::check_document(cfg.catalog_label(), cfg.load_catalog_unchecked());
            deliver(g, Kind::CatalogCheck, &doc).map(Some)
        }
        Command::MatrixExclusions { matrix } => {
            let catalog = config(g).load_catalog_unchecked()?;
            emit_raw(g, &crate::catalog::matrix_exclusions(&catalog, matrix)?)?;
            Ok(Some(0))
        }
        Command::ExposeDriverRoot { mount_ns } => {
            // First: setns refuses a process that has started threads.
            if let Some(ns) = mount_ns {
                crate::userspace::enter_mount_namespace(ns)?;
            }
            let root = host_root(g);
            let current = Path::new(crate::install::DRIVERS_DIR).join("current");
            crate::userspace::expose_driver_root(&root.fs()?, &current)?;
            Ok(Some(0))
        }
        Command::HostTool {
            mount_ns,
            tool,
            args,
        } => {
            // First: setns refuses a process that has started threads.
            crate::userspace::enter_mount_namespace(mount_ns)?;
            Err(crate::install::exec_host_tool((*tool).into(), args))
        }
        Command::SigningCert { signing_cert, out } => {
            let (der, signer) = crate::signing::read_certificate(signing_cert)?;
            if let Some(out) = out {
                crate::signing::write_der(&der, out)?;
            }
            let doc = serde_json::json!({
                "subject": signer.subject,
                "sha256": signer.sha256,
                "der": out.as_ref().map(|p| p.display().to_string()),
            });
            emit_raw(g, &format!("{doc}\n"))?;
            Ok(Some(0))
        }
        Command::CopySelf { dest } => {
            copy_self(dest)?;
            emit_raw(g, &format!("{}\n", dest.display()))?;
            Ok(Some(0))
        }
        _ => Ok(None),
    }
}

/// The pipeline's steps and `run`/`prebuild`: each delivers its result
/// document.
pub(super) fn execute_step(g: &GlobalArgs, command: &Command) -> Result<u8> {
    match command {
        Command::Detect => deliver(g, Kind::HostReport, &run::detect(&config(g))),
        Command::Resolve(args) => {
            let cfg = with_plan(config(g), args);
            deliver(g, Kind::InstallPlan, &run::resolve(&cfg))
        }
        Command::Fetch(args) => {
            let cfg = with_fetch(config(g), args);
            deliver(g, Kind::FetchResult, &run::fetch(&cfg))
        }
        Command::Build(args) => {
            let doc = build::build(&build_options(g, args));
            deliver(g, Kind::BuildResult, &doc)
        }
        Command::Install(args) => {
            let cfg = with_load(config(g), &args.load);
            let doc = run::install_with_daemons(
                &cfg,
                &args.artifact,
                args.fabric_manager.as_deref(),
                args.persistenced,
            );
            deliver(g, Kind::InstallResult, &doc)
        }
        Command::Uninstall(args) => {
            let root = host_root(g);
            let doc = install::uninstall(&UninstallOptions {
                root: &root,
                modules: args.modules.clone(),
                force: args.force,
            });
            deliver(g, Kind::InstallResult, &doc)
        }
        Command::Verify(args) => {
            let mut cfg = config(g);
            cfg.nvidia_smi = args.nvidia_smi.clone();
            cfg.libcuda = args.libcuda.clone();
            let doc = run::verify(&cfg, args.driver_version.clone());
            deliver(g, Kind::VerifyResult, &doc)
        }
        Command::Run(args) => {
            let mut cfg = with_load(with_fetch(config(g), &args.fetch), &args.load);
            cfg.artifact = args.artifact.clone();
            cfg.nvidia_smi = args.nvidia_smi.clone();
            cfg.no_compile = args.no_compile;
            cfg.artifact_sha256 = args.artifact_sha256.clone();
            cfg.cache_entry = args.cache_entry.clone();
            cfg.signing = args.signing.files();
            deliver(g, Kind::RunResult, &run::run(&cfg))
        }
        Command::Prebuild(args) => {
            let mut cfg = with_fetch(config(g), &args.fetch);
            cfg.signing = args.signing.files();
            let doc = run::prebuild(&cfg, &args.os_id, &args.os_version);
            deliver(g, Kind::RunResult, &doc)
        }
        _ => Err(Error::new(
            Failure::Internal,
            "a tool command reached the steps' dispatch",
        )),
    }
}

/// Copies the running binary to `dest` (atomically, mode 0755): the
/// operator's init container hands the installer from the scratch image to
/// the builder image this way (no `cp` in scratch).
fn copy_self(dest: &Path) -> Result<()> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::new(Failure::Internal, format!("finding this binary: {e}")))?;
    let bytes =
        std::fs::read(&exe).map_err(|e| Error::io(Failure::Internal, "reading", &exe, e))?;
    write_atomic(dest, &bytes, 0o755, Failure::InvalidArgument)
}
