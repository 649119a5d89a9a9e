//! Pod discovery end to end, the short path: kvdir watches the harness's namespace as the
//! `kvdir` user; a selected pod that goes Running and Ready is listed as an engine
//! (`<namespace>/<pod>`, `source: kubernetes`), answers its polls (a test engine on loopback,
//! the pod's IP), loses its engine when it goes NotReady, gets it back, and loses it for good
//! when it is deleted. A pod outside the selector is never an engine.

use kvdir::config::parse_config_file;
use kvdir_service::service::Service;
use kvdir_testkit::kube::{KubeApiServer, User, NAMESPACE};
use serde_json::{json, Value};

use crate::common::*;

const SELECTED: (&str, &str) = ("llm-d.ai/inference-serving", "true");

/// kvdir with only `kubernetes` in its config, as the `kvdir` user.
fn kvdir_watching(server: &KubeApiServer) -> Service {
    let kubeconfig = server.kubeconfig(User::Kvdir);
    let config = json!({"kubernetes": {"namespace": NAMESPACE,
        "kubeconfig": kubeconfig.display().to_string()}, "engine_poll_interval_ms": 100});
    let config = parse_config_file(&config.to_string()).expect("a valid config");
    let flags = kvdir::config::Flags {
        http_server_port: 0,
        server_host: "127.0.0.1".into(),
        etcd_addr: NO_ETCD.into(),
        ..Default::default()
    };
    Service::start(flags, Some(config)).expect("kvdir starts")
}

fn instances(svc: &Service) -> Value {
    let r = request(&svc.http_addr().to_string(), "GET", "/v1/internal/instances", None, None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// The instance named `name`, if listed.
fn engine(svc: &Service, name: &str) -> Option<Value> {
    let all = instances(svc);
    all["instances"].as_array()?.iter().find(|i| i["name"] == name).cloned()
}

#[test]
fn a_ready_pod_is_an_engine_until_it_is_deleted() {
    let server = KubeApiServer::start();
    let http = TestEngine::start();
    let port = http.port.to_string();
    // Event and replay ports no other test uses (nothing publishes there).
    let base = free_http_port(1);
    let (events, replay) = ((base + 10_000).to_string(), (base + 30_000).to_string());
    let annotations = [
        ("kvdir.io/http-port", port.as_str()),
        ("kvdir.io/events-port", events.as_str()),
        ("kvdir.io/replay-port", replay.as_str()),
        ("kvdir.io/model", "m"),
    ];
    let uid = server.create_pod(NAMESPACE, "vllm-0", &[SELECTED], &annotations);
    server.create_pod(NAMESPACE, "other", &[("app", "other")], &annotations);
    let svc = kvdir_watching(&server);
    eventually("the pods listed", || {
        let k = instances(&svc)["kubernetes"].clone();
        (k["connected"] == true && k["pods"] == 1 && k["engines"] == 0)
            .then_some(())
            .ok_or(k.to_string())
    });

    server.run_pod(NAMESPACE, "vllm-0", "127.0.0.1");
    server.run_pod(NAMESPACE, "other", "127.0.0.1");
    let name = format!("{NAMESPACE}/vllm-0");
    let listed = eventually("the pod's engine ACTIVE", || match engine(&svc, &name) {
        Some(e) if e["state"] == "ACTIVE" => Ok(e),
        other => Err(format!("{other:?}")),
    });
    let e = &listed["engine"];
    assert_eq!(e["source"], "kubernetes", "{listed}");
    assert_eq!(e["url"], format!("http://127.0.0.1:{port}"));
    assert_eq!(e["events"], json!([format!("tcp://127.0.0.1:{events}")]));
    assert_eq!(e["replay"], json!([format!("tcp://127.0.0.1:{replay}")]));
    assert_eq!((e["model"].as_str(), e["block_size"].as_u64()), (Some("m"), Some(16)));
    let id = listed["incarnation_id"].as_str().unwrap_or_default();
    assert!(id.starts_with(&format!("pod-uid={uid} ")), "{id}");
    assert_eq!(instances(&svc)["instances"].as_array().map(Vec::len), Some(1), "not `other`");

    server.set_pod_ready(NAMESPACE, "vllm-0", false);
    eventually("the NotReady pod's engine gone", || engine(&svc, &name).is_none());
    server.set_pod_ready(NAMESPACE, "vllm-0", true);
    eventually("the engine back", || engine(&svc, &name).is_some());

    server.delete_pod(NAMESPACE, "vllm-0");
    eventually("the deleted pod's engine gone", || engine(&svc, &name).is_none());
    let k = instances(&svc)["kubernetes"].clone();
    assert_eq!((k["pods"].as_u64(), k["engines"].as_u64()), (Some(0), Some(0)), "{k}");
    assert_eq!(k["namespace"], NAMESPACE);
}
