//! Unit tests of stream planning: refreshes that keep streams, replacements, hostile registry
//! values, overlapping endpoints and the bind endpoint.

use std::time::{Duration, Instant};

use super::*;
use crate::config::DiscoveryConfig;
use crate::registry::tests::record;
use crate::registry::*;

/// The streams `p` would leave running, as the discovery actor records them.
fn running(p: &Plan) -> Vec<(crate::config::StreamSpec, Option<Identity>)> {
    p.streams.iter().map(|s| (s.spec.clone(), Some(s.identity.clone()))).collect()
}

/// Whether every stream of `p` keeps the matching stream of `before` (and so its index).
fn keeps_all(p: &Plan, before: &[(crate::config::StreamSpec, Option<Identity>)]) -> bool {
    p.streams.len() == before.len()
        && p.streams.iter().zip(before).all(|(s, (spec, id))| s.is_running_as(spec, id.as_ref()))
}

/// Discovery's settings: block 128, event ports at +10,000, replay at +30,000.
fn discovery() -> DiscoveryConfig {
    DiscoveryConfig {
        enabled: true,
        block_size: 128,
        topic: "xllm-kv".into(),
        event_port_offset: 10_000,
        replay_port_offset: 30_000,
        refresh_interval: Duration::from_secs(1),
        bind: None,
        approximate: false,
    }
}

#[test]
fn planning_follows_roles_ports_overlaps_and_capacity() {
    let t = Instant::now();
    let mut reg = Registry::default();
    reg.put(record("127.0.0.1:8000", 0, 2, Some("a")), t); // DEFAULT, 2 ranks
    reg.put(record("127.0.0.1:8100", 2, 1, Some("b")), t); // DECODE
    let mut mix_decode = record("127.0.0.1:8200", 3, 1, Some("c"));
    mix_decode.mix_acting_prefill = false;
    reg.put(mix_decode, t);
    reg.put(record("127.0.0.1:8300", 3, 1, Some("d")), t); // MIX acting as prefill
    reg.put(record("127.0.0.1:65000", 1, 1, Some("e")), t); // overflow
    reg.put(record("127.0.0.1:8401", 1, 2, Some("f")), t); // overlaps the next one
    reg.put(record("127.0.0.1:8402", 1, 1, Some("g")), t);
    let mut vllm = record("127.0.0.1:8500", 1, 1, None);
    vllm.backend = "vllm".into();
    reg.put(vllm, t);
    let p = plan(reg.instances(), &discovery(), 128);
    let names: Vec<(String, u32, String)> = p
        .streams
        .iter()
        .map(|s| (s.spec.instance_name.clone(), s.spec.dp_rank, s.spec.endpoint.clone()))
        .collect();
    assert_eq!(
        names,
        [
            ("127.0.0.1:8000".into(), 0, "tcp://127.0.0.1:18000".into()),
            ("127.0.0.1:8000".into(), 1, "tcp://127.0.0.1:18001".into()),
            ("127.0.0.1:8300".into(), 0, "tcp://127.0.0.1:18300".into()),
        ]
    );
    assert_eq!(p.streams[1].spec.replay_endpoint, "tcp://127.0.0.1:38001");
    let why = |n: &str| why_in(&p, n);
    assert!(why("127.0.0.1:8100").contains("DECODE"));
    assert!(why("127.0.0.1:8200").contains("acting as DECODE"));
    assert!(why("127.0.0.1:65000").starts_with("port overflow"), "{}", why("127.0.0.1:65000"));
    assert!(why("127.0.0.1:8401").contains("overlaps instance 127.0.0.1:8402"));
    assert!(why("127.0.0.1:8402").contains("overlaps instance 127.0.0.1:8401"));
    assert!(why("127.0.0.1:8500").contains("vllm"));

    let small = plan(reg.instances(), &discovery(), 2);
    assert_eq!(small.streams.len(), 2, "the first instance in name order fits whole");
    assert!(why_in(&small, "127.0.0.1:8300").starts_with("capacity"));
    let ticket = reg.deleted("127.0.0.1:8000").unwrap();
    reg.probed("127.0.0.1:8000", ticket, false, t);
    let p = plan(reg.instances(), &discovery(), 128);
    assert_eq!(p.excluded["127.0.0.1:8000"].to_string(), "SUSPECT");
}

fn why_in(p: &Plan, name: &str) -> String {
    p.excluded.get(name).map(ToString::to_string).unwrap_or_default()
}

