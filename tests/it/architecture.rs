//! The shape docs/architecture.md describes, kept true: no import circle
//! between the library's modules, no function in src/ longer than
//! MAX_FN_LINES, and no `Result<_, String>` (a failure must keep its
//! reason). Reads the sources; pure logic.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 120;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every .rs file under src/, with its text up to its unit tests.
fn sources() -> Vec<(PathBuf, String)> {
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
    walk(&src(), &mut out);
    out
}

/// The top-level module a file belongs to (`src/operator/job.rs` →
/// `operator`); lib.rs, main.rs and bin/ belong to none.
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).ok()?;
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

/// Module → the modules it names as `crate::x` (in paths or `use crate::{x, …}`).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let files = sources();
    for (p, _) in &files {
        if let Some(m) = module_of(p) {
            g.entry(m).or_default();
        }
    }
    let known: BTreeSet<String> = g.keys().cloned().collect();
    for (p, code) in &files {
        let Some(m) = module_of(p) else { continue };
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
        let deps = g.entry(m.clone()).or_default();
        for n in names {
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
    let g = graph();
    assert!(g.contains_key("run") && g.contains_key("artifact"), "{g:?}");
    assert!(
        g["cli"].contains("run"),
        "the CLI dispatches to run: {:?}",
        g["cli"]
    );
    if let Some(c) = find_cycle(&g) {
        panic!("import circle: {}", c.join(" -> "));
    }
}

#[test]
fn the_architecture_page_lists_every_module_and_its_uses() {
    let page =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .unwrap();
    for (m, deps) in graph() {
        let row = page
            .lines()
            .find(|l| l.starts_with(&format!("| `{m}` |")))
            .unwrap_or_else(|| panic!("docs/architecture.md has no row for module {m}"));
        let uses = row.rsplit('|').nth(1).unwrap_or("");
        for d in deps.iter().filter(|d| *d != "error" && *d != "report") {
            assert!(
                uses.contains(&format!("`{d}`")),
                "docs/architecture.md: {m} uses {d}, its row does not say so: {row}"
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
        let sig = t
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ")
            .trim_start_matches("async ")
            .trim_start_matches("const ");
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
