//! A real HTTP/1.1 server on loopback for tests, with faults injected by a
//! handler: cut connections, ignored ranges, error statuses, wrong bodies,
//! stalls. Each connection gets its own thread.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// As sent: origin-form `/path` or absolute-form `http://host/path` (proxy).
    pub target: String,
    pub headers: Vec<(String, String)>,
    /// 0-based index of this request on the server.
    pub index: usize,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path, also for absolute-form targets.
    pub fn path(&self) -> &str {
        match self.target.split_once("://") {
            Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
            None => &self.target,
        }
    }

    /// `Range: bytes=N-` → N
    pub fn range_start(&self) -> Option<u64> {
        self.header("range")?
            .strip_prefix("bytes=")?
            .strip_suffix('-')?
            .parse()
            .ok()
    }
}

pub enum Reply {
    /// Status, extra headers, body; Content-Length is added.
    Full(u16, Vec<(String, String)>, Vec<u8>),
    /// Announce `len` bytes, send the first `send` of `body`, then close.
    Cut { body: Vec<u8>, send: usize },
    /// Send headers for `body`, then stall without sending it.
    Stall { body: Vec<u8>, secs: u64 },
    /// A 200 or 206 for `body`, honouring a `Range` request.
    Ranged(Vec<u8>),
    /// Announce `announce` bytes (true or not), send `body`, then close.
    Announce { announce: u64, body: Vec<u8> },
    /// Send `body` one byte every `every_ms`, each well inside any read
    /// timeout: only an overall deadline ends it.
    Drip { body: Vec<u8>, every_ms: u64 },
}

pub type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

pub struct Server {
    pub port: u16,
    pub requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Server {
        Self::start_inner(None, handler)
    }

    /// The same server over TLS, with a certificate for 127.0.0.1 and
    /// localhost signed by a fresh test CA; returns the CA's PEM too.
    pub fn start_tls(
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> (Server, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "gpu-driver test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf_params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
        (
            Self::start_inner(Some(Arc::new(config)), handler),
            ca_cert.pem(),
        )
    }

    fn start_inner(
        tls: Option<Arc<rustls::ServerConfig>>,
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let counter = Arc::new(AtomicUsize::new(0));
        {
            let requests = requests.clone();
            let stop = stop.clone();
            thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let handler = handler.clone();
                    let requests = requests.clone();
                    let counter = counter.clone();
                    let tls = tls.clone();
                    thread::spawn(move || match tls {
                        Some(cfg) => {
                            let conn = rustls::ServerConnection::new(cfg).unwrap();
                            serve(
                                rustls::StreamOwned::new(conn, stream),
                                &*handler,
                                &requests,
                                &counter,
                            )
                        }
                        None => serve(stream, &*handler, &requests, &counter),
                    });
                }
            });
        }
        Server {
            port,
            requests,
            stop,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    pub fn https_url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{}", self.port, path)
    }

    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    pub fn log(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve<S: Read + Write>(
    stream: S,
    handler: &Handler,
    requests: &Mutex<Vec<Request>>,
    counter: &AtomicUsize,
) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let req = Request {
            method,
            target,
            headers,
            index: counter.fetch_add(1, Ordering::SeqCst),
        };
        requests.lock().unwrap().push(req.clone());
        // Returning drops the stream: the connection closes.
        if !respond(reader.get_mut(), &req, handler(&req)) {
            return;
        }
    }
}

fn head(out: &mut impl Write, status: u16, headers: &[(String, String)], len: usize) -> bool {
    let mut s = format!("HTTP/1.1 {status} X\r\nContent-Length: {len}\r\n");
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    s.push_str("\r\n");
    out.write_all(s.as_bytes()).is_ok()
}

