//! The fleet as it runs: a thousand streams on the bind endpoint, engines registered in etcd
//! sending heartbeats every 500 ms, one query client at 20 a second, driven by the load tool
//! against the `kvdir` binary, bounded by the tool's deadlines. Every batch is applied live,
//! no stream faults (no gap, no false restart, no recovery), every heartbeat is answered 200,
//! and the report shows kvdir's descriptors and its HTTP connection peak.

use std::net::TcpListener;

use kvdir_bench as bench;
use kvdir_bench::{BenchCommand, Kind};
use kvdir_testkit::etcd::etcd_endpoint;

use crate::common::load_tool_turn;

/// Engines of the run, each with [`DP`] ranks: 1,024 streams.
const ENGINES: u32 = 256;
const DP: u16 = 4;

/// The first of `n` consecutive free ports on 127.0.0.1 from `from` on, below the ephemeral
/// range (where a block of a thousand is rarely free); the tool binds them moments later.
fn free_block(from: u16, n: u16) -> u16 {
    let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
    let mut base = from;
    while base + n < 32_768 {
        match (base..base + n).find(|&p| !free(p)) {
            None => return base,
            Some(taken) => base = taken + 1,
        }
    }
    panic!("no {n} consecutive free ports on 127.0.0.1 below 32768");
}

#[test]
fn a_thousand_bound_streams_with_heartbeats_apply_every_batch_without_a_fault() {
    let _turn = load_tool_turn();
    let etcd = etcd_endpoint();
    // The engines bind only their replay ports (their PUBs connect to kvdir): a free block
    // at `--http_port + --replay_port_offset`; their HTTP and event ports are names.
    let streams = ENGINES as u16 * DP;
    let replay = free_block(12_000, streams);
    let bind = free_block(replay + streams, DP);
    let args = [
        format!("--spawn_kvdir={}", env!("CARGO_BIN_EXE_kvdir")),
        format!("--etcd_addr={}", etcd.endpoint),
        format!("--engines={ENGINES}"),
        format!("--dp_size={DP}"),
        format!("--events_bind={bind}"),
        format!("--http_port={}", replay - 2 * streams),
        format!("--event_port_offset={streams}"),
        format!("--replay_port_offset={}", 2 * streams),
        "--block_size=16".into(),
        "--duration_seconds=3".into(),
        "--idle_seconds=1".into(),
        "--baseline_seconds=0".into(),
        "--rate=500".into(),
        "--route_clients=0".into(),
        "--sync_timeout_seconds=90".into(),
    ];
    let o = match bench::parse_args(args.to_vec()) {
        Ok(BenchCommand::Run(o)) => *o,
        other => panic!("{other:?}"),
    };
    assert_eq!(o.heartbeat, Some(std::time::Duration::from_millis(500)), "heartbeats on");
    let report = bench::run(&o).expect("the run completes");
    let text = report.text();
    assert_eq!(report.streams, 1024, "{text}");
    assert!(report.applied.caught_up, "kvdir applied every batch: {text}");
    assert!(report.published.batches > 0, "{text}");
    assert_eq!(report.applied.messages, report.published.batches, "every batch live: {text}");
    assert_eq!(report.applied.faults(), [], "no gap, restart or recovery: {text}");
    let (answered, not_ok) = report.heartbeats.expect("etcd mode sends heartbeats");
    assert!(answered > 0 && not_ok == 0, "heartbeats answered 200: {text}");
    let query = report.kind(Kind::Query).expect("a query client");
    assert!(query.errors.is_empty() && !query.latencies.is_empty(), "{text}");
    let scale = &report.scale;
    assert!(scale.kvdir_fds.0.is_some_and(|n| n >= 1024), "a descriptor per stream: {text}");
    assert!(scale.http_connections_peak.is_some_and(|n| n >= 1), "{text}");
    assert!(text.contains("HTTP connections: "), "{text}");
}
