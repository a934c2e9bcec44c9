//! The shape docs/architecture.md describes, kept true: the crates depend
//! on each other only as the page says (the wire contract on nothing, the
//! installer, operator and exporter on the contract alone), no import
//! circle between a crate's modules, the page's module tables and the code
//! agree both ways, clap only in the binaries' CLI modules, no function
//! longer than MAX_FN_LINES, no `Result<_, String>` (a failure must
//! keep its reason), and the installer's step documents made by one
//! adapter. Reads the sources; pure logic.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 80;

/// The workspace's crates: (package, source directory relative to the
/// workspace root).
const CRATES: &[(&str, &str)] = &[
    ("gpu-driver-contract", "crates/contract/src"),
    ("gpu-driver-installer", "src"),
    ("gpu-driver-operator", "crates/operator/src"),
    ("gpu-driver-exporter", "crates/exporter/src"),
    ("gpu-driver-serve", "crates/serve/src"),
];

/// Which sibling crates each crate may depend on.
const ALLOWED_DEPS: &[(&str, &[&str])] = &[
    ("gpu-driver-contract", &[]),
    ("gpu-driver-installer", &["gpu-driver-contract"]),
    (
        "gpu-driver-operator",
        &["gpu-driver-contract", "gpu-driver-serve"],
    ),
    (
        "gpu-driver-exporter",
        &["gpu-driver-contract", "gpu-driver-serve"],
    ),
    ("gpu-driver-serve", &[]),
];

/// The workspace root: the tests are a package of their own, two levels
/// down.
fn root() -> &'static Path {
    crate::support::repo_root()
}

fn src_of(krate: &str) -> PathBuf {
    let dir = CRATES.iter().find(|(c, _)| *c == krate).unwrap().1;
    root().join(dir)
}

/// Every .rs file under a crate's source directory, with its text up to
/// its unit tests.
fn sources_of(krate: &str) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = fs::read_to_string(&p).unwrap();
                let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
                out.push((p, code.to_string()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&src_of(krate), &mut out);
    out
}

/// Every crate's sources.
fn sources() -> Vec<(PathBuf, String)> {
    CRATES.iter().flat_map(|(c, _)| sources_of(c)).collect()
}

