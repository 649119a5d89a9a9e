//! Unit tests of the config file's validation (the flags' are in `flags/tests.rs`).

use super::*;

fn problems(text: &str) -> Vec<String> {
    parse_config_file(text).unwrap_err().problems
}

const TWO_STREAMS: &str = r#"{
  "streams": [
    {"instance_name": "a", "endpoint": "tcp://127.0.0.1:18000", "replay_endpoint": "tcp://127.0.0.1:38000", "topic": "xllm-kv"},
    {"instance_name": "a", "dp_rank": 1, "block_size": 16, "endpoint": "tcp://127.0.0.1:18001", "replay_endpoint": "tcp://127.0.0.1:38001", "replay": "history"}
  ],
  "max_blocks_per_stream": 1000,
  "replay_timeout_ms": 500
}"#;

#[test]
fn static_streams_with_defaults_and_limits() {
    let c = parse_config_file(TWO_STREAMS).unwrap();
    let Source::Streams(s) = &c.source else { panic!("streams expected") };
    assert_eq!(s.len(), 2);
    assert_eq!((s[0].dp_rank, s[0].block_size, s[0].hash_seed), (0, 128, 1024));
    assert_eq!((s[1].dp_rank, s[1].block_size, s[1].topic.as_str()), (1, 16, ""));
    assert_eq!((s[0].replay, s[1].replay), (ReplayKind::Snapshot, ReplayKind::History));
    assert_eq!(c.limits.max_blocks_per_stream, 1000);
    assert_eq!(c.limits.replay_timeout, Duration::from_millis(500));
    assert_eq!(c.limits.resync_interval, Duration::from_secs(30));
    assert_eq!(s[1].index_config(&c.limits).max_blocks, 1000);
}

