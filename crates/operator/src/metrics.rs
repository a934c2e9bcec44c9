//! Prometheus metrics in the text exposition format, served on `/metrics`
//! (and `/healthz`) by a minimal HTTP/1.1 responder: a handful of counters
//! does not need a metrics framework or an HTTP server stack.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bounds of the install duration histogram, in seconds.
const BUCKETS: &[f64] = &[5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0];

#[derive(Default)]
struct Inner {
    /// (name, labels) → value.
    counters: BTreeMap<(&'static str, String), u64>,
    gauges: BTreeMap<(&'static str, String), f64>,
    /// Install duration: bucket counts, sum, count.
    durations: (Vec<u64>, f64, u64),
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

const HELP: &[(&str, &str, &str)] = &[
    (
        "gpu_driver_installs_total",
        "counter",
        "Finished install Jobs by result (succeeded, failed, skipped).",
    ),
    (
        "gpu_driver_install_failures_total",
        "counter",
        "Failed install Jobs by the installer's reason.",
    ),
    (
        "gpu_driver_cache_total",
        "counter",
        "Successful installs by artifact cache outcome (Hit, Miss, ..., Unknown).",
    ),
    (
        "gpu_driver_jobs_created_total",
        "counter",
        "Jobs created, by role (install, detect).",
    ),
    (
        "gpu_driver_api_writes_total",
        "counter",
        "Write requests this operator sent to the API server, by verb and resource.",
    ),
    (
        "gpu_driver_reconcile_errors_total",
        "counter",
        "Reconciles that ended in an error (retried).",
    ),
    (
        "gpu_driver_nodes",
        "gauge",
        "Selected nodes by phase (Ready, Installing, Failed, Pending, NoGpu, ...).",
    ),
    (
        "gpu_driver_is_leader",
        "gauge",
        "1 while this instance holds the leader lease.",
    ),
];

fn label(k: &str, v: &str) -> String {
    let v = v
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!("{k}=\"{v}\"")
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain counters: still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn inc(&self, name: &'static str, labels: &[(&str, &str)]) {
        let l = labels
            .iter()
            .map(|(k, v)| label(k, v))
            .collect::<Vec<_>>()
            .join(",");
        *self.lock().counters.entry((name, l)).or_default() += 1;
    }

    pub fn set(&self, name: &'static str, labels: &[(&str, &str)], value: f64) {
        let l = labels
            .iter()
            .map(|(k, v)| label(k, v))
            .collect::<Vec<_>>()
            .join(",");
        self.lock().gauges.insert((name, l), value);
    }

    /// Replaces every series of a gauge (phases that no longer occur go).
    pub fn set_all(&self, name: &'static str, key: &str, values: &BTreeMap<String, u32>) {
        let mut inner = self.lock();
        inner.gauges.retain(|(n, _), _| *n != name);
        for (k, v) in values {
            inner.gauges.insert((name, label(key, k)), f64::from(*v));
        }
    }

    pub fn write(&self, verb: &str, resource: &str) {
        self.inc(
            "gpu_driver_api_writes_total",
            &[("verb", verb), ("resource", resource)],
        );
    }

    /// Sum of a counter over all its label sets.
    pub fn total(&self, name: &str) -> u64 {
        self.lock()
            .counters
            .iter()
            .filter(|((n, _), _)| *n == name)
            .map(|(_, v)| v)
            .sum()
    }

    pub fn observe_duration(&self, seconds: f64) {
        let mut inner = self.lock();
        let d = &mut inner.durations;
        if d.0.is_empty() {
            d.0 = vec![0; BUCKETS.len()];
        }
        for (i, b) in BUCKETS.iter().enumerate() {
            if seconds <= *b {
                d.0[i] += 1;
            }
        }
        d.1 += seconds;
        d.2 += 1;
    }

    pub fn render(&self) -> String {
        let inner = self.lock();
        let mut out = String::new();
        for (name, kind, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            let series = |l: &str| {
                if l.is_empty() {
                    name.to_string()
                } else {
                    format!("{name}{{{l}}}")
                }
            };
            for ((n, l), v) in &inner.counters {
                if n == name {
                    let _ = writeln!(out, "{} {v}", series(l));
                }
            }
            for ((n, l), v) in &inner.gauges {
                if n == name {
                    let _ = writeln!(out, "{} {v}", series(l));
                }
            }
        }
        let name = "gpu_driver_install_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Seconds from Job start to a successful install.\n# TYPE {name} histogram"
        );
        let (buckets, sum, count) = &inner.durations;
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{b}\"}} {}",
                buckets.get(i).copied().unwrap_or(0)
            );
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
        out
    }
}

/// Serves `/metrics` and `/healthz` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: std::sync::Arc<Metrics>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            // Read the request head (a scraper's GET fits in one buffer).
            while n < buf.len() {
                match sock.read(&mut buf[n..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(m) => n += m,
                }
                if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = match path {
                "/metrics" => ("200 OK", metrics.render()),
                "/healthz" | "/readyz" => ("200 OK", "ok\n".to_string()),
                _ => ("404 Not Found", "not found\n".to_string()),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_text_format() {
        let m = Metrics::default();
        m.inc("gpu_driver_installs_total", &[("result", "succeeded")]);
        m.inc("gpu_driver_installs_total", &[("result", "succeeded")]);
        m.write("create", "jobs");
        m.observe_duration(20.0);
        m.set_all(
            "gpu_driver_nodes",
            "phase",
            &[("Ready".to_string(), 3u32)].into(),
        );
        let t = m.render();
        assert!(
            t.contains("gpu_driver_installs_total{result=\"succeeded\"} 2"),
            "{t}"
        );
        assert!(t.contains("gpu_driver_api_writes_total{verb=\"create\",resource=\"jobs\"} 1"));
        assert!(t.contains("gpu_driver_install_duration_seconds_bucket{le=\"15\"} 0"));
        assert!(t.contains("gpu_driver_install_duration_seconds_bucket{le=\"30\"} 1"));
        assert!(t.contains("gpu_driver_install_duration_seconds_count 1"));
        assert!(t.contains("gpu_driver_nodes{phase=\"Ready\"} 3"));
        assert_eq!(m.total("gpu_driver_api_writes_total"), 1);
    }

    #[tokio::test]
    async fn serves_metrics_over_http() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let m = std::sync::Arc::new(Metrics::default());
        m.inc("gpu_driver_jobs_created_total", &[("role", "install")]);
        let task = tokio::spawn(serve(l, m));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
        assert!(resp.contains("gpu_driver_jobs_created_total{role=\"install\"} 1"));
        task.abort();
    }
}
