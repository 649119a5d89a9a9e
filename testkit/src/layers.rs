//! The layers check of a crate's modules: each module uses only modules of lower layers, so
//! there is no import cycle. [`violations`] reads every `crate::…` reference in the code of a
//! crate's `src/` (comments and string literals skipped; `use crate::{a, b}` groups read) and
//! names each reference that does not point to a lower layer, with its file and line. The core
//! (`src/layers.rs`) and the service (`actors/src/layers.rs`) each list their layers and call it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each problem with `src`'s modules against `layers` (lowest first), as a sentence naming the
/// edge and where it is: a reference to the same or a higher layer, a module given no layer, a
/// layer listing a module that does not exist. Files in `not_modules` (the crate root, a
/// binary's `main.rs`, the test itself) belong to no module.
pub fn violations(src: &Path, layers: &[&[&str]], not_modules: &[&str]) -> Vec<String> {
    let layer_of = |module: &str| layers.iter().position(|l| l.contains(&module));
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules = BTreeSet::new();
    let mut bad = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(src).expect("under src/");
        if not_modules.iter().any(|n| rel == Path::new(n)) {
            continue;
        }
        let first = rel.components().next().expect("a path").as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        let Some(from) = layer_of(&module) else {
            bad.push(format!("module {module} ({}) has no layer in LAYERS", rel.display()));
            continue;
        };
        modules.insert(module.clone());
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for (target, line) in crate_refs(&code_only(&text)) {
            let Some(to) = layer_of(&target).filter(|_| target != module) else { continue };
            if to >= from {
                bad.push(format!(
                    "{module} -> {target} ({}:{line}): {module} is in layer {from}, {target} in \
                     layer {to}; a module may use only lower layers",
                    rel.display()
                ));
            }
        }
    }
    let listed: BTreeSet<String> =
        layers.iter().flat_map(|l| l.iter().map(|m| m.to_string())).collect();
    for gone in listed.difference(&modules) {
        bad.push(format!("LAYERS lists {gone}, which is not a module of {}", src.display()));
    }
    bad
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source folder is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src` with comments, string literals and char literals blanked out (lines kept).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let skip_to = |out: &mut String, from: usize, to: usize| {
        out.extend(src[from..to].chars().filter(|&c| c == '\n'));
        to
    };
    while i < b.len() {
        let rest = &src[i..];
        let end = if rest.starts_with("//") {
            i + rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            i + rest.find("*/").map_or(rest.len(), |e| e + 2)
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].bytes().take_while(|&c| c == b'#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i + body + rest[body..].find(&close).map_or(rest.len() - body, |e| e + close.len())
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            j + 1
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            i + 2 + rest[2..].find('\'').map_or(rest.len() - 2, |e| e + 1)
        } else if b[i] == b'\'' && rest.chars().nth(2) == Some('\'') {
            i + rest.chars().take(3).map(char::len_utf8).sum::<usize>()
        } else {
            let c = rest.chars().next().expect("not at the end");
            out.push(c);
            i += c.len_utf8();
            continue;
        };
        i = skip_to(&mut out, i, end.min(src.len()));
    }
    out
}

/// The first path segments after each `crate::` in `code`, with the line of each.
fn crate_refs(code: &str) -> Vec<(String, usize)> {
    let ident = |s: &str| -> String {
        s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
    };
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut refs = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find("crate::") {
        let start = from + found;
        from = start + "crate::".len();
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(group) = code[from..].strip_prefix('{') else {
            refs.push((ident(&code[from..]), line_of(start)));
            continue;
        };
        // `crate::{a::X, b::{Y, Z}}`: the first segment of each path at depth 1.
        let (mut depth, mut expect) = (1, true);
        for (k, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 1 => break,
                '}' => depth -= 1,
                ',' if depth == 1 => expect = true,
                c if expect && depth == 1 && !c.is_whitespace() => {
                    refs.push((ident(&group[k..]), line_of(from + 1 + k)));
                    expect = false;
                }
                _ => {}
            }
        }
    }
    refs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_reader_sees_groups_and_skips_comments_and_strings() {
        let code = code_only(
            "use crate::{wire::Batch, index::{A, B},\n  car::C};\n// crate::audit\n\
             let s = \"crate::config\";\nlet c = '\"'; /* crate::stream */ mycrate::overload::f();\n\
             crate::registry::f(); r#\"crate::query\"#; let d = 'x'; fn f<'a>() { crate::metrics }",
        );
        let names: Vec<(String, usize)> = crate_refs(&code);
        let want = [("wire", 1), ("index", 1), ("car", 2), ("registry", 6), ("metrics", 6)];
        assert_eq!(names, want.map(|(m, l)| (m.to_string(), l)));
    }
}
