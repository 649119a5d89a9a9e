//! Unit tests of flag and config-file validation.

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
        ["config needs \"discovery\", a non-empty \"streams\" list or an \"engines\" list"]
    );
    assert_eq!(
        problems(r#"{"streams": []}"#),
        ["streams: the list is empty; add at least one stream or use discovery"]
    );
    assert!(problems("{not json")[0].starts_with("config is not valid JSON"));
}

#[test]
fn flags_accept_both_forms_and_report_all_errors() {
    let Command::Run(f) = parse_flags(&[
        "--http_server_port=9000",
        "--server_host",
        "127.0.0.2",
        "--kv_events_config_file=",
        "--internal_api_token",
        "s3cret",
        "--check_config",
    ])
    .unwrap() else {
        panic!("run expected")
    };
    assert_eq!(f.http_server_port, 9000);
    assert_eq!(f.server_host, "127.0.0.2");
    assert_eq!(f.kv_events_config_file, None, "an empty path disables the directory");
    assert_eq!(f.internal_api_token.as_deref(), Some("s3cret"));
    assert!(f.check_config);
    assert_eq!(f.log_format, LogFormat::Text, "the default");

    let Command::Run(f) = parse_flags(&["--log_format", "json"]).unwrap() else {
        panic!("run expected")
    };
    assert_eq!(f.log_format, LogFormat::Json);
    let err = parse_flags(&["--log_format=xml"]).unwrap_err();
    assert_eq!(err.problems, ["--log_format=\"xml\" is not supported; use text or json"]);

    let err =
        parse_flags(&["--http_server_port=70000", "--bogus=1", "--max_request_bytes"]).unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--http_server_port=\"70000\" is not an integer in 0..=65535",
            "unknown flag --bogus; run kvdir --help for the list",
            "--max_request_bytes needs a value: --max_request_bytes=VALUE",
        ]
    );
    assert_eq!(parse_flags(&["--help"]).unwrap(), Command::Help);
    let err = parse_flags(&[
        "--car_prefill_lambda=1.5",
        "--load_balance_policy=FASTEST",
        "--target_ttft=-1",
    ])
    .unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--car_prefill_lambda=\"1.5\" is outside the allowed range 0..=1",
            "--load_balance_policy=\"FASTEST\" is not one of RR, SLO_AWARE, CAR, TTFT",
            "--target_ttft=\"-1\" is not a non-negative number of milliseconds",
        ]
    );
    let Command::Run(f) =
        parse_flags(&["--load_balance_policy", "RR", "--car_host_hit_weight=1"]).unwrap()
    else {
        panic!("run expected")
    };
    assert_eq!((f.route.policy, f.route.host_weight), (crate::car::Policy::Rr, 1.0));
    let no_args = Flags { demo: true, ..Flags::default() };
    assert_eq!(
        parse_flags::<&str>(&[]).unwrap(),
        Command::Run(Box::new(no_args)),
        "no flags runs the demo"
    );
}

#[test]
fn predict_on_route_flags_are_validated_and_zero_turns_it_off() {
    let Command::Run(f) =
        parse_flags(&["--car_predict_ttl_ms=0", "--car_predict_weight", "0.25"]).unwrap()
    else {
        panic!("run expected")
    };
    assert_eq!((f.route.predict_ttl_ms, f.route.predict_weight), (0, 0.25));
    assert_eq!(Flags::default().route.predict_ttl_ms, 2000);
    let err = parse_flags(&["--car_predict_ttl_ms=2s", "--car_predict_weight=2"]).unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--car_predict_ttl_ms=\"2s\" is not an integer in 0..=600000",
            "--car_predict_weight=\"2\" is outside the allowed range 0..=1",
        ]
    );
}

#[test]
fn overload_flags_are_validated_and_off_by_default() {
    let off = Flags::default().front.overload;
    assert_eq!((off.enabled(), off.queue, off.max_wait_ms), (false, 256, 30_000));
    let args = ["--overload_ttft_ms=2000", "--overload_queue", "0", "--overload_max_wait_ms=500"];
    let Command::Run(f) = parse_flags(&args).unwrap() else { panic!("run expected") };
    let o = f.front.overload;
    assert_eq!((o.enabled(), o.ttft_bound_ms, o.queue, o.max_wait_ms), (true, 2000, 0, 500));
    let err = parse_flags(&["--overload_ttft_ms=-1", "--overload_max_wait_ms=0"]).unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--overload_ttft_ms=\"-1\" is not an integer in 0..=3600000",
            "--overload_max_wait_ms=\"0\" is not an integer in 1..=3600000",
        ]
    );
}

