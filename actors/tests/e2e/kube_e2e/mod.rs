//! Pod discovery against a real Kubernetes API server (`kvdir_testkit::kube`: kube-apiserver
//! 1.20 built by `scripts/kube-apiserver.sh`, with its own etcd; a missing binary fails the
//! test with the fix, never skips it). kvdir runs in process with a config whose `kubernetes`
//! key points at the harness's kubeconfig; the test plays the kubelet and asserts what an
//! operator reads: `/v1/internal/instances` (the pod engines and the `kubernetes` report),
//! routing credit, and the log.
//!
//! Each test has its own API server and namespace (the namespace names its log lines); the
//! harness itself is checked first ([`harness`]).

mod harness;
mod lifecycle;
mod outages;

use crate::common::*;
use kvdir::config::{parse_config_file, Flags};
use kvdir_service::Service;
use kvdir_testkit::kube::{KubeApiServer, User};
use serde_json::{json, Value};

/// The label that selects engine pods (kvdir's default selector, llm-d's label).
const SELECTED: (&str, &str) = ("llm-d.ai/inference-serving", "true");

/// Creates `namespace` and lets the `kvdir` user read its pods.
fn own_namespace(server: &KubeApiServer, namespace: &str) {
    server.create_namespace(namespace);
    server.grant_pod_reading(namespace);
}

/// kvdir watching the selected pods of `namespace` with `user`'s kubeconfig (engines polled
/// every 100 ms).
fn kvdir(server: &KubeApiServer, user: User, namespace: &str) -> Service {
    let kubernetes = json!({"namespace": namespace,
                            "kubeconfig": server.kubeconfig(user).display().to_string()});
    let config = json!({"kubernetes": kubernetes, "engine_poll_interval_ms": 100});
    let directory = parse_config_file(&config.to_string()).expect("a valid kubernetes config");
    let flags = Flags {
        http_server_port: 0,
        server_host: "127.0.0.1".into(),
        etcd_addr: NO_ETCD.into(),
        ..Flags::default()
    };
    Service::start(flags, Some(directory)).expect("kvdir starts")
}

/// `GET /v1/internal/instances`.
fn instances(svc: &Service) -> Value {
    let r = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"");
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// The `kubernetes` object of the instances report.
fn kube_report(svc: &Service) -> Value {
    instances(svc)["kubernetes"].clone()
}

/// The instance named `name`, if listed.
fn instance(svc: &Service, name: &str) -> Option<Value> {
    let all = instances(svc);
    all["instances"].as_array()?.iter().find(|i| i["name"] == name).cloned()
}

/// The names of the engines listed from pods, sorted.
fn pod_engines(svc: &Service) -> Vec<String> {
    let all = instances(svc);
    let list = all["instances"].as_array().cloned().unwrap_or_default();
    let mut names: Vec<String> = list
        .iter()
        .filter(|i| i["engine"]["source"] == "kubernetes")
        .filter_map(|i| i["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// Waits until the pod engines are exactly `names`.
fn engines_become(svc: &Service, names: &[&str]) {
    engines_become_within(svc, names, Patience::new(kvdir_testkit::DEADLINE));
}

/// [`engines_become`] within `patience`.
fn engines_become_within(svc: &Service, names: &[&str], patience: Patience) {
    patience.eventually(&format!("pod engines {names:?}"), || {
        let now = pod_engines(svc);
        (now == names).then_some(()).ok_or_else(|| format!("{now:?}; {}", kube_report(svc)))
    });
}

/// The annotations of an engine pod whose OpenAI server listens on `http` and whose publisher
/// and replay endpoints are at `events` and `replay` (ports of the pod's IP).
fn annotations(http: u16, events: u16, replay: u16) -> Vec<(String, String)> {
    let port = |key: &str, port: u16| (format!("kvdir.io/{key}"), port.to_string());
    vec![
        port("http-port", http),
        port("events-port", events),
        port("replay-port", replay),
        ("kvdir.io/block-size".into(), B.to_string()),
        ("kvdir.io/model".into(), "kvdir-demo".into()),
    ]
}

/// `pairs` borrowed, as the harness takes them.
fn pairs(owned: &[(String, String)]) -> Vec<(&str, &str)> {
    owned.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// The port of a `tcp://host:port` endpoint.
fn port_of(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).expect("tcp://host:port")
}
