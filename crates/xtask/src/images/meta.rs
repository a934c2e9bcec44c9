//! images.json: per image, its `name`, its `archive` (relative to
//! images.json's directory), `bytes` = the sum of its compressed layers
//! (what a registry or containerd's content store holds for it;
//! `archiveBytes` is the file's size) and `digest` = the manifest's digest
//! (`ctr images ls`'s DIGEST).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::ser::SerializeMap as _;
use serde::{Deserialize, Serialize};

use super::sys;
use crate::cmd::cmd;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageMeta {
    pub name: String,
    pub archive: String,
    pub bytes: u64,
    pub archive_bytes: u64,
    pub digest: String,
}

/// images.json's images in the order they were built (serde_json's own
/// map would sort them).
struct Ordered<'a>(&'a [(&'a str, ImageMeta)]);

impl Serialize for Ordered<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// Reads each `(image, name)`'s archive `<image>.oci.tar` in `dir`, checks
/// that its index names `name`, and writes `dir/images.json`.
pub fn record(dir: &Path, images: &[(&str, String)]) -> Result<()> {
    let mut all = Vec::new();
    for (image, name) in images {
        let archive = format!("{image}.oci.tar");
        let path = dir.join(&archive);
        let index = parse_index(&member(&path, "index.json")?)
            .with_context(|| format!("{archive}'s index.json"))?;
        if index.ref_name.as_deref() != Some(name.as_str()) {
            let r = index.ref_name.as_deref().unwrap_or("None");
            bail!("{archive}'s index names '{r}', not '{name}'");
        }
        let hex = index.digest.trim_start_matches("sha256:");
        let manifest = member(&path, &format!("blobs/sha256/{hex}"))?;
        let bytes = layer_bytes(&manifest).with_context(|| format!("{archive}'s manifest"))?;
        let archive_bytes = path
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        all.push((
            *image,
            ImageMeta {
                name: name.clone(),
                archive,
                bytes,
                archive_bytes,
                digest: index.digest,
            },
        ));
    }
    let p = dir.join("images.json");
    std::fs::write(&p, to_json(&all)?).with_context(|| format!("writing {}", p.display()))
}

fn to_json(all: &[(&str, ImageMeta)]) -> Result<String> {
    Ok(serde_json::to_string_pretty(&Ordered(all))? + "\n")
}

/// One member of the tar `archive` (index.json or a manifest: small).
fn member(archive: &Path, name: &str) -> Result<Vec<u8>> {
    sys::output(
        cmd("tar").arg("-xOf").arg(archive).arg(name),
        1 << 20,
        Duration::from_secs(120),
    )
}

#[derive(Debug, PartialEq)]
struct Index {
    ref_name: Option<String>,
    digest: String,
}

/// An OCI index.json that holds exactly one manifest: its
/// org.opencontainers.image.ref.name and digest (`sha256:<64 hex>`).
fn parse_index(json: &[u8]) -> Result<Index> {
    #[derive(Deserialize)]
    struct Doc {
        manifests: Vec<Desc>,
    }
    #[derive(Deserialize)]
    struct Desc {
        digest: String,
        #[serde(default)]
        annotations: BTreeMap<String, String>,
    }
    let doc: Doc = serde_json::from_slice(json)?;
    let [m] = <[Desc; 1]>::try_from(doc.manifests)
        .map_err(|v| anyhow::anyhow!("the index holds {} manifests, not one", v.len()))?;
    let hex = m.digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("the manifest's digest is not sha256:<64 hex>: {}", m.digest);
    }
    Ok(Index {
        ref_name: m
            .annotations
            .get("org.opencontainers.image.ref.name")
            .cloned(),
        digest: m.digest,
    })
}

/// The sum of an OCI manifest's layer sizes.
fn layer_bytes(json: &[u8]) -> Result<u64> {
    #[derive(Deserialize)]
    struct Doc {
        layers: Vec<Layer>,
    }
    #[derive(Deserialize)]
    struct Layer {
        size: u64,
    }
    let doc: Doc = serde_json::from_slice(json)?;
    Ok(doc.layers.iter().map(|l| l.size).sum())
}

/// images.json as `images build` writes it.
pub fn parse(json: &[u8]) -> Result<BTreeMap<String, ImageMeta>> {
    Ok(serde_json::from_slice(json)?)
}

/// The line printed for an image: its name, digest and compressed size.
pub fn summary(image: &str, m: &ImageMeta) -> String {
    let digest: String = m.digest.chars().take(19).collect();
    format!(
        "  {image}: {} {digest} {:.1} MB",
        m.name,
        m.bytes as f64 / 1e6
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from buildah 1.28's `push --format oci IMAGE oci-archive:F:IMAGE`.
    const INDEX: &str = r#"{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:71f0299d798c2c5ef30470fcb04e4e6b30636bf32d4da54272c2765b429fb828","size":573,"annotations":{"org.opencontainers.image.ref.name":"localhost/pause:4d84ee287609"}}]}"#;
    const MANIFEST: &str = r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:310dbe28dcb2de1bf456647506a38d7a8648c5d6a240bca9de49bc769f3ea406","size":837},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:bc01676cc4ee20e6ea37c93b79498b325838bd0cafcb4ce8143b680145013917","size":321186}],"annotations":{"org.opencontainers.image.base.digest":"sha256:fe92fafc4f4e8ea17d415c739c77a5d0dfedf96343bee8eeb8a68b826982059c","org.opencontainers.image.base.name":""}}"#;

    #[test]
    fn reads_the_index_and_the_manifest() {
        let i = parse_index(INDEX.as_bytes()).unwrap();
        assert_eq!(i.ref_name.as_deref(), Some("localhost/pause:4d84ee287609"));
        assert_eq!(
            i.digest,
            "sha256:71f0299d798c2c5ef30470fcb04e4e6b30636bf32d4da54272c2765b429fb828"
        );
        assert_eq!(layer_bytes(MANIFEST.as_bytes()).unwrap(), 321186);
        let two = INDEX.replace("}]}", "},{\"digest\":\"sha256:00\"}]}");
        assert!(parse_index(two.as_bytes()).is_err());
        let bad = INDEX.replace("sha256:71f0", "sha256:../");
        assert!(parse_index(bad.as_bytes()).is_err());
    }

    #[test]
    fn writes_images_json_in_build_order_and_reads_it_back() {
        let m = |name: &str, bytes| ImageMeta {
            name: name.into(),
            archive: "x.oci.tar".into(),
            bytes,
            archive_bytes: bytes + 8190,
            digest: "sha256:71f0299d798c2c5ef30470fcb04e4e6b30636bf32d4da54272c2765b429fb828"
                .into(),
        };
        let all = [
            ("pause", m("localhost/pause:4d84ee287609", 321186)),
            (
                "exporter",
                m("localhost/gpu-driver-exporter:4d84ee287609", 1),
            ),
        ];
        let json = to_json(&all).unwrap();
        assert!(json.starts_with("{\n  \"pause\": {\n    \"name\": \"localhost/pause:"));
        assert!(json.contains("\"archiveBytes\": 329376,"));
        assert!(json.find("pause").unwrap() < json.find("exporter").unwrap());
        let back = parse(json.as_bytes()).unwrap();
        assert_eq!(back["pause"], all[0].1);
        assert_eq!(
            summary("pause", &back["pause"]),
            "  pause: localhost/pause:4d84ee287609 sha256:71f0299d798c 0.3 MB"
        );
    }
}
