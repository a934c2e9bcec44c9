//! The matrix's bookkeeping. `record` turns one pair's BuildResult (`<work>/<pair>.result.json`, if
//! the installer wrote one) and the builder root's `.gpu-driver-root.json`
//! into `<work>/<pair>.record.json`. `report` merges the records into
//! `<out>/matrix.json` (keeping earlier rows of pairs not run, unless
//! `--fresh`), writes `<out>/matrix.md`, and fails if a pair run now does
//! not match its expectation.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context as _, Result, bail};
use gpu_driver_contract::text::rfc3339_utc;

use crate::pyjson::{J, py_round};

pub(super) const SUITES: [&str; 2] = ["bookworm", "trixie"];
pub(super) const FLAVORS: [&str; 2] = ["open", "proprietary"];

/// One pair's run, as `record` needs it.
pub(super) struct RecordArgs {
    pub work: PathBuf,
    pub pair: String,
    pub suite: String,
    pub flavor: String,
    pub root: PathBuf,
    pub source: String,
    pub kernel: String,
    pub exit_code: i64,
    pub wall_ms: i64,
    pub timeout: i64,
}

pub(super) struct ReportArgs {
    pub work: PathBuf,
    pub out: PathBuf,
    /// As given: matrix.json names it.
    pub expect: String,
    /// Where it is read from.
    pub expect_path: PathBuf,
    pub jobs: i64,
    pub fresh: bool,
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub(super) fn now() -> String {
    rfc3339_utc(SystemTime::now())
}

/// `535.261.03-1` -> `535.261.03` (the epoch and Debian revision dropped).
fn upstream(version: &J) -> J {
    match version.as_str() {
        Some(v) if !v.is_empty() => {
            let v = v.rsplit(':').next().unwrap_or(v);
            J::str(v.rsplit_once('-').map_or(v, |(u, _)| u))
        }
        _ => J::Null,
    }
}

/// Python's white space, as `str.strip()` takes it off.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
fn py_strip(s: &str) -> &str {
    s.trim_matches(py_space)
}

/// The last `n` characters.
fn tail_chars(s: &str, n: usize) -> &str {
    let count = s.chars().count();
    if count <= n {
        return s;
    }
    let start = s.char_indices().nth(count - n).map_or(0, |(i, _)| i);
    &s[start..]
}

/// The first `n` characters.
fn head_chars(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(i, _)| &s[..i])
}

fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes)
        .replace("\r\n", "\n")
        .replace('\r', "\n");
    let all: Vec<&str> = text.split_inclusive('\n').collect();
    let from = all.len().saturating_sub(lines);
    py_strip(&all[from..].concat()).to_string()
}

/// `<work>/<pair>.result.json`, if the installer wrote one that is an object.
fn read_result(a: &RecordArgs) -> Option<J> {
    let result_path = a.work.join(format!("{}.result.json", a.pair));
    std::fs::read_to_string(&result_path)
        .ok()
        .and_then(|t| J::parse(&t).ok())
        .filter(|d| matches!(d, J::Obj(_)))
}

/// The root's source package and headers package, each as `name version`,
/// and the driver's upstream version from the source package's.
fn packages(a: &RecordArgs, root: &J) -> (J, J, J) {
    let pkg = if a.flavor == "open" {
        "nvidia-open-kernel-source"
    } else {
        "nvidia-kernel-source"
    };
    let pkg_version = root.get("packages").get(pkg);
    let headers = format!("linux-headers-{}", a.kernel);
    let headers_version = match root.get("packages") {
        p if p.has(&headers) => p.get(&headers).py_str(),
        _ => "?".to_string(),
    };
    (
        J::str(format!("{pkg} {}", pkg_version.py_str())),
        J::str(format!("{headers} {headers_version}")),
        upstream(pkg_version),
    )
}

/// The record's `builderRoot`: the root's suite, key and creation time,
/// which its `.gpu-driver-root.json` must have.
fn builder_root(a: &RecordArgs, root: &J) -> Result<J> {
    let field = |k: &str| -> Result<J> {
        if root.has(k) {
            Ok(root.get(k).clone())
        } else {
            bail!(
                "{} has no {k}",
                a.root.join(".gpu-driver-root.json").display()
            )
        }
    };
    Ok(J::Obj(vec![
        ("suite".into(), field("suite")?),
        ("key".into(), field("key")?),
        ("created".into(), field("created")?),
    ]))
}