#[test]
fn a_refresh_with_the_same_incarnation_keeps_the_streams_despite_a_new_register_ts() {
    let t = Instant::now();
    let mut reg = Registry::default();
    let mut first = record("127.0.0.1:8000", 1, 2, Some("a"));
    first.identity.register_ts_ms = Some(1_000);
    reg.put(first, t);
    let before = running(&plan(reg.instances(), &discovery(), 128));
    assert_eq!(before.len(), 2);

    // The engine re-registers (lease renewal, restart of its etcd client): a new timestamp,
    // another role and new profiling data, but the same process.
    let mut refresh = record("127.0.0.1:8000", 0, 2, Some("a"));
    refresh.identity.register_ts_ms = Some(2_000);
    refresh.ttft_profile = vec![(128.0, 30.0)];
    assert_eq!(reg.put(refresh, t), PutOutcome::Refreshed);
    let p = plan(reg.instances(), &discovery(), 128);
    assert_ne!(p.streams[0].identity, before[0].1.clone().unwrap(), "the identity record changed");
    assert!(keeps_all(&p, &before), "a refresh must not restart the streams cold");

    // Another incarnation on the same address is a replacement: new streams.
    reg.put(record("127.0.0.1:8000", 1, 2, Some("b")), t);
    assert!(!keeps_all(&plan(reg.instances(), &discovery(), 128), &before));
    // A statically configured stream (no identity) is never taken over.
    assert!(!p.streams[0].is_running_as(&before[0].0, None));
}

#[test]
fn register_ts_decides_replacement_only_when_both_lack_an_incarnation() {
    let t = Instant::now();
    let mut reg = Registry::default();
    let mut old = record("127.0.0.1:8000", 1, 1, None);
    old.identity.register_ts_ms = Some(5);
    reg.put(old.clone(), t);
    let before = running(&plan(reg.instances(), &discovery(), 128));
    reg.put(old.clone(), t);
    assert!(keeps_all(&plan(reg.instances(), &discovery(), 128), &before));
    old.identity.register_ts_ms = Some(6);
    assert_eq!(reg.put(old, t), PutOutcome::Replaced);
    assert!(!keeps_all(&plan(reg.instances(), &discovery(), 128), &before));
    // Gaining an incarnation id is another process too.
    let now = running(&plan(reg.instances(), &discovery(), 128));
    let mut upgraded = record("127.0.0.1:8000", 1, 1, Some("x"));
    upgraded.identity.register_ts_ms = Some(6);
    assert_eq!(reg.put(upgraded, t), PutOutcome::Replaced);
    assert!(!keeps_all(&plan(reg.instances(), &discovery(), 128), &now));
}

#[test]
fn a_dp_size_beyond_max_streams_is_excluded_before_anything_is_allocated() {
    let t = Instant::now();
    let mut reg = Registry::default();
    let hostile = br#"{"name":"127.0.0.1:8000","rpc_address":"","type":1,"dp_size":4294967295}"#;
    reg.put(parse_instance("127.0.0.1:8000", hostile).unwrap(), t);
    reg.put(record("127.0.0.1:9000", 1, 1, Some("b")), t);
    let p = plan(reg.instances(), &discovery(), 128);
    assert_eq!(
        why_in(&p, "127.0.0.1:8000"),
        "dp_size 4294967295 exceeds max_streams = 128: no streams for it"
    );
    assert!(p.excluded["127.0.0.1:8000"].needs_operator(), "logged at ERROR");
    assert_eq!(p.streams.len(), 1, "the other instance is unaffected");
    assert_eq!(p.streams[0].spec.instance_name, "127.0.0.1:9000");
}

#[test]
fn port_arithmetic_cannot_overflow_whatever_the_registered_values() {
    // With no stream cap the u32 sum 65535 + 30000 + (2^32 - 2) used to overflow: a panic in
    // debug builds, a wrapped and wrong port in release.
    let t = Instant::now();
    let mut reg = Registry::default();
    let mut r = record("127.0.0.1:65535", 1, 1, Some("a"));
    r.dp_size = u32::MAX;
    reg.put(r, t);
    let p = plan(reg.instances(), &discovery(), usize::MAX);
    assert_eq!(
        why_in(&p, "127.0.0.1:65535"),
        "port overflow: 65535 + offset + dp rank 4294967294 reaches 4295062829 > 65535"
    );
    assert!(p.streams.is_empty());
}

