//! The exposition format checker: every `/metrics` body parsed back as
//! OpenMetrics text (Prometheus' text format with `_total` counter samples
//! and a final `# EOF`).

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sample {
    pub(super) name: String,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) value: f64,
}

fn is_metric_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// `{k="v",…}` at the start of `s`: the labels and the rest after `}`.
fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = s.strip_prefix('{').ok_or("no {")?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !is_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut chars = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("unquoted value")?
            .char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next().ok_or("unterminated value")? {
                (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    c => return Err(format!("bad escape \\{c}")),
                },
                (i, '"') => break i,
                (_, '\n') => return Err("newline in a value".into()),
                (_, c) => value.push(c),
            }
        };
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &rest[eq + 1 + 1 + end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..end];
    if !is_metric_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let (labels, rest) = if line[end..].starts_with('{') {
        parse_labels(&line[end..])?
    } else {
        (BTreeMap::new(), &line[end..])
    };
    let mut fields = rest
        .strip_prefix(' ')
        .ok_or("no space before the value")?
        .split(' ');
    let v = fields.next().ok_or("no value")?;
    let value = match v {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse::<f64>().map_err(|e| format!("value {v:?}: {e}"))?,
    };
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|e| format!("timestamp {ts:?}: {e}"))?;
    }
    if fields.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample {
        name: name.into(),
        labels,
        value,
    })
}

/// Every sample of a text-format body, checked: names, labels and escapes,
/// HELP and TYPE once per family and before its samples, each family in one
/// block, no series twice.
fn parse_exposition(text: &str) -> Result<(Vec<Sample>, BTreeMap<String, String>), String> {
    let mut types = BTreeMap::new();
    let mut helps = BTreeSet::new();
    let mut finished = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut series = BTreeSet::new();
    let mut samples = Vec::new();
    let mut enter = |name: &str, current: &mut Option<String>| -> Result<(), String> {
        if current.as_deref() != Some(name) {
            if finished.contains(name) {
                return Err(format!("family {name} split in two blocks"));
            }
            if let Some(c) = current.replace(name.to_string()) {
                finished.insert(c);
            }
        }
        Ok(())
    };
    let mut eof = false;
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line}", n + 1);
        if line.is_empty() {
            continue;
        }
        if eof {
            return Err(at("after # EOF".into()));
        }
        if line == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut p = rest.splitn(3, ' ');
            let (kw, name, arg) = (p.next(), p.next().unwrap_or(""), p.next().unwrap_or(""));
            match kw {
                Some("HELP") | Some("TYPE") if !is_metric_name(name) => {
                    return Err(at(format!("bad family name {name:?}")));
                }
                Some("HELP") => {
                    enter(name, &mut current).map_err(at)?;
                    if !helps.insert(name.to_string()) {
                        return Err(at("HELP twice".into()));
                    }
                }
                Some("TYPE") => {
                    enter(name, &mut current).map_err(at)?;
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&arg) {
                        return Err(at(format!("unknown type {arg:?}")));
                    }
                    if samples.iter().any(|s: &Sample| s.name == name) {
                        return Err(at("TYPE after samples".into()));
                    }
                    if types.insert(name.to_string(), arg.to_string()).is_some() {
                        return Err(at("TYPE twice".into()));
                    }
                }
                _ => {}
            }
            continue;
        }
        let s = parse_sample(line).map_err(at)?;
        let Some(family) = family_of(&s.name, &types) else {
            return Err(at("sample without a TYPE before it".into()));
        };
        enter(&family, &mut current).map_err(at)?;
        if !series.insert((s.name.clone(), format!("{:?}", s.labels))) {
            return Err(at("series twice".into()));
        }
        samples.push(s);
    }
    // Types by sample name too: `x_total` is a sample of counter `x`.
    for s in &samples {
        if let Some(family) = family_of(&s.name, &types) {
            let kind = types[&family].clone();
            types.entry(s.name.clone()).or_insert(kind);
        }
    }
    Ok((samples, types))
}

/// The family a sample belongs to: its own name, or in OpenMetrics a
/// counter's `_total` or a histogram's `_bucket`, `_sum` and `_count`.
fn family_of(sample: &str, types: &BTreeMap<String, String>) -> Option<String> {
    if types.contains_key(sample) {
        return Some(sample.to_string());
    }
    let suffixes: &[(&str, &[&str])] = &[
        ("_total", &["counter"]),
        ("_bucket", &["histogram"]),
        ("_sum", &["histogram", "summary"]),
        ("_count", &["histogram", "summary"]),
    ];
    suffixes.iter().find_map(|(suffix, kinds)| {
        let base = sample.strip_suffix(suffix)?;
        let kind = types.get(base)?;
        kinds.contains(&kind.as_str()).then(|| base.to_string())
    })
}

pub(super) fn parse_ok(text: &str) -> (Vec<Sample>, BTreeMap<String, String>) {
    parse_exposition(text).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{text}"))
}

pub(super) fn find<'a>(
    samples: &'a [Sample],
    name: &str,
    labels: &[(&str, &str)],
) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

pub(super) fn one<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> &'a Sample {
    let found = find(samples, name, labels);
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    found[0]
}

#[test]
fn the_format_checker_rejects_broken_text() {
    let ok = "# HELP a x\n# TYPE a gauge\na{l=\"v\\\"\\n\"} 1\na 2.5\n";
    let (s, _) = parse_ok(ok);
    assert_eq!(s[0].labels["l"], "v\"\n");
    // OpenMetrics: a counter family's samples end in _total; # EOF last.
    let (s, types) = parse_ok("# HELP c x\n# TYPE c counter\nc_total 3\n# EOF\n");
    assert_eq!((s[0].name.as_str(), s[0].value), ("c_total", 3.0));
    assert_eq!(types["c_total"], "counter");
    for bad in [
        "a 1\n",
        "# TYPE a gauge\na{l=\"v} 1\n",
        "# TYPE a gauge\na{1l=\"v\"} 1\n",
        "# TYPE a gauge\na 1\na 2\n",
        "# TYPE a gauge\n# TYPE b gauge\nb 1\na 1\n",
        "# TYPE a gauge\na one\n",
        "# TYPE a gauge\na{l=\"\\x\"} 1\n",
        "# TYPE a sometimes\n",
        "# TYPE a gauge\na_total 1\n",
        "# TYPE a gauge\na 1\n# EOF\na 2\n",
    ] {
        assert!(parse_exposition(bad).is_err(), "accepted: {bad}");
    }
}
