//! A minimal HTTP/1.1 responder for `/metrics` and `/healthz`: one request
//! per connection, answered and closed. Prometheus needs nothing more, and
//! an HTTP server stack would cost more memory than the exporter itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::scrape::Scraper;

/// Longest request head read; a scrape's is a few hundred bytes.
const MAX_HEAD: usize = 8192;
/// A client that sends no complete head in this time is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Prometheus' text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    Metrics,
    Health,
    NotFound,
    /// Anything but GET and HEAD.
    BadMethod,
}

/// The route and whether a body is wanted (HEAD wants none), from the
/// request line of a head; `None` for what is not HTTP.
pub fn route(head: &[u8]) -> Option<(Route, bool)> {
    let line_end = head.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&head[..line_end]).ok()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    let body = method != "HEAD";
    let r = match (method, path) {
        ("GET" | "HEAD", "/metrics") => Route::Metrics,
        ("GET" | "HEAD", "/healthz") => Route::Health,
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::BadMethod,
    };
    Some((r, body))
}

async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.len() >= MAX_HEAD {
            return Ok(buf);
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
    with_body: bool,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if with_body {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

async fn handle(mut stream: TcpStream, scraper: Arc<Scraper>) -> std::io::Result<()> {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(h) => h?,
        Err(_) => return Ok(()),
    };
    let text = "text/plain; charset=utf-8";
    match route(&head) {
        Some((Route::Metrics, body)) => {
            let metrics = scraper.scrape().await;
            respond(&mut stream, "200 OK", METRICS_CONTENT_TYPE, &metrics, body).await
        }
        Some((Route::Health, body)) => respond(&mut stream, "200 OK", text, "ok\n", body).await,
        Some((Route::NotFound, body)) => {
            let msg = "not found: this exporter serves /metrics and /healthz\n";
            respond(&mut stream, "404 Not Found", text, msg, body).await
        }
        Some((Route::BadMethod, _)) => {
            let msg = "method not allowed: use GET\n";
            respond(&mut stream, "405 Method Not Allowed", text, msg, true).await
        }
        None => respond(&mut stream, "400 Bad Request", text, "bad request\n", true).await,
    }
}

/// Accepts connections until the process ends; each is answered on its own task.
pub async fn serve(listener: TcpListener, scraper: Arc<Scraper>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let scraper = scraper.clone();
                tokio::spawn(async move {
                    if let Err(e) = handle(stream, scraper).await {
                        tracing::debug!(%peer, "answering: {e}");
                    }
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let r = |s: &str| route(s.as_bytes());
        assert_eq!(
            r("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some((Route::Metrics, true))
        );
        assert_eq!(
            r("GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Some((Route::Metrics, true))
        );
        assert_eq!(
            r("HEAD /healthz HTTP/1.1\r\n\r\n"),
            Some((Route::Health, false))
        );
        assert_eq!(r("GET / HTTP/1.1\r\n\r\n"), Some((Route::NotFound, true)));
        assert_eq!(
            r("POST /metrics HTTP/1.1\r\n\r\n"),
            Some((Route::BadMethod, true))
        );
        assert_eq!(r("GET /metrics\r\n\r\n"), None);
        assert_eq!(r("GET /metrics HTTP/1.1"), None, "no line end");
        assert_eq!(r("\u{1}\u{2}"), None);
    }
}