#[test]
fn hostile_registry_values_are_refused_with_short_reasons() {
    let value = |name: &str| {
        serde_json::json!({"name": name, "rpc_address": "", "type": 1}).to_string().into_bytes()
    };
    for name in ["h:-1", "h:99999999999999999999", "h:0", "h:65536", ":8000"] {
        assert!(matches!(parse_instance(name, &value(name)), Err(RecordError::Name(_))), "{name}");
    }
    for dp in ["-1", "4294967296", "1e9", "\"2\""] {
        let v = format!(r#"{{"name":"h:1","rpc_address":"","type":1,"dp_size":{dp}}}"#);
        assert!(matches!(parse_instance("h:1", v.as_bytes()), Err(RecordError::Parse(_))), "{dp}");
    }

    let mib = 1 << 20;
    let long_name = format!("{}:8000", "h".repeat(mib));
    let err = parse_instance(&long_name, &value(&long_name)).unwrap_err();
    assert!(matches!(err, RecordError::Name(_)), "{err}");
    assert!(err.to_string().len() < 2 * QUOTED_BYTES, "{}", err.to_string().len());
    assert!(err.to_string().contains("(1048581 bytes)"), "{err}");
    assert_eq!(parse_key("", &format!("XLLM:PREFILL:{long_name}")), None);

    let huge_type = format!(r#"{{"name":"h:1","rpc_address":"","type":"{}"}}"#, "x".repeat(mib));
    let err = parse_instance("h:1", huge_type.as_bytes()).unwrap_err();
    assert!(matches!(err, RecordError::Parse(_)) && err.to_string().len() < 2 * QUOTED_BYTES);

    let nested = format!("{}{}", "[".repeat(mib / 2), "]".repeat(mib / 2));
    assert!(matches!(parse_instance("h:1", nested.as_bytes()), Err(RecordError::Parse(_))));

    // A 1 MiB value of an ignored field still parses: it is only read, never kept.
    let padded = format!(
        r#"{{"name":"h:1","rpc_address":"","type":1,"padding":"{}","ignored":[{}0]}}"#,
        "p".repeat(mib),
        "0,".repeat(1024)
    );
    assert_eq!(parse_instance("h:1", padded.as_bytes()).unwrap().dp_size, 1);
}

#[test]
fn one_engine_registered_under_two_spellings_overlaps_itself() {
    let t = Instant::now();
    let mut reg = Registry::default();
    reg.put(record("localhost:8000", 1, 1, Some("a")), t);
    reg.put(record("127.0.0.1:8000", 1, 1, Some("b")), t);
    reg.put(record("127.0.0.1:8500", 1, 1, Some("c")), t);
    let p = plan(reg.instances(), &discovery(), 128);
    assert_eq!(
        why_in(&p, "localhost:8000"),
        "endpoint tcp://127.0.0.1:18000 overlaps instance 127.0.0.1:8000"
    );
    assert_eq!(
        why_in(&p, "127.0.0.1:8000"),
        "endpoint tcp://127.0.0.1:18000 overlaps instance localhost:8000"
    );
    assert!(p.excluded["localhost:8000"].needs_operator());
    let names: Vec<&str> = p.streams.iter().map(|s| s.spec.instance_name.as_str()).collect();
    assert_eq!(names, ["127.0.0.1:8500"]);
}

#[test]
fn bound_discovery_puts_every_rank_on_the_bind_endpoint_under_its_own_topic() {
    let t = Instant::now();
    let mut reg = Registry::default();
    reg.put(record("10.0.0.1:8000", 0, 2, Some("a")), t);
    reg.put(record("10.0.0.2:8000", 0, 1, Some("b")), t);
    reg.put(record("10.0.0.3:8000", 0, 3, Some("c")), t);
    let bind = crate::config::BindConfig::with_endpoint("tcp://*:5557").unwrap();
    let bind = crate::config::BindConfig {
        ranks: 2,
        topic: crate::config::TopicPattern::parse("kv@{host}:{port}").unwrap(),
        ..bind
    };
    let d = DiscoveryConfig { bind: Some(bind), ..discovery() };
    let p = plan(reg.instances(), &d, 128);
    let got: Vec<(&str, u32, &str, &str)> = p
        .streams
        .iter()
        .map(|s| {
            let s = &s.spec;
            (s.instance_name.as_str(), s.dp_rank, s.endpoint.as_str(), s.topic.as_str())
        })
        .collect();
    let bound = crate::config::BIND_ENDPOINT;
    assert_eq!(
        got,
        [
            ("10.0.0.1:8000", 0, bound, "kv@10.0.0.1:8000"),
            ("10.0.0.1:8000", 1, bound, "kv@10.0.0.1:8000"),
            ("10.0.0.2:8000", 0, bound, "kv@10.0.0.2:8000"),
        ],
        "sharing the bind endpoint is no overlap"
    );
    assert_eq!(p.streams[1].spec.replay_endpoint, "tcp://10.0.0.1:38001");
    assert_eq!(
        why_in(&p, "10.0.0.3:8000"),
        "dp_size 3 exceeds kv_events_bind.ranks = 2: raise ranks"
    );
}