#[test]
fn the_ttft_policy_and_its_settings_are_validated() {
    let args = ["--load_balance_policy=TTFT", "--ttft_prefill_tokens_per_s", "8000"];
    let Command::Run(f) = parse_flags(&args).unwrap() else { panic!("run expected") };
    assert_eq!((f.route.policy, f.route.ttft.tokens_per_s), (crate::car::Policy::Ttft, 8000.0));
    let args = ["--ttft_overhead_ms=2.5", "--ttft_decode_ms=0"];
    let Command::Run(f) = parse_flags(&args).unwrap() else { panic!("run expected") };
    assert_eq!((f.route.ttft.overhead_ms, f.route.ttft.decode_ms), (2.5, 0.0));
    let bad = ["--ttft_prefill_tokens_per_s=0", "--ttft_overhead_ms=-1", "--ttft_decode_ms=x"];
    let err = parse_flags(&bad).unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--ttft_prefill_tokens_per_s=\"0\" is not a number of tokens per second of at least 1",
            "--ttft_overhead_ms=\"-1\" is not a non-negative number of milliseconds",
            "--ttft_decode_ms=\"x\" is not a non-negative number of milliseconds",
        ]
    );
}

#[test]
fn a_demo_length_means_the_demo() {
    let demo = |args: &[&str]| match parse_flags(args).unwrap() {
        Command::Run(f) => (f.demo, f.demo_seconds),
        other => panic!("{other:?}"),
    };
    assert_eq!(demo(&["--demo_seconds=60"]), (true, Some(60)));
    assert_eq!(demo(&[]), (true, None), "no flags at all");
    assert_eq!(demo(&["--http_server_port=0"]), (false, None), "the service");
}

#[test]
fn the_front_door_routes_with_ttft_unless_a_policy_is_given() {
    let front = |args: &[&str]| match parse_flags(args).unwrap() {
        Command::Run(f) => (f.route.policy, f.front.policy),
        other => panic!("{other:?}"),
    };
    use crate::car::Policy::{Car, Rr, Ttft};
    assert_eq!(front(&["--demo"]), (Car, Ttft), "the defaults");
    assert_eq!(front(&["--load_balance_policy=CAR"]), (Car, Car), "it follows a given one");
    assert_eq!(front(&["--frontend_policy=TTFT"]), (Car, Ttft));
    assert_eq!(front(&["--load_balance_policy=RR"]), (Rr, Rr));
    assert_eq!(front(&["--frontend_policy=CAR", "--load_balance_policy=RR"]), (Rr, Car));
    assert_eq!(front(&["--load_balance_policy=CAR", "--frontend_policy", "TTFT"]), (Car, Ttft));
    let err = parse_flags(&["--frontend_policy=FAST"]).unwrap_err();
    assert_eq!(err.problems, ["--frontend_policy=\"FAST\" is not one of RR, SLO_AWARE, CAR, TTFT"]);
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
fn the_old_block_size_flag_starts_with_a_warning_instead_of_failing() {
    let Command::Run(f) =
        parse_flags(&["--block_size=128", "--http_server_port", "9000", "--block_size", "16"])
            .unwrap()
    else {
        panic!("run expected")
    };
    assert_eq!(f.http_server_port, 9000, "the other flags still apply");
    assert_eq!(f.warnings.len(), 2);
    assert_eq!(
        f.warnings[0],
        "--block_size=128 does not configure the directory and is ignored (kept for xllm-service \
         command lines); set block_size in the kv_events_config_file: discovery.block_size or \
         streams[].block_size"
    );
    assert!(f.warnings[1].starts_with("--block_size=16 does not configure the directory"));
    assert!(usage().contains("--block_size"));
    let Command::Run(plain) = parse_flags(&["--http_server_port=9000"]).unwrap() else {
        panic!("run expected")
    };
    assert!(plain.warnings.is_empty());
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
