//! Fabric Manager and nvidia-persistenced: the host daemons some GPUs need
//! beyond the driver, supervised by the host's systemd.
//!
//! On NVSwitch systems (HGX A100/H100/H200) CUDA fails with error 802
//! (`cudaErrorSystemNotReady`) until `nv-fabricmanager` has set up the
//! fabric; nvidia-smi works regardless. Its version must equal the
//! driver's: NVIDIA publishes it as a redistributable archive next to the
//! driver's (`…/redist/fabricmanager/linux-<x86_64|sbsa>/fabricmanager-linux-<x86_64|sbsa>-<version>-archive.tar.xz`,
//! sha256 in `…/redist/redistrib_<version>.json`), holding `bin/`,
//! `etc/fabricmanager.cfg`, `share/nvidia/nvswitch/` (topologies),
//! `systemd/`, `lib/` and `include/` (docs/install.md cites the sources).
//!
//! Its files go into the driver root (`usr/bin/nv-fabricmanager`, …), so
//! the `current` link names the driver and its Fabric Manager at once; the
//! systemd units run them from `/var/lib/gpu-driver/drivers/current`. The
//! units are written through [`crate::hostfs`] and enabled with the same
//! link `systemctl enable` makes; starting needs the host's running systemd,
//! reached in its mount namespace (hostPID) by a single-threaded child that
//! enters `/proc/1/ns/mnt` and execs systemctl there.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::host::{CpuArch, HostRoot, HostRootSource};
use crate::hostfs::HostFs;
use crate::report::Reason;

/// NVIDIA's redistributable driver components.
pub const REDIST_BASE: &str = "https://developer.download.nvidia.com/compute/nvidia-driver/redist";
/// The driver root the units run from, as the host sees it.
pub const CURRENT_ROOT: &str = "/var/lib/gpu-driver/drivers/current";
pub const FABRIC_MANAGER_UNIT: &str = "nvidia-fabricmanager.service";
pub const PERSISTENCED_UNIT: &str = "nvidia-persistenced.service";
/// Where units of the local administrator live (and ours: they are not a
/// package's, so not under /usr/lib/systemd).
pub const UNIT_DIR: &str = "/etc/systemd/system";
/// `WantedBy=multi-user.target`, as `systemctl enable` links it.
pub const WANTS_DIR: &str = "/etc/systemd/system/multi-user.target.wants";
/// Inside the driver root.
pub const FM_BINARY: &str = "usr/bin/nv-fabricmanager";
pub const FM_CONFIG: &str = "etc/fabricmanager.cfg";
pub const TOPOLOGY_DIR: &str = "usr/share/nvidia/nvswitch";
pub const PERSISTENCED_BINARY: &str = "usr/bin/nvidia-persistenced";
/// Lines of the unit's journal quoted in a failure.
const JOURNAL_LINES: usize = 20;

/// NVIDIA's redist platform: the aarch64 server platform is `linux-sbsa`.
pub fn redist_platform(arch: CpuArch) -> &'static str {
    match arch {
        CpuArch::X86_64 => "linux-x86_64",
        CpuArch::Aarch64 => "linux-sbsa",
    }
}

/// The Fabric Manager archive of driver `version`.
pub fn archive_url(version: &str, arch: CpuArch) -> String {
    let p = redist_platform(arch);
    format!("{REDIST_BASE}/fabricmanager/{p}/fabricmanager-{p}-{version}-archive.tar.xz")
}

/// The driver version in an archive's file name
/// (`fabricmanager-linux-<platform>-<version>-archive.tar.xz`).
pub fn archive_version(file_name: &str) -> Option<String> {
    let rest = file_name
        .strip_prefix("fabricmanager-")?
        .strip_suffix("-archive.tar.xz")?;
    let version = rest.rsplit('-').next()?;
    crate::host::is_driver_version(version).then(|| version.to_string())
}

// ------------------------------------------------------------ placement

