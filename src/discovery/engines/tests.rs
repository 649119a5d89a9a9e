//! Unit tests of engine polls: `/metrics` texts as vLLM and SGLang write them, identity and
//! health.

use std::time::Instant;

use super::*;
use crate::config::parse_engine_json;

/// The shape of vLLM 0.x's `/metrics` (prometheus_client, one label set per engine core).
const VLLM: &str = r#"# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76459812345e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 864.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny-llama"} 7.0
"#;

/// The shape of SGLang's `/metrics` with `--enable-metrics` (no process collector).
const SGLANG: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="tiny",pp_rank="0",tp_rank="0"} 1.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="tiny",pp_rank="0",tp_rank="0"} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="tiny",pp_rank="0",tp_rank="0"} 0.5
sglang:cache_hit_rate{engine_type="unified",model_name="tiny",pp_rank="0",tp_rank="0"} 0.9
"#;

#[test]
fn vllm_and_sglang_gauges_are_read() {
    let v = read_metrics(Dialect::Vllm, VLLM).unwrap();
    assert_eq!(v.process_start, Some(1_764_598_123.45));
    assert_eq!((v.waiting, v.running, v.usage), (3, 2, 0.25));
    assert_eq!(v.load(None).waiting_requests_num, 5, "the queue is waiting plus running");
    let s = read_metrics(Dialect::Sglang, SGLANG).unwrap();
    assert_eq!((s.process_start, s.waiting, s.running, s.usage), (None, 4, 1, 0.5));
    let old = VLLM.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc");
    assert_eq!(read_metrics(Dialect::Vllm, &old).unwrap().usage, 0.25, "older vLLM");
}

#[test]
fn a_missing_gauge_or_a_bad_usage_is_named() {
    let e = read_metrics(Dialect::Vllm, SGLANG).unwrap_err();
    assert!(e.starts_with("vllm:num_requests_waiting is missing from /metrics"), "{e}");
    let e = read_metrics(Dialect::Sglang, "sglang:num_queue_reqs 1\nsglang:num_running_reqs 1\n")
        .unwrap_err();
    assert!(e.starts_with("sglang:token_usage is missing"), "{e}");
    let e = read_metrics(Dialect::Vllm, &VLLM.replace("} 0.25", "} 7")).unwrap_err();
    assert_eq!(e, "KV cache usage 7 is outside 0..=1");
}

fn engine(dialect: &str) -> Engines {
    let spec = parse_engine_json(&serde_json::json!({
        "url": "http://127.0.0.1:8100", "dialect": dialect, "events": "tcp://127.0.0.1:5557",
        "replay": "tcp://127.0.0.1:5567", "dp_size": 2, "block_size": 16
    }))
    .unwrap();
    let mut e = Engines::default();
    e.add(spec.clone(), Instant::now()).unwrap();
    assert!(e.add(spec, Instant::now()).unwrap_err().contains("listed already"));
    e
}

fn poll(e: &mut Engines, healthy: bool, metrics: &str) -> IdentityChange {
    let health = if healthy { Ok(()) } else { Err("connection refused".to_string()) };
    e.observe("127.0.0.1:8100", Probe { health, metrics: Ok(metrics.into()) }, Instant::now())
}

#[test]
fn vllm_identity_is_its_process_start_time() {
    let mut e = engine("vllm");
    let one = |e: &Engines| e.get("127.0.0.1:8100").unwrap().clone();
    assert!(e.planned().is_empty(), "no streams before the process is known");
    assert_eq!(one(&e).instance.state, InstanceState::Suspect);
    assert_eq!(poll(&mut e, true, VLLM), IdentityChange::Learned);
    let id = one(&e).instance.record.identity.incarnation_id.unwrap();
    assert_eq!(id, "process_start_time_seconds=1764598123.45");
    let planned = e.planned();
    assert_eq!(planned.len(), 2);
    assert_eq!(planned[1].spec.endpoint, "tcp://127.0.0.1:5558", "rank 1 is port + 1");
    assert_eq!(planned[1].spec.replay, crate::config::ReplayKind::History);
    assert_eq!(poll(&mut e, true, VLLM), IdentityChange::Unchanged);
    assert_eq!(poll(&mut e, false, VLLM), IdentityChange::Unchanged);
    assert_eq!(one(&e).instance.state, InstanceState::Suspect, "unhealthy is never routed");
    assert_eq!(poll(&mut e, true, VLLM), IdentityChange::Unchanged, "a blip is the same process");
    assert_eq!(one(&e).instance.state, InstanceState::Active);
    let restarted = VLLM.replace("1.76459812345e+09", "1.76459900000e+09");
    assert_eq!(poll(&mut e, true, &restarted), IdentityChange::Changed);
    assert_eq!(one(&e).instance.load.unwrap().waiting_requests_num, 5);
}

#[test]
fn sglang_identity_comes_from_its_events_and_a_slow_or_failed_poll_is_no_restart() {
    // Regression: SGLang's /health takes a second; one slow poll made the engine SUSPECT and
    // the next healthy one "restarted" it, and a stream whose history no longer reached back
    // lost its credit for good.
    let mut e = engine("sglang");
    assert_eq!(poll(&mut e, true, SGLANG), IdentityChange::Learned);
    assert_eq!(poll(&mut e, true, SGLANG), IdentityChange::Unchanged);
    assert_eq!(poll(&mut e, false, ""), IdentityChange::Unchanged);
    let i = &e.get("127.0.0.1:8100").unwrap().instance;
    assert_eq!(i.state, InstanceState::Suspect, "a failed poll: not routed");
    assert_eq!(poll(&mut e, true, SGLANG), IdentityChange::Unchanged, "down, then up: the same");
    let i = &e.get("127.0.0.1:8100").unwrap().instance;
    assert_eq!(i.state, InstanceState::Active);
    assert_eq!(i.record.identity.incarnation_id.as_deref(), Some(FROM_EVENTS));
    assert_eq!(i.record.backend, "sglang");
}

