//! The daemons' services on the host: our systemd units for Fabric
//! Manager and nvidia-persistenced (written through [`crate::confined_fs`] and
//! enabled with the same link `systemctl enable` makes), and systemctl and
//! journalctl run against the host's running systemd, reached in its mount
//! namespace (hostPID) by a single-threaded child that enters
//! `/proc/1/ns/mnt` and execs the tool there.

use std::fs;
use std::path::Path;
use std::process::Command;

use super::documents::{InstallStatus, ServiceState};
use crate::confined_fs::HostFs;
use crate::error::{Error, Failure, Result};
use crate::fabric::{CURRENT_ROOT, FM_BINARY, FM_CONFIG, PERSISTENCED_BINARY};
use crate::host_root::{HostRoot, HostRootSource};

const FABRIC_MANAGER_UNIT: &str = "nvidia-fabricmanager.service";
const PERSISTENCED_UNIT: &str = "nvidia-persistenced.service";
/// Where units of the local administrator live (and ours: they are not a
/// package's, so not under /usr/lib/systemd).
const UNIT_DIR: &str = "/etc/systemd/system";
/// `WantedBy=multi-user.target`, as `systemctl enable` links it.
const WANTS_DIR: &str = "/etc/systemd/system/multi-user.target.wants";
/// Lines of the unit's journal quoted in a failure.
const JOURNAL_LINES: usize = 20;

/// A daemon's unit that cannot be written or started: `FabricManagerFailed`
/// (for persistenced the caller turns it into a note).
fn failed(message: String) -> Error {
    Error::new(Failure::FabricManagerFailed, message)
}

// ------------------------------------------------------------ units

