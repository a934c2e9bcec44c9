//! The static installer inside an empty chroot (no libraries, no
//! /etc/ssl/certs, no /proc): it resolves a plan, fetches a package from
//! the S3 cache, and runs verify's CUDA check on NVIDIA's real libcuda
//! with the host root's loader and glibc.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::cmd::{cmd, run};

const TRIPLET: &str = "x86_64-linux-gnu";

/// Runs the three checks in a fresh temporary jail under `work`.
pub fn check(
    repo: &Path,
    work: &Path,
    bin: &Path,
    s3_server: &Path,
    test_data: &Path,
) -> Result<()> {
    crate::cache::remove(work)?;
    std::fs::create_dir_all(work.join("tmp"))?;
    std::fs::copy(bin, work.join("gpu-driver-installer"))?;
    run(cmd("cp")
        .arg("-a")
        .arg(repo.join("tests/fixtures/hosts/gardenlinux-2150-h100"))
        .arg(work.join("host")))?;
    resolve(work)?;
    fetch_from_s3(work, s3_server)?;
    cuda(repo, work, test_data)?;
    crate::cache::remove(work)
}

/// The installer in the jail; its result document and exit code.
fn installer(work: &Path, args: &[&str], env: &[(&str, String)]) -> Result<(Value, i32)> {
    let mut c = Command::new("chroot");
    c.arg(work)
        .arg("/gpu-driver-installer")
        .args(["--log-level", "warn"])
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c
        .stderr(Stdio::inherit())
        .output()
        .context("running chroot")?;
    let doc = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("the installer ({args:?}) printed no result document"))?;
    Ok((doc, out.status.code().unwrap_or(-1)))
}

fn resolve(work: &Path) -> Result<()> {
    let (doc, rc) = installer(work, &["--host-root", "/host", "resolve"], &[])?;
    ensure!(
        rc == 0 && doc["status"]["reason"] == "Resolved",
        "resolve in an empty chroot: exit {rc}, {doc}"
    );
    eprintln!("static binary resolved a plan inside an empty chroot");
    Ok(())
}

/// The artifact cache's S3 client in a root without /etc/ssl/certs (as in
/// builder roots and scratch images): a package from the store's mirror.
fn fetch_from_s3(work: &Path, s3_server: &Path) -> Result<()> {
    let pkg = work.join("store/jail/packages/pkg.run");
    std::fs::create_dir_all(pkg.parent().context("package path")?)?;
    std::fs::write(&pkg, "a package\n")?;
    let sum = hex::encode(Sha256::digest(std::fs::read(&pkg)?));
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let server = Server(
        cmd(s3_server)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", "jail", "--secret-key", "jail-secret"])
            .arg(work.join("store"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the S3 server")?,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("the S3 server did not listen on 127.0.0.1:{port} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let env = [
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
        ("AWS_ACCESS_KEY_ID", "jail".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "jail-secret".to_string()),
    ];
    let args = [
        "fetch",
        "--url",
        "https://download.invalid/pkg.run",
        "--sha256",
        &sum,
        "--offline",
        "--cache-dir",
        "/tmp/packages",
        "--cache-url",
        "s3://jail/",
        "--allow-http",
    ];
    let (doc, rc) = installer(work, &args, &env)?;
    drop(server);
    ensure!(
        rc == 0 && doc["status"]["reason"] == "Fetched",
        "S3 fetch in an empty chroot: exit {rc}, {doc}"
    );
    eprintln!("static binary fetched a package from the S3 cache inside an empty chroot");
    Ok(())
}

/// verify's CUDA check from a root without any library of its own: the
/// embedded helper runs with the host root's loader and glibc (copies of
/// this machine's) on NVIDIA's real libcuda, which finds no GPU here. The
/// jail has no /proc, so the helper goes through a temporary file, not a
/// memfd (the integration tests cover that path).
fn cuda(repo: &Path, work: &Path, test_data: &Path) -> Result<()> {
    let host = work.join("cudahost");
    run(cmd("cp")
        .arg("-a")
        .arg(repo.join("tests/fixtures/hosts/debian-12-t4-headers"))
        .arg(&host))?;
    let libdir = host.join("usr/lib").join(TRIPLET);
    std::fs::create_dir_all(&libdir)?;
    std::fs::create_dir_all(host.join("lib64"))?;
    std::fs::create_dir_all(work.join("dev"))?;
    for l in [
        "ld-linux-x86-64.so.2",
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
    ] {
        std::fs::copy(Path::new("/lib").join(TRIPLET).join(l), libdir.join(l))?;
    }
    std::os::unix::fs::symlink(
        format!("/usr/lib/{TRIPLET}/ld-linux-x86-64.so.2"),
        host.join("lib64/ld-linux-x86-64.so.2"),
    )?;
    let driver = host
        .join("var/lib/gpu-driver/drivers/test/usr/lib")
        .join(TRIPLET);
    std::fs::create_dir_all(&driver)?;
    for e in std::fs::read_dir(test_data.join("libcuda"))? {
        let p = e?.path();
        if p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("libcuda.so."))
        {
            run(cmd("cp").arg("-P").arg(&p).arg(&driver))?;
        }
    }
    std::os::unix::fs::symlink("test", host.join("var/lib/gpu-driver/drivers/current"))?;
    if !work.join("dev/null").exists() {
        run(cmd("mknod")
            .args(["-m", "666"])
            .arg(work.join("dev/null"))
            .args(["c", "1", "3"]))?;
    }
    let (doc, rc) = installer(work, &["--host-root", "/cudahost", "verify"], &[])?;
    let c = &doc["status"]["cuda"];
    ensure!(
        rc == 15,
        "verify in an empty chroot: exit {rc} (expected 15), {doc}"
    );
    ensure!(
        c["error"]["name"] == "CUDA_ERROR_NO_DEVICE",
        "verify's CUDA check: {c}"
    );
    ensure!(
        c["libc"]
            .as_str()
            .is_some_and(|l| l.starts_with("/cudahost/")),
        "the CUDA helper did not use the host root's glibc: {c}"
    );
    eprintln!(
        "static binary ran NVIDIA's libcuda {} with the host root's glibc inside an empty chroot: cuInit says {}",
        c["driverApiVersion"], c["error"]["name"]
    );
    Ok(())
}

/// A child process killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
