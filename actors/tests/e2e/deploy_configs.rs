//! The Kubernetes manifests cannot drift from kvdir's flags and config schema: every config file
//! that a kustomization under `deploy/kubernetes/` puts in a ConfigMap (its `configMapGenerator`
//! files) passes `kvdir --check_config`, given the arguments kvdir's Deployment gives it
//! (`deploy/kubernetes/base/deployment.yaml`, with the config path pointed at the file).
//! `scripts/k8s-validate.sh` checks the rest offline: the schemas and the example engines.

use std::path::{Path, PathBuf};

use crate::common::kvdir;

/// Where the Deployment mounts the ConfigMap's `config.json`.
const MOUNTED: &str = "--kv_events_config_file=/etc/kvdir/config.json";

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// Every `kustomization.yaml` under `dir`.
fn kustomizations(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            kustomizations(&path, out);
        } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
            out.push(path);
        }
    }
}

/// The files of a kustomization's `configMapGenerator` (`- config.json`, or `- key=path`): the
/// list items after each `files:` line.
fn generated_files(kustomization: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(kustomization).expect("a readable kustomization");
    let folder = kustomization.parent().expect("a folder");
    let mut files = Vec::new();
    let mut in_files = false;
    for line in text.lines() {
        let item = line.trim_start().strip_prefix("- ");
        match (in_files, item) {
            (true, Some(f)) => files.push(folder.join(f.rsplit('=').next().unwrap_or(f))),
            _ => in_files = line.trim() == "files:",
        }
    }
    files
}

/// The `args` of the kvdir container in the base Deployment: the `- --flag` items after the
/// first `args:` line.
fn deployment_args() -> Vec<String> {
    let path = deploy().join("base/deployment.yaml");
    let text = std::fs::read_to_string(&path).expect("a readable deployment.yaml");
    let lines = text.lines().skip_while(|l| l.trim() != "args:").skip(1);
    let args: Vec<String> = lines
        .map_while(|l| l.trim_start().strip_prefix("- --").map(|a| format!("--{a}")))
        .collect();
    assert!(
        args.iter().any(|a| a == MOUNTED),
        "{} gives kvdir {MOUNTED}: {args:?}",
        path.display()
    );
    assert!(text.contains("mountPath: /etc/kvdir\n"), "the ConfigMap is mounted at /etc/kvdir");
    args
}

#[test]
fn every_kubernetes_config_passes_check_config_with_the_deployments_flags() {
    let mut found = Vec::new();
    kustomizations(&deploy(), &mut found);
    found.sort();
    let configs: Vec<PathBuf> = found.iter().flat_map(|k| generated_files(k)).collect();
    let base = deploy().join("base/config.json");
    assert!(configs.contains(&base), "the base's config is generated: {configs:?}");
    let args = deployment_args();
    for config in &configs {
        let flag = format!("--kv_events_config_file={}", config.display());
        let mut run = kvdir();
        run.args(args.iter().map(|a| if a == MOUNTED { &flag } else { a })).arg("--check_config");
        let out = run.output().expect("kvdir runs");
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success() && stdout.contains("configuration is valid"),
            "{}: {:?}\n{stdout}{stderr}",
            config.display(),
            out.status
        );
    }
}
