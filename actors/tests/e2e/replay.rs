//! `kvdir-bench replay` (`kvdir_bench::replay`) against the real `kvdir` binary, as a user
//! runs it: a short prefix of the Mooncake conversation trace (in the repository under
//! `sim/data/mooncake/`), engines registered in etcd, kvdir spawned and discovering them, CAR,
//! TTFT then RR, with one kvdir or two replicas; the test reads the JSON report. Needs `etcd` (test
//! support uses `KVDIR_TEST_ETCD` or starts a private one); everything binds 127.0.0.1.

use kvdir_bench::replay::{self, ReplayCommand, ReplayOptions};
use kvdir_testkit::etcd::etcd_endpoint;
use serde_json::{json, Value};

use crate::common::load_tool_turn;

const CONVERSATION: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../sim/data/mooncake/conversation_trace.jsonl");

/// Parses flags as the binary does, with this build's `kvdir` and the test's etcd.
fn options(etcd: &str, flags: &[&str]) -> ReplayOptions {
    let mut args = vec![
        format!("--spawn_kvdir={}", env!("CARGO_BIN_EXE_kvdir")),
        format!("--etcd_addr={etcd}"),
        format!("--trace={CONVERSATION}"),
    ];
    args.extend(flags.iter().map(|f| f.to_string()));
    match replay::parse_replay_args(args) {
        Ok(ReplayCommand::Run(o)) => *o,
        other => panic!("{flags:?}: {other:?}"),
    }
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// A run's JSON: every request routed and executed, no error or stream fault, figures in range,
/// `routers` replicas that each routed their round-robin share, caught up and fault-free.
fn assert_sane(run: &Value, requests: u64, engines: usize, bound: f64, routers: u64) {
    assert_eq!(run["routed"], requests, "every request routed: {run:#}");
    assert_eq!(run["route_errors"], serde_json::json!({}), "{run:#}");
    assert_eq!(run["stream_faults"], serde_json::json!({}), "{run:#}");
    assert_eq!(run["caught_up"], true, "{run:#}");
    let share = f(&run["hit_share"]);
    assert!((0.0..=bound).contains(&share), "hit share {share} outside [0, {bound}]: {run:#}");
    let per_engine = run["requests_per_engine"].as_array().expect("a list");
    assert_eq!(per_engine.len(), engines, "{run:#}");
    assert_eq!(per_engine.iter().map(|n| n.as_u64().unwrap()).sum::<u64>(), requests);
    assert!(f(&run["imbalance"]) >= 1.0, "{run:#}");
    let (p50, p99) = (f(&run["ttft_ms"]["p50"]), f(&run["ttft_ms"]["p99"]));
    assert!(0.0 < p50 && p50 <= p99, "TTFT percentiles: {run:#}");
    let (d50, d99) = (f(&run["decision_ms"]["p50"]), f(&run["decision_ms"]["p99"]));
    assert!(0.0 < d50 && d50 <= d99, "decision cost: {run:#}");
    let (busy, busiest) = (f(&run["busy_share"]["mean"]), f(&run["busy_share"]["max"]));
    assert!(0.0 < busy && busy <= busiest, "busy share: {run:#}");
    let replicas = run["routers"].as_array().expect("routers");
    assert_eq!(replicas.len() as u64, routers, "{run:#}");
    for (i, r) in replicas.iter().enumerate() {
        assert_eq!(r["router"], i, "{run:#}");
        assert_eq!(r["routed"], requests / routers, "round-robin over the replicas: {run:#}");
        assert_eq!(r["route_errors"], serde_json::json!({}), "{run:#}");
        assert_eq!(r["caught_up"], true, "{run:#}");
        assert_eq!(r["stream_faults"], json!({}), "{run:#}");
        // A replica's requests are a subset: their hit share may exceed the bound of all
        // requests (one replica can get the later turns of conversations), not 1.
        assert!((0.0..=1.0).contains(&f(&r["hit_share"])), "{run:#}");
        assert!(f(&r["decision_ms"]["p50"]) > 0.0, "{run:#}");
    }
    // The run's hit share is a weighted mean of the replicas' shares.
    let shares: Vec<f64> = replicas.iter().map(|r| f(&r["hit_share"])).collect();
    let (lo, hi) = shares.iter().fold((1.0f64, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
    let share = f(&run["hit_share"]);
    assert!(lo - 1e-9 <= share && share <= hi + 1e-9, "{share} outside {shares:?}: {run:#}");
}

/// The references: the per-engine LRU bound (perfect affinity) is at most the infinite-cache
/// bound, and each run's share of it is its hit share over it.
fn assert_bounds(json: &Value) {
    let bound = f(&json["bound"]["token_share"]);
    let per_engine = f(&json["per_engine_lru_bound"]["token_share"]);
    assert!(0.0 < per_engine && per_engine <= bound, "{json:#}");
    assert!(f(&json["per_engine_lru_bound"]["imbalance"]) <= 1.1 + 1e-9, "{json:#}");
    for run in json["runs"].as_array().expect("runs") {
        let share = f(&run["share_of_per_engine_bound"]);
        assert!((share - f(&run["hit_share"]) / per_engine).abs() < 1e-9, "{json:#}");
    }
}

/// 500 conversation requests (the first 170 s of the trace, whose bound is 16 %) on 4 engines
/// with 1024 blocks each (a quarter of their blocks: eviction happens), unpaced: CAR keeps
/// conversations on the engine that has their prefix (about 7 % of tokens hit), RR spreads them
/// evenly (about 5 %).
#[test]
fn a_conversation_prefix_replays_with_car_ttft_then_rr_and_both_hit_more() {
    let _turn = load_tool_turn();
    let etcd = etcd_endpoint();
    let ns = format!("--etcd_namespace=replay-test-{}", std::process::id());
    let flags = ["--requests=500", "--engines=4", "--cache_blocks=1024", "--speed=0", "--json"];
    let flags = [&flags[..], &["--policies=CAR,TTFT,RR"]].concat();
    let o = options(&etcd.endpoint, &[&flags[..], &[ns.as_str()]].concat());
    let report = replay::run(&o).expect("the replay completes");
    let json = report.json();
    assert_eq!(json["requests"], 500, "{json:#}");
    let bound = f(&json["bound"]["token_share"]);
    assert!(0.0 < bound && bound < 1.0, "{json:#}");
    let runs = json["runs"].as_array().expect("runs");
    let policies: Vec<&str> = runs.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["CAR", "TTFT", "RR"], "{json:#}");
    runs.iter().for_each(|run| assert_sane(run, 500, 4, bound, 1));
    assert_bounds(&json);
    let (car, ttft, rr) =
        (f(&runs[0]["hit_share"]), f(&runs[1]["hit_share"]), f(&runs[2]["hit_share"]));
    assert!(car >= rr && ttft >= rr, "CAR {car} or TTFT {ttft} below RR {rr}: {json:#}");
    assert!(f(&json["hit_share_over_rr"]) >= 1.0, "{json:#}");
    let predicted = &runs[0]["prediction"];
    assert_eq!(predicted["requests"], 500, "kvdir predicts a hit for every request: {json:#}");
    assert!((0.0..=1.0).contains(&f(&predicted["share"])), "{json:#}");
    assert_eq!(report.runs[2].imbalance(), 1.0, "RR gives each engine 125: {json:#}");
}

/// The same prefix (300 requests) with two kvdir replicas, each discovering the engines and
/// following their streams on its own: requests alternate between them, each routes 150, and
/// the report has each replica's hit share, decision cost and stream health.
#[test]
fn two_kvdir_replicas_share_the_requests_and_are_reported_each() {
    let _turn = load_tool_turn();
    let etcd = etcd_endpoint();
    let ns = format!("--etcd_namespace=replay-routers-{}", std::process::id());
    let flags = ["--requests=300", "--engines=4", "--cache_blocks=1024", "--speed=0", "--json"];
    let more = ["--routers=2", "--compare_rr=false", ns.as_str()];
    let o = options(&etcd.endpoint, &[&flags[..], &more[..]].concat());
    let json = replay::run(&o).expect("the replay completes").json();
    assert_eq!((&json["requests"], &json["routers"]), (&json!(300), &json!(2)), "{json:#}");
    let runs = json["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "CAR only: {json:#}");
    assert_sane(&runs[0], 300, 4, f(&json["bound"]["token_share"]), 2);
    assert_bounds(&json);
}

/// The conversation prefix of the first test with `--events none`: kvdir discovers the engines
/// with `"events": "none"`, follows no stream and credits each engine approximately with the
/// prompts it routed there. CAR still keeps conversations together (more hits than RR), and
/// kvdir's approximate credit is what the engines then reuse for most requests.
#[test]
fn without_kv_events_car_credits_its_own_routing_and_still_hits_more_than_rr() {
    let _turn = load_tool_turn();
    let etcd = etcd_endpoint();
    let ns = format!("--etcd_namespace=replay-approx-{}", std::process::id());
    let flags = ["--requests=500", "--engines=4", "--cache_blocks=1024", "--speed=0", "--json"];
    let o = options(&etcd.endpoint, &[&flags[..], &["--events=none", ns.as_str()]].concat());
    assert!(o.approximate);
    let json = replay::run(&o).expect("the replay completes").json();
    let runs = json["runs"].as_array().expect("runs");
    let bound = f(&json["bound"]["token_share"]);
    runs.iter().for_each(|run| assert_sane(run, 500, 4, bound, 1));
    let (car, rr) = (f(&runs[0]["hit_share"]), f(&runs[1]["hit_share"]));
    assert!(car > rr, "CAR {car} not above RR {rr} on approximate credit: {json:#}");
    let predicted = &runs[0]["prediction"];
    assert!(f(&predicted["share"]) > 0.5, "assumed = reused for most requests: {json:#}");
}