/// The names of the modules the result lists.
fn module_names(status: &J) -> Vec<J> {
    match status.get("modules") {
        J::Arr(ms) => ms
            .iter()
            .filter(|m| matches!(m, J::Obj(_)))
            .map(|m| m.get("name").clone())
            .collect(),
        _ => Vec::new(),
    }
}

/// The record from the result document `d` (an empty object if there was
/// none) and the root's record.
fn build_record(a: &RecordArgs, d: &J, root: &J, measured: &str) -> Result<J> {
    let empty = J::Obj(Vec::new());
    let spec = d.get("spec").or(&empty);
    let status = d.get("status").or(&empty);
    let (source_package, headers_package, upstream) = packages(a, root);
    let kernel = J::str(a.kernel.clone());
    let log_excerpt = status.get("logExcerpt").or(&J::Null).as_str().unwrap_or("");
    let message = if status.has("message") {
        status.get("message").clone()
    } else {
        J::str("")
    };
    let driver = status.get("driverVersion").or(spec.get("driverVersion"));
    let release = spec.get("kernelRelease").or(spec.get("kernel"));
    let gcc = status.get("compiler").get("version").or(root.get("gcc"));
    Ok(J::Obj(vec![
        ("pair".into(), J::str(format!("{}/{}", a.suite, a.flavor))),
        ("suite".into(), J::str(a.suite.clone())),
        ("flavor".into(), J::str(a.flavor.clone())),
        ("phase".into(), status.get("phase").clone()),
        ("reason".into(), status.get("reason").clone()),
        ("message".into(), message),
        ("exitCode".into(), J::Int(a.exit_code)),
        (
            "wallSeconds".into(),
            J::Float(py_round(a.wall_ms as f64 / 1000.0, 1)),
        ),
        ("driverVersion".into(), driver.or(&upstream).clone()),
        ("kernel".into(), release.or(&kernel).clone()),
        ("gcc".into(), gcc.clone()),
        ("source".into(), J::str(a.source.clone())),
        ("sourcePackage".into(), source_package),
        ("headersPackage".into(), headers_package),
        ("modules".into(), J::Arr(module_names(status))),
        ("artifact".into(), status.get("artifact").clone()),
        ("timings".into(), status.get("timings").or(&empty).clone()),
        (
            "logExcerpt".into(),
            J::str(tail_chars(log_excerpt, 2000).to_string()),
        ),
        ("builderRoot".into(), builder_root(a, root)?),
        ("measured".into(), J::str(measured)),
    ]))
}

/// A pair without a result document: the installer timed out or died.
fn no_result(rec: &mut J, a: &RecordArgs) {
    let timed_out = a.exit_code == 124;
    rec.set("phase", J::str("NoResult"));
    rec.set(
        "reason",
        J::str(if timed_out { "Timeout" } else { "NoResult" }),
    );
    let what = if timed_out {
        format!("killed after {} s", a.timeout)
    } else {
        format!("exit {}", a.exit_code)
    };
    rec.set(
        "message",
        J::str(format!("no BuildResult document ({what})")),
    );
    rec.set(
        "logExcerpt",
        J::str(log_tail(&a.work.join(format!("{}.log", a.pair)), 15)),
    );
}

pub(super) fn record(a: &RecordArgs, measured: &str) -> Result<()> {
    let root = J::read(&a.root.join(".gpu-driver-root.json"))?;
    let doc = read_result(a);
    let empty = J::Obj(Vec::new());
    let mut rec = build_record(a, doc.as_ref().unwrap_or(&empty), &root, measured)?;
    if doc.is_none() || !rec.get("phase").truthy() {
        no_result(&mut rec, a);
    }
    let path = a.work.join(format!("{}.record.json", a.pair));
    std::fs::write(&path, rec.dump()).with_context(|| format!("writing {}", path.display()))?;
    let message = rec.get("message").or(&J::Null).py_str();
    let first = message.lines().next().unwrap_or("");
    eprintln!(
        "{}: {} {} in {} s (exit {}) {}",
        rec.get("pair").py_str(),
        rec.get("phase").py_str(),
        rec.get("reason").py_str(),
        rec.get("wallSeconds").py_str(),
        a.exit_code,
        head_chars(first, 200)
    );
    Ok(())
}

/// docs/matrix-expect.json's pairs: a bare string is the reason.
fn load_expect(path: &Path) -> Result<Vec<(String, J)>> {
    let doc = J::read(path)?;
    Ok(match doc.get("pairs") {
        J::Obj(kv) => kv
            .iter()
            .map(|(k, v)| {
                let want = match v {
                    J::Str(_) => J::Obj(vec![("reason".into(), v.clone())]),
                    _ => v.clone(),
                };
                (k.clone(), want)
            })
            .collect(),
        _ => Vec::new(),
    })
}

