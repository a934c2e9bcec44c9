//! `/metrics` and `/healthz`: axum's router, served by `gpu_driver_serve`
//! (HTTP/1.1, one bounded request per connection).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use axum::routing::get;
use gpu_driver_serve::{openmetrics, plain_text as text};

use crate::scrape::Scraper;

async fn metrics(State(scraper): State<Arc<Scraper>>) -> Response {
    openmetrics(scraper.scrape().await)
}

fn bad_method() -> Response {
    text(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed: use GET\n",
    )
}

/// The routes `gpu_driver_serve` serves: GET and HEAD (axum answers HEAD
/// without the body) of the two paths; 404 for other paths, 405 for other
/// methods.
pub fn router(scraper: Arc<Scraper>) -> Router {
    Router::new()
        .route("/metrics", get(metrics).fallback(|| async { bad_method() }))
        .route(
            "/healthz",
            get(|| async { text(StatusCode::OK, "ok\n") }).fallback(|| async { bad_method() }),
        )
        .fallback(|method: Method| async move {
            if method == Method::GET || method == Method::HEAD {
                let msg = "not found: this exporter serves /metrics and /healthz\n";
                text(StatusCode::NOT_FOUND, msg)
            } else {
                bad_method()
            }
        })
        .with_state(scraper)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::Config;
    use gpu_driver_contract::host_root::{HostRoot, HostRootSource};
    use gpu_driver_serve::{METRICS_CONTENT_TYPE, ask};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn routes() {
        let dir = tempfile::tempdir().unwrap();
        let scraper = Arc::new(Scraper::new(Config {
            host_root: HostRoot::new(dir.path(), HostRootSource::Flag),
            nvml: Some(dir.path().join("none/libnvidia-ml.so.1")),
            kubelet_socket: dir.path().join("none.sock"),
            hostname: "n".into(),
        }));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(gpu_driver_serve::serve(l, router(scraper)));
        let r = ask(addr, "GET /metrics?x=1 HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.0 200 OK\r\n"), "{r}");
        assert!(r.contains(&format!("content-type: {METRICS_CONTENT_TYPE}\r\n")));
        assert!(
            r.contains("\r\n\r\n# HELP ") && r.ends_with("# EOF\n"),
            "{r}"
        );
        let r = ask(addr, "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        let r = ask(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(r.ends_with("\r\n\r\nok\n"), "{r}");
        let r = ask(addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
        for req in ["POST /metrics", "DELETE /healthz", "PUT /x"] {
            let r = ask(addr, &format!("{req} HTTP/1.1\r\nHost: x\r\n\r\n")).await;
            assert!(r.starts_with("HTTP/1.1 405 "), "{req}: {r}");
        }
        task.abort();
    }
}
