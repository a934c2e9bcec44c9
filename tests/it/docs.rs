//! The documentation's links: every relative markdown link in README.md
//! and docs/*.md resolves to a file or directory of the repository, and
//! every backticked repository path in them exists. A renamed file is
//! then found by `cargo test`, not by a reader.

use std::path::{Path, PathBuf};

use crate::support::repo_root;

/// The top-level directories a backticked path must start with to count
/// as a repository path.
const ROOTS: [&str; 14] = [
    "src/",
    "crates/",
    "tests/",
    "scripts/",
    "docs/",
    "charts/",
    "deploy/",
    "images/",
    "tools/",
    "catalog/",
    "schema/",
    "keyrings/",
    "examples/",
    ".ci/",
];

/// README.md and docs/*.md.
fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut docs = vec![root.join("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// The targets of the inline links `](target)` on one line.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        // `[text](target "title")`: the target is the first word.
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        out.push(target.trim_start_matches('<').trim_end_matches('>'));
        rest = &rest[end..];
    }
    out
}

/// Whether a link target is outside the repository (a URL, a mail
/// address) or inside the same document (`#anchor`).
fn external(target: &str) -> bool {
    target.is_empty()
        || target.starts_with('#')
        || target.starts_with("http://")
        || target.starts_with("https://")
        || target.starts_with("mailto:")
}

/// The backticked spans of one line that name a repository path, cleaned:
/// no trailing `:line` or punctuation; patterns (`<`, `*`, `{`, spaces)
/// are left out.
fn code_paths(line: &str) -> Vec<String> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| ROOTS.iter().any(|r| s.starts_with(r)))
        .filter(|s| !s.contains(['<', '*', '{', ' ']))
        .map(|s| {
            let s = s.trim_end_matches(|c: char| ".,;:)".contains(c));
            // `src/main.rs:42` or `src/main.rs:42:7`: the file.
            let mut s = s;
            while let Some((head, tail)) = s.rsplit_once(':') {
                if tail.chars().all(|c| c.is_ascii_digit()) && !tail.is_empty() {
                    s = head;
                } else {
                    break;
                }
            }
            s.to_string()
        })
        .collect()
}

/// Every broken link or path of one document, as `file:line: what`.
fn broken_in(doc: &Path) -> Vec<String> {
    let root = repo_root();
    let text = std::fs::read_to_string(doc).unwrap();
    let rel = doc.strip_prefix(root).unwrap().display().to_string();
    let dir = doc.parent().unwrap();
    let mut broken = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        // Code blocks hold commands and output, not links.
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for target in link_targets(line).into_iter().filter(|t| !external(t)) {
            let file = target.split('#').next().unwrap();
            if !dir.join(file).exists() {
                broken.push(format!("{rel}:{}: link ({target})", n + 1));
            }
        }
        for path in code_paths(line) {
            if !root.join(&path).exists() {
                broken.push(format!("{rel}:{}: path `{path}`", n + 1));
            }
        }
    }
    broken
}

#[test]
fn relative_links_and_repository_paths_in_the_docs_exist() {
    let docs = documents();
    assert!(docs.len() > 1, "no docs/*.md found");
    let broken: Vec<String> = docs.iter().flat_map(|d| broken_in(d)).collect();
    assert!(
        broken.is_empty(),
        "{} broken link(s) or path(s) in the docs:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_link_and_path_readers_find_what_they_should() {
    assert_eq!(
        link_targets("see [a](docs/a.md#x), [b](https://e.org) and [c](../c \"t\")"),
        ["docs/a.md#x", "https://e.org", "../c"]
    );
    assert!(external("https://e.org") && external("#anchor") && external("mailto:a@b"));
    assert!(!external("docs/a.md"));
    assert_eq!(
        code_paths(
            "`src/main.rs:42`, `docs/x.md`. `scripts/*` `src/<m>.rs` `cargo test` `tests/it/`"
        ),
        ["src/main.rs", "docs/x.md", "tests/it/"]
    );
}
