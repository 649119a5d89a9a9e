//! The flag table of `docs/operations.md` against `kvdir --help`: every flag the binary
//! accepts is documented, nothing documented is missing from the binary, and each plain default
//! (a number, an address, a name) reads the same in both. Edit one without the other and this
//! test says which flag differs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::common::kvdir;

/// `--flag` -> the rest of its help entry (continuation lines joined).
fn help_entries() -> BTreeMap<String, String> {
    let out = kvdir().arg("--help").output().expect("kvdir --help runs");
    let help = String::from_utf8(out.stdout).expect("help is UTF-8");
    let mut entries: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        // Clap's layout: `      --flag <VALUE>`, then the help indented further.
        if indent <= 6 && trimmed.starts_with("--") {
            let flag = trimmed.split_whitespace().next().unwrap_or_default().to_string();
            entries.insert(flag.clone(), trimmed.to_string());
            current = Some(flag);
        } else if indent > 6 {
            if let Some(entry) = current.as_ref().and_then(|f| entries.get_mut(f)) {
                entry.push(' ');
                entry.push_str(trimmed);
            }
        } else {
            current = None;
        }
    }
    entries
}

/// `--flag` -> its default column in the operations guide's flag table.
fn documented_flags() -> BTreeMap<String, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md");
    let text = std::fs::read_to_string(&path).expect("docs/operations.md exists");
    text.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let flag = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let default = cells.get(2)?;
            flag.starts_with("--").then(|| (flag.to_string(), default.to_string()))
        })
        .collect()
}

/// The default a help entry states, when it is one plain word (`8888`, `127.0.0.1:2379`,
/// `CAR`), not a phrase or `none`.
fn plain_default(entry: &str) -> Option<&str> {
    let value = entry.split("[default: ").nth(1)?.split(']').next()?;
    let plain = value.chars().all(|c| c.is_ascii_alphanumeric() || ".:_-".contains(c));
    (plain && value != "none").then_some(value)
}

#[test]
fn the_operations_flag_table_matches_the_help_text() {
    let help = help_entries();
    let documented = documented_flags();
    assert!(help.len() >= 20, "too few flags parsed from --help: {help:?}");
    let undocumented: Vec<_> = help.keys().filter(|f| !documented.contains_key(*f)).collect();
    let unknown: Vec<_> = documented.keys().filter(|f| !help.contains_key(*f)).collect();
    assert!(undocumented.is_empty(), "in --help but not in docs/operations.md: {undocumented:?}");
    assert!(unknown.is_empty(), "in docs/operations.md but not in --help: {unknown:?}");
    for (flag, entry) in &help {
        if let Some(default) = plain_default(entry) {
            let doc = &documented[flag];
            assert_eq!(doc, default, "{flag}: docs/operations.md says {doc:?}, --help {default:?}");
        }
    }
}
