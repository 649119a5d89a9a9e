//! `GET /metrics` over real HTTP while a simulated engine publishes over real ZeroMQ: the
//! exposition is well-formed Prometheus text, and its numbers match what the engine did and
//! what the test asked.

use std::collections::BTreeMap;

use crate::common::*;
use kvdir::wire::Tier;
use kvdir_sim::Fault;
use serde_json::json;

/// Samples by `name{labels}` as written, after checking every line's shape and that each
/// sample's family was declared with `# HELP` and `# TYPE` before it.
fn scrape(svc: &kvdir_service::Service) -> BTreeMap<String, f64> {
    let r = http(svc.http_addr(), "GET", "/metrics", &[], b"");
    assert_eq!(r.status, 200, "{}", r.body);
    let mut declared = Vec::new();
    let mut samples = BTreeMap::new();
    for line in r.body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            declared.push(rest.split(' ').next().unwrap().to_string());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line}"));
        let name = series.split('{').next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| declared.iter().any(|d| d == f)))
            .unwrap_or(name);
        assert!(declared.iter().any(|d| d == family), "{name} has no # TYPE before it");
        assert!(samples.insert(series.to_string(), value).is_none(), "duplicate {series}");
    }
    samples
}

fn get(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    *m.get(series).unwrap_or_else(|| panic!("no {series} in {m:#?}"))
}

