//! The Grafana dashboard: valid against Grafana's schema, querying only
//! metrics we export.

use super::*;

fn fixture_schema(file: &str, definition: &str) -> jsonschema::Validator {
    let mut schema: Json =
        serde_json::from_str(&read(&format!("tests/fixtures/grafana/{file}"))).unwrap();
    // A definition of the file as the root, its siblings reachable.
    schema["$ref"] = Json::String(format!("#/definitions/{definition}"));
    jsonschema::draft7::new(&schema).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn schema_errors(v: &jsonschema::Validator, instance: &Json) -> Vec<String> {
    v.iter_errors(instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// The dashboard is a Grafana dashboard by Grafana's own JSON schema
/// (generated from its CUE schema; tests/fixtures/grafana/README.md), its
/// panels' options by their plugins' schemas and its queries by the
/// Prometheus data source's; the layout fits Grafana's 24-column grid
/// without overlaps; every query names metrics that gpu-driver-operator
/// (crates/operator/src/metrics.rs) or gpu-driver-exporter (crates/exporter/src/metrics.rs)
/// export, and only variables the dashboard defines.
#[test]
fn dashboard_is_valid_grafana_json_over_our_metrics() {
    let text = read("charts/gpu-driver/dashboards/gpu-driver.json");
    // A ConfigMap carries it: far below the 1 MiB object limit.
    assert!(text.len() < 256 * 1024, "{} bytes", text.len());
    let dash: Json = serde_json::from_str(&text).unwrap();
    assert_eq!(dash["uid"], "gpu-driver");
    let dashboard = fixture_schema("dashboard.jsonschema.json", "Dashboard");
    let errors = schema_errors(&dashboard, &dash);
    assert!(errors.is_empty(), "not a Grafana dashboard: {errors:#?}");
    // The validator does refuse a broken one.
    let mut broken = dash.clone();
    broken["panels"][1]["gridPos"]["w"] = Json::String("wide".into());
    broken["graphTooltip"] = Json::from(7);
    assert!(schema_errors(&dashboard, &broken).len() >= 2);

    let timeseries_options = fixture_schema("timeseries.jsonschema.json", "Options");
    let timeseries_field = fixture_schema("timeseries.jsonschema.json", "FieldConfig");
    let stat_options = fixture_schema("stat.jsonschema.json", "Options");
    let query = fixture_schema("prometheus.jsonschema.json", "Dataquery");

    let variables: BTreeSet<String> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert!(variables.contains("datasource"), "{variables:?}");
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        let id = p["id"].as_i64().unwrap();
        assert!(ids.insert(id), "panel id {id} twice");
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_i64().unwrap(),
            g["y"].as_i64().unwrap(),
            g["w"].as_i64().unwrap(),
            g["h"].as_i64().unwrap(),
        );
        assert!(x >= 0 && w > 0 && x + w <= 24 && h > 0, "panel {id}: {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "panel {id} overlaps another at {cx},{cy}"
                );
            }
        }
        let title = p["title"].as_str().unwrap_or_default();
        let mut errs = Vec::new();
        match p["type"].as_str().unwrap() {
            "row" => continue,
            "timeseries" => {
                errs.extend(schema_errors(&timeseries_options, &p["options"]));
                errs.extend(schema_errors(
                    &timeseries_field,
                    &p["fieldConfig"]["defaults"]["custom"],
                ));
            }
            "stat" => errs.extend(schema_errors(&stat_options, &p["options"])),
            other => panic!("panel {title}: no vendored schema for panel type {other}"),
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            errs.extend(schema_errors(&query, t));
            exprs.push((title.to_string(), t["expr"].as_str().unwrap().to_string()));
        }
        assert!(errs.is_empty(), "panel {title}: {errs:#?}");
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"].as_str().filter(|_| v["type"] == "query") {
            exprs.push((format!("variable {}", v["name"]), q.to_string()));
        }
    }
    let metrics_seen = metrics_of(&exprs, &variables);
    for m in [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_XID_ERRORS",
        "gpu_driver_nodes",
        "gpu_driver_install_failures_total",
        "gpu_driver_cache_total",
    ] {
        assert!(metrics_seen.contains(m), "the dashboard shows no {m}");
    }
    // Per node and per pod: by DCGM's Hostname, namespace and pod labels.
    let all_exprs: String = exprs.iter().map(|(_, e)| e.as_str()).collect();
    for label in [
        "by (Hostname)",
        "by (namespace, pod)",
        "by (phase)",
        "by (reason)",
    ] {
        assert!(all_exprs.contains(label), "no query {label}");
    }
}

/// The metrics the queries read, each checked to be one the operator or
/// the exporter exports; every variable they use is the dashboard's.
fn metrics_of(exprs: &[(String, String)], variables: &BTreeSet<String>) -> BTreeSet<String> {
    let operator_metrics = gpu_driver_operator::metrics::Metrics::default().render();
    let exporter_source = read("crates/exporter/src/metrics.rs");
    let mut metrics_seen = BTreeSet::new();
    for (where_, expr) in exprs {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("DCGM_FI_") || word.starts_with("gpu_driver_exporter_") {
                assert!(
                    exporter_source.contains(&format!("\"{word}\"")),
                    "{where_}: {word} is not a metric of crates/exporter/src/metrics.rs"
                );
                metrics_seen.insert(word.to_string());
            } else if word.starts_with("gpu_driver_") {
                // OpenMetrics: a histogram's `_bucket` and a counter's
                // `_total` are samples of the family without the suffix.
                let family = word.strip_suffix("_bucket").unwrap_or(word);
                let counter = word
                    .strip_suffix("_total")
                    .is_some_and(|c| operator_metrics.contains(&format!("# TYPE {c} counter\n")));
                assert!(
                    counter || operator_metrics.contains(&format!("# TYPE {family} ")),
                    "{where_}: {word} is not a metric of gpu-driver-operator"
                );
                metrics_seen.insert(word.to_string());
            }
        }
        // Dashboard variables, or Grafana's own ($__rate_interval, $__range).
        for var in expr.split('$').skip(1) {
            let name: String = var
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                name.starts_with("__") || variables.contains(&name),
                "{where_}: ${name} is not a variable of the dashboard"
            );
        }
    }
    metrics_seen
}