fn lookup<'a>(expect: &'a [(String, J)], pair: &str) -> Option<&'a J> {
    expect.iter().find(|(k, _)| k == pair).map(|(_, v)| v)
}

/// pass / FAIL / reported, and why.
fn verdict(rec: &J, expect: &[(String, J)]) -> (&'static str, String) {
    let phase = rec.get("phase");
    if phase.as_str() == Some("NoResult") {
        return ("FAIL", "the installer gave no result document".into());
    }
    let succeeded = phase.as_str() == Some("Succeeded");
    let exit_zero = rec.get("exitCode").as_f64() == Some(0.0);
    if succeeded != exit_zero {
        return (
            "FAIL",
            format!(
                "exit code {} disagrees with phase {}",
                rec.get("exitCode").py_str(),
                phase.py_str()
            ),
        );
    }
    let Some(want) = lookup(expect, rec.get("pair").as_str().unwrap_or_default()) else {
        return ("reported", "no expectation listed".into());
    };
    if rec.get("reason") != want.get("reason") {
        return (
            "FAIL",
            format!(
                "expected {}, got {}",
                want.get("reason").py_str(),
                rec.get("reason").py_str()
            ),
        );
    }
    ("pass", String::new())
}

fn order(rec: &J) -> (usize, String, usize, String) {
    let suite = rec.get("suite").py_str();
    let flavor = rec.get("flavor").py_str();
    let s = SUITES.iter().position(|x| *x == suite).unwrap_or(99);
    let f = FLAVORS.iter().position(|x| *x == flavor).unwrap_or(99);
    (s, suite, f, flavor)
}

/// `gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0` -> `12.2.0`: the first
/// `) N.N[.N]`, else the text as it is.
fn short_gcc(gcc: &J) -> String {
    let text = match gcc {
        J::Null => String::new(),
        g => g.py_str(),
    };
    let b = text.as_bytes();
    let digits = |mut i: usize| {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        (i > start).then_some(i)
    };
    for (at, _) in text.match_indices(") ") {
        let start = at + 2;
        let Some(i) = digits(start) else { continue };
        if b.get(i) != Some(&b'.') {
            continue;
        }
        let Some(mut end) = digits(i + 1) else {
            continue;
        };
        if b.get(end) == Some(&b'.')
            && let Some(e) = digits(end + 1)
        {
            end = e;
        }
        return text[start..end].to_string();
    }
    if text.is_empty() { "?".into() } else { text }
}