#[test]
fn an_sglang_hybrid_sliding_window_model_gets_no_streams_and_says_why() {
    // SGLang 0.5.23 frees and restores a gpt-oss window's KV without an event: its events
    // credit more than it reuses, so no credit is the only safe answer.
    let mut e = engine("sglang");
    let swa = format!("{SGLANG}sglang:max_total_num_tokens_swa{{tp_rank=\"0\"}} 4096\n");
    assert_eq!(poll(&mut e, true, &swa), IdentityChange::Learned);
    assert!(e.planned().is_empty(), "no streams, so no credit");
    let one = e.get("127.0.0.1:8100").unwrap();
    assert_eq!(one.error.as_deref(), Some(HYBRID_SWA));
    assert_eq!(one.instance.state, InstanceState::Active, "still routed, by load");
    let mut dense = engine("sglang");
    poll(&mut dense, true, SGLANG);
    assert_eq!(dense.planned().len(), 2);
}

#[test]
fn a_vllm_without_a_start_time_gets_credit_from_its_events() {
    // Regression: vLLM's default data-parallel launch runs several API servers, whose metrics
    // have no process_start_time_seconds; kvdir started no streams and credited nothing.
    let mut e = engine("vllm");
    let multiprocess = VLLM.replace("process_start", "other");
    assert_eq!(poll(&mut e, true, &multiprocess), IdentityChange::Learned);
    assert_eq!(e.planned().len(), 2, "both ranks' streams start");
    let one = e.get("127.0.0.1:8100").unwrap();
    assert_eq!(one.instance.record.identity.incarnation_id.as_deref(), Some(FROM_EVENTS));
    assert!(one.error.is_none(), "{:?}", one.error);
    assert_eq!(poll(&mut e, false, ""), IdentityChange::Unchanged);
    assert_eq!(poll(&mut e, true, &multiprocess), IdentityChange::Unchanged);
}

#[test]
fn a_listed_engine_wins_over_an_etcd_instance_by_name_or_endpoint() {
    let e = engine("vllm");
    let mut e2 = Engines::default();
    let clash = parse_engine_json(&serde_json::json!({"name": "other", "url": "http://h:1",
        "dialect": "vllm", "events": "tcp://localhost:5568", "replay": "tcp://h:2", "block_size": 16}))
    .unwrap();
    e2.add(engine("vllm").get("127.0.0.1:8100").unwrap().spec.clone(), Instant::now()).unwrap();
    let err = e2.add(clash, Instant::now()).unwrap_err();
    assert!(err.starts_with("endpoint tcp://127.0.0.1:5568 is also one of engine"), "{err}");
    let stream = |name: &str, ep: &str| PlannedStream {
        spec: crate::config::StreamSpec {
            instance_name: name.into(),
            dp_rank: 0,
            block_size: 16,
            endpoint: ep.into(),
            replay_endpoint: "tcp://10.0.0.1:9".into(),
            topic: String::new(),
            hash_seed: 1024,
            model: String::new(),
            salt: String::new(),
            replay: crate::config::ReplayKind::Snapshot,
        },
        identity: Identity::default(),
        dp_size: 1,
    };
    let mut plan = Plan {
        streams: vec![
            stream("127.0.0.1:8100", "tcp://10.0.0.1:1"),
            stream("x:1", "tcp://LOCALHOST:5557"),
            stream("y:1", "tcp://10.0.0.1:2"),
        ],
        ..Plan::default()
    };
    e.exclude_from(&mut plan);
    assert_eq!(plan.streams.len(), 1);
    assert_eq!(plan.streams[0].spec.instance_name, "y:1");
    assert!(plan.excluded["127.0.0.1:8100"].to_string().contains("the listing wins"));
    let why = plan.excluded["x:1"].to_string();
    assert_eq!(why, "endpoint tcp://127.0.0.1:5557 is one of listed engine \"127.0.0.1:8100\"");
}

#[test]
fn each_dp_ranks_load_is_read_from_its_label() {
    let vllm = "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
        vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0\n\
        vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1.0\n\
        vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 4.0\n\
        vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
        vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n";
    let ranks = read_rank_loads(Dialect::Vllm, vllm);
    let got: Vec<(u32, u64, f64)> =
        ranks.iter().map(|r| (r.dp_rank, r.waiting, r.kv_usage)).collect();
    assert_eq!(got, [(0, 3, 0.25), (1, 4, 0.5)], "waiting plus running, per engine label");
    let sglang = "sglang:num_queue_reqs{dp_rank=\"1\",tp_rank=\"0\"} 5\n\
        sglang:num_running_reqs{dp_rank=\"1\",tp_rank=\"0\"} 1\n\
        sglang:token_usage{dp_rank=\"1\",tp_rank=\"0\"} 0.75\n";
    let ranks = read_rank_loads(Dialect::Sglang, sglang);
    assert_eq!(ranks, [RankLoad { dp_rank: 1, waiting: 6, kv_usage: 0.75 }]);
    assert!(read_rank_loads(Dialect::Vllm, "vllm:num_requests_waiting 2\n").is_empty());
    assert!(read_rank_loads(Dialect::Xllm, vllm).is_empty());
}
