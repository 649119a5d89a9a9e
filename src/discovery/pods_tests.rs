//! Unit tests of engine pods: readiness, every annotation and its default, labels, and bad
//! values.

use super::pods::*;
use crate::config::Dialect;

fn pod() -> Pod {
    Pod {
        namespace: "llm".into(),
        name: "vllm-0".into(),
        uid: "3f2a".into(),
        phase: "Running".into(),
        ready: true,
        ip: Some("10.1.2.3".into()),
        ..Pod::default()
    }
}

fn with(annotations: &[(&str, &str)]) -> Pod {
    let mut p = pod();
    for (k, v) in annotations {
        p.annotations.insert(k.to_string(), v.to_string());
    }
    p
}

fn serving(p: &Pod) -> crate::config::EngineSpec {
    match pod_engine(p) {
        PodEngine::Serving(e) => e,
        other => panic!("expected an engine, got {other:?}"),
    }
}

fn problems(p: &Pod) -> Vec<String> {
    match pod_engine(p) {
        PodEngine::Invalid(problems) => problems.iter().map(ToString::to_string).collect(),
        other => panic!("expected problems, got {other:?}"),
    }
}

#[test]
fn a_ready_pod_without_annotations_is_a_vllm_engine_on_the_default_ports() {
    let e = serving(&pod());
    assert_eq!(e.name, "llm/vllm-0");
    assert_eq!(e.url, "http://10.1.2.3:8000");
    assert_eq!(e.events, ["tcp://10.1.2.3:5557"]);
    assert_eq!(e.replay, ["tcp://10.1.2.3:5558"]);
    assert_eq!((e.dialect, e.block_size, e.dp_size()), (Dialect::Vllm, 16, 1));
    assert_eq!((e.model.as_str(), e.topic.as_str(), e.pod_uid.as_str()), ("", "", "3f2a"));
    assert!(!e.is_approximate() && !e.is_bound());
}

#[test]
fn only_running_ready_pods_with_an_ip_serve() {
    type Case = (&'static str, fn(&mut Pod), NotServing);
    let cases: [Case; 6] = [
        ("pending", |p| p.phase = "Pending".into(), NotServing::Phase("Pending".into())),
        ("no phase", |p| p.phase.clear(), NotServing::Phase(String::new())),
        ("not ready", |p| p.ready = false, NotServing::NotReady),
        ("no ip", |p| p.ip = None, NotServing::NoIp),
        ("empty ip", |p| p.ip = Some(String::new()), NotServing::NoIp),
        ("deleting", |p| p.deleting = true, NotServing::Deleting),
    ];
    for (what, change, expected) in cases {
        let mut p = pod();
        change(&mut p);
        assert_eq!(pod_engine(&p), PodEngine::NotServing(expected), "{what}");
    }
    assert_eq!(NotServing::Phase("Failed".into()).to_string(), "phase Failed, not Running");
}

#[test]
fn every_annotation_is_read() {
    let p = with(&[
        (HTTP_PORT, "30000"),
        (EVENTS_PORT, "6000"),
        (REPLAY_PORT, "7000"),
        (DIALECT, "sglang"),
        (MODEL, "meta-llama/Llama-3.1-8B"),
        (BLOCK_SIZE, "64"),
        (DP_SIZE, "2"),
        (TOPIC, "kv@llm"),
    ]);
    let e = serving(&p);
    assert_eq!(e.url, "http://10.1.2.3:30000");
    assert_eq!(e.events, ["tcp://10.1.2.3:6000", "tcp://10.1.2.3:6001"]);
    assert_eq!(e.replay, ["tcp://10.1.2.3:7000", "tcp://10.1.2.3:7001"]);
    assert_eq!((e.dialect, e.block_size, e.dp_size()), (Dialect::Sglang, 64, 2));
    assert_eq!((e.model.as_str(), e.topic.as_str()), ("meta-llama/Llama-3.1-8B", "kv@llm"));
    let streams = e.streams();
    assert_eq!(streams.len(), 2);
    assert_eq!((streams[1].dp_rank, streams[1].endpoint.as_str()), (1, "tcp://10.1.2.3:6001"));
}

#[test]
fn a_label_is_read_when_no_annotation_is_given_and_the_annotation_wins() {
    let mut p = pod();
    p.labels.insert(MODEL.into(), "from-label".into());
    p.labels.insert(BLOCK_SIZE.into(), "32".into());
    p.annotations.insert(BLOCK_SIZE.into(), "128".into());
    let e = serving(&p);
    assert_eq!((e.model.as_str(), e.block_size), ("from-label", 128));
    p.labels.insert(DP_SIZE.into(), "x".into());
    assert_eq!(
        problems(&p),
        ["label kvdir.io/dp-size = \"x\": expected an integer in 1..=65536, the engine's DP size; \
          fix the value, or remove it for the default 1"]
    );
}

#[test]
fn ipv6_pods_are_bracketed() {
    let mut p = pod();
    p.ip = Some("fd00::7".into());
    let e = serving(&p);
    assert_eq!(
        (e.url.as_str(), e.events[0].as_str()),
        ("http://[fd00::7]:8000", "tcp://[fd00::7]:5557")
    );
    for ep in e.events.iter().chain(&e.replay) {
        assert_eq!(crate::config::check_endpoint(ep), Ok(()), "{ep}");
    }
}

#[test]
fn bad_values_name_the_key_the_value_and_the_fix() {
    let cases: [(&[(&str, &str)], &str); 8] = [
        (
            &[(HTTP_PORT, "http")],
            "annotation kvdir.io/http-port = \"http\": expected an integer in 1..=65535",
        ),
        (
            &[(EVENTS_PORT, "0")],
            "annotation kvdir.io/events-port = \"0\": expected an integer in 1..=65535",
        ),
        (
            &[(REPLAY_PORT, "70000")],
            "annotation kvdir.io/replay-port = \"70000\": expected an integer",
        ),
        (
            &[(DP_SIZE, "0")],
            "annotation kvdir.io/dp-size = \"0\": expected an integer in 1..=65536",
        ),
        (&[(BLOCK_SIZE, "-16")], "annotation kvdir.io/block-size = \"-16\": expected an integer"),
        (
            &[(DIALECT, "xllm")],
            "annotation kvdir.io/dialect = \"xllm\": expected \"vllm\" or \"sglang\"",
        ),
        (&[(DIALECT, "VLLM")], "annotation kvdir.io/dialect = \"VLLM\": expected \"vllm\""),
        (
            &[(EVENTS_PORT, "65535"), (DP_SIZE, "2")],
            "annotation kvdir.io/events-port = \"65535\": rank 1 would be at port 65536 > 65535",
        ),
    ];
    for (annotations, expected) in cases {
        let p = problems(&with(annotations));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with(expected), "{:?} does not start with {expected:?}", p[0]);
    }
    let mut p = pod();
    p.ip = Some("10.1.2".into());
    assert_eq!(problems(&p), ["status podIP = \"10.1.2\": not an IP address"]);
    let all = problems(&with(&[(HTTP_PORT, "x"), (DP_SIZE, "y"), (DIALECT, "z")]));
    assert_eq!(all.len(), 3, "every problem at once: {all:?}");
}