/// Our unit for Fabric Manager: NVIDIA's (forking daemon, 240 s start
/// timeout, core dumps kept) with paths into the current driver root, and
/// conditions so that at boot, before the installer has loaded the driver
/// and recreated `/dev/nvidiactl` (devtmpfs starts empty), the unit is
/// skipped instead of failing; the installer starts it after every load.
fn fabric_manager_unit() -> String {
    format!(
        "# Written by gpu-driver-installer; rewritten on every install.\n\
         [Unit]\n\
         Description=NVIDIA Fabric Manager (driver root {CURRENT_ROOT})\n\
         Documentation=https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/\n\
         ConditionPathExists={CURRENT_ROOT}/{FM_BINARY}\n\
         ConditionPathExists=/dev/nvidiactl\n\
         After=network-online.target\n\
         Wants=network-online.target\n\
         \n\
         [Service]\n\
         Type=forking\n\
         TimeoutStartSec=240\n\
         ExecStart={CURRENT_ROOT}/{FM_BINARY} -c {CURRENT_ROOT}/{FM_CONFIG}\n\
         Restart=on-failure\n\
         RestartSec=10\n\
         LimitCORE=infinity\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

/// Our unit for nvidia-persistenced: NVIDIA's sample unit (forking, its
/// PID file) run as root from the current driver root, with the same
/// conditions as Fabric Manager's. `on-failure`, not NVIDIA's `always`: an
/// uninstall that stops it must be able to unload the modules it holds.
fn persistenced_unit() -> String {
    let lib = crate::userspace::lib_dir();
    format!(
        "# Written by gpu-driver-installer; rewritten on every install.\n\
         [Unit]\n\
         Description=NVIDIA Persistence Daemon (driver root {CURRENT_ROOT})\n\
         ConditionPathExists={CURRENT_ROOT}/{PERSISTENCED_BINARY}\n\
         ConditionPathExists=/dev/nvidiactl\n\
         \n\
         [Service]\n\
         Type=forking\n\
         PIDFile=/run/nvidia-persistenced/nvidia-persistenced.pid\n\
         Environment=LD_LIBRARY_PATH={CURRENT_ROOT}/{lib}\n\
         ExecStart={CURRENT_ROOT}/{PERSISTENCED_BINARY} --persistence-mode\n\
         Restart=on-failure\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

/// Writes `unit` (atomically, confined to the host root) and enables it
/// the way `systemctl enable` does for `WantedBy=multi-user.target`: a
/// link in `multi-user.target.wants`. Works without a running systemd.
/// Returns the unit file's host path.
fn write_unit(fs: &HostFs, unit: &str, text: &str) -> Result<String> {
    let path = format!("{UNIT_DIR}/{unit}");
    let io = |e: Error| failed(format!("writing the systemd unit {path}: {}", e));
    fs.create_dir_all(UNIT_DIR).map_err(io)?;
    fs.write_atomic(&path, text.as_bytes(), 0o644).map_err(io)?;
    fs.create_dir_all(WANTS_DIR).map_err(io)?;
    fs.replace_symlink(format!("{WANTS_DIR}/{unit}"), &path)
        .map_err(io)?;
    Ok(path)
}

// ------------------------------------------------------------ host systemd

/// How the host's running systemd is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HostSystemd {
    /// We run in the host's mount namespace (host root `/`).
    Here,
    /// The host root is PID 1's (`/proc/1/root`, hostPID): a child enters
    /// `/proc/1/ns/mnt` and runs the host's systemctl there.
    Pid1Namespace,
    /// Another directory (a fixture, an image, `/host`): its systemd, if
    /// any, is not ours to reach; units are written and enabled only.
    Unreachable,
}

pub(super) fn host_systemd(root: &HostRoot) -> HostSystemd {
    if root.path() == Path::new("/") {
        HostSystemd::Here
    } else if root.source() == HostRootSource::Pid1Root || root.path() == Path::new("/proc/1/root")
    {
        HostSystemd::Pid1Namespace
    } else {
        HostSystemd::Unreachable
    }
}

/// The host tools run in the host's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostTool {
    Systemctl,
    Journalctl,
}

impl HostTool {
    pub(crate) fn name(self) -> &'static str {
        match self {
            HostTool::Systemctl => "systemctl",
            HostTool::Journalctl => "journalctl",
        }
    }
}

/// The command that runs `tool args` against the host's systemd; `None`
/// when it cannot be reached.
fn host_command(how: HostSystemd, tool: HostTool, args: &[&str]) -> Option<Command> {
    match how {
        HostSystemd::Here => {
            let mut cmd = crate::process::command(tool.name());
            cmd.args(args);
            Some(cmd)
        }
        HostSystemd::Pid1Namespace => {
            let mut cmd = crate::process::command("/proc/self/exe");
            cmd.args([
                "host-tool",
                "--mount-ns",
                crate::userspace::PID1_MOUNT_NS,
                tool.name(),
                "--",
            ]);
            cmd.args(args);
            Some(cmd)
        }
        HostSystemd::Unreachable => None,
    }
}

/// Replaces this process (the `host-tool` child, already in the host's
/// mount namespace) with `tool args`; returns only on failure.
pub(crate) fn exec_host_tool(tool: HostTool, args: &[String]) -> Error {
    use std::os::unix::process::CommandExt;
    // The working directory is a path of the namespace we left.
    if let Err(e) = std::env::set_current_dir("/") {
        return Error::io(
            Failure::FabricManagerFailed,
            "changing to",
            Path::new("/"),
            e,
        );
    }
    let mut cmd = crate::process::command(tool.name());
    cmd.args(args);
    let e = cmd.exec();
    failed(format!(
        "running {} in the host's mount namespace: {e}",
        tool.name()
    ))
}

/// Runs systemctl on the host; a failure is `FabricManagerFailed` quoting
/// the command line and its stderr tail.
fn systemctl(how: HostSystemd, args: &[&str]) -> Result<()> {
    let Some(mut cmd) = host_command(how, HostTool::Systemctl, args) else {
        return Ok(());
    };
    crate::process::run(&mut cmd, Failure::FabricManagerFailed).map(|_| ())
}

/// The unit's last journal lines, or why they could not be read.
fn journal_tail(how: HostSystemd, unit: &str) -> String {
    let n = JOURNAL_LINES.to_string();
    let args = ["-u", unit, "-n", &n, "--no-pager", "-o", "short-iso"];
    let Some(mut cmd) = host_command(how, HostTool::Journalctl, &args) else {
        return String::new();
    };
    match crate::process::run(&mut cmd, Failure::FabricManagerFailed) {
        Ok(out) => tail_text(&String::from_utf8_lossy(&out.stdout)),
        Err(e) => format!("({})", e),
    }
}

/// The last lines of a log, joined with ` | ` for a one-line message;
/// journalctl's `-- No entries --` and blank lines say nothing.
fn tail_text(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with("-- "))
        .collect();
    let from = lines.len().saturating_sub(JOURNAL_LINES);
    crate::text::truncate(&lines[from..].join(" | "), 4000)
}

