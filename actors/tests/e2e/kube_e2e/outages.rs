//! What goes wrong between kvdir and the API server: the server killed and restarted (every
//! watch broken mid-stream), a resume point too old for the restarted server (410 Gone), and
//! RBAC refusing access. kvdir keeps its engines and their credit, says what is wrong, keeps
//! serving, and catches up once the server answers.

use std::time::Duration;

use super::*;
use kvdir_sim::{Dialect, EngineConfig, SimEngine};
use tracing_subscriber::filter::LevelFilter;

/// Long enough for kvdir's retry back-off (up to 10 s between tries) after an outage.
fn after_outage() -> Patience {
    Patience::new(Duration::from_secs(45))
}

/// The publishing side of an engine in vLLM's dialect (live batches and history replay).
fn vllm_events(name: &str) -> SimEngine {
    let config = EngineConfig {
        name: name.into(),
        block_size: B,
        device_capacity_blocks: 256,
        dialect: Dialect::Vllm,
        ..EngineConfig::default()
    };
    SimEngine::start(config).expect("the simulated engine starts")
}

/// The route candidate `name` for `tokens`, once it has credit.
fn credited(svc: &Service, name: &str, tokens: &[i32]) -> Result<Value, String> {
    let body = json!({ "token_ids": tokens }).to_string();
    let r = http(svc.http_addr(), "POST", "/v1/internal/route", &[], body.as_bytes());
    let routed = r.json();
    let c = routed["candidates"].as_array().and_then(|c| c.iter().find(|c| c["name"] == name));
    match c {
        Some(c) if c["kv_hit_ratio"].as_f64() > Some(0.0) => Ok(c.clone()),
        _ => Err(r.body),
    }
}

#[test]
fn engines_keep_their_credit_while_the_api_server_is_down_and_later_changes_are_seen() {
    let mut server = KubeApiServer::start();
    let ns = "outage";
    own_namespace(&server, ns);
    let http_a = TestEngine::start();
    let events = vllm_events("outage-a");
    let ep = &events.endpoints()[0];
    let mut notes = annotations(http_a.port, port_of(&ep.event), port_of(&ep.replay));
    notes.push(("kvdir.io/topic".into(), events.config().topic.clone()));
    server.create_pod(ns, "a", &[SELECTED], &pairs(&notes));
    server.run_pod(ns, "a", "127.0.0.1");
    let svc = kvdir(&server, User::Kvdir, ns);
    let tokens = prompt(7, 4);
    events.process(0, &tokens).unwrap();
    eventually("credit on the pod's engine", || credited(&svc, "outage/a", &tokens));

    // Killed: every watch breaks. kvdir says so and keeps the engine, its stream and credit.
    server.stop();
    let k = eventually("the outage reported", || {
        let k = kube_report(&svc);
        (k["connected"] == false && k["error"].is_string())
            .then_some(k.clone())
            .ok_or(k.to_string())
    });
    assert!(
        k["error"].as_str().unwrap().contains("cannot watch pods in namespace \"outage\""),
        "{k}"
    );
    assert_eq!(pod_engines(&svc), ["outage/a"]);
    let more = prompt(300, 2);
    events.process(0, &more).unwrap();
    eventually("new blocks credited during the outage", || credited(&svc, "outage/a", &more));

    // Restarted: kvdir watches again and sees what changes after.
    server.start_again();
    let http_b = TestEngine::start();
    server.create_pod(ns, "b", &[SELECTED], &pairs(&annotations(http_b.port, 1, 2)));
    server.run_pod(ns, "b", "127.0.0.1");
    engines_become_within(&svc, &["outage/a", "outage/b"], after_outage());
    let k = eventually("connected again", || {
        let k = kube_report(&svc);
        (k["connected"] == true).then_some(k.clone()).ok_or(k.to_string())
    });
    assert_eq!(k["error"], Value::Null, "{k}");
    credited(&svc, "outage/a", &tokens).expect("the credit kept across the outage");
}

