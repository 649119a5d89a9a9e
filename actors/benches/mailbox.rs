//! Mailbox benchmarks of the actix service: what the actor messages themselves cost, with the
//! same work done by a direct call as the baseline measured in the same run.
//!
//! - `router_query_128_streams_2048_tokens`: a 2,048-token query (16 blocks of 128) against
//!   128 streams in one shared index, each holding the query's 16 blocks among 1,024 (the
//!   router's worst case: every stream hits the whole prefix). Baseline: `Directory::query`, what
//!   the query endpoint's handler calls (no mailbox). Subjects: the same read followed by a
//!   `RouteRequest` with its hits (no instances, so the answer is "no candidate"), awaited
//!   from the router's own arbiter (`send_same_arbiter`), from another thread as the HTTP
//!   workers do (`send_other_arbiter`), and 16 kept in flight from another thread
//!   (`send_other_arbiter_16_in_flight`): what a route pays for its mailbox hop.
//!
//! Live batches no longer take a mailbox: the stream thread applies them itself (see
//! `worker/`), so the former `index_mailbox_512_blocks_per_batch` group is gone; the ingest
//! bench measures that path directly.
//!
//! After criterion, each group is measured again in 30 **paired rounds**: every case runs a
//! short stretch (200 queries) per round, round after round, so that the load of a
//! shared machine hits every case alike; the bench prints the median and 10th-90th percentile of
//! each case's per-round ratio to the baseline. These ratios are steadier than ratios of
//! criterion medians taken seconds apart.
//!
//! `cargo bench -p kvdir-service --bench mailbox` prints, besides criterion's output: the
//! percentiles of 3,000 single queries per router case, the paired rounds, and at the end the
//! ratios of criterion's medians measured in this run.

#[path = "../../benches/common/mod.rs"]
mod common;

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::dev::Request;
use actix::prelude::*;
use common::{percentile, Estimates, Rng, BLOCK_SIZE};
use criterion::{Criterion, Throughput};
use kvdir::car::RouteParams;
use kvdir::index::{IndexConfig, StreamLabel, StreamWriter};
use kvdir::query::QueryResponse;
use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, StoredRecord, WireHash};
use kvdir::wire::{decode_batch, encode_batch, Batch, Tier};
use kvdir_service::directory::{Directory, RouteRead};
use kvdir_service::router::{RouteRequest, RouterActor};

/// Streams registered with the router.
const STREAMS: usize = 128;
/// Blocks of the query (2,048 tokens).
const QUERY_BLOCKS: usize = 16;
/// Prefixes of `QUERY_BLOCKS` blocks per stream; the first is the query.
const PREFIXES: usize = 64;
/// Queries kept in flight by the pipelined case.
const IN_FLIGHT: usize = 16;
/// Single queries timed per case for the percentiles.
const TIMED: usize = 3_000;
/// Rounds of the paired measurement.
const ROUNDS: usize = 30;
/// Queries per case per paired round.
const ROUTER_ROUND: u64 = 200;
const ROUTER: &str = "router_query_128_streams_2048_tokens";

fn decode(payload: &[u8]) -> Batch {
    let mut b = Batch::default();
    decode_batch(payload, &mut b).expect("bench payload decodes");
    b
}

fn encode(events: Vec<EventRecord>) -> Vec<u8> {
    let rec = BatchRecord { timestamp: 1.0, events, dp_rank: Some(0) };
    encode_batch(&rec, BatchForm::Array, EventForm::Map)
}

/// The router's streams: one snapshot of `PREFIXES` independent prefixes of `QUERY_BLOCKS`
/// blocks, and the tokens of the first prefix (the query).
fn router_snapshot() -> (Batch, Vec<i32>) {
    let mut rng = Rng::new(11);
    let b = BLOCK_SIZE as usize;
    let prefixes: Vec<(Vec<u64>, Vec<i32>)> = (0..PREFIXES)
        .map(|_| {
            let hashes = (0..QUERY_BLOCKS).map(|_| rng.next_u64()).collect();
            (hashes, rng.tokens(QUERY_BLOCKS * b))
        })
        .collect();
    let events = prefixes
        .iter()
        .map(|(hashes, tokens)| {
            EventRecord::Stored(StoredRecord::new(
                hashes.iter().map(|h| WireHash::Uint(*h)).collect(),
                None,
                tokens.clone(),
                BLOCK_SIZE,
                Tier::Device,
            ))
        })
        .collect();
    (decode(&encode(events)), prefixes[0].1.clone())
}

