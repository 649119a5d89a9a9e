//! A pod's life as kvdir sees it: created (Pending), Running but not Ready, Ready, NotReady,
//! Ready again, moved to another IP (seen by a watch resumed after every connection broke),
//! recreated under its name (a new UID), deleted; pods that are not selected or in another
//! namespace never become engines.

use super::*;
use kvdir_testkit::kube::api::PodStatus;

/// The pod engine's name in kvdir.
const A: &str = "lifecycle/a";

#[test]
fn a_pod_is_an_engine_while_it_runs_ready_with_an_ip() {
    let server = KubeApiServer::start();
    let ns = "lifecycle";
    own_namespace(&server, ns);
    server.create_namespace("unwatched");
    // The engine's HTTP side on 127.0.0.1, and another process on 127.0.0.2 (the pod moved).
    let http = TestEngine::start();
    let moved = TestEngine::start_at(&format!("127.0.0.2:{}", http.port));
    moved.set(|s| s.start_time = Some(2.5));
    let notes = annotations(http.port, 1, 2);
    let svc = kvdir(&server, User::Kvdir, ns);
    eventually("the first list", || {
        let k = kube_report(&svc);
        (k["connected"] == true && k["listings"] == 1).then_some(()).ok_or(k.to_string())
    });

    // Created, not selected, or elsewhere: no engine. Running but not Ready: none either.
    let uid = server.create_pod(ns, "a", &[SELECTED], &pairs(&notes));
    server.create_pod(ns, "unlabelled", &[], &pairs(&notes));
    server.run_pod(ns, "unlabelled", "127.0.0.1");
    server.create_pod("unwatched", "a", &[SELECTED], &pairs(&notes));
    server.run_pod("unwatched", "a", "127.0.0.1");
    let not_ready = PodStatus { ready: false, ..PodStatus::running("127.0.0.1") };
    server.set_pod_status(ns, "a", &not_ready);
    seen(&svc, &server, ns, "a");
    assert_eq!(pod_engines(&svc), Vec::<String>::new());
    assert_eq!(kube_report(&svc)["pods"], 1, "only lifecycle/a is selected");

    // Ready: an engine at the pod's IP, whose identity carries the pod's UID.
    server.set_pod_ready(ns, "a", true);
    let first = format!("pod-uid={uid} process_start_time_seconds=1764598123.25");
    let i = identity(&svc, &first);
    let e = &i["engine"];
    assert_eq!(e["url"], format!("http://127.0.0.1:{}", http.port), "{i}");
    assert_eq!(
        (e["events"].clone(), e["replay"].clone()),
        (json!(["tcp://127.0.0.1:1"]), json!(["tcp://127.0.0.1:2"]))
    );
    assert_eq!(
        (e["model"].as_str(), e["block_size"].as_u64()),
        (Some("kvdir-demo"), Some(B.into()))
    );
    assert_eq!((e["source"].as_str(), i["backend"].as_str()), (Some("kubernetes"), Some("vllm")));
    let k = kube_report(&svc);
    assert_eq!((k["engines"].as_u64(), k["namespace"].as_str()), (Some(1), Some(ns)), "{k}");
    assert_eq!(instances(&svc)["instances"].as_array().map(Vec::len), Some(1), "only {A}");

    // NotReady: gone at once; Ready again: back.
    server.set_pod_ready(ns, "a", false);
    engines_become(&svc, &[]);
    server.set_pod_ready(ns, "a", true);
    identity(&svc, &first);

    // Every connection broken (the watch ends mid-stream), then another IP: kvdir resumes its
    // watch where it was (no new list) and sees the engine there, another process.
    server.break_connections();
    server.set_pod_ip(ns, "a", "127.0.0.2");
    let i = identity(&svc, &format!("pod-uid={uid} process_start_time_seconds=2.5"));
    assert_eq!(i["engine"]["url"], format!("http://127.0.0.2:{}", http.port), "{i}");

    // Recreated under the same name: the old engine goes with the old pod, and the new pod is
    // another engine once it runs (its UID in the identity).
    let new_uid = server.recreate_pod(ns, "a");
    assert_ne!(new_uid, uid);
    engines_become(&svc, &[]);
    server.run_pod(ns, "a", "127.0.0.1");
    identity(&svc, &format!("pod-uid={new_uid} process_start_time_seconds=1764598123.25"));

    // Deleted: gone, and no pod is selected any more.
    server.delete_pod(ns, "a");
    engines_become(&svc, &[]);
    eventually("no selected pod", || kube_report(&svc)["pods"] == 0);
    let k = kube_report(&svc);
    assert_eq!((k["listings"].as_u64(), k["error"].clone()), (Some(1), Value::Null), "{k}");
    let names = instances(&svc)["instances"].to_string();
    assert!(!names.contains("unlabelled") && !names.contains("unwatched"), "{names}");
}

/// Waits until kvdir's pod watch has reached the version of pod `name` (so whatever it does
/// with the pod's latest state is done). Versions are etcd revisions, which only grow.
fn seen(svc: &Service, server: &KubeApiServer, namespace: &str, name: &str) {
    let pod = server.pod(namespace, name).expect("the pod exists");
    let version = |v: &Value| v.as_str().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let wanted = version(&pod["metadata"]["resourceVersion"]);
    eventually("kvdir to see the pod's latest version", || {
        let k = kube_report(svc);
        (version(&k["resource_version"]) >= wanted).then_some(()).ok_or(k.to_string())
    });
}

/// Waits until engine [`A`] is ACTIVE with identity `incarnation`; its instance.
fn identity(svc: &Service, incarnation: &str) -> Value {
    eventually(&format!("{A} as {incarnation}"), || {
        let i = instance(svc, A).ok_or_else(|| format!("not listed: {}", kube_report(svc)))?;
        let ok = i["incarnation_id"] == incarnation && i["state"] == "ACTIVE";
        ok.then_some(i.clone()).ok_or(i.to_string())
    })
}
