//! The operator's Prometheus metrics, kept and encoded by prometheus-client
//! (OpenMetrics text), and served on `/metrics` (with `/healthz` and
//! `/readyz`) by axum's router on `gpu_driver_serve`.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::any;
use gpu_driver_serve::{openmetrics, plain_text};
use prometheus_client::encoding::{
    EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the install duration histogram, in seconds.
const BUCKETS: &[f64] = &[5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0];

/// Counters as the controller names them (with `_total`; prometheus-client
/// appends it to the registered name), their HELP.
const COUNTERS: &[(&str, &str)] = &[
    (
        "gpu_driver_installs_total",
        "Finished install Jobs by result (succeeded, failed, skipped).",
    ),
    (
        "gpu_driver_install_failures_total",
        "Failed install Jobs by the installer's reason.",
    ),
    (
        "gpu_driver_cache_total",
        "Successful installs by artifact cache outcome (Hit, Miss, ..., Unknown).",
    ),
    (
        "gpu_driver_jobs_created_total",
        "Jobs created, by role (install, detect).",
    ),
    (
        "gpu_driver_api_writes_total",
        "Write requests this operator sent to the API server, by verb and resource.",
    ),
    (
        "gpu_driver_reconcile_errors_total",
        "Reconciles that ended in an error (retried).",
    ),
];

const GAUGES: &[(&str, &str)] = &[
    (
        "gpu_driver_nodes",
        "Selected nodes by phase (Ready, Installing, Failed, Pending, NoGpu, ...).",
    ),
    (
        "gpu_driver_is_leader",
        "1 while this instance holds the leader lease.",
    ),
];

/// A label value, escaped as the text format wants (prometheus-client
/// writes values as they are).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Value(String);

impl EncodeLabelValue for Value {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

type Labels = Vec<(String, Value)>;
type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;

/// A family written with its HELP and TYPE even before its first series
/// (prometheus-client leaves empty families out): Prometheus' metadata and
/// the dashboard's checks see every family from the start, as before.
#[derive(Debug)]
struct Declared<M>(M);

impl<M: EncodeMetric> EncodeMetric for Declared<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Value(v.to_string())))
        .collect()
}

/// Registry help text without the final period: prometheus-client adds one.
fn help(h: &str) -> &str {
    h.strip_suffix('.').unwrap_or(h)
}

struct CounterFamily {
    name: &'static str,
    series: Family<Labels, Counter>,
    /// Over all label sets, for [`Metrics::total`].
    sum: Counter,
}

pub struct Metrics {
    registry: Registry,
    counters: Vec<CounterFamily>,
    gauges: Vec<(&'static str, GaugeFamily)>,
    duration: Histogram,
    /// Held while [`Metrics::set_all`] replaces a gauge's series and while
    /// encoding, so that a scrape never sees the gauge half replaced.
    replacing: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let counters = COUNTERS
            .iter()
            .map(|(name, h)| {
                let series = Family::<Labels, Counter>::default();
                let base = name.strip_suffix("_total").unwrap_or(name);
                registry.register(base, help(h), Declared(series.clone()));
                CounterFamily {
                    name,
                    series,
                    sum: Counter::default(),
                }
            })
            .collect();
        let gauges = GAUGES
            .iter()
            .map(|(name, h)| {
                let series = GaugeFamily::default();
                registry.register(*name, help(h), Declared(series.clone()));
                (*name, series)
            })
            .collect();
        let duration = Histogram::new(BUCKETS.iter().copied());
        registry.register(
            "gpu_driver_install_duration_seconds",
            "Seconds from Job start to a successful install",
            duration.clone(),
        );
        Metrics {
            registry,
            counters,
            gauges,
            duration,
            replacing: Mutex::new(()),
        }
    }
}

impl Metrics {
    fn counter(&self, name: &str) -> Option<&CounterFamily> {
        let c = self.counters.iter().find(|c| c.name == name);
        if c.is_none() {
            tracing::debug!("no counter {name}: not counted");
        }
        c
    }

    fn gauge(&self, name: &str) -> Option<&GaugeFamily> {
        let g = self.gauges.iter().find(|(n, _)| *n == name).map(|(_, g)| g);
        if g.is_none() {
            tracing::debug!("no gauge {name}: not set");
        }
        g
    }

