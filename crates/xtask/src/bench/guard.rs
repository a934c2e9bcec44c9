//! What a benchmark leaves behind (servers, a /proc mount and files in a
//! shared builder root, scratch directories, a local cluster), undone when
//! it ends: normally, on an error, or on SIGINT/SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::unistd::Pid;

enum Action {
    /// A server: SIGTERM, then SIGKILL after 10 s.
    Stop(Child),
    Umount(PathBuf),
    Remove(PathBuf),
    /// A command whose output and outcome do not matter.
    Run(Command),
    /// A lock, held until the actions registered after it have run.
    Hold(std::fs::File),
}

type Actions = Arc<Mutex<Vec<Action>>>;

/// Registered actions run once, last registered first, when this is
/// dropped or when SIGINT or SIGTERM arrives (the process then exits with
/// 128 + the signal's number).
pub(super) struct Cleanup {
    actions: Actions,
}

impl Cleanup {
    /// Call it before any other thread starts: the signals are blocked in
    /// this thread (and so in every thread it starts) and taken by a
    /// thread of their own; children start with no signal blocked (std
    /// clears the mask when it spawns).
    pub(super) fn new() -> Result<Self> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGINT);
        set.add(Signal::SIGTERM);
        set.thread_block().context("blocking SIGINT and SIGTERM")?;
        let actions: Actions = Arc::default();
        let on_signal = actions.clone();
        std::thread::spawn(move || {
            let Ok(sig) = set.wait() else { return };
            eprintln!("bench: {sig}, cleaning up");
            run_all(&on_signal);
            std::process::exit(128 + sig as i32);
        });
        Ok(Self { actions })
    }

    fn push(&self, a: Action) {
        self.actions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(a);
    }

    /// Stops `child` at the end; returns its pid.
    pub(super) fn stop(&self, child: Child) -> u32 {
        let pid = child.id();
        self.push(Action::Stop(child));
        pid
    }

    pub(super) fn umount(&self, path: &Path) {
        self.push(Action::Umount(path.to_path_buf()));
    }

    pub(super) fn remove(&self, path: &Path) {
        self.push(Action::Remove(path.to_path_buf()));
    }

    pub(super) fn run(&self, c: Command) {
        self.push(Action::Run(c));
    }

    pub(super) fn hold(&self, lock: std::fs::File) {
        self.push(Action::Hold(lock));
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        run_all(&self.actions);
    }
}

fn run_all(actions: &Actions) {
    // Taken whole under the lock: the signal's thread and the main one
    // never run an action twice.
    let todo: Vec<Action> = std::mem::take(&mut *actions.lock().unwrap_or_else(|e| e.into_inner()));
    for a in todo.into_iter().rev() {
        if let Err(e) = undo(a) {
            eprintln!("warning: cleaning up: {e:#}");
        }
    }
}

fn undo(a: Action) -> Result<()> {
    match a {
        Action::Stop(mut child) => {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            wait_or_kill(&mut child, Duration::from_secs(10))?;
        }
        Action::Umount(p) => {
            let quiet = |lazy: bool| {
                let mut c = Command::new("umount");
                if lazy {
                    c.arg("-l");
                }
                c.arg(&p)
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            };
            if !quiet(false) && !quiet(true) {
                eprintln!("warning: could not unmount {}", p.display());
            }
        }
        Action::Remove(p) => crate::cache::remove(&p)?,
        Action::Hold(lock) => drop(lock),
        Action::Run(mut c) => {
            let mut child = c.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
            wait_or_kill(&mut child, Duration::from_secs(120))?;
        }
    }
    Ok(())
}

/// Waits for `child` up to `limit`, then kills it; whether it ended alone.
pub(super) fn wait_or_kill(child: &mut Child, limit: Duration) -> Result<bool> {
    let deadline = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(true)
}