/// The page's title, its introduction and the results table's head.
fn md_header(jobs: i64, expect_path: &str) -> Vec<String> {
    let mut lines: Vec<String> = [
        "# Build matrix",
        "",
        "Generated by `scripts/matrix` (do not edit by hand). Debian's packaged",
        "NVIDIA kernel-module sources (`/usr/src/nvidia-open-kernel.tar.xz`,",
        "`nvidia-kernel.tar.xz`) compiled by `gpu-driver-installer build` inside",
        "debootstrap builder roots (`scripts/builder-root`), for the root's own",
    ]
    .map(String::from)
    .to_vec();
    lines.push(format!(
        "cloud kernel headers, with `--jobs {jobs}`. Expectations:"
    ));
    lines.push(format!(
        "`{expect_path}`; **pass** = outcome as expected, **FAIL** = not,"
    ));
    lines.extend(
        [
            "*reported* = no expectation listed. Pairs that fail with",
            "`KernelApiMismatch` seed the catalog's exclusions",
            "(`scripts/matrix-exclusions`, see [compatibility.md](compatibility.md)).",
            "",
            "| root | gcc | driver | flavor | kernel | result | reason | expected | verdict | wall | measured |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        .map(String::from),
    );
    lines
}

/// A pair's row of the results table.
fn md_result_row(r: &J) -> String {
    let mut result = r.get("phase").py_str();
    if let J::Arr(m) = r.get("modules")
        && !m.is_empty()
    {
        let n = m.len();
        result.push_str(&format!(" ({n} module{})", if n != 1 { "s" } else { "" }));
    }
    let measured = r.get("measured").py_str();
    format!(
        "| {} | {} | {} | {} | {} | {} | `{}` | {} | **{}** | {:.0} s | {} |",
        r.get("suite").py_str(),
        short_gcc(r.get("gcc")),
        r.get("driverVersion").py_str(),
        r.get("flavor").py_str(),
        r.get("kernel").py_str(),
        result,
        r.get("reason").py_str(),
        r.get("expected").or(&J::str("–")).py_str(),
        r.get("verdict").py_str(),
        r.get("wallSeconds").as_f64().unwrap_or_default(),
        head_chars(&measured, 10),
    )
}

/// A failure's note: the pair, its reason and message, and the installer
/// log's tail where there was no result document.
fn md_failure(r: &J) -> Vec<String> {
    let note = r.get("verdictNote");
    let note = if note.truthy() {
        format!(" ({})", note.py_str())
    } else {
        String::new()
    };
    let message = r.get("message").or(&J::str("")).py_str();
    let mut lines = vec![
        format!(
            "**{}** — `{}`{note}:",
            r.get("pair").py_str(),
            r.get("reason").py_str()
        ),
        String::new(),
        "```".into(),
        head_chars(py_strip(&message), 1500).to_string(),
        "```".into(),
        String::new(),
    ];
    let excerpt = r.get("logExcerpt");
    if r.get("phase").as_str() == Some("NoResult") && excerpt.truthy() {
        lines.extend([
            "Installer log (tail):".into(),
            String::new(),
            "```".into(),
            tail_chars(&excerpt.py_str(), 1500).to_string(),
            "```".into(),
            String::new(),
        ]);
    }
    lines
}

/// The Failures section: pairs that did not succeed or failed their
/// expectation; nothing if none.
fn md_failures(results: &[J]) -> Vec<String> {
    let notes: Vec<&J> = results
        .iter()
        .filter(|r| {
            r.get("phase").as_str() != Some("Succeeded")
                || r.get("verdict").as_str() == Some("FAIL")
        })
        .collect();
    if notes.is_empty() {
        return Vec::new();
    }
    let mut lines = ["", "## Failures", ""].map(String::from).to_vec();
    for r in notes {
        lines.extend(md_failure(r));
    }
    lines
}

/// The Packages section's table (its heading is the caller's).
fn md_packages(results: &[J]) -> Vec<String> {
    let mut lines = [
        "",
        "| root | source package | headers package | root made |",
        "|---|---|---|---|",
    ]
    .map(String::from)
    .to_vec();
    for r in results {
        let b = r.get("builderRoot");
        let created = b.get("created").py_str();
        lines.push(format!(
            "| {}/{} | {} | {} | {} (key {}) |",
            r.get("suite").py_str(),
            r.get("flavor").py_str(),
            r.get("sourcePackage").py_str(),
            r.get("headersPackage").py_str(),
            head_chars(&created, 10),
            b.get("key").py_str(),
        ));
    }
    lines
}

fn markdown(results: &[J], jobs: i64, expect_path: &str) -> String {
    let mut lines = md_header(jobs, expect_path);
    lines.extend(results.iter().map(md_result_row));
    lines.extend(md_failures(results));
    let heading = if lines.last().is_some_and(|l| l.is_empty()) {
        "## Packages"
    } else {
        "\n## Packages"
    };
    lines.push(heading.to_string());
    lines.extend(md_packages(results));
    format!("{}\n", lines.join("\n").trim_end_matches(py_space))
}

/// matrix.json and matrix.md as the report writes them; the pairs run now
/// that failed.
fn render(
    previous: Option<J>,
    new: Vec<J>,
    expect: &[(String, J)],
    expect_path: &str,
    jobs: i64,
    generated: &str,
) -> (String, String, Vec<J>, Vec<String>) {
    let mut merged: Vec<J> = match previous.as_ref().map(|p| p.get("results")) {
        Some(J::Arr(rs)) => rs.clone(),
        _ => Vec::new(),
    };
    let new_pairs: Vec<String> = new.iter().map(|r| r.get("pair").py_str()).collect();
    for rec in new {
        let pair = rec.get("pair").clone();
        match merged.iter_mut().find(|r| r.get("pair") == &pair) {
            Some(r) => *r = rec,
            None => merged.push(rec),
        }
    }
    merged.sort_by_key(order);
    let mut failed = Vec::new();
    for r in &mut merged {
        let pair = r.get("pair").py_str();
        let expected = lookup(expect, &pair).map_or(J::Null, |w| w.get("reason").clone());
        r.set("expected", expected);
        let (v, note) = verdict(r, expect);
        r.set("verdict", J::str(v));
        r.set("verdictNote", J::str(note));
        if v == "FAIL" && new_pairs.contains(&pair) {
            failed.push(pair);
        }
    }
    let doc = J::Obj(vec![
        ("generated".into(), J::str(generated)),
        ("generator".into(), J::str("scripts/matrix")),
        ("jobs".into(), J::Int(jobs)),
        ("expectations".into(), J::str(expect_path)),
        ("results".into(), J::Arr(merged.clone())),
    ]);
    let json = format!("{}\n", doc.dump());
    let md = markdown(&merged, jobs, expect_path);
    (json, md, merged, failed)
}

pub(super) fn report(a: &ReportArgs, generated: &str) -> Result<()> {
    let expect = load_expect(&a.expect_path)?;
    let path_json = a.out.join("matrix.json");
    let previous = if !a.fresh && path_json.exists() {
        Some(J::read(&path_json)?)
    } else {
        None
    };
    let mut records: Vec<PathBuf> = std::fs::read_dir(&a.work)
        .with_context(|| format!("reading {}", a.work.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".record.json"))
        })
        .collect();
    records.sort();
    let mut new: Vec<J> = Vec::new();
    for p in &records {
        let rec = J::read(p)?;
        let pair = rec.get("pair").clone();
        match new.iter_mut().find(|r| r.get("pair") == &pair) {
            Some(r) => *r = rec,
            None => new.push(rec),
        }
    }
    let new_pairs: Vec<String> = new.iter().map(|r| r.get("pair").py_str()).collect();
    let (json, md, results, failed) = render(previous, new, &expect, &a.expect, a.jobs, generated);
    write_replace(&path_json, &json)?;
    write_replace(&a.out.join("matrix.md"), &md)?;
    for r in &results {
        let pair = r.get("pair").py_str();
        let mark = if new_pairs.contains(&pair) { "*" } else { " " };
        eprintln!(
            "{mark} {pair:<22} {:<18} expected {:<18} {:<8} {:>6.0} s  {}",
            r.get("reason").or(&J::str("-")).py_str(),
            r.get("expected").or(&J::str("-")).py_str(),
            r.get("verdict").py_str(),
            r.get("wallSeconds").as_f64().unwrap_or_default(),
            r.get("verdictNote").py_str()
        );
    }
    if !failed.is_empty() {
        bail!(
            "matrix: {} pair(s) differ from {}: {}",
            failed.len(),
            a.expect,
            failed.join(", ")
        );
    }
    eprintln!(
        "matrix: {} pair(s) run, all as expected or reported",
        new_pairs.len()
    );
    Ok(())
}

