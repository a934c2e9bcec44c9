//! `fetch` against real HTTP servers on loopback, with faults injected.

use crate::support::fabric as fabric_support;

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::support::http::{ConnectProxy, Reply, Request, Server, bytes, sha256_hex};
use serde_json::Value;

mod plan;
mod resume;
mod transport;

/// Every variable that could send the installer through a proxy.
fn proxy_vars() -> impl Iterator<Item = &'static str> {
    gpu_driver_installer::fetch::PROXY_VARS
        .into_iter()
        .chain(["NO_PROXY", "no_proxy"])
}

struct Run {
    code: i32,
    doc: Value,
}

impl Run {
    fn message(&self) -> &str {
        self.doc["status"]["message"].as_str().unwrap()
    }
}

fn fetch(cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = Command::new(crate::support::bin::installer());
    for v in proxy_vars() {
        c.env_remove(v);
    }
    c.envs(env.iter().copied());
    c.args([
        "--termination-log",
        "/nonexistent/t",
        "fetch",
        "--cache-dir",
    ])
    .arg(cache)
    .args(["--backoff-ms", "10"])
    .args(args);
    let out = c.output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Run {
        code: out.status.code().unwrap(),
        doc,
    }
}

/// The common plain-HTTP fetch: `url` checked against `sum`, with `extra` flags.
fn fetch_http(cache: &Path, url: &str, sum: &str, extra: &[&str]) -> Run {
    fetch_http_env(cache, url, sum, extra, &[])
}

fn fetch_http_env(cache: &Path, url: &str, sum: &str, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let mut args = vec!["--url", url, "--sha256", sum, "--allow-http"];
    args.extend_from_slice(extra);
    fetch(cache, &args, env)
}

/// [`fetch_http`] of the server's `/p.run` into a fresh cache directory.
fn fetch_p_run(server: &Server, sum: &str, extra: &[&str]) -> (tempfile::TempDir, Run) {
    let dir = tempfile::tempdir().unwrap();
    let r = fetch_http(dir.path(), &server.url("/p.run"), sum, extra);
    (dir, r)
}

/// A server whose first answer is cut after `send` bytes of `body`; the
/// later ones are `then(body)`.
fn cut_once_then(body: &[u8], send: usize, then: fn(Vec<u8>) -> Reply) -> Server {
    let b = body.to_vec();
    Server::start(move |req: &Request| {
        if req.index == 0 {
            Reply::Cut {
                body: b.clone(),
                send,
            }
        } else {
            then(b.clone())
        }
    })
}

/// A body of `len` bytes (pattern `seed`), its sha256, and a server that
/// answers every request with it, honouring Range.
fn served(len: usize, seed: u64) -> (Vec<u8>, String, Server) {
    let body = bytes(len, seed);
    let sum = sha256_hex(&body);
    let b = body.clone();
    (body, sum, Server::start(move |_| Reply::Ranged(b.clone())))
}

fn cache_files(cache: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(cache)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