#[test]
fn overlapping_port_ranges_say_so() {
    // The default replay port (5558) is rank 1's event port at dp-size 2.
    let p = problems(&with(&[(DP_SIZE, "2")]));
    assert_eq!(
        p,
        ["default kvdir.io/replay-port = \"5558\": the replay ports 5558..=5559 overlap the event \
          ports 5557..=5558 (kvdir.io/events-port, kvdir.io/dp-size = 2); give \
          kvdir.io/replay-port a port outside them, such as 5559"]
    );
    serving(&with(&[(DP_SIZE, "2"), (REPLAY_PORT, "5559")]));
    serving(&with(&[(DP_SIZE, "2"), (REPLAY_PORT, "5555")]));
    let p = problems(&with(&[(EVENTS_PORT, "7000"), (REPLAY_PORT, "7000")]));
    assert!(p[0].contains("overlap the event ports 7000..=7000"), "{p:?}");
    let p = problems(&with(&[(HTTP_PORT, "5558")]));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with(
            "annotation kvdir.io/http-port = \"5558\": the HTTP port 5558 is one of \
                          the ports 5558..=5558 of kvdir.io/replay-port"
        ),
        "{p:?}"
    );
}

#[test]
fn the_pod_uid_and_address_make_the_engine() {
    let a = serving(&pod());
    let mut recreated = pod();
    recreated.uid = "9c1d".into();
    assert_ne!(serving(&recreated), a, "another UID is another engine");
    let mut moved = pod();
    moved.ip = Some("10.1.2.4".into());
    assert_ne!(serving(&moved), a, "another IP is another engine");
    let mut relabelled = pod();
    relabelled.labels.insert("unrelated".into(), "x".into());
    assert_eq!(serving(&relabelled), a, "other labels change nothing");
}

#[test]
fn the_identity_of_a_pod_engine_is_its_pod_uid_and_its_process() {
    use crate::discovery::{Engines, IdentityChange, Probe};
    let now = std::time::Instant::now();
    let metrics = "process_start_time_seconds 1700000000\nvllm:num_requests_waiting 0\n\
                   vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n";
    let mut engines = Engines::default();
    engines.add(serving(&pod()), now).unwrap();
    let probe = Probe { health: Ok(()), metrics: Ok(metrics.into()) };
    assert_eq!(engines.observe("llm/vllm-0", probe, now), IdentityChange::Learned);
    let id = &engines.get("llm/vllm-0").unwrap().instance.record.identity;
    assert_eq!(
        id.incarnation_id.as_deref(),
        Some("pod-uid=3f2a process_start_time_seconds=1700000000")
    );
    assert_eq!(engines.planned()[0].identity, *id, "the streams run for this pod's process");
}
