//! What `up` writes before it starts anything: the CA and the apiserver's
//! serving certificate (openssl), the service-account key pair, the static
//! tokens, the admin kubeconfig, KWOK's configuration, the audit policy and
//! cluster.env (what tests and scripts source).

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};
use base64::Engine as _;

use super::Layout;
use super::process::output;
use crate::cmd::cmd;

/// The apiserver certificate's extensions: every name a client inside or
/// outside the cluster uses for it.
const APISERVER_EXT: &str = "\
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
";

/// A KwokConfiguration given in --config is not defaulted: every option
/// that KWOK defaults is spelled out (as in v0.8.0's defaults), except the
/// stage workers, raised from 4 so that 1000 nodes' pods don't queue.
const KWOK_HEADER: &str = "\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: 10.244.0.0/16
  manageAllNodes: true
  enableDebuggingHandlers: true
  enableContentionProfiling: false
  enableProfilingHandler: true
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 16
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
";

/// Writes only create, update, patch and delete, one JSON line each.
pub const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
";

/// Writes `path` through a temp file beside it, with `mode`.
pub fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let name = path.file_name().context("a file name")?.to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))?;
    fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// 24 random bytes as hex: a bearer token.
fn random_token() -> Result<String> {
    let mut b = [0u8; 24];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom")?;
    Ok(hex::encode(b))
}

fn openssl(args: &[&str]) -> Result<()> {
    output(cmd("openssl").args(args), Duration::from_secs(60)).map(drop)
}

/// The CA, the apiserver's serving certificate (both ECDSA P-256) and the
/// service-account signing key (RSA 2048) in pki/.
pub fn certificates(l: &Layout) -> Result<()> {
    let pki = l.pki();
    let p = |f: &str| pki.join(f).to_string_lossy().into_owned();
    let ec_key = |f: &str| {
        let out = p(f);
        openssl(&[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            &out,
        ])
    };
    ec_key("ca.key")?;
    #[rustfmt::skip]
    openssl(&["req", "-x509", "-new", "-key", &p("ca.key"), "-subj", "/CN=gpu-driver-local-ca",
        "-days", "3650", "-out", &p("ca.crt")])?;
    ec_key("apiserver.key")?;
    write_file(&pki.join("apiserver.ext"), APISERVER_EXT.as_bytes(), 0o600)?;
    #[rustfmt::skip]
    openssl(&["req", "-new", "-key", &p("apiserver.key"), "-subj", "/CN=kube-apiserver",
        "-out", &p("apiserver.csr")])?;
    #[rustfmt::skip]
    openssl(&["x509", "-req", "-in", &p("apiserver.csr"), "-CA", &p("ca.crt"),
        "-CAkey", &p("ca.key"), "-CAcreateserial", "-days", "3650",
        "-extfile", &p("apiserver.ext"), "-out", &p("apiserver.crt")])?;
    // The service-account token signing key (the apiserver signs; the
    // controller-manager's token controller and the authenticator verify).
    openssl(&["genrsa", "-out", &p("sa.key"), "2048"])?;
    openssl(&["rsa", "-in", &p("sa.key"), "-pubout", "-out", &p("sa.pub")])?;
    Ok(())
}

/// The static tokens: the admin's (group system:masters; every component
/// uses it too) and, for a real kubelet, the node's (system:node:NAME,
/// which the Node authorizer gives exactly what a node needs). Returns the
/// admin token.
pub fn tokens(l: &Layout, kubelet: Option<&str>) -> Result<String> {
    let token = random_token()?;
    let mut csv = format!("{token},admin,admin,system:masters\n");
    if let Some(node) = kubelet {
        let node_token = random_token()?;
        csv.push_str(&format!(
            "{node_token},system:node:{node},system:node:{node},system:nodes\n"
        ));
        write_file(&l.kubelet_token(node), node_token.as_bytes(), 0o600)?;
    }
    let pki = l.pki();
    write_file(&pki.join("tokens.csv"), csv.as_bytes(), 0o600)?;
    write_file(&l.dir.join("token"), token.as_bytes(), 0o600)?;
    let header = format!("Authorization: Bearer {token}\n");
    write_file(&pki.join("auth-header"), header.as_bytes(), 0o600)?;
    // openssl's files too (keys, serial, CSR): nobody else reads them.
    for e in fs::read_dir(&pki).with_context(|| format!("reading {}", pki.display()))? {
        fs::set_permissions(e?.path(), fs::Permissions::from_mode(0o600))?;
    }
    Ok(token)
}