/// What starting the units did, for the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Started {
    /// The systemctl command lines run, in order.
    pub(super) commands: Vec<String>,
}

/// `daemon-reload`, then `restart` (the driver changed: a running daemon
/// holds the old one's files and state) or `start` (a no-op when running)
/// for each unit, in the host's namespace. A failure quotes systemctl's
/// stderr, the unit's journal tail, and `log_tail` (Fabric Manager's own
/// log file, read by the caller through the host root).
fn start_units(
    how: HostSystemd,
    units: &[&str],
    restart: bool,
    log_tail: &dyn Fn(&str) -> Option<String>,
) -> Result<Started> {
    let verb = if restart { "restart" } else { "start" };
    let mut commands = Vec::new();
    systemctl(how, &["daemon-reload"])?;
    commands.push("systemctl daemon-reload".to_string());
    for unit in units {
        if let Err(e) = systemctl(how, &[verb, unit]) {
            let mut msg = format!("starting {unit}: {}", e);
            let journal = journal_tail(how, unit);
            if !journal.is_empty() {
                msg.push_str(&format!("; journalctl -u {unit}: {journal}"));
            }
            if let Some(log) = log_tail(unit) {
                msg.push_str(&format!("; {log}"));
            }
            return Err(failed(msg));
        }
        commands.push(format!("systemctl {verb} {unit}"));
    }
    Ok(Started { commands })
}

/// Stops our units where their files exist on the host (a new driver can
/// only be loaded once nothing holds the old one); best effort: each
/// failure is returned as a note, and the unload then says whether it
/// mattered.
pub(super) fn stop_ours(fs: &HostFs, how: HostSystemd) -> Vec<String> {
    let mut notes = Vec::new();
    for unit in [FABRIC_MANAGER_UNIT, PERSISTENCED_UNIT] {
        let ours = matches!(fs.kind(format!("{UNIT_DIR}/{unit}")), Ok(Some(_)));
        if !ours {
            continue;
        }
        match systemctl(how, &["stop", unit]) {
            Ok(()) if how == HostSystemd::Unreachable => {}
            Ok(()) => notes.push(format!("stopped {unit} before replacing the driver")),
            Err(e) => notes.push(format!("{unit} not stopped: {}", e)),
        }
    }
    notes
}

/// The last lines of the log file `fabricmanager.cfg` names
/// (`LOG_FILE_NAME`), read through the host root; `None` when it names
/// none or it cannot be read.
fn config_log_tail(root: &HostRoot, config: &str) -> Option<String> {
    let log = crate::fabric::config_value(config, "LOG_FILE_NAME")?;
    let bytes = crate::node::read_host_file(&root.resolve(&log)?).ok()??;
    let text = String::from_utf8_lossy(&bytes);
    Some(format!("{log}: {}", tail_text(&text)))
}