    fn replacing(&self) -> std::sync::MutexGuard<'_, ()> {
        // A panic while holding it leaves whole series: still usable.
        self.replacing.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn inc(&self, name: &'static str, labels: &[(&str, &str)]) {
        if let Some(c) = self.counter(name) {
            c.series.get_or_create(&self::labels(labels)).inc();
            c.sum.inc();
        }
    }

    pub fn set(&self, name: &'static str, labels: &[(&str, &str)], value: f64) {
        if let Some(g) = self.gauge(name) {
            g.get_or_create(&self::labels(labels)).set(value);
        }
    }

    /// Replaces every series of a gauge (phases that no longer occur go).
    pub fn set_all(&self, name: &'static str, key: &str, values: &BTreeMap<String, u32>) {
        let Some(g) = self.gauge(name) else { return };
        let _replacing = self.replacing();
        g.clear();
        for (k, v) in values {
            g.get_or_create(&labels(&[(key, k)])).set(f64::from(*v));
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
        self.counter(name).map_or(0, |c| c.sum.get())
    }

    pub fn observe_duration(&self, seconds: f64) {
        self.duration.observe(seconds);
    }

    /// The `/metrics` body, OpenMetrics text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _replacing = self.replacing();
        // Writing into a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The routes `gpu_driver_serve` serves: `/metrics`, `/healthz` and
/// `/readyz` (any method, as before).
pub fn router(metrics: Arc<Metrics>) -> Router {
    let ok = || async { plain_text(StatusCode::OK, "ok\n") };
    Router::new()
        .route(
            "/metrics",
            any(move || async move { openmetrics(metrics.render()) }),
        )
        .route("/healthz", any(ok))
        .route("/readyz", any(ok))
        .fallback(|| async { plain_text(StatusCode::NOT_FOUND, "not found\n") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_driver_serve::{METRICS_CONTENT_TYPE, ask};
    use tokio::net::TcpListener;

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
        assert!(t.contains("gpu_driver_install_duration_seconds_bucket{le=\"15.0\"} 0"));
        assert!(t.contains("gpu_driver_install_duration_seconds_bucket{le=\"30.0\"} 1"));
        assert!(t.contains("gpu_driver_install_duration_seconds_count 1"));
        assert!(t.contains("gpu_driver_nodes{phase=\"Ready\"} 3"));
        assert_eq!(m.total("gpu_driver_api_writes_total"), 1);
    }

    #[test]
    fn keeps_names_help_and_types() {
        let t = Metrics::default().render();
        for (name, h) in COUNTERS {
            let base = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                t.contains(&format!("# HELP {base} {h}\n# TYPE {base} counter\n")),
                "{t}"
            );
        }
        for (name, h) in GAUGES {
            assert!(t.contains(&format!("# HELP {name} {h}\n# TYPE {name} gauge\n")));
        }
        assert!(t.contains("# TYPE gpu_driver_install_duration_seconds histogram\n"));
        assert!(t.contains("# HELP gpu_driver_install_duration_seconds Seconds from Job start to a successful install.\n"));
        assert!(t.ends_with("# EOF\n"), "{t}");
    }

    #[test]
    fn set_all_replaces_and_values_are_escaped() {
        let m = Metrics::default();
        m.set_all("gpu_driver_nodes", "phase", &[("Old".into(), 1)].into());
        m.set_all(
            "gpu_driver_nodes",
            "phase",
            &[("a\"\\\nb".into(), 2)].into(),
        );
        let t = m.render();
        assert!(!t.contains("Old"), "{t}");
        assert!(
            t.contains("gpu_driver_nodes{phase=\"a\\\"\\\\\\nb\"} 2"),
            "{t}"
        );
    }

    #[tokio::test]
    async fn serves_metrics_over_http() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let m = Arc::new(Metrics::default());
        m.inc("gpu_driver_jobs_created_total", &[("role", "install")]);
        let task = tokio::spawn(gpu_driver_serve::serve(l, router(m)));
        let resp = ask(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
        assert!(resp.contains(&format!("content-type: {METRICS_CONTENT_TYPE}")));
        assert!(resp.contains("gpu_driver_jobs_created_total{role=\"install\"} 1"));
        let resp = ask(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(resp.starts_with("HTTP/1.1 200 OK") && resp.ends_with("\r\n\r\nok\n"));
        let resp = ask(addr, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
        task.abort();
    }
}
