//! Every repository path the docs name exists: in README.md, BENCHMARKS.md and docs/*.md, a
//! word in backticks whose first segment is an entry of the repository's root (`src/…`,
//! `actors/src/directory/`, `config/vllm-engines.json`, `Cargo.toml`) must name a file or folder
//! that is there. A `:line` or `#anchor` after it is ignored, and so are patterns (`*`, `{`,
//! `<`). Move or rename a file without its docs and this test names the line. README.md and
//! BENCHMARKS.md stay short enough to read: under 10,000 bytes each.

use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The docs that name paths: README.md, BENCHMARKS.md and every docs/*.md.
fn docs(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let dir = std::fs::read_dir(root.join("docs")).expect("docs/ is readable");
    let mut md: Vec<PathBuf> = dir
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    md.sort();
    out.extend(md);
    out
}

/// The words in backticks of `line` that are repository paths (see the module docs), each
/// without its `:line` or `#anchor`.
fn repository_paths<'a>(line: &'a str, top: &[String]) -> Vec<&'a str> {
    let quoted = line.split('`').skip(1).step_by(2);
    quoted
        .filter(|w| !w.is_empty() && !w.contains(char::is_whitespace))
        .filter(|w| !w.contains(['*', '{', '<']))
        .map(|w| w.split('#').next().unwrap_or(w))
        .map(|w| w.split(':').next().unwrap_or(w))
        .filter(|w| top.iter().any(|t| w.split('/').next() == Some(t.as_str())))
        .collect()
}

#[test]
fn every_repository_path_in_the_docs_exists() {
    let root = root();
    let top: Vec<String> = std::fs::read_dir(&root)
        .expect("the repository root is readable")
        .map(|e| e.expect("a root entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name != "target" && name != ".git")
        .collect();
    assert!(top.iter().any(|t| t == "docs"), "the root has docs/: {top:?}");
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in docs(&root) {
        let text = std::fs::read_to_string(&doc).expect("a readable doc");
        let name = doc.strip_prefix(&root).unwrap_or(&doc).display().to_string();
        for (n, line) in text.lines().enumerate() {
            for path in repository_paths(line, &top) {
                checked += 1;
                if !root.join(path).exists() {
                    missing.push(format!("{name}:{}: `{path}` does not exist", n + 1));
                }
            }
        }
    }
    assert!(checked > 50, "too few paths found in the docs ({checked}); is the reader broken?");
    assert!(missing.is_empty(), "paths in the docs that are not in the repository:\n{}", {
        missing.join("\n")
    });
}

#[test]
fn the_path_reader_takes_root_paths_only() {
    let top = ["src".to_string(), "Cargo.toml".to_string()];
    let line = "see `src/index/mod.rs:12`, `src/car#x`, `/v1/route`, `index/flat.rs`, \
                `src/*.rs`, `Cargo.toml` and `cargo run`";
    assert_eq!(repository_paths(line, &top), ["src/index/mod.rs", "src/car", "Cargo.toml"]);
}

#[test]
fn the_readme_and_the_benchmarks_stay_under_ten_kilobytes() {
    let root = root();
    for name in ["README.md", "BENCHMARKS.md"] {
        let bytes = std::fs::metadata(root.join(name)).expect("a readable doc").len();
        assert!(
            bytes < 10_000,
            "{name} is {bytes} bytes; keep it under 10,000: replace stale rows or move detail \
             to docs/"
        );
    }
}