/// Unpacks the Fabric Manager archive (already sha256-verified by fetch)
/// into the staging driver root `staged` (a real path): `bin/*` →
/// `usr/bin`, `share/nvidia/nvswitch` → `usr/share/nvidia/nvswitch`,
/// `etc/fabricmanager.cfg` → `etc/fabricmanager.cfg` with its topology and
/// database paths moved into the driver root. NVIDIA's own unit, the SDK
/// library and headers are left out: the unit is ours (paths), the SDK
/// serves only virtualized (shared NVSwitch) modes. Returns the placed
/// paths, relative to the root.
pub fn place_archive(archive: &Path, staged: &Path) -> Result<Vec<String>> {
    let scratch = staged.join(".fabricmanager");
    let _ = fs::remove_dir_all(&scratch);
    let placed = place_from(archive, &scratch, staged);
    let _ = fs::remove_dir_all(&scratch);
    placed
}

fn place_from(archive: &Path, scratch: &Path, staged: &Path) -> Result<Vec<String>> {
    crate::extract::extract_package(archive, scratch).map_err(|e| {
        failed(format!(
            "unpacking the Fabric Manager archive {}: {}",
            archive.display(),
            e.message
        ))
    })?;
    let top = archive_top(scratch).ok_or_else(|| {
        failed(format!(
            "{} has no bin/nv-fabricmanager (NVIDIA's layout: fabricmanager-linux-<platform>-<version>-archive/bin/nv-fabricmanager)",
            archive.display()
        ))
    })?;
    let mut placed = Vec::new();
    let bin = staged.join("usr/bin");
    mkdir(&bin)?;
    for entry in read_dir(&top.join("bin"))? {
        let name = entry.file_name();
        move_into(&entry.path(), &bin.join(&name))?;
        placed.push(format!("usr/bin/{}", name.to_string_lossy()));
    }
    let topo = top.join("share/nvidia/nvswitch");
    if topo.is_dir() {
        let dest = staged.join(TOPOLOGY_DIR);
        mkdir(dest.parent().unwrap_or(staged))?;
        move_into(&topo, &dest)?;
        placed.push(TOPOLOGY_DIR.to_string());
    }
    let cfg = top.join("etc/fabricmanager.cfg");
    if let Ok(text) = fs::read_to_string(&cfg) {
        mkdir(&staged.join("etc"))?;
        let dest = staged.join(FM_CONFIG);
        fs::write(&dest, adjust_config(&text, CURRENT_ROOT))
            .map_err(|e| Error::io(Reason::FabricManagerFailed, "writing", &dest, e))?;
        placed.push(FM_CONFIG.to_string());
    }
    Ok(placed)
}

/// The directory holding `bin/nv-fabricmanager`: the archive's one top
/// directory, or the extraction directory itself.
fn archive_top(scratch: &Path) -> Option<PathBuf> {
    let has = |d: &Path| d.join("bin/nv-fabricmanager").is_file();
    if has(scratch) {
        return Some(scratch.to_path_buf());
    }
    fs::read_dir(scratch)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.is_dir() && has(p))
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    let mut v: Vec<fs::DirEntry> = fs::read_dir(dir)
        .map_err(|e| Error::io(Reason::FabricManagerFailed, "reading", dir, e))?
        .filter_map(std::result::Result::ok)
        .collect();
    v.sort_by_key(fs::DirEntry::file_name);
    Ok(v)
}

fn mkdir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| Error::io(Reason::FabricManagerFailed, "creating", dir, e))
}

fn move_into(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).map_err(|e| {
        Error::io(
            Reason::FabricManagerFailed,
            &format!("moving {} to", from.display()),
            to,
            e,
        )
    })
}

fn failed(message: String) -> Error {
    Error::new(Reason::FabricManagerFailed, message)
}

