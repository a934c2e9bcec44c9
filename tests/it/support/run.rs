//! One installer run's exit code, result document and stderr, for tests
//! that run the binary. Included with `#[path]` by the tests that use it.

use serde_json::Value;

pub struct Run {
    pub code: i32,
    pub doc: Value,
    pub stderr: String,
}

/// Reads a finished run: stdout must be exactly one JSON document.
pub fn finish(out: std::process::Output) -> Run {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("stdout is not one JSON document ({e}):\n{stdout}\nstderr:\n{stderr}")
    });
    Run {
        code: out.status.code().unwrap_or(-1),
        doc,
        stderr,
    }
}

/// Runs `cmd` to its end, or kills it and fails the test after `deadline`:
/// for runs that must not hang (a FIFO, a stalled peer). Not a speed
/// target: the deadline is far above a normal run.
pub fn output_within(
    mut cmd: std::process::Command,
    deadline: std::time::Duration,
) -> std::process::Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
            panic!("{cmd:?} still running after {deadline:?}: it hangs\nstderr:\n{stderr}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}