fn write_replace(path: &Path, text: &str) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming onto {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// The committed matrix, reported again with no new pairs, comes out
    /// byte for byte as committed (the generation time aside, which is the
    /// committed one here).
    #[test]
    fn committed_matrix_reproduces() -> Result<()> {
        let docs = repo().join("docs");
        let committed = std::fs::read_to_string(docs.join("matrix.json"))?;
        let previous = J::parse(&committed)?;
        let expect_path = previous.get("expectations").py_str();
        let expect = load_expect(&repo().join(&expect_path))?;
        let jobs = previous.get("jobs").as_f64().unwrap_or_default() as i64;
        let generated = previous.get("generated").py_str();
        let (json, md, _, failed) = render(
            Some(previous),
            Vec::new(),
            &expect,
            &expect_path,
            jobs,
            &generated,
        );
        assert_eq!(json, committed);
        assert_eq!(md, std::fs::read_to_string(docs.join("matrix.md"))?);
        assert!(failed.is_empty());
        Ok(())
    }

    #[test]
    fn gcc_versions() {
        let g = |s: &str| short_gcc(&J::str(s));
        assert_eq!(g("gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"), "12.2.0");
        assert_eq!(g("gcc (Debian 14.2.0-19) 14.2"), "14.2");
        assert_eq!(g("clang 17"), "clang 17");
        assert_eq!(short_gcc(&J::Null), "?");
    }

    /// The contract's timestamps are the ones matrix.json has always had.
    #[test]
    fn dates() {
        let utc = |s| rfc3339_utc(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_796_222_550), "2026-12-02T14:42:30Z");
    }

    #[test]
    fn upstream_versions() {
        assert_eq!(upstream(&J::str("535.261.03-1")), J::str("535.261.03"));
        assert_eq!(
            upstream(&J::str("1:550.163.01-2~deb13")),
            J::str("550.163.01")
        );
        assert_eq!(upstream(&J::Null), J::Null);
    }
}