/// `fabricmanager.cfg` with the keys that name the topology files
/// (`TOPOLOGY_FILE_PATH`, and `DATABASE_PATH` where the release has it)
/// pointed into `root` when they name NVIDIA's default
/// `/usr/share/nvidia/nvswitch`; every other line is kept as shipped
/// (`KEY=VALUE`, `#` comments), so NVIDIA's defaults (log file, daemon
/// mode, fabric mode) stay.
pub fn adjust_config(text: &str, root: &str) -> String {
    let mut out = String::with_capacity(text.len() + 128);
    for line in text.lines() {
        match line.split_once('=') {
            Some((key, value))
                if matches!(key.trim(), "TOPOLOGY_FILE_PATH" | "DATABASE_PATH")
                    && value.trim().starts_with("/usr/share/nvidia/nvswitch") =>
            {
                out.push_str(&format!("{}={root}{}", key.trim(), value.trim()));
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// A `KEY=VALUE` of `fabricmanager.cfg` (the last one wins, as in FM's own
/// reading); `None` when absent or empty.
pub fn config_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
        .next_back()
        .filter(|v| !v.is_empty())
}

// ------------------------------------------------------------ units

/// Our unit for Fabric Manager: NVIDIA's (forking daemon, 240 s start
/// timeout, core dumps kept) with paths into the current driver root, and
/// conditions so that at boot, before the installer has loaded the driver
/// and recreated `/dev/nvidiactl` (devtmpfs starts empty), the unit is
/// skipped instead of failing; the installer starts it after every load.
pub fn fabric_manager_unit() -> String {
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
pub fn persistenced_unit() -> String {
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
pub fn write_unit(fs: &HostFs, unit: &str, text: &str) -> Result<String> {
    let path = format!("{UNIT_DIR}/{unit}");
    let io = |e: Error| failed(format!("writing the systemd unit {path}: {}", e.message));
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
pub enum HostSystemd {
    /// We run in the host's mount namespace (host root `/`).
    Here,
    /// The host root is PID 1's (`/proc/1/root`, hostPID): a child enters
    /// `/proc/1/ns/mnt` and runs the host's systemctl there.
    Pid1Namespace,
    /// Another directory (a fixture, an image, `/host`): its systemd, if
    /// any, is not ours to reach; units are written and enabled only.
    Unreachable,
}

pub fn host_systemd(root: &HostRoot) -> HostSystemd {
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
pub enum HostTool {
    Systemctl,
    Journalctl,
}

impl HostTool {
    pub fn name(self) -> &'static str {
        match self {
            HostTool::Systemctl => "systemctl",
            HostTool::Journalctl => "journalctl",
        }
    }
}

/// The command that runs `tool args` against the host's systemd; `None`
/// when it cannot be reached.
pub fn host_command(how: HostSystemd, tool: HostTool, args: &[&str]) -> Option<Command> {
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
pub fn exec_host_tool(tool: HostTool, args: &[String]) -> Error {
    use std::os::unix::process::CommandExt;
    // The working directory is a path of the namespace we left.
    if let Err(e) = std::env::set_current_dir("/") {
        return Error::io(
            Reason::FabricManagerFailed,
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
pub fn systemctl(how: HostSystemd, args: &[&str]) -> Result<()> {
    let Some(mut cmd) = host_command(how, HostTool::Systemctl, args) else {
        return Ok(());
    };
    crate::process::run(&mut cmd, Reason::FabricManagerFailed).map(|_| ())
}

/// The unit's last journal lines, or why they could not be read.
pub fn journal_tail(how: HostSystemd, unit: &str) -> String {
    let n = JOURNAL_LINES.to_string();
    let args = ["-u", unit, "-n", &n, "--no-pager", "-o", "short-iso"];
    let Some(mut cmd) = host_command(how, HostTool::Journalctl, &args) else {
        return String::new();
    };
    match crate::process::run(&mut cmd, Reason::FabricManagerFailed) {
        Ok(out) => tail_text(&String::from_utf8_lossy(&out.stdout)),
        Err(e) => format!("({})", e.message),
    }
}

/// The last lines of a log, joined with ` | ` for a one-line message;
/// journalctl's `-- No entries --` and blank lines say nothing.
pub fn tail_text(text: &str) -> String {
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
pub struct Started {
    /// The systemctl command lines run, in order.
    pub commands: Vec<String>,
}

/// `daemon-reload`, then `restart` (the driver changed: a running daemon
/// holds the old one's files and state) or `start` (a no-op when running)
/// for each unit, in the host's namespace. A failure quotes systemctl's
/// stderr, the unit's journal tail, and `log_tail` (Fabric Manager's own
/// log file, read by the caller through the host root).
pub fn start_units(
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
            let mut msg = format!("starting {unit}: {}", e.message);
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
pub fn stop_ours(fs: &HostFs, how: HostSystemd) -> Vec<String> {
    let mut notes = Vec::new();
    for unit in [FABRIC_MANAGER_UNIT, PERSISTENCED_UNIT] {
        let ours = matches!(fs.kind(format!("{UNIT_DIR}/{unit}")), Ok(Some(_)));
        if !ours {
            continue;
        }
        match systemctl(how, &["stop", unit]) {
            Ok(()) if how == HostSystemd::Unreachable => {}
            Ok(()) => notes.push(format!("stopped {unit} before replacing the driver")),
            Err(e) => notes.push(format!("{unit} not stopped: {}", e.message)),
        }
    }
    notes
}

/// The last lines of the log file `fabricmanager.cfg` names
/// (`LOG_FILE_NAME`), read through the host root; `None` when it names
/// none or it cannot be read.
pub fn config_log_tail(root: &HostRoot, config: &str) -> Option<String> {
    let log = config_value(config, "LOG_FILE_NAME")?;
    let bytes = crate::host::read_host_file(&root.resolve(&log)?).ok()??;
    let text = String::from_utf8_lossy(&bytes);
    Some(format!("{log}: {}", tail_text(&text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_urls_follow_nvidias_redist_layout() {
        assert_eq!(
            archive_url("580.95.05", CpuArch::X86_64),
            "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-580.95.05-archive.tar.xz"
        );
        assert_eq!(
            archive_url("580.95.05", CpuArch::Aarch64),
            "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-sbsa/fabricmanager-linux-sbsa-580.95.05-archive.tar.xz"
        );
        assert_eq!(
            archive_version("fabricmanager-linux-sbsa-580.95.05-archive.tar.xz").as_deref(),
            Some("580.95.05")
        );
        assert_eq!(
            archive_version("fabricmanager-linux-x86_64-x-archive.tar.xz"),
            None
        );
        assert_eq!(archive_version("NVIDIA-Linux-x86_64-580.95.05.run"), None);
    }

    #[test]
    fn the_config_keeps_nvidias_defaults_and_finds_topologies_in_the_root() {
        let shipped = "# comment\nLOG_LEVEL=4\nLOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=1\nTOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch\nDATABASE_PATH=/usr/share/nvidia/nvswitch\nSTATE_FILE_NAME=/tmp/fabricmanager.state\n";
        let got = adjust_config(shipped, CURRENT_ROOT);
        assert_eq!(
            got,
            "# comment\nLOG_LEVEL=4\nLOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=1\nTOPOLOGY_FILE_PATH=/var/lib/gpu-driver/drivers/current/usr/share/nvidia/nvswitch\nDATABASE_PATH=/var/lib/gpu-driver/drivers/current/usr/share/nvidia/nvswitch\nSTATE_FILE_NAME=/tmp/fabricmanager.state\n"
        );
        // A path an administrator chose elsewhere is theirs.
        assert_eq!(
            adjust_config("TOPOLOGY_FILE_PATH=/opt/topo\n", CURRENT_ROOT),
            "TOPOLOGY_FILE_PATH=/opt/topo\n"
        );
        assert_eq!(
            config_value(shipped, "LOG_FILE_NAME").as_deref(),
            Some("/var/log/fabricmanager.log")
        );
        assert_eq!(config_value("LOG_FILE_NAME=\n", "LOG_FILE_NAME"), None);
        assert_eq!(config_value("#LOG_FILE_NAME=/x\n", "LOG_FILE_NAME"), None);
    }

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
            e.message
                .starts_with("systemctl daemon-reload exited with exit status: 1: "),
            "{e}"
        );
        assert!(
            e.message.contains("not been booted with systemd")
                || e.message.contains("Failed to connect to bus"),
            "{e}"
        );
    }
}