/// Returns whether the connection may be reused.
fn respond(out: &mut impl Write, req: &Request, reply: Reply) -> bool {
    match reply {
        Reply::Full(status, headers, body) => {
            head(out, status, &headers, body.len()) && out.write_all(&body).is_ok()
        }
        Reply::Cut { body, send } => {
            if head(out, 200, &[], body.len()) {
                let _ = out.write_all(&body[..send.min(body.len())]);
                let _ = out.flush();
            }
            false
        }
        Reply::Stall { body, secs } => {
            if head(out, 200, &[], body.len()) {
                let _ = out.flush();
                thread::sleep(Duration::from_secs(secs));
            }
            false
        }
        Reply::Announce { announce, body } => {
            if head(out, 200, &[], announce as usize) {
                let _ = out.write_all(&body);
                let _ = out.flush();
            }
            false
        }
        Reply::Drip { body, every_ms } => {
            if head(out, 200, &[], body.len()) {
                for b in body {
                    if out.write_all(&[b]).and_then(|()| out.flush()).is_err() {
                        break;
                    }
                    thread::sleep(Duration::from_millis(every_ms));
                }
            }
            false
        }
        Reply::Ranged(body) => match req.range_start() {
            Some(start) if (start as usize) < body.len() => {
                let range = format!("bytes {start}-{}/{}", body.len() - 1, body.len());
                head(
                    out,
                    206,
                    &[("Content-Range".into(), range)],
                    body.len() - start as usize,
                ) && out.write_all(&body[start as usize..]).is_ok()
            }
            Some(_) => head(out, 416, &[], 0),
            None => head(out, 200, &[], body.len()) && out.write_all(&body).is_ok(),
        },
    }
}

/// Deterministic pseudo-random bytes (xorshift), so bodies are not trivially
/// compressible and every test file differs.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2).wrapping_add(1); // odd, and distinct per seed
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// A real proxy on loopback: tunnels CONNECT (HTTPS) to the requested
/// host:port, forwards plain-HTTP requests sent in absolute form, and
/// records each connection's target host:port and method.
pub struct ConnectProxy {
    pub port: u16,
    pub targets: Arc<Mutex<Vec<String>>>,
    /// `CONNECT` or the forwarded request's method, per target.
    pub methods: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    pub fn start() -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let targets = Arc::new(Mutex::new(Vec::new()));
        let methods = Arc::new(Mutex::new(Vec::new()));
        let (t, m) = (targets.clone(), methods.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(client) = stream else { continue };
                let (t, m) = (t.clone(), m.clone());
                thread::spawn(move || tunnel(client, &t, &m));
            }
        });
        ConnectProxy {
            port,
            targets,
            methods,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn tunnel(client: TcpStream, targets: &Mutex<Vec<String>>, methods: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut head = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim_end().is_empty() {
            break;
        }
        head.push(h);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    // CONNECT host:port (HTTPS), or a plain-HTTP request in absolute form
    // (`GET http://host:port/path`), forwarded in origin form.
    let (authority, forwarded) = if method == "CONNECT" {
        (target.to_string(), None)
    } else if let Some(rest) = target.strip_prefix("http://") {
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let path = if path.is_empty() { "/" } else { path };
        let mut request = format!("{method} {path} {version}\r\n");
        for h in &head {
            if !h.to_ascii_lowercase().starts_with("proxy-") {
                request.push_str(h);
            }
        }
        request.push_str("\r\n");
        (authority.to_string(), Some(request))
    } else {
        let mut c = client;
        let _ = c.write_all(b"HTTP/1.1 405 X\r\nContent-Length: 0\r\n\r\n");
        return;
    };
    targets.lock().unwrap().push(authority.clone());
    methods.lock().unwrap().push(method.to_string());
    let Ok(mut upstream) = TcpStream::connect(&authority) else {
        let mut c = client;
        let _ = c.write_all(b"HTTP/1.1 502 X\r\nContent-Length: 0\r\n\r\n");
        return;
    };
    match forwarded {
        Some(request) => {
            let _ = upstream.write_all(request.as_bytes());
        }
        None => {
            let mut c = client.try_clone().unwrap();
            let _ = c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
        }
    }
    let (mut up_r, mut up_w) = (upstream.try_clone().unwrap(), upstream);
    let mut client_w = client;
    let t = thread::spawn(move || {
        let _ = std::io::copy(&mut reader, &mut up_w);
        let _ = up_w.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut up_r, &mut client_w);
    let _ = client_w.shutdown(Shutdown::Write);
    let _ = t.join();
}