/// The top-level module a file of `krate` belongs to
/// (`crates/operator/src/controller/upgrade.rs` → `controller`); lib.rs,
/// main.rs and bin/ belong to none.
fn module_of(krate: &str, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src_of(krate)).ok()?;
    let first = rel
        .components()
        .next()?
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    match first.as_str() {
        "lib.rs" | "main.rs" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// The module names a piece of code names as `crate::x` (in paths or
/// `use crate::{x, …}`), doc comments left out.
fn crate_paths(code: &str) -> BTreeSet<String> {
    // Doc links (`[`crate::x`]`) are not imports.
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for part in group.split(',') {
                let name = part.trim().split("::").next().unwrap_or("").trim();
                names.insert(name.to_string());
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// A crate's modules → the modules of the same crate each one uses.
fn graph(krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let files = sources_of(krate);
    for (p, _) in &files {
        if let Some(m) = module_of(krate, p) {
            g.entry(m).or_default();
        }
    }
    let known: BTreeSet<String> = g.keys().cloned().collect();
    for (p, code) in &files {
        let Some(m) = module_of(krate, p) else {
            continue;
        };
        let deps = g.entry(m.clone()).or_default();
        for n in crate_paths(code) {
            if n != m && known.contains(&n) {
                deps.insert(n);
            }
        }
    }
    g
}

/// A cycle in the graph, if there is one (depth-first search).
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for d in &g[n] {
            if let Some(c) = visit(d, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_import_circle_between_modules() {
    let g = graph("gpu-driver-installer");
    assert!(g.contains_key("run") && g.contains_key("artifact"), "{g:?}");
    assert!(
        g["cli"].contains("run"),
        "the CLI dispatches to run: {:?}",
        g["cli"]
    );
    for (krate, _) in CRATES {
        if let Some(c) = find_cycle(&graph(krate)) {
            panic!("import circle in {krate}: {}", c.join(" -> "));
        }
    }
}

/// The sibling crates a crate's manifest depends on (normal and build
/// dependencies; dev-dependencies may reach further, for tests).
fn sibling_deps(krate: &str) -> BTreeSet<String> {
    let dir = src_of(krate);
    let manifest = fs::read_to_string(dir.parent().unwrap().join("Cargo.toml")).unwrap();
    let doc: toml::Table = manifest.parse().unwrap();
    ["dependencies", "build-dependencies"]
        .iter()
        .filter_map(|t| doc.get(*t).and_then(|v| v.as_table()))
        .flat_map(|t| t.keys().cloned())
        .filter(|k| CRATES.iter().any(|(c, _)| c == k))
        .collect()
}

#[test]
fn crates_depend_only_on_the_wire_contract() {
    for (krate, allowed) in ALLOWED_DEPS {
        let deps = sibling_deps(krate);
        let allowed: BTreeSet<String> = allowed.iter().map(|s| s.to_string()).collect();
        assert!(
            deps.is_subset(&allowed),
            "{krate} depends on {deps:?}; only {allowed:?} is allowed"
        );
        // Nor through a path in the code (a dev-dependency reached from src/).
        for (p, code) in sources_of(krate) {
            for (other, _) in CRATES.iter().filter(|(c, _)| c != krate) {
                let name = format!("{}::", other.replace('-', "_"));
                if code.contains(&name) && !allowed.contains(*other) {
                    panic!("{} names {name}", p.display());
                }
            }
        }
    }
}

/// docs/architecture.md's module table of each crate: the rows under the
/// heading that names the crate, module → the modules its "uses" column
/// names.
fn documented(krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let page = fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut rows = BTreeMap::new();
    let mut inside = false;
    for line in page.lines() {
        if line.starts_with('#') {
            inside = line.contains(&format!("`{krate}`"));
            continue;
        }
        let Some(rest) = line.strip_prefix("| `").filter(|_| inside) else {
            continue;
        };
        let module = rest.split('`').next().unwrap_or("").to_string();
        let uses = line.trim_end_matches('|').rsplit('|').next().unwrap_or("");
        let names = uses
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        rows.insert(module, names);
    }
    rows
}

#[test]
fn the_architecture_page_and_the_code_agree_both_ways() {
    for (krate, _) in CRATES {
        let code = graph(krate);
        let page = documented(krate);
        let code_modules: BTreeSet<&String> = code.keys().collect();
        let page_modules: BTreeSet<&String> = page.keys().collect();
        assert_eq!(
            code_modules, page_modules,
            "docs/architecture.md's table for {krate} lists other modules than the code has"
        );
        for (m, deps) in &code {
            // Everything uses the installer's `error` and `report`: the
            // page leaves them out of the "uses" column.
            let real: BTreeSet<&String> = deps
                .iter()
                .filter(|d| *d != "error" && *d != "report")
                .collect();
            let said: BTreeSet<&String> = page[m]
                .iter()
                .filter(|d| *d != "error" && *d != "report" && code.contains_key(*d))
                .collect();
            assert_eq!(
                real, said,
                "docs/architecture.md: {krate}'s module {m} uses {real:?}, its row says {said:?}"
            );
        }
    }
}

#[test]
fn clap_only_in_the_binaries_cli_modules() {
    for (krate, _) in CRATES {
        for (p, code) in sources_of(krate) {
            let cli = module_of(krate, &p).is_none_or(|m| m == "cli");
            assert!(
                cli || !code.contains("clap::"),
                "{} uses clap outside a CLI module",
                p.display()
            );
        }
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.insert("a".into(), ["b".to_string()].into());
    g.insert("b".into(), ["c".to_string()].into());
    g.insert("c".into(), BTreeSet::new());
    assert_eq!(find_cycle(&g), None);
    g.get_mut("c").unwrap().insert("a".into());
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
}

/// (file, line, name, length) of every `fn` outside unit tests: from its
/// signature to the closing brace at the same indentation.
fn functions(code: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let indent = &l[..l.len() - t.len()];
        // Visibility (`pub`, `pub(crate)`, `pub(super)`, `pub(in …)`) and
        // qualifiers before `fn`.
        let mut sig = t;
        if let Some(rest) = sig.strip_prefix("pub(") {
            sig = rest.split_once(") ").map_or(rest, |(_, r)| r);
        }
        let sig = sig
            .trim_start_matches("pub ")
            .trim_start_matches("const ")
            .trim_start_matches("async ")
            .trim_start_matches("unsafe ")
            .trim_start_matches("extern \"C\" ");
        let Some(rest) = sig.strip_prefix("fn ") else {
            continue;
        };
        if t.ends_with(';') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{indent}}}");
        if let Some(end) = lines[i..].iter().position(|x| *x == close) {
            out.push((i + 1, name, end + 1));
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let mut long = Vec::new();
    for (p, code) in sources() {
        for (line, name, len) in functions(&code) {
            if len > MAX_FN_LINES {
                long.push(format!("{}:{line} {name}: {len} lines", p.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these into named steps:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_length_check_measures_functions() {
    let code = "fn a() {\n    x();\n}\n\n    pub fn b(\n        y: u8,\n    ) {\n    }\n";
    assert_eq!(
        functions(code),
        vec![(1, "a".to_string(), 3), (5, "b".to_string(), 4)]
    );
    let code = "pub(super) fn c() {\n}\npub(in crate::x) async fn d() {\n    y();\n}\n";
    assert_eq!(
        functions(code),
        vec![(1, "c".to_string(), 2), (3, "d".to_string(), 3)]
    );
}

/// The error type of every two-argument `Result<T, E>` on a line.
fn result_error_types(line: &str) -> Vec<String> {
    let squeezed: String = line.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, _) in squeezed.match_indices("Result<") {
        let rest = &squeezed[i + "Result<".len()..];
        let (mut depth, mut args, mut cur) = (0i32, Vec::new(), String::new());
        for c in rest.chars() {
            match c {
                '<' | '(' => depth += 1,
                '>' | ')' if depth == 0 => break,
                '>' | ')' => depth -= 1,
                ',' if depth == 0 => {
                    args.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        args.push(cur);
        if args.len() == 2 {
            out.push(args[1].clone());
        }
    }
    out
}

#[test]
fn the_result_check_reads_error_types() {
    assert_eq!(
        result_error_types("fn f() -> Result<(), String> {"),
        ["String"]
    );
    assert_eq!(
        result_error_types("fn f() -> std::result::Result<Vec<(String, String)>, String>"),
        ["String"]
    );
    assert!(result_error_types("fn f(m: &BTreeMap<String, String>) -> Result<Os> {").is_empty());
    assert!(result_error_types("-> Result<BTreeMap<String, String>>").is_empty());
}

#[test]
fn no_result_with_a_string_error() {
    let mut found = Vec::new();
    for (p, code) in sources() {
        for (i, l) in code.lines().enumerate() {
            if result_error_types(l).iter().any(|e| e == "String") {
                found.push(format!("{}:{}: {}", p.display(), i + 1, l.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "failures that lose their reason:\n{}",
        found.join("\n")
    );
}

/// Lines of the installer's sources (unit tests aside) that contain
/// `needle`, outside the files allowed to.
fn installer_lines_with(needle: &str, allowed: &[&str]) -> Vec<String> {
    let src = src_of("gpu-driver-installer");
    let mut found = Vec::new();
    for (p, code) in sources_of("gpu-driver-installer") {
        let rel = p.strip_prefix(&src).unwrap();
        if allowed.iter().any(|a| rel == Path::new(a)) {
            continue;
        }
        for (i, l) in code.lines().enumerate() {
            if l.contains(needle) {
                found.push(format!("{}:{}: {}", rel.display(), i + 1, l.trim()));
            }
        }
    }
    found
}

/// A step's work returns its status or the error that stopped it;
/// `step::document` alone makes the step's document and turns an error
/// into its outcome. The run's document (its steps summed up) and the
/// catalog check's are the only others.
#[test]
fn step_documents_are_made_by_the_one_adapter() {
    let by_hand = installer_lines_with(
        "Document::new(",
        &["step.rs", "run/summary.rs", "catalog/check.rs"],
    );
    assert!(
        by_hand.is_empty(),
        "documents made outside step::document:\n{}",
        by_hand.join("\n")
    );
    let outcomes = installer_lines_with(
        "Outcome::from(&",
        &["step.rs", "error.rs", "run/mod.rs", "catalog/check.rs"],
    );
    assert!(
        outcomes.is_empty(),
        "errors turned into outcomes outside step::document:\n{}",
        outcomes.join("\n")
    );
}
