//! The load tool (`kvdir_bench`, the `kvdir-bench` binary's library) against the real
//! `kvdir` binary, started by the tool with `--spawn_kvdir`, as a user runs it: short bounded
//! loads, and what the report shows. Needs `etcd` (test support uses `KVDIR_TEST_ETCD` or starts
//! a private one); everything binds 127.0.0.1.

use std::time::Duration;

use kvdir_bench as bench;
use kvdir_bench::{BenchCommand, BenchOptions, Kind, Report};
use kvdir_testkit::etcd::etcd_endpoint;

use crate::common::{self, load_tool_turn};

/// Parses flags as the binary does, with the `kvdir` binary of this build to spawn.
fn options(flags: &[&str]) -> BenchOptions {
    let mut args = vec![format!("--spawn_kvdir={}", env!("CARGO_BIN_EXE_kvdir"))];
    args.extend(flags.iter().map(|f| f.to_string()));
    match bench::parse_args(args) {
        Ok(BenchCommand::Run(o)) => *o,
        other => panic!("{flags:?}: {other:?}"),
    }
}

fn assert_served(report: &Report, kind: Kind) {
    let text = report.text();
    let s = report.kind(kind).unwrap_or_else(|| panic!("no {kind:?} clients: {text}"));
    assert!(s.per_second() > 0.0 && !s.latencies.is_empty(), "no {kind:?} served: {text}");
    assert!(s.errors.is_empty(), "{kind:?} errors {:?}: {text}", s.errors);
    let (p50, p99, max) = (s.percentile(50.0), s.percentile(99.0), s.max());
    assert!(Duration::ZERO < p50 && p50 <= p99 && p99 <= max, "{kind:?} percentiles: {text}");
}

/// Etcd mode with an internal token: 2 engines x DP 2 register with leases, LOADMETRICS and
/// heartbeats; the spawned kvdir discovers them; 2 s of ingest with query and route clients.
#[test]
fn a_short_etcd_load_reports_synchronized_streams_applied_events_throughput_and_rss() {
    let _turn = load_tool_turn();
    let etcd = etcd_endpoint();
    let o = options(&[
        &format!("--etcd_addr={}", etcd.endpoint),
        "--engines=2",
        "--dp_size=2",
        "--block_size=16",
        "--duration_seconds=2",
        "--baseline_seconds=1",
        "--rate=200",
        "--query_clients=1",
        "--route_clients=1",
        "--client_rate=100",
        "--internal_api_token=bench-secret",
        "--sync_timeout_seconds=30",
    ]);
    let report = bench::run(&o).expect("the run completes");
    let text = report.text();
    assert_eq!(report.streams, 4, "{text}");
    assert!(report.applied.caught_up, "kvdir applied every batch: {text}");
    assert!(report.published.batches > 0, "{text}");
    assert_eq!(report.applied.batches, report.published.batches, "{text}");
    assert_eq!(report.applied.messages, report.published.batches, "{text}");
    assert_eq!(report.applied.faults(), [], "no gap, rejection or resnapshot: {text}");
    assert!(!text.contains("WARNING"), "{text}");
    assert_served(&report, Kind::Query);
    assert_served(&report, Kind::Route);
    assert_eq!(report.total_errors(), 0, "{text}");
    assert_eq!(report.baseline.len(), 2, "query and route baselines: {text}");
    assert!(report.rss_after.bytes.is_some_and(|b| b > 1 << 20), "RSS: {text}");
    assert!(report.rss_after.source.starts_with("/proc/"), "{text}");
    assert!(report.kvdir_cpu.is_some_and(|s| s > 0.0), "kvdir CPU: {text}");
    let (answered, not_ok) = report.heartbeats.expect("etcd mode sends heartbeats");
    assert!(answered > 0 && not_ok == 0, "heartbeats with the token: {text}");
    for line in ["synchronized: 4 streams", "applied by kvdir:", "ratio load / baseline, route"] {
        assert!(text.contains(line), "missing {line:?}: {text}");
    }
    // kvdir's own histograms saw every request the clients saw served, in each phase.
    for (phase, clients, handler) in [
        ("load", &report.load, &report.handler.0),
        ("baseline", &report.baseline, &report.handler.1),
    ] {
        for s in clients {
            let h = handler.iter().find(|h| h.kind == s.kind);
            let h = h.unwrap_or_else(|| panic!("no {phase} handler line for {:?}: {text}", s.kind));
            assert!(h.count >= s.latencies.len() as u64, "{phase} {h:?}: {text}");
            assert!(0.0 < h.p50_le && h.p50_le <= h.p99_le, "{phase} {h:?}: {text}");
        }
    }
    assert!(text.contains("kvdir's own histograms (bucket bounds), the baseline:"), "{text}");
    let json = report.json();
    assert_eq!(json["applied"]["caught_up"], true, "{json}");
    assert_eq!(json["load"][1]["kind"], "route", "{json}");
    assert_eq!(json["handler"]["load"][0]["kind"], "query", "{json}");
}

