//! The VM: its second disk (kubelet, images, credentials), its QEMU
//! process and what its console says (tools/node/node-init's lines).

use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use super::kube::Ctx;
use super::{Clock, NODE, now};
use crate::cmd::{cmd, run};

/// The PCI address node-init shows the double's function at (and the
/// profile names).
pub(super) const GPU_PCI: &str = "0000:3b:00.0";

/// The images each node imports, as named in images.json.
const NODE_IMAGES: [&str; 6] = [
    "installer",
    "operator",
    "builder-bookworm",
    "pause",
    "exporter",
    "nvidia-device-plugin",
];

/// `node.json` of scripts/node-root's output: the VM kernel's release.
pub(super) fn kernel_release(noderoot: &Path) -> Result<String> {
    let p = noderoot.join("node.json");
    let text = read_small(&p)?;
    parse_kernel_release(&text).with_context(|| format!("no kernelRelease in {}", p.display()))
}

fn parse_kernel_release(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v["kernelRelease"].as_str().map(String::from)
}

/// A JSON file of a few KB another tool wrote, read with a bound.
pub(super) fn read_small(p: &Path) -> Result<String> {
    let mut s = String::new();
    fs::File::open(p)
        .with_context(|| format!("opening {}", p.display()))?
        .take(16 << 20)
        .read_to_string(&mut s)
        .with_context(|| format!("reading {}", p.display()))?;
    Ok(s)
}

#[derive(Deserialize)]
pub(super) struct Image {
    pub(super) name: String,
    archive: String,
    pub(super) bytes: u64,
}

/// scripts/build-images' images.json, in its order (the result's `images`
/// keeps it).
pub(super) struct Images {
    dir: PathBuf,
    pub(super) list: Vec<(String, Image)>,
}

impl Images {
    pub(super) fn read(dir: &Path) -> Result<Self> {
        let p = dir.join("images.json");
        let list =
            parse_images(&read_small(&p)?).with_context(|| format!("parsing {}", p.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            list,
        })
    }

    fn get(&self, key: &str) -> Result<&Image> {
        self.list
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, i)| i)
            .with_context(|| format!("{}/images.json has no {key}", self.dir.display()))
    }

    /// The image's name (`localhost/…:tag`).
    pub(super) fn name(&self, key: &str) -> Result<&str> {
        Ok(&self.get(key)?.name)
    }
}

/// images.json's entries in the file's order (serde_json's map sorts).
fn parse_images(text: &str) -> Result<Vec<(String, Image)>> {
    struct Ordered(Vec<(String, Image)>);
    impl<'de> Deserialize<'de> for Ordered {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Ordered;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a map of images")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut m: A,
                ) -> Result<Ordered, A::Error> {
                    let mut v = Vec::new();
                    while let Some(e) = m.next_entry()? {
                        v.push(e);
                    }
                    Ok(Ordered(v))
                }
            }
            d.deserialize_map(V)
        }
    }
    Ok(serde_json::from_str::<Ordered>(text)?.0)
}

/// The second disk (`/dev/vdb`): the kubelet, the images' OCI archives,
/// the cluster's CA, the kubelet's token and node.env, as ext4.
pub(super) fn config_disk(ctx: &Ctx, images: &Images, bin: &Path, st: &mut Clock) -> Result<()> {
    st.stage("config disk (kubelet, images, credentials)")?;
    let cfg = ctx.out.join("cfg");
    for i in NODE_IMAGES {
        let src = images.dir.join(&images.get(i)?.archive);
        copy(&src, &cfg.join("images").join(format!("{i}.tar")))?;
    }
    copy(&bin.join("kubelet"), &cfg.join("kubelet"))?;
    copy(&ctx.env.ca_file, &cfg.join("ca.crt"))?;
    copy(&ctx.env.kubelet_token_file, &cfg.join("kubelet.token"))?;
    let env = format!(
        "NODE_NAME={NODE}\nAPI_PORT={}\nSERVICE_IP=10.96.0.1\nPAUSE_IMAGE={}\n\
         NODE_LABELS=worker.gardener.cloud/pool=gpu\nGPU_DOUBLE_PCI={GPU_PCI}\n",
        ctx.env.api_port,
        images.name("pause")?
    );
    fs::write(cfg.join("node.env"), env)?;
    let size_mb = disk_usage(&cfg)?.div_ceil(1 << 20) + 64;
    let img = ctx.out.join("cfg.img");
    run(cmd("mkfs.ext4")
        .args(["-q", "-F", "-L", "nodecfg", "-d"])
        .arg(&cfg)
        .arg(&img)
        .arg(format!("{size_mb}M")))
}

fn copy(src: &Path, dst: &Path) -> Result<()> {
    fs::copy(src, dst)
        .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    Ok(())
}

/// What `du` counts: each file's size in 4 KiB blocks.
fn disk_usage(dir: &Path) -> Result<u64> {
    let mut sum = 0;
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let m = e.metadata()?;
        sum += if m.is_dir() {
            disk_usage(&e.path())? + 4096
        } else {
            m.len().div_ceil(4096) * 4096
        };
    }
    Ok(sum)
}