/// The admin kubeconfig: a bearer token, the CA inline.
pub fn kubeconfig(server: &str, ca_pem: &[u8], token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: gpu-driver-local
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: admin
  user:
    token: {token}
contexts:
- name: gpu-driver-local
  context:
    cluster: gpu-driver-local
    user: admin
current-context: gpu-driver-local
"
    )
}

/// One stage file of tools/k8s/stages: lines marked `#MANUAL#` are the
/// manual Job-pod completion, unmarked with `manual`, dropped otherwise.
fn stage_text(text: &str, manual: bool) -> String {
    let mut out = String::new();
    for line in text.lines() {
        match line.strip_prefix("#MANUAL#") {
            Some(rest) if manual => out.push_str(rest),
            Some(_) => continue,
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// KWOK's configuration: the header, then every stage file in name order.
pub fn kwok_config(stages_dir: &Path, manual: bool) -> Result<String> {
    let mut files: Vec<_> = fs::read_dir(stages_dir)
        .with_context(|| format!("reading {}", stages_dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    let mut out = KWOK_HEADER.to_string();
    for f in files {
        let text = fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        out.push_str("---\n");
        out.push_str(&stage_text(&text, manual));
    }
    Ok(out)
}

/// What cluster.env holds: KEY=VALUE lines for scripts to source.
pub struct Env<'a> {
    pub kubeconfig: &'a Path,
    pub server: &'a str,
    pub token_file: &'a Path,
    pub ca_file: &'a Path,
    pub bin: &'a Path,
    pub job_pods: &'a str,
    pub audit_log: Option<&'a Path>,
    pub api_port: u16,
    pub kubelet: Option<&'a str>,
    pub kubelet_token_file: Option<&'a Path>,
}

impl Env<'_> {
    pub fn render(&self) -> String {
        let opt = |p: Option<&Path>| p.map(|p| p.display().to_string()).unwrap_or_default();
        format!(
            "KUBECONFIG={}\nSERVER={}\nTOKEN_FILE={}\nCA_FILE={}\nBIN={}\nJOB_PODS={}\n\
             AUDIT_LOG={}\nAPI_PORT={}\nKUBELET_NODE={}\nKUBELET_TOKEN_FILE={}\n",
            self.kubeconfig.display(),
            self.server,
            self.token_file.display(),
            self.ca_file.display(),
            self.bin.display(),
            self.job_pods,
            opt(self.audit_log),
            self.api_port,
            self.kubelet.unwrap_or_default(),
            opt(self.kubelet_token_file),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_lines() {
        let text = "a: 1\n#MANUAL#  b: 2\nc: 3\n";
        assert_eq!(stage_text(text, true), "a: 1\n  b: 2\nc: 3\n");
        assert_eq!(stage_text(text, false), "a: 1\nc: 3\n");
    }

    #[test]
    fn kubeconfig_text() {
        let k = kubeconfig("https://127.0.0.1:16443", b"PEM", "t0k");
        assert!(k.contains("    server: https://127.0.0.1:16443\n"));
        assert!(k.contains("    certificate-authority-data: UEVN\n"));
        assert!(k.contains("    token: t0k\n"));
        assert!(k.ends_with("current-context: gpu-driver-local\n"));
    }

    #[test]
    fn env_lines() {
        let e = Env {
            kubeconfig: Path::new("/d/kubeconfig"),
            server: "https://127.0.0.1:1",
            token_file: Path::new("/d/token"),
            ca_file: Path::new("/d/pki/ca.crt"),
            bin: Path::new("/b"),
            job_pods: "auto",
            audit_log: None,
            api_port: 1,
            kubelet: None,
            kubelet_token_file: None,
        };
        let r = e.render();
        assert!(r.starts_with("KUBECONFIG=/d/kubeconfig\nSERVER=https://127.0.0.1:1\n"));
        assert!(r.contains("\nAUDIT_LOG=\nAPI_PORT=1\nKUBELET_NODE=\nKUBELET_TOKEN_FILE=\n"));
    }
}