/// Static streams, and a kvdir that refuses every workload prompt (`--max_query_tokens=16`):
/// the run still completes, and the report counts the failures by status instead of latencies.
#[test]
fn rejected_queries_are_reported_as_errors_by_status() {
    let _turn = load_tool_turn();
    let o = options(&[
        "--engines=1",
        "--dp_size=1",
        "--block_size=16",
        "--duration_seconds=1",
        "--baseline_seconds=0",
        "--rate=50",
        "--query_clients=1",
        "--client_rate=100",
        "--kvdir_arg=--max_query_tokens=16",
    ]);
    let report = bench::run(&o).expect("the run completes");
    let text = report.text();
    let query = report.kind(Kind::Query).expect("query clients");
    assert!(query.latencies.is_empty(), "{text}");
    assert_eq!(query.errors.keys().collect::<Vec<_>>(), ["HTTP 400"], "{text}");
    assert!(report.total_errors() > 0 && text.contains("errors") && text.contains("HTTP 400: "));
    assert!(report.applied.caught_up && report.applied.batches > 0, "{text}");
    assert!(report.baseline.is_empty(), "{text}");
}

/// The tool against a kvdir it did not start (the operator's case): kvdir runs with a
/// discovery config, the tool registers its engines in etcd under kvdir's namespace, and
/// without a pid it reads kvdir's RSS from `GET /metrics`.
#[test]
fn a_running_kvdir_is_driven_through_etcd_and_its_rss_read_from_metrics() {
    let _turn = load_tool_turn();
    let etcd = etcd_endpoint();
    let ns = format!("bench-running-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("discovery.json");
    let discovery = serde_json::json!({"discovery": {"enabled": true, "block_size": 16,
        "topic": "xllm-kv", "refresh_interval_ms": 100}});
    std::fs::write(&config, discovery.to_string()).unwrap();
    let kvdir = common::spawn(
        &[
            "--http_server_port=0",
            &format!("--kv_events_config_file={}", config.display()),
            &format!("--etcd_addr={}", etcd.endpoint),
            &format!("--etcd_namespace={ns}"),
        ],
        "kvdir listening on http://",
    );
    let args = [
        format!("--etcd_addr={}", etcd.endpoint),
        format!("--etcd_namespace={ns}"),
        format!("--kvdir_addr={}", kvdir.addr),
        "--engines=1".into(),
        "--dp_size=2".into(),
        "--block_size=16".into(),
        "--duration_seconds=1".into(),
        "--baseline_seconds=0".into(),
        "--rate=100".into(),
        "--query_clients=1".into(),
        "--route_clients=1".into(),
        "--client_rate=50".into(),
        "--sync_timeout_seconds=30".into(),
    ];
    let o = match bench::parse_args(args.to_vec()) {
        Ok(BenchCommand::Run(o)) => *o,
        other => panic!("{other:?}"),
    };
    let report = bench::run(&o).expect("the run completes");
    let text = report.text();
    assert_eq!(report.streams, 2, "{text}");
    assert!(report.applied.caught_up && report.applied.batches > 0, "{text}");
    assert_served(&report, Kind::Query);
    assert_served(&report, Kind::Route);
    assert_eq!(report.rss_after.source, "GET /metrics", "{text}");
    assert!(report.rss_after.bytes.is_some_and(|b| b > 1 << 20), "RSS: {text}");
}