/// `STREAMS` synchronized streams holding `snapshot` in one shared index; the writers must
/// outlive the reads.
fn router_directory(snapshot: &Batch) -> (Directory, Vec<StreamWriter>) {
    let directory = Directory::default();
    let writers = (0..STREAMS)
        .map(|i| {
            let label = StreamLabel {
                instance_name: format!("inst-{:02}", i / 8),
                dp_rank: (i % 8) as u32,
                ..StreamLabel::default()
            };
            let mut w = directory.add_stream(IndexConfig::default(), label).expect("a free slot");
            w.load_snapshot(snapshot, 0).expect("router snapshot applies");
            w.publish();
            w
        })
        .collect();
    (directory, writers)
}

fn check_full_hit(r: &QueryResponse, tokens: usize) {
    assert_eq!(r.matches.len(), STREAMS);
    assert!(r.matches.iter().all(|m| m.device_hit_tokens == tokens as u64), "not a full hit");
}

/// Times `f` `TIMED` times, one call each, and prints p50 / p99 / max.
fn print_percentiles(label: &str, mut f: impl FnMut() -> Duration) {
    let mut times: Vec<Duration> = (0..TIMED).map(|_| f()).collect();
    times.sort();
    println!(
        "{label:<40} p50 {:>8.1} µs   p99 {:>8.1} µs   max {:>8.1} µs",
        percentile(&times, 50.0).as_secs_f64() * 1e6,
        percentile(&times, 99.0).as_secs_f64() * 1e6,
        times[times.len() - 1].as_secs_f64() * 1e6,
    );
}

/// The router's cases; criterion and the paired rounds time them with the same code.
struct RouterCases<'a> {
    sys: &'a SystemRunner,
    tokens: Vec<i32>,
    directory: &'a Directory,
    local: Addr<RouterActor>,
    remote: Addr<RouterActor>,
}

/// The router's cases, baseline first.
const ROUTER_CASES: [&str; 4] = [
    "baseline_direct_read",
    "send_same_arbiter",
    "send_other_arbiter",
    "send_other_arbiter_16_in_flight",
];

impl RouterCases<'_> {
    /// Runs case `case` (an index into `ROUTER_CASES`) `iters` times; returns the time taken.
    fn time(&mut self, case: usize, iters: u64) -> Duration {
        let (tokens, directory) = (&self.tokens, self.directory);
        let route = || RouteRequest {
            input_tokens: tokens.len(),
            read: RouteRead::of_hits(directory.read(tokens)),
        };
        match case {
            0 => {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(directory.query(black_box(tokens)));
                }
                start.elapsed()
            }
            1 | 2 => {
                let addr = if case == 1 { &self.local } else { &self.remote };
                self.sys.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(addr.send(route()).await.expect("answered").is_err());
                    }
                    start.elapsed()
                })
            }
            _ => self.sys.block_on(async {
                let start = Instant::now();
                let mut flight: VecDeque<Request<RouterActor, RouteRequest>> =
                    VecDeque::with_capacity(IN_FLIGHT);
                for _ in 0..iters {
                    if flight.len() == IN_FLIGHT {
                        let done = flight.pop_front().expect("in flight");
                        black_box(done.await.expect("answered").is_err());
                    }
                    flight.push_back(self.remote.send(route()));
                }
                for done in flight {
                    black_box(done.await.expect("answered").is_err());
                }
                start.elapsed()
            }),
        }
    }
}