#[test]
fn metrics_count_what_the_engine_published_and_what_clients_asked() {
    let eng = engine("met", 1, 64);
    let svc = service(streams_of(&eng), json!({}));
    agrees(&svc, &eng, 0, &[]);
    let a = prompt(1, 4);
    eng.process(0, &a).unwrap();
    eng.offload(0, &a).unwrap();
    eng.evict(0, &a[..2 * B as usize], Tier::Device).unwrap();
    eng.clear(0).unwrap();
    eng.process(0, &a[..B as usize]).unwrap();
    agrees(&svc, &eng, 0, &a);

    let m = scrape(&svc);
    let s = |name: &str, tier: &str| {
        format!("{name}{{instance=\"met\",dp_rank=\"0\",tier=\"{tier}\"}}")
    };
    assert_eq!(
        get(&m, &s("kvdir_blocks_stored_total", "device")),
        5.0,
        "4, then 1 after the clear"
    );
    assert_eq!(get(&m, &s("kvdir_blocks_stored_total", "host")), 4.0, "offload copies");
    assert_eq!(get(&m, &s("kvdir_blocks_removed_total", "device")), 1.0, "the last block");
    assert_eq!(get(&m, &s("kvdir_blocks_removed_total", "host")), 0.0);
    let (device, host) = eng.counts(0).unwrap();
    assert_eq!(get(&m, &s("kvdir_resident_blocks", "device")), device as f64);
    assert_eq!(get(&m, &s("kvdir_resident_blocks", "host")), host as f64);
    assert_eq!(get(&m, "kvdir_all_blocks_cleared_total{instance=\"met\",dp_rank=\"0\"}"), 1.0);
    assert_eq!(get(&m, "kvdir_stream_synchronized{instance=\"met\",dp_rank=\"0\"}"), 1.0);
    assert_eq!(get(&m, "kvdir_streams_unsynchronized"), 0.0);
    assert_eq!(get(&m, "kvdir_streams"), 1.0);
    assert!(get(&m, "process_resident_memory_bytes") > 1e6, "RSS is reported");

    // Requests: latencies are observed and errors counted by reason.
    let before = scrape(&svc);
    for _ in 0..3 {
        query(&svc, &a);
    }
    let bad = http(svc.http_addr(), "POST", "/v1/internal/kv-cache/query", &[], b"{}");
    assert_eq!(bad.status, 400);
    let no_route =
        http(svc.http_addr(), "POST", "/v1/internal/route", &[], br#"{"token_ids":[1]}"#);
    assert_eq!(no_route.status, 503, "static streams give no candidates: {}", no_route.body);
    let after = scrape(&svc);
    let delta = |k: &str| get(&after, k) - get(&before, k);
    assert_eq!(delta("kvdir_query_duration_seconds_count"), 4.0);
    assert_eq!(delta("kvdir_query_duration_seconds_bucket{le=\"+Inf\"}"), 4.0);
    assert!(delta("kvdir_query_duration_seconds_sum") > 0.0);
    assert_eq!(delta("kvdir_route_duration_seconds_count"), 1.0);
    assert_eq!(delta("kvdir_http_errors_total{reason=\"bad_request\"}"), 1.0);
    assert_eq!(delta("kvdir_http_errors_total{reason=\"no_candidate\"}"), 1.0);
    assert_eq!(delta("kvdir_http_errors_total{reason=\"unauthorized\"}"), 0.0);
    // Each answered request's stages, as its Server-Timing header gave them; errors are not.
    let stage = |endpoint: &str, stage: &str| {
        let series = format!("{{endpoint=\"{endpoint}\",stage=\"{stage}\"}}");
        delta(&format!("kvdir_request_stage_duration_seconds_count{series}"))
    };
    for s in ["body", "parse", "read"] {
        assert_eq!(stage("query", s), 3.0, "{s}");
    }
    assert_eq!(stage("query", "wait"), 0.0, "no client sent X-Request-Start");
    assert_eq!(stage("route", "decide"), 0.0, "the route failed");
    assert!(
        delta("kvdir_request_stage_duration_seconds_sum{endpoint=\"query\",stage=\"read\"}") > 0.0
    );
    let sent = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let start = format!("t={}", sent.as_micros() - 20_000);
    let body = format!("{{\"token_ids\": {a:?}}}");
    let r = http(
        svc.http_addr(),
        "POST",
        "/v1/internal/kv-cache/query",
        &[("X-Request-Start", &start)],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let waited = scrape(&svc);
    let wait = |k: &str| get(&waited, k) - get(&after, k);
    let series = "{endpoint=\"query\",stage=\"wait\"}";
    assert_eq!(wait(&format!("kvdir_request_stage_duration_seconds_count{series}")), 1.0);
    // Sent 20 ms before it was: its wait is in no bucket below 10 ms.
    let le = "{endpoint=\"query\",stage=\"wait\",le=\"0.01\"}";
    assert_eq!(wait(&format!("kvdir_request_stage_duration_seconds_bucket{le}")), 0.0);
}

/// A healthy stream shows one initial sync and no recovery; a dropped message (a sequence gap)
/// shows a recovery, and every sync has its duration.
#[test]
fn metrics_show_gaps_recoveries_and_their_duration() {
    let eng = engine("met-gap", 1, 0);
    let svc = service(streams_of(&eng), json!({}));
    agrees(&svc, &eng, 0, &[]);
    let l = "{instance=\"met-gap\",dp_rank=\"0\"}";
    let syncs = |m: &BTreeMap<String, f64>| {
        let family = |name: &str| get(m, &format!("{name}{l}"));
        let counts = ["kvdir_initial_syncs_total", "kvdir_resyncs_total", "kvdir_recoveries_total"];
        counts.map(family)
    };
    eventually("the first sync in /metrics", || match syncs(&scrape(&svc)) {
        [1.0, 0.0, 0.0] => Ok(()),
        other => Err(format!("(initial, resyncs, recoveries) = {other:?}")),
    });
    eng.faults(0, Fault::DropNext(1)).unwrap();
    let lost = prompt(1, 2);
    let next = prompt(500, 2);
    eng.process(0, &lost).unwrap();
    eng.process(0, &next).unwrap();
    agrees(&svc, &eng, 0, &lost);
    let m = scrape(&svc);
    assert!(get(&m, &format!("kvdir_sequence_gaps_total{l}")) >= 1.0);
    let [initial, resyncs, recoveries] = syncs(&m);
    assert_eq!(initial, 1.0, "one first sync");
    assert!(recoveries >= 1.0, "the sync after the gap is a recovery");
    assert_eq!(
        get(&m, &format!("kvdir_recovery_duration_seconds_count{l}")),
        initial + resyncs + recoveries,
        "every sync has a duration"
    );
    assert!(get(&m, &format!("kvdir_snapshot_bytes_total{l}")) > 0.0);
    // The gap is a fault with a bounded reason; nothing else went wrong.
    let fault = |reason: &str| {
        get(&m, &format!("kvdir_stream_faults_total{{instance=\"met-gap\",dp_rank=\"0\",reason=\"{reason}\"}}"))
    };
    assert!(fault("sequence") >= 1.0, "the gap counted as a sequence fault");
    assert_eq!(fault("decode") + fault("index") + fault("snapshot"), 0.0);
}