/// Starts the VM (its console into `<out>/console.log`); the deadline of
/// the waits starts now. Returns QEMU's start.
pub(super) fn boot(ctx: &mut Ctx, noderoot: &Path) -> Result<f64> {
    let start = now();
    let console = fs::File::create(ctx.out.join("console.log"))?;
    let child = cmd("qemu-system-x86_64")
        .args(["-accel", "tcg,thread=multi", "-smp", "2", "-m", "3072", "-nographic"])
        .arg("-kernel")
        .arg(noderoot.join("vmlinuz"))
        .arg("-initrd")
        .arg(noderoot.join("initrd.img"))
        .args([
            "-append",
            "console=ttyS0 root=/dev/vda rw init=/usr/local/sbin/node-init net.ifnames=0 panic=-1 quiet",
        ])
        .arg("-drive")
        .arg(drive(&noderoot.join("disk.img"), "snapshot=on"))
        .arg("-drive")
        .arg(drive(&ctx.out.join("cfg.img"), "readonly=on"))
        .args(["-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0"])
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .spawn()
        .context("starting qemu-system-x86_64")?;
    ctx.live.qemu = Some(child);
    ctx.restart_deadline(1);
    Ok(start)
}

fn drive(file: &Path, opt: &str) -> std::ffi::OsString {
    let mut s = std::ffi::OsString::from("file=");
    s.push(file);
    s.push(format!(",format=raw,if=virtio,{opt}"));
    s
}

/// The console, read as it grows: how often node-init mounted (once per
/// boot) and whether it failed.
pub(super) struct Console {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
    pub(super) boots: usize,
    pub(super) failed: bool,
}

impl Console {
    pub(super) fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            partial: Vec::new(),
            boots: 0,
            failed: false,
        }
    }

    /// Reads what was appended since the last call (at most 16 MiB a call).
    pub(super) fn poll(&mut self) -> Result<()> {
        let Ok(mut f) = fs::File::open(&self.path) else {
            return Ok(());
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.take(16 << 20).read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        let Some(last_nl) = self.partial.iter().rposition(|b| *b == b'\n') else {
            return Ok(());
        };
        let whole: Vec<u8> = self.partial.drain(..=last_nl).collect();
        let (boots, failed) = scan(&String::from_utf8_lossy(&whole));
        self.boots += boots;
        self.failed |= failed;
        Ok(())
    }
}

/// Counts the boots (`node-init: mounts done`) and whether node-init failed.
fn scan(text: &str) -> (usize, bool) {
    let mut boots = 0;
    let mut failed = false;
    for l in text.lines() {
        let l = l.trim_end_matches('\r');
        boots += usize::from(l.starts_with("node-init: mounts done"));
        failed |= l.starts_with("node-init: FAILED");
    }
    (boots, failed)
}

/// The last `max` bytes of a file.
pub(super) fn read_tail(p: &Path, max: u64) -> Result<String> {
    let mut f = fs::File::open(p)?;
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The last `n` of node-init's and the kubelet's lines on the console.
pub(super) fn init_lines(text: &str, n: usize) -> Vec<&str> {
    let all: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("node-init:") || l.starts_with("node-log:"))
        .collect();
    all[all.len().saturating_sub(n)..].to_vec()
}

/// Fails when the VM stopped or node-init failed.
pub(super) fn check_alive(ctx: &mut Ctx, what: &str) -> Result<()> {
    let exited = match ctx.live.qemu.as_mut() {
        Some(c) => c.try_wait()?.is_some(),
        None => true,
    };
    if exited {
        bail!("the VM stopped while waiting for {what}");
    }
    if ctx.console.failed {
        bail!("node-init failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_images_in_order() {
        let text = r#"{
  "installer": {"name": "localhost/gpu-driver-installer:4d84ee287609", "archive": "installer.oci.tar",
    "bytes": 9448958, "archiveBytes": 9458176, "digest": "sha256:b3b7"},
  "operator": {"name": "localhost/gpu-driver-operator:4d84ee287609", "archive": "operator.oci.tar",
    "bytes": 8052274, "archiveBytes": 8061440, "digest": "sha256:4ebb"},
  "builder-bookworm": {"name": "localhost/gpu-driver-builder:bookworm-4d84ee287609",
    "archive": "builder-bookworm.oci.tar", "bytes": 111661866, "archiveBytes": 111670784, "digest": "sha256:d728"}
}"#;
        let l = super::parse_images(text).unwrap();
        let keys: Vec<&str> = l.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["installer", "operator", "builder-bookworm"]);
        assert_eq!(l[2].1.bytes, 111661866);
        assert_eq!(l[2].1.archive, "builder-bookworm.oci.tar");
    }

    #[test]
    fn reads_the_kernel_release() {
        let text = r#"{"key": "59f9a66b4d4a1a1c", "kernelRelease": "6.1.0-50-cloud-amd64", "created": "2026-12-07T18:58:37Z",
 "packages": {"containerd": "1.6.20~ds1-1+deb12u3"}}"#;
        assert_eq!(
            super::parse_kernel_release(text).as_deref(),
            Some("6.1.0-50-cloud-amd64")
        );
    }

    #[test]
    fn counts_boots_and_failures() {
        let text = "[    0.000000] Linux version 6.1.0\r\nnode-init: mounts done 1765140000\r\n\
                    node-log: E1207 kubelet\nnode-init: mounts done 1765140100\n";
        assert_eq!(super::scan(text), (2, false));
        assert_eq!(
            super::scan("node-init: FAILED: mounting the config disk /dev/vdb\n"),
            (0, true)
        );
        let lines = super::init_lines(text, 2);
        assert_eq!(lines.len(), 2);
        assert!(lines[1].starts_with("node-init: mounts done 1765140100"));
    }
}