fn bench_router(c: &mut Criterion, sys: &SystemRunner) {
    let (snapshot, tokens) = router_snapshot();
    let (directory, writers) = router_directory(&snapshot);
    let directory = Arc::new(directory);
    let router = {
        let directory = Arc::clone(&directory);
        let params = RouteParams::default();
        move || RouterActor::new(directory, params.clone(), params.policy)
    };
    let local = sys.block_on({
        let router = router.clone();
        async move { router().start() }
    });
    let other_arbiter = Arbiter::new();
    let remote = RouterActor::start_in_arbiter(&other_arbiter.handle(), move |_| router());
    let mut cases = RouterCases { sys, tokens, directory: &directory, local, remote };
    check_full_hit(&directory.query(&cases.tokens), cases.tokens.len());

    let mut g = c.benchmark_group(ROUTER);
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
    for (case, name) in ROUTER_CASES.iter().enumerate() {
        g.bench_function(*name, |b| b.iter_custom(|iters| cases.time(case, iters)));
    }
    g.finish();

    println!("\nsingle queries, {TIMED} each:");
    for (case, name) in ROUTER_CASES.iter().enumerate().take(3) {
        print_percentiles(&format!("router: {name}"), || cases.time(case, 1));
    }
    paired(ROUTER, &ROUTER_CASES, ROUTER_ROUND, |case, n| cases.time(case, n), 1.0, "queries");
    drop(cases);
    drop(writers);
    other_arbiter.stop();
}

/// Times every case for `n` iterations per round, `ROUNDS` rounds, starting each round with
/// the next case, so that the slow phases of a shared machine hit every case alike. Prints each
/// case's median time per iteration over the rounds, and the median and 10th-90th percentile of
/// its per-round time ratio to case 0, the baseline.
fn paired(
    group: &str,
    names: &[&str],
    n: u64,
    mut time: impl FnMut(usize, u64) -> Duration,
    per_iter: f64,
    unit: &str,
) {
    let k = names.len();
    let mut ns: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); k];
    for round in 0..ROUNDS {
        for i in 0..k {
            let case = (round + i) % k;
            ns[case].push(time(case, n).as_secs_f64() * 1e9 / n as f64);
        }
    }
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let at = |v: &[f64], p: f64| v[((p * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)];
    println!("\n{group}: paired rounds ({ROUNDS} rounds of {n} iterations per case):");
    for (case, name) in names.iter().enumerate() {
        let med = at(&sorted(ns[case].clone()), 0.5);
        let ratios = sorted(ns[case].iter().zip(&ns[0]).map(|(s, b)| s / b).collect());
        println!(
            "  {name:<34} {:>9.2} µs/iter {:>10.0} {unit}/s   x baseline: median {:.2} \
             [p10 {:.2}, p90 {:.2}]",
            med / 1e3,
            per_iter * 1e9 / med,
            at(&ratios, 0.5),
            at(&ratios, 0.1),
            at(&ratios, 0.9),
        );
    }
}

/// Prints `subject`'s median, its rate of `per_iter` `unit` and its time ratio to `baseline`.
fn print_ratio(
    e: &Estimates,
    group: &str,
    subject: &str,
    baseline: &str,
    per_iter: f64,
    unit: &str,
) {
    match (e.median_ns(group, subject), e.median_ns(group, baseline)) {
        (Some(s), Some(b)) => println!(
            "{group}: {subject} {:.2} µs/iter = {:.0} {unit}/s = {:.2} x {baseline}'s time \
             ({:.2} µs/iter, {:.0} {unit}/s)",
            s / 1e3,
            per_iter * 1e9 / s,
            s / b,
            b / 1e3,
            per_iter * 1e9 / b,
        ),
        _ => println!("{group}: {subject} vs {baseline}: not both measured in this run"),
    }
}

fn main() {
    let estimates = Estimates::new();
    let sys = System::new();
    let mut c = Criterion::default().configure_from_args();
    bench_router(&mut c, &sys);
    c.final_summary();
    println!("\nratios measured in this run (medians):");
    for s in ["send_same_arbiter", "send_other_arbiter", "send_other_arbiter_16_in_flight"] {
        print_ratio(&estimates, ROUTER, s, "baseline_direct_call", 1.0, "queries");
    }
}
