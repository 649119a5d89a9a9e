//! The service's modules form layers (see the crate documentation): a module uses only modules
//! of lower layers, so there is no import cycle. The test reads every `crate::…` reference in
//! the code of `actors/src/` ([`kvdir_testkit::layers`]) and fails on any reference that does
//! not point to a lower layer, naming the edge and where it is. A new module must be given a
//! layer here and in the crate documentation.

use std::path::Path;

/// The layers, lowest first (keep in step with `lib.rs` and docs/architecture.md).
const LAYERS: &[&[&str]] = &[
    &["sync"],
    &["faults", "held_logs"],
    &["directory"],
    &["router"],
    &["stream"],
    &["discovery"],
    &["http"],
    &["service"],
    &["demo"],
];

/// Files that belong to no module: the crate root, the binary's and this test.
const NOT_MODULES: &[&str] = &["lib.rs", "main.rs", "layers.rs"];

#[test]
fn every_module_uses_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = kvdir_testkit::layers::violations(&src, LAYERS, NOT_MODULES);
    assert!(bad.is_empty(), "module layering broken:\n{}", bad.join("\n"));
}