/// Writes and enables the units of the daemons the driver root `real_dir`
/// carries (Fabric Manager when placed; nvidia-persistenced when planned
/// and present), then (re)starts them in the host's namespace. Fabric
/// Manager's failure is `FabricManagerFailed` (CUDA does not work without
/// it); persistenced's is a note (it only keeps the driver initialized).
pub(super) fn start_daemons(
    root: &HostRoot,
    fs: &HostFs,
    real_dir: &Path,
    persistenced: bool,
    restart: bool,
    st: &mut InstallStatus,
) -> Result<()> {
    let how = host_systemd(root);
    if st.fabric_manager.is_some() {
        start_fabric_manager(root, fs, real_dir, how, restart, st)?;
    }
    let has_persistenced = real_dir.join(PERSISTENCED_BINARY).is_file();
    if persistenced && has_persistenced {
        start_persistenced(fs, how, restart, st);
    } else if persistenced {
        st.notes.push(format!(
            "nvidia-persistenced was planned, but the driver root has no {PERSISTENCED_BINARY}: the package had none"
        ));
    }
    if how == HostSystemd::Unreachable && !st.services.is_empty() {
        st.notes.push(format!(
            "the units are written and enabled but not started: the host's systemd cannot be reached from the host root {} (only / and /proc/1/root with hostPID can); they start at the next boot, or by an install run in the host's namespace",
            root.path().display()
        ));
    }
    Ok(())
}

/// Fabric Manager's unit; a failure to start quotes its own log file too.
fn start_fabric_manager(
    root: &HostRoot,
    fs: &HostFs,
    real_dir: &Path,
    how: HostSystemd,
    restart: bool,
    st: &mut InstallStatus,
) -> Result<()> {
    let unit_file = write_unit(fs, FABRIC_MANAGER_UNIT, &fabric_manager_unit())?;
    let config = fs::read_to_string(real_dir.join(FM_CONFIG)).unwrap_or_default();
    let log_tail = |_: &str| config_log_tail(root, &config);
    let started = start_units(how, &[FABRIC_MANAGER_UNIT], restart, &log_tail)?;
    st.services
        .push(service_state(FABRIC_MANAGER_UNIT, unit_file, how, &started));
    Ok(())
}

/// nvidia-persistenced's unit; a failure is a note.
fn start_persistenced(fs: &HostFs, how: HostSystemd, restart: bool, st: &mut InstallStatus) {
    let started = write_unit(fs, PERSISTENCED_UNIT, &persistenced_unit()).and_then(|f| {
        Ok((
            f,
            start_units(how, &[PERSISTENCED_UNIT], restart, &|_| None)?,
        ))
    });
    match started {
        Ok((f, started)) => st
            .services
            .push(service_state(PERSISTENCED_UNIT, f, how, &started)),
        Err(e) => st.notes.push(format!("nvidia-persistenced: {}", e)),
    }
}