#[test]
fn a_resume_point_the_restarted_server_no_longer_has_lists_again() {
    let log = capture_logs(LevelFilter::INFO);
    let mut server = KubeApiServer::start();
    let ns = "gone";
    own_namespace(&server, ns);
    let engine = TestEngine::start();
    let notes = annotations(engine.port, 1, 2);
    // Each pod on its own loopback address: two engines never share an endpoint.
    for (pod, ip) in [("a", "127.0.0.1"), ("b", "127.0.0.2")] {
        server.create_pod(ns, pod, &[SELECTED], &pairs(&notes));
        server.run_pod(ns, pod, ip);
    }
    let svc = kvdir(&server, User::Kvdir, ns);
    engines_become(&svc, &["gone/a", "gone/b"]);

    // While kvdir's server is down, the pods change through another server on the same etcd:
    // the restarted server's watch cache starts past kvdir's last version, so its resume
    // gets 410 Gone, and only a new list shows the changes.
    server.stop();
    let second = server.second();
    second.delete_pod(ns, "b");
    second.create_pod(ns, "c", &[SELECTED], &pairs(&notes));
    second.run_pod(ns, "c", "127.0.0.3");
    drop(second);
    server.start_again();
    engines_become_within(&svc, &["gone/a", "gone/c"], after_outage());
    assert_eq!(kube_report(&svc)["listings"], 2, "{}", kube_report(&svc));
    let lines = captured_log();
    let relisted = lines
        .lines()
        .find(|l| l.contains("listing the pods again") && l.contains("namespace=gone"));
    let relisted = relisted.unwrap_or_else(|| panic!("no relist of namespace gone in:\n{lines}"));
    assert!(relisted.contains("410"), "{relisted}");
    drop(log);
}

#[test]
fn without_the_right_to_read_pods_kvdir_says_how_to_fix_it_and_keeps_serving() {
    let log = capture_logs(LevelFilter::ERROR);
    let server = KubeApiServer::start();
    own_namespace(&server, "rbac");
    server.create_namespace("rbac-later");
    let engine = TestEngine::start();
    for ns in ["rbac", "rbac-later"] {
        server.create_pod(ns, "a", &[SELECTED], &pairs(&annotations(engine.port, 1, 2)));
        server.run_pod(ns, "a", "127.0.0.1");
    }
    // `nobody` may read nothing; `kvdir` may not read rbac-later (yet).
    let nobody = kvdir(&server, User::Nobody, "rbac");
    let later = kvdir(&server, User::Kvdir, "rbac-later");
    for (svc, ns) in [(&nobody, "rbac"), (&later, "rbac-later")] {
        let k = eventually("the refusal reported", || {
            let k = kube_report(svc);
            k["error"].is_string().then_some(k.clone()).ok_or(k.to_string())
        });
        let error = k["error"].as_str().unwrap();
        assert!(
            error.contains(&format!("forbidden to list pods in namespace \"{ns}\"")),
            "{error}"
        );
        assert!(error.contains("grant kvdir's service account get, list and watch"), "{error}");
        assert_eq!((k["connected"].as_bool(), pod_engines(svc).len()), (Some(false), 0), "{k}");
        // Still serving: health and queries answer.
        let health = http(svc.http_addr(), "GET", "/health", &[], b"");
        assert_eq!(health.status, 200, "{}", health.body);
        query(svc, &prompt(1, 1));
        let needle = format!("forbidden to list pods in namespace \"{ns}\"");
        let lines = captured_log();
        let logged = lines.lines().any(|l| l.contains("ERROR") && l.contains(&needle));
        assert!(logged, "no ERROR naming {ns}:\n{lines}");
    }

    // Granted: kvdir's retries get through.
    server.grant_pod_reading("rbac-later");
    engines_become_within(&later, &["rbac-later/a"], after_outage());
    assert_eq!(kube_report(&later)["error"], Value::Null);
    drop(log);
}
