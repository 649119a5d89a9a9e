//! The test kit's Kubernetes API server harness against the real kube-apiserver: what the
//! tests of pod discovery rely on (RBAC per user, status written as a kubelet would, restarts,
//! and a 410 Gone made by a second server on the same etcd).

use kvdir_testkit::kube::api::PodStatus;
use kvdir_testkit::kube::{KubeApiServer, User, NAMESPACE};
use serde_json::Value;

const PODS: &str = "/api/v1/namespaces/engines/pods";

#[test]
fn each_user_has_exactly_its_rights() {
    let server = KubeApiServer::start();
    server.create_namespace("elsewhere");
    server.create_pod(NAMESPACE, "a", &[("app", "x")], &[]);
    let list = server.request_as(User::Kvdir, "GET", PODS, None);
    assert_eq!(list.status, 200, "{}", list.text);
    assert_eq!(list.json["items"][0]["metadata"]["name"], "a");
    let watch = format!("{PODS}?watch=1&timeoutSeconds=1");
    assert_eq!(server.request_as(User::Kvdir, "GET", &watch, None).status, 200);
    let denied = [
        (User::Kvdir, "GET", "/api/v1/namespaces/elsewhere/pods".to_string()),
        (User::Kvdir, "DELETE", format!("{PODS}/a")),
        (User::Kvdir, "GET", "/api/v1/namespaces/engines/secrets".to_string()),
        (User::Nobody, "GET", PODS.to_string()),
    ];
    for (user, method, path) in denied {
        let r = server.request_as(user, method, &path, None);
        assert_eq!(r.status, 403, "{} {method} {path}: {}", user.name(), r.text);
    }
    let config = std::fs::read_to_string(server.kubeconfig(User::Kvdir)).unwrap();
    assert!(config.contains(&server.url()) && config.contains(server.token(User::Kvdir)));
    assert!(config.contains(&server.ca_file().display().to_string()));
}

#[test]
fn the_test_writes_pod_status_as_a_kubelet_would() {
    let server = KubeApiServer::start();
    let annotations = [("kvdir.io/http-port", "8001"), ("kvdir.io/model", "m")];
    let uid =
        server.create_pod(NAMESPACE, "p", &[("llm-d.ai/inference-serving", "true")], &annotations);
    let pod = server.pod(NAMESPACE, "p").expect("created");
    assert_eq!(pod["metadata"]["annotations"]["kvdir.io/http-port"], "8001");
    assert_eq!(pod["status"]["phase"], "Pending");

    server.run_pod(NAMESPACE, "p", "127.0.0.7");
    let status = |server: &KubeApiServer| server.pod(NAMESPACE, "p").unwrap()["status"].clone();
    let s = status(&server);
    assert_eq!((s["phase"].as_str(), s["podIP"].as_str()), (Some("Running"), Some("127.0.0.7")));
    assert_eq!(ready(&s), "True");
    server.set_pod_ready(NAMESPACE, "p", false);
    assert_eq!(
        (ready(&status(&server)), status(&server)["podIP"].clone()),
        ("False", "127.0.0.7".into())
    );
    server.set_pod_ip(NAMESPACE, "p", "127.0.0.8");
    assert_eq!(status(&server)["podIPs"][0]["ip"], "127.0.0.8");
    let failed = PodStatus { phase: "Failed".into(), ip: None, ready: false };
    server.set_pod_status(NAMESPACE, "p", &failed);
    assert_eq!(status(&server)["phase"], "Failed");

    let new_uid = server.recreate_pod(NAMESPACE, "p");
    assert_ne!(new_uid, uid);
    let pod = server.pod(NAMESPACE, "p").unwrap();
    assert_eq!(pod["metadata"]["annotations"]["kvdir.io/model"], "m");
    assert_eq!(pod["status"]["phase"], "Pending");
    server.delete_pod(NAMESPACE, "p");
    assert!(server.pod(NAMESPACE, "p").is_none());
}

#[test]
fn a_second_server_on_the_same_etcd_makes_the_first_answer_410_after_its_restart() {
    let mut server = KubeApiServer::start();
    server.create_pod(NAMESPACE, "before", &[], &[]);
    let list = server.request_as(User::Kvdir, "GET", PODS, None);
    let version = list.json["metadata"]["resourceVersion"].as_str().unwrap().to_string();

    server.stop();
    assert!(!server.is_running());
    let second = server.second();
    second.create_pod(NAMESPACE, "while-down", &[], &[]);
    drop(second);
    server.start_again();

    let names = server.request_as(User::Kvdir, "GET", PODS, None).json["items"].clone();
    let names: Vec<&str> =
        names.as_array().unwrap().iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
    assert_eq!(names, ["before", "while-down"]);
    let watch = format!("{PODS}?watch=1&timeoutSeconds=2&resourceVersion={version}");
    let r = server.request_as(User::Kvdir, "GET", &watch, None);
    assert!(r.status == 410 || r.text.contains("\"code\":410"), "{}: {}", r.status, r.text);
}

fn ready(status: &Value) -> &str {
    let conditions = status["conditions"].as_array().expect("conditions");
    let ready = conditions.iter().find(|c| c["type"] == "Ready").expect("a Ready condition");
    ready["status"].as_str().unwrap()
}