#[test]
fn discovery_defaults_and_refresh_range() {
    let c = parse_config_file(r#"{"discovery": {"enabled": true, "topic": "xllm-kv"}}"#).unwrap();
    let Source::Discovery(d) = c.source else { panic!("discovery expected") };
    assert_eq!((d.block_size, d.event_port_offset, d.replay_port_offset), (128, 10_000, 30_000));
    assert_eq!(d.refresh_interval, Duration::from_millis(1000));
    assert_eq!(
        problems(r#"{"discovery": {"refresh_interval_ms": 10}}"#),
        ["discovery.refresh_interval_ms = 10 is outside the allowed range 50..=60000"]
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = r#"{
      "streams": [
        {"instance_name": "a", "endpoint": "tcp://*:18000", "replay_endpoint": "tcp://127.0.0.1:18000", "colour": 1},
        {"instance_name": "a", "endpoint": "tcp://127.0.0.1:18000", "replay_endpoint": "udp://x:1", "replay": "vllm"},
        {"endpoint": "tcp://127.0.0.1:18000", "replay_endpoint": "tcp://127.0.0.1:0"}
      ],
      "max_streams": 0,
      "replay_timeout_ms": -5
    }"#;
    let p = problems(text);
    let expect = [
        "max_streams = 0 is outside the allowed range 1..=65536",
        "replay_timeout_ms = -5 is outside the allowed range 1..=3600000",
        "streams[0]: unknown field \"colour\"",
        "streams[0].endpoint = \"tcp://*:18000\": host \"*\" is not connectable",
        "streams[1].replay_endpoint = \"udp://x:1\": must start with tcp://",
        "streams[1].replay = \"vllm\": expected \"snapshot\" (xLLM) or \"history\" (vLLM, SGLang)",
        "streams[2].instance_name: missing",
        "streams[2].replay_endpoint = \"tcp://127.0.0.1:0\": port \"0\" is not in 1..=65535",
        "streams[1]: instance \"a\" dp_rank 0 duplicates streams[0]",
        "streams[2].endpoint \"tcp://127.0.0.1:18000\" duplicates streams[1]",
        "streams[0].replay_endpoint \"tcp://127.0.0.1:18000\" overlaps the event endpoint of streams[1]",
    ];
    for e in expect {
        assert!(p.iter().any(|m| m.starts_with(e)), "missing {e:?} in {p:#?}");
    }
    let shown = parse_config_file(text).unwrap_err().to_string();
    assert!(
        shown.starts_with(&format!("invalid configuration ({} problems):", p.len())),
        "{shown}"
    );
}

#[test]
fn discovery_and_streams_are_exclusive_and_one_is_required() {
    let both = r#"{"discovery": {}, "streams": [{"instance_name": "a", "endpoint": "tcp://h:1", "replay_endpoint": "tcp://h:2"}]}"#;
    assert_eq!(
        problems(both),
        ["discovery and a non-empty streams list are mutually exclusive; keep one"]
    );
    assert_eq!(
        problems("{}"),
        ["config needs \"discovery\", a non-empty \"streams\" list, an \"engines\" list, \
          \"kubernetes\" or kv_events_bind.announce"]
    );
    // Engine pods alone are a source; a bad kubernetes object says what is wrong, once.
    let pods = parse_config_file(r#"{"kubernetes": {"namespace": "llm"}}"#).unwrap();
    assert_eq!(pods.source, Source::EnginesOnly);
    assert!(pods.kubernetes.is_some_and(|k| k.selector == kubernetes::DEFAULT_SELECTOR));
    assert_eq!(
        problems(r#"{"kubernetes": 1}"#),
        ["kubernetes: expected an object, found a number"]
    );
    assert_eq!(
        problems(r#"{"streams": []}"#),
        ["streams: the list is empty; add at least one stream or use discovery"]
    );
    assert!(problems("{not json")[0].starts_with("config is not valid JSON"));
}

#[test]
fn endpoints_must_be_connectable_tcp() {
    assert!(check_endpoint("tcp://127.0.0.1:18000").is_ok());
    assert!(check_endpoint("tcp://engine-a.local:1").is_ok());
    assert!(check_endpoint("tcp://0.0.0.0:18000").is_err());
    assert!(check_endpoint("tcp://127.0.0.1").is_err());
    assert!(check_endpoint("ipc:///tmp/x").is_err());
}

#[test]
fn duplicate_and_overlapping_endpoints_are_found_in_any_spelling() {
    let text = r#"{"streams": [
      {"instance_name": "a", "endpoint": "tcp://127.0.0.1:18000", "replay_endpoint": "tcp://127.0.0.1:38000"},
      {"instance_name": "b", "endpoint": "tcp://localhost:18000", "replay_endpoint": "tcp://[::ffff:127.0.0.1]:38000"},
      {"instance_name": "c", "endpoint": "tcp://Engine.example:1", "replay_endpoint": "tcp://LOCALHOST.:18000"},
      {"instance_name": "d", "endpoint": "tcp://engine.example:01", "replay_endpoint": "tcp://[::1]:38000"}
    ]}"#;
    assert_eq!(
        problems(text),
        [
            "streams[1].endpoint \"tcp://localhost:18000\" duplicates streams[0] \
             (both are tcp://127.0.0.1:18000)",
            "streams[3].endpoint \"tcp://engine.example:01\" duplicates streams[2] \
             (both are tcp://engine.example:1)",
            "streams[1].replay_endpoint \"tcp://[::ffff:127.0.0.1]:38000\" duplicates streams[0] \
             (both are tcp://127.0.0.1:38000)",
            "streams[2].replay_endpoint \"tcp://LOCALHOST.:18000\" overlaps the event endpoint \
             of streams[0] (both are tcp://127.0.0.1:18000)",
        ]
    );
}

#[test]
fn engines_with_defaults_and_explicit_ranks() {
    let text = r#"{"engines": [
      {"url": "http://127.0.0.1:8100/v1", "dialect": "vllm", "events": "tcp://127.0.0.1:5557",
       "replay": "tcp://127.0.0.1:5567", "dp_size": 2, "block_size": 32, "model": "m", "topic": "kv"},
      {"name": "b", "url": "http://127.0.0.1:8200/", "dialect": "sglang", "block_size": 16,
       "events": ["tcp://127.0.0.1:6000", "tcp://127.0.0.1:6010"],
       "replay": ["tcp://127.0.0.1:6001", "tcp://127.0.0.1:6011"]}
    ], "engine_poll_interval_ms": 500}"#;
    let c = parse_config_file(text).unwrap();
    assert_eq!(c.source, Source::EnginesOnly);
    assert_eq!(c.engine_poll_interval, Duration::from_millis(500));
    let (a, b) = (&c.engines[0], &c.engines[1]);
    assert_eq!((a.name.as_str(), a.url.as_str()), ("127.0.0.1:8100", "http://127.0.0.1:8100"));
    assert_eq!(a.events, ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"]);
    assert_eq!(a.replay, ["tcp://127.0.0.1:5567", "tcp://127.0.0.1:5568"]);
    assert_eq!((a.dialect, a.block_size, a.topic.as_str()), (Dialect::Vllm, 32, "kv"));
    assert_eq!((b.name.as_str(), b.dp_size(), b.url.as_str()), ("b", 2, "http://127.0.0.1:8200"));
    let s = a.streams();
    assert_eq!((s[1].dp_rank, s[1].replay, s[1].model.as_str()), (1, ReplayKind::History, "m"));
    assert_eq!(
        parse_config_file(r#"{"discovery": {}, "engines": [{"url": "http://h:1", "dialect": "xllm", "events": "tcp://h:2", "replay": "tcp://h:3", "block_size": 128}]}"#)
            .unwrap()
            .engines[0]
            .streams()[0]
            .replay,
        ReplayKind::Snapshot
    );
}

#[test]
fn engine_problems_are_named_all_at_once() {
    let text = r#"{
      "streams": [{"instance_name": "a", "endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:9000"}],
      "engines": [
        {"url": "https://h:1", "dialect": "tgi", "events": "tcp://*:1", "replay": 7, "colour": 1},
        {"url": "http://127.0.0.1:8100", "dialect": "vllm", "events": "tcp://127.0.0.1:5556",
         "replay": ["tcp://127.0.0.1:5567"], "dp_size": 2, "block_size": 16},
        {"name": "a", "url": "http://127.0.0.1:8101/x", "dialect": "sglang", "events": "tcp://127.0.0.1:65535",
         "replay": "tcp://127.0.0.1:7000", "dp_size": 2, "block_size": 0},
        {"url": "http://127.0.0.1:8102", "dialect": "vllm", "events": "tcp://localhost:5557", "replay": "tcp://127.0.0.1:7100", "block_size": 16},
        {"url": "http://127.0.0.1:8102", "dialect": "vllm", "events": "tcp://127.0.0.1:7200", "replay": "tcp://127.0.0.1:7300", "block_size": 16},
        {"name": "a", "url": "http://127.0.0.1:8103", "dialect": "vllm", "events": "tcp://127.0.0.1:7400", "replay": "tcp://127.0.0.1:7300", "block_size": 16}
      ],
      "engine_poll_interval_ms": 5
    }"#;
    let p = problems(text);
    let expect = [
        "engine_poll_interval_ms = 5 is outside the allowed range 100..=60000",
        "engines[0]: unknown field \"colour\"",
        "engines[0].url = \"https://h:1\": must start with http://",
        "engines[0].dialect = \"tgi\": expected \"vllm\", \"sglang\" or \"xllm\"",
        "engines[0].block_size: missing; give the engine's block size",
        "engines[0].events = \"tcp://*:1\": host \"*\" is not connectable",
        "engines[0].replay: expected a string or a list, found a number",
        "engines[1].replay: lists 1 endpoints but dp_size = 2",
        "engines[2].url = \"http://127.0.0.1:8101/x\": must be http://host:port",
        "engines[2].block_size = 0 is outside the allowed range 1..=65536",
        "engines[2].events = \"tcp://127.0.0.1:65535\": rank 1 would be at port 65536 > 65535",
        "engines[4]: name \"127.0.0.1:8102\" duplicates engines[3]",
        "streams[0].instance_name \"a\" is the name of engines[5]; rename one",
        "engines[5].replay (rank 0) \"tcp://127.0.0.1:7300\" is also engines[4].replay (rank 0)",
        "engines[3].events (rank 0) \"tcp://localhost:5557\" is also streams[0].endpoint",
    ];
    for e in expect {
        assert!(p.iter().any(|m| m.starts_with(e)), "missing {e:?} in {p:#?}");
    }
    assert_eq!(p.len(), expect.len(), "{p:#?}");
    let alone = problems(r#"{"engines": [{"url": "http://x", "dialect": "vllm"}]}"#);
    // Without events (nor replay) the engine is credited approximately: not a problem.
    assert_eq!(alone.len(), 2, "the engine's problems only: {alone:#?}");
    assert_eq!(
        problems(r#"{"engines": []}"#),
        ["engines: the list is empty; list at least one engine or leave it out"]
    );
}

const BOUND: &str = r#"{
  "kv_events_bind": {"endpoint": "tcp://127.0.0.1:5557", "ranks": 4, "topic": "kv@{host}@{model}"},
  "engines": [
    {"url": "http://10.0.0.7:8000", "dialect": "vllm", "events": "bind", "dp_size": 2,
     "replay": "tcp://10.0.0.7:5560", "block_size": 16, "model": "m"},
    {"name": "b", "url": "http://10.0.0.8:8000", "dialect": "vllm", "events": "bind", "dp_size": 1,
     "replay": "tcp://10.0.0.8:5560", "block_size": 16, "topic": "mine"}
  ]
}"#;

#[test]
fn bound_engines_publish_to_the_bind_endpoint_under_their_topic() {
    let c = parse_config_file(BOUND).unwrap();
    let bind = c.bind.as_ref().unwrap();
    assert_eq!((bind.endpoint.as_str(), bind.ranks), ("tcp://127.0.0.1:5557", 4));
    let a = c.engines[0].streams();
    assert_eq!(a.len(), 2);
    assert!(a.iter().all(|s| s.endpoint == BIND_ENDPOINT && s.topic == "kv@10.0.0.7@m"));
    assert_eq!(a[1].replay_endpoint, "tcp://10.0.0.7:5561", "replay is still the engine's");
    assert_eq!(c.engines[1].topic, "mine", "an engine's own topic wins over the pattern");
    let keyed = StreamSpec { topic: keyed_topic(7, &a[0].topic), ..a[0].clone() };
    assert_eq!(keyed.replay_topic(), b"kv@10.0.0.7@m");
    let flag = parse_config_file_with_bind(BOUND, Some("tcp://*:6000")).unwrap();
    assert_eq!(flag.bind.unwrap().endpoint, "tcp://*:6000", "the flag overrides the file");
}

#[test]
fn bound_engines_need_a_bind_endpoint_a_dp_size_within_ranks_and_own_topics() {
    let engine = |extra: &str| {
        format!(
            r#"{{"url": "http://h:1", "dialect": "vllm", "events": "bind", "replay": "tcp://h:2", "block_size": 16{extra}}}"#
        )
    };
    let p = problems(&format!(r#"{{"engines": [{}]}}"#, engine(r#", "dp_size": 1"#)));
    assert_eq!(p.len(), 1);
    assert!(p[0].starts_with("engines[0].events = \"bind\": kvdir binds no endpoint"), "{p:?}");
    assert!(p[0].contains("--kv_events_bind=tcp://*:5557"), "{p:?}");
    let with = |engines: &[String]| {
        format!(
            r#"{{"kv_events_bind": {{"endpoint": "tcp://*:5557", "ranks": 2, "topic": "kv@{{host}}"}}, "engines": [{}]}}"#,
            engines.join(",")
        )
    };
    let p = problems(&with(&[engine("")]));
    assert!(p[0].starts_with("engines[0].dp_size: missing; an engine with \"events\": \"bind\""));
    let p = problems(&with(&[engine(r#", "dp_size": 3"#)]));
    assert!(p[0].starts_with("engines[0].dp_size = 3 exceeds kv_events_bind.ranks = 2"), "{p:?}");
    let two = [
        engine(r#", "dp_size": 1"#),
        engine(r#", "dp_size": 1, "name": "x", "replay": "tcp://h:3""#),
    ];
    let p = problems(&with(&two));
    assert!(p[0].starts_with("engines[1]: topic \"kv@h\" is also engines[0]'s"), "{p:?}");
    let p = problems(
        r#"{"kv_events_bind": {"endpoint": "tcp://*:65535", "ranks": 2, "topic": "kv@{ip}"}, "engines": []}"#,
    );
    assert!(
        p.iter()
            .any(|m| m.starts_with("kv_events_bind.topic = \"kv@{ip}\": unknown placeholder {ip}")),
        "{p:?}"
    );
    assert!(p.iter().any(|m| m.contains("rank 1 would bind port 65536")), "{p:?}");
}

#[test]
fn discovery_with_events_bind_takes_the_pattern() {
    let c = parse_config_file(
        r#"{"kv_events_bind": {"endpoint": "tcp://*:5557"}, "discovery": {"events": "bind"}}"#,
    )
    .unwrap();
    let Source::Discovery(d) = c.source else { panic!("discovery expected") };
    assert_eq!(d.bind.unwrap().topic.as_str(), "kv@{host}@{model}");
    let p = problems(r#"{"discovery": {"events": "bind"}}"#);
    assert!(p[0].starts_with("discovery.events = \"bind\": kvdir binds no endpoint"), "{p:?}");
    let p = problems(r#"{"discovery": {"events": "connect"}}"#);
    assert!(p[0].starts_with("discovery.events = \"connect\": expected \"bind\""), "{p:?}");
}

#[test]
fn the_bind_flag_is_checked_and_binds_alone() {
    let Ok(Command::Run(f)) = parse_flags(&["--kv_events_bind=tcp://*:5557"]) else { panic!() };
    assert_eq!(f.kv_events_bind.as_deref(), Some("tcp://*:5557"));
    let err = parse_flags(&["--kv_events_bind", "udp://x:1"]).unwrap_err().to_string();
    assert!(err.contains("--kv_events_bind=\"udp://x:1\": must start with tcp://"), "{err}");
    let c = parse_config_file_with_bind(r#"{"engines": [{"url": "http://h:1", "dialect": "vllm", "events": "bind", "dp_size": 1, "replay": "tcp://h:2", "block_size": 16, "model": "m"}]}"#, Some("tcp://*:5557")).unwrap();
    assert_eq!(c.engines[0].topic, "kv@h@m");
}

#[test]
fn an_engine_without_events_is_approximate_with_its_settings_checked() {
    let c = parse_config_file(
        r#"{"engines": [{"url": "http://127.0.0.1:8100", "dialect": "vllm", "block_size": 16,
            "dp_size": 2}], "approximate_ttl_ms": 5000, "approximate_blocks_per_engine": 4096}"#,
    )
    .unwrap();
    let e = &c.engines[0];
    assert!(e.is_approximate() && e.streams().is_empty(), "no stream: {e:?}");
    assert_eq!(e.dp_size(), 2);
    let a = c.limits.approximate;
    assert_eq!((a.ttl_ms, a.blocks_per_engine), (5000, 4096));
    let d = Limits::default().approximate;
    assert_eq!((d.ttl_ms, d.blocks_per_engine), (120_000, 65_536), "the documented defaults");
    let p = problems(
        r#"{"engines": [{"url": "http://127.0.0.1:8100", "dialect": "vllm", "block_size": 16,
            "replay": "tcp://127.0.0.1:5557"}], "approximate_ttl_ms": 0,
            "approximate_blocks_per_engine": 0}"#,
    );
    let expect = [
        "engines[0].replay is given without events; give the engine's events endpoint too, or \
         leave both out for an engine without KV events (approximate credit)",
        "approximate_ttl_ms = 0 is outside the allowed range 1..=86400000",
        "approximate_blocks_per_engine = 0 is outside the allowed range 1..=16777216",
    ];
    for e in expect {
        assert!(p.iter().any(|m| m == e), "missing {e:?} in {p:#?}");
    }
    assert_eq!(p.len(), expect.len(), "{p:#?}");
    // Discovery: "events": "none" subscribes to nothing and credits approximately.
    let d = |events: &str| {
        let text = format!(r#"{{"discovery": {{"block_size": 512, "events": {events:?}}}}}"#);
        parse_config_file(&text)
    };
    match d("none").unwrap().source {
        Source::Discovery(d) => assert!(d.approximate && d.bind.is_none() && d.block_size == 512),
        other => panic!("{other:?}"),
    }
    let err = d("off").unwrap_err().to_string();
    assert!(err.contains("discovery.events = \"off\": expected \"bind\""), "{err}");
    assert!(err.contains("\"none\" (instances publish no KV events: approximate credit)"), "{err}");
}

/// Reports (`/v1/internal/streams`, `/v1/internal/instances`) spell a replay kind and a dialect
/// as the config does.
#[test]
fn reports_spell_replay_kinds_and_dialects_as_the_config_does() {
    for kind in [ReplayKind::Snapshot, ReplayKind::History] {
        let json = serde_json::to_string(&kind).unwrap();
        assert_eq!(
            (json, ReplayKind::parse(kind.as_str())),
            (format!("\"{}\"", kind.as_str()), Some(kind))
        );
    }
    for dialect in [Dialect::Xllm, Dialect::Vllm, Dialect::Sglang] {
        let json = serde_json::to_string(&dialect).unwrap();
        assert_eq!(
            (json, Dialect::parse(dialect.as_str())),
            (format!("\"{}\"", dialect.as_str()), Some(dialect))
        );
    }
}