/// The result's account of one unit: written, enabled, and how it was started.
pub(super) fn service_state(
    unit: &str,
    unit_file: String,
    how: HostSystemd,
    started: &Started,
) -> ServiceState {
    ServiceState {
        unit: unit.to_string(),
        unit_file,
        enabled: true,
        started: (how != HostSystemd::Unreachable)
            .then(|| started.commands.last().cloned())
            .flatten(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;

    #[test]
    fn units_run_from_the_current_root_and_wait_for_the_driver() {
        let fm = fabric_manager_unit();
        assert!(fm.contains(
            "ExecStart=/var/lib/gpu-driver/drivers/current/usr/bin/nv-fabricmanager -c /var/lib/gpu-driver/drivers/current/etc/fabricmanager.cfg\n"
        ));
        assert!(fm.contains(
            "ConditionPathExists=/var/lib/gpu-driver/drivers/current/usr/bin/nv-fabricmanager\n"
        ));
        assert!(fm.contains("ConditionPathExists=/dev/nvidiactl\n"));
        assert!(fm.contains("Type=forking\n") && fm.contains("WantedBy=multi-user.target\n"));
        let p = persistenced_unit();
        assert!(p.contains(
            "ExecStart=/var/lib/gpu-driver/drivers/current/usr/bin/nvidia-persistenced --persistence-mode\n"
        ));
        assert!(p.contains("Restart=on-failure\n"));
    }

    #[test]
    fn host_commands_enter_pid1s_namespace_only_through_the_child() {
        let line = |how| {
            host_command(how, HostTool::Systemctl, &["restart", FABRIC_MANAGER_UNIT])
                .map(|c| crate::process::command_line(&c))
        };
        assert_eq!(
            line(HostSystemd::Here).as_deref(),
            Some("systemctl restart nvidia-fabricmanager.service")
        );
        assert_eq!(
            line(HostSystemd::Pid1Namespace).as_deref(),
            Some(
                "/proc/self/exe host-tool --mount-ns /proc/1/ns/mnt systemctl -- restart nvidia-fabricmanager.service"
            )
        );
        assert_eq!(line(HostSystemd::Unreachable), None);
        let root = |p: &str, s| host_systemd(&HostRoot::new(p, s));
        assert_eq!(root("/", HostRootSource::Root), HostSystemd::Here);
        assert_eq!(root("/", HostRootSource::Flag), HostSystemd::Here);
        assert_eq!(
            root("/proc/1/root", HostRootSource::Flag),
            HostSystemd::Pid1Namespace
        );
        assert_eq!(
            root("/proc/1/root", HostRootSource::Pid1Root),
            HostSystemd::Pid1Namespace
        );
        assert_eq!(
            root("/host", HostRootSource::HostMount),
            HostSystemd::Unreachable
        );
    }

    #[test]
    fn journal_tails_drop_journalctls_own_lines() {
        // Captured from journalctl -u nvidia-fabricmanager -n 20 -o short-iso.
        let captured = "2025-03-25T02:10:14+0000 node systemd[1]: Starting NVIDIA fabric manager service...\n2025-03-25T02:10:15+0000 node nv-fabricmanager[2116]: fabric manager NVIDIA GPU driver interface version 570.124.06 don't match with driver version 580.95.05. Please update with matching NVIDIA driver package.\n2025-03-25T02:10:15+0000 node systemd[1]: nvidia-fabricmanager.service: Control process exited, code=exited, status=1/FAILURE\n\n";
        let t = tail_text(captured);
        assert!(t.starts_with("2025-03-25T02:10:14+0000 node systemd[1]: Starting"));
        assert!(t.contains(" | 2025-03-25T02:10:15+0000 node nv-fabricmanager[2116]: fabric manager NVIDIA GPU driver interface version 570.124.06 don't match"));
        assert_eq!(tail_text("-- No entries --\n"), "");
        let many: String = (0..50).map(|i| format!("line {i}\n")).collect();
        let t = tail_text(&many);
        assert!(t.starts_with("line 30 | ") && t.ends_with("line 49"));
    }

    /// This machine has systemctl but no running systemd (a container):
    /// the real systemctl's refusal becomes FabricManagerFailed quoting it.
    /// Where systemd runs, nothing is started here.
    #[test]
    fn a_real_systemctl_without_systemd_fails_with_its_stderr() {
        let state = crate::process::command("systemctl")
            .arg("is-system-running")
            .output();
        let Ok(state) = state else {
            eprintln!("no systemctl here: skipped");
            return;
        };
        let state = String::from_utf8_lossy(&state.stdout).trim().to_string();
        if state != "offline" {
            eprintln!("systemd is {state:?} here, not offline: skipped");
            return;
        }
        let e = start_units(HostSystemd::Here, &[FABRIC_MANAGER_UNIT], true, &|_| {
            Some("/var/log/fabricmanager.log: (test)".into())
        })
        .unwrap_err();
        assert_eq!(e.reason, Reason::FabricManagerFailed);
        assert!(
            e.to_string()
                .starts_with("systemctl daemon-reload exited with exit status: 1: "),
            "{e}"
        );
        assert!(
            e.to_string().contains("not been booted with systemd")
                || e.to_string().contains("Failed to connect to bus"),
            "{e}"
        );
    }
}
