//! The HTTP/1.1 server the operator's and the exporter's `/metrics` share:
//! axum's router on hyper's connection builder. A scrape is one short
//! request, so each connection answers one request (no keep-alive), and a
//! client may hold a connection only as long as it takes to send a head of
//! at most [`MAX_HEAD`] bytes within [`HEADER_READ_TIMEOUT`]: a slow or
//! oversized client cannot pin the server's tasks or memory. At most
//! [`MAX_CONNECTIONS`] are open at once: a new one closes the oldest, so
//! idle clients can neither exhaust the file descriptors nor keep a probe
//! of `/healthz` out.
//!
//! The rest of what both binaries share lives here too: [`start_server`]
//! (bind, then serve on a task of its own), the responses both routers give
//! ([`plain_text`], [`openmetrics`]), [`shutdown_signal`], and
//! [`cli::run_command_line`] (arguments, logging, exit code).

pub mod cli;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// hyper's smallest read buffer; a scrape's head is a few hundred bytes.
pub const MAX_HEAD: usize = 8192;
/// A client that sends no complete head in this time is dropped.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at most, well under a process's usual 1024 file
/// descriptors; Prometheus and the probes need a handful.
pub const MAX_CONNECTIONS: usize = 256;

/// OpenMetrics text, what prometheus-client writes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The address a server could not listen on, and why.
#[derive(Debug, thiserror::Error)]
#[error("{addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr` and serves `app` there on a task of its own (until the
/// runtime ends), so that the caller goes on with its own work; the bound
/// address, whose port is the system's choice where `addr`'s is 0.
pub async fn start_server(addr: SocketAddr, app: Router) -> Result<SocketAddr, BindError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tokio::spawn(serve(listener, app));
    Ok(bound)
}

/// A short plain-text answer: `/healthz`'s "ok", a 404's or a 405's reason.
pub fn plain_text(status: StatusCode, body: &'static str) -> Response {
    let ct = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    (status, ct, body).into_response()
}

/// A `/metrics` answer: `body` as OpenMetrics text.
pub fn openmetrics(body: String) -> Response {
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response()
}

/// The open connections, oldest first: their ids and how to close them.
type Open = Arc<Mutex<VecDeque<(u64, tokio::task::AbortHandle)>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Accepts connections until the task is dropped; each is answered by `app`
/// on its own task.
pub async fn serve(listener: TcpListener, app: Router) {
    let open: Open = Arc::default();
    let mut next_id = 0u64;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let service = TowerToHyperService::new(app.clone());
        let (id, done) = (next_id, open.clone());
        next_id += 1;
        // Held across the spawn: the task's own removal comes after this
        // push even when it ends at once on another worker.
        let mut q = lock(&open);
        let task = tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "answering: {e}");
            }
            lock(&done).retain(|(i, _)| *i != id);
        });
        q.push_back((id, task.abort_handle()));
        while q.len() > MAX_CONNECTIONS {
            if let Some((_, oldest)) = q.pop_front() {
                oldest.abort();
            }
        }
    }
}

/// Returns on SIGTERM (what Kubernetes sends a pod it stops) or SIGINT: the
/// operator and the exporter stop their servers and loops on it and exit 0.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Sends `request` as raw bytes to `addr` and reads until the server closes
/// the connection: the servers' tests speak HTTP byte by byte, malformed
/// requests included. A test helper (feature `test-client`); it panics.
#[cfg(any(test, feature = "test-client"))]
pub async fn ask(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connecting to the server under test");
    s.write_all(request.as_bytes())
        .await
        .expect("sending the request");
    let mut resp = String::new();
    s.read_to_string(&mut resp)
        .await
        .expect("reading the answer");
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    /// One request per connection, and malformed or oversized heads refused.
    /// 600 idle connections (over the cap, not over a process's file
    /// descriptors) do not keep a probe out: each new connection closes the
    /// oldest, so the probe is answered.
    #[tokio::test]
    async fn idle_connections_over_the_cap_close_the_oldest() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let app = Router::new().route("/healthz", get(|| async { "ok\n" }));
        let task = tokio::spawn(serve(l, app));
        let mut idle = Vec::new();
        for _ in 0..600 {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let probe = tokio::time::timeout(
            Duration::from_secs(5),
            ask(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
        )
        .await
        .expect("the probe was kept out by idle connections");
        assert!(probe.ends_with("\r\n\r\nok\n"), "{probe}");
        // The oldest idle ones were closed by the server.
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), idle[0].read(&mut buf))
            .await
            .expect("the oldest idle connection is still open")
            .unwrap_or(0);
        assert_eq!(n, 0);
        task.abort();
    }

    /// `start_server` serves on its own task at the port the system chose,
    /// and a taken address fails with the address in the message.
    #[tokio::test]
    async fn start_server_serves_in_the_background_and_names_a_taken_address() {
        let app = Router::new().route(
            "/healthz",
            get(|| async { plain_text(StatusCode::OK, "ok\n") }),
        );
        let addr = start_server("127.0.0.1:0".parse().unwrap(), app.clone())
            .await
            .unwrap();
        assert_ne!(addr.port(), 0);
        let r = ask(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains("content-type: text/plain; charset=utf-8\r\n"),
            "{r}"
        );
        let taken = start_server(addr, app).await.unwrap_err();
        assert!(
            taken.to_string().starts_with(&format!("{addr}: ")),
            "{taken}"
        );
    }

    #[tokio::test]
    async fn answers_one_bounded_request_per_connection() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let app = Router::new().route("/metrics", get(|| async { "m\n" }));
        let task = tokio::spawn(serve(l, app));
        // read_to_string returns: the server closed after one answer even
        // though HTTP/1.1 would keep the connection open.
        let r = ask(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.ends_with("\r\n\r\nm\n"), "{r}");
        let r = ask(addr, "GET /metrics\r\n\r\n").await;
        assert!(r.is_empty() || r.starts_with("HTTP/1.1 400 "), "{r}");
        let r = ask(addr, "\u{1}\u{2}\r\n\r\n").await;
        assert!(r.is_empty() || r.starts_with("HTTP/1.1 400 "), "{r}");
        let long = format!(
            "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
            "x".repeat(MAX_HEAD)
        );
        let r = ask(addr, &long).await;
        assert!(r.is_empty() || r.starts_with("HTTP/1.1 431 "), "{r}");
        task.abort();
    }
}
