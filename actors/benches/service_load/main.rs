//! End-to-end load of the running service (no criterion; `harness = false`): simulated engines
//! publish over real ZeroMQ into a real `kvdir_service::Service` with 128 static streams, while
//! HTTP clients query it. Bounded in count and time: about 15-25 s in all, then it stops.
//!
//! Setup: 16 `SimEngine`s x 8 DP ranks = 128 streams, block size 16, 1,024 Device + 1,024 Host
//! blocks per rank, everything on 127.0.0.1 with ephemeral ports. 4 driver threads call
//! `engine.process(rank, tokens)` as fast as they can, `REQUESTS_PER_DRIVER` requests each
//! (stopping early only at `INGEST_CAP`), each with its own seeded `kvdir_sim::workload`
//! generator (4 sessions per stream, sticky routing, so turns reuse their prefix and evictions
//! and Host copies happen). Both ingest phases therefore publish exactly the same batches.
//!
//! Phases, all in one process:
//! 1. **Baseline: the engines alone.** The same drivers and seeds against fresh engines nobody
//!    subscribes to: how fast the publishing side alone produces those batches here.
//! 2. **Ingest under query load.** Fresh engines, the service subscribed and synchronized, then
//!    the same drivers. The clock stops when every stream's `sequence` in the
//!    query endpoint equals its engine's `next_sequence() - 1` and is synchronized ("caught
//!    up"). Meanwhile `QUERY_CLIENTS` threads each send one `POST /v1/internal/kv-cache/query`
//!    every `QUERY_INTERVAL` (one TCP connection per query, `Connection: close`, through
//!    `kvdir_sim::http::request`), with prompts of at most 2,048 tokens that share the
//!    workload's system prompts.
//! 3. **Queries without ingest** (the latency baseline): the same clients for `IDLE_QUERIES`,
//!    after `QUIET` seconds with neither ingest nor queries (what idle streams cost).
//!
//! Every phase prints the CPU seconds its threads used, by group (engine ranks, drivers, stream
//! workers, actix threads, ZeroMQ I/O ...), from `/proc/self/task/*/schedstat`.
//!
//! Afterwards: every stream's answer for the last prompt its engine served is compared with the
//! engine's own ground truth, the streams report's counters are summed, and the workload is
//! replayed through `kvdir_sim::CacheModel` mirrors to count the blocks the batches carried
//! (the mirrors must produce exactly the engines' batch counts).
//!
//! Run: `cargo bench -p kvdir-service --bench service_load`. `RUST_LOG` filters the service's
//! logs (default `warn`, on stderr).

mod queries;
mod report;

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use kvdir::config::{parse_config_file, Flags};
use kvdir_service::Service;
use kvdir_sim::cache::CacheConfig;
use kvdir_sim::workload::{Workload, WorkloadConfig};
use kvdir_sim::{CacheEvent, CacheModel, EngineConfig, SimEngine};
use serde_json::{json, Value};

use queries::{query, query_bodies, query_body, stream_of, streams_report, wait_for, with_queries};
use report::{loadavg, print_latencies, print_rates, print_report, thread_cpu, us, Cpu};

/// Simulated engines.
const ENGINES: usize = 16;
/// DP ranks per engine.
const DP: u32 = 8;
/// Streams: one per engine rank.
const STREAMS: usize = ENGINES * DP as usize;
/// Tokens per block.
const BLOCK_SIZE: u32 = 16;
/// Device blocks per rank.
const DEVICE_BLOCKS: usize = 1024;
/// Host blocks per rank.
const HOST_BLOCKS: usize = 1024;
/// Driver threads calling `process`.
const DRIVERS: usize = 4;
/// Workload sessions per stream.
const SESSIONS_PER_STREAM: usize = 4;
/// Requests each driver sends, in both ingest phases.
const REQUESTS_PER_DRIVER: usize = 2_000;
/// The drivers stop early after this long (then the phases did different work; it is printed).
const INGEST_CAP: Duration = Duration::from_secs(10);
/// Seed of driver 0's workload; driver `t` uses `SEED + t`.
const SEED: u64 = 2024;
/// Longest wait for the streams to synchronize, and to catch up after the drivers stop.
const DEADLINE: Duration = Duration::from_secs(20);
/// How often catch-up is polled.
const POLL: Duration = Duration::from_millis(20);
/// Query client threads.
const QUERY_CLIENTS: usize = 2;
/// Each client sends one query per interval (open loop; a late query is sent at once).
const QUERY_INTERVAL: Duration = Duration::from_millis(10);
/// Length of the query-only phase.
const IDLE_QUERIES: Duration = Duration::from_secs(3);
/// Length of the phase with neither ingest nor queries (idle CPU).
const QUIET: Duration = Duration::from_secs(2);
/// Largest query.
const QUERY_TOKENS: usize = 2048;
/// Distinct query prompts.
const QUERY_POOL: usize = 64;

fn engine_config(e: usize) -> EngineConfig {
    EngineConfig {
        name: format!("eng-{e:02}"),
        dp_size: DP,
        block_size: BLOCK_SIZE,
        device_capacity_blocks: DEVICE_BLOCKS,
        host_capacity_blocks: HOST_BLOCKS,
        ..EngineConfig::default()
    }
}

fn start_engines() -> Vec<SimEngine> {
    (0..ENGINES).map(|e| SimEngine::start(engine_config(e)).expect("engine starts")).collect()
}

/// Stream `s` is rank `s % DP` of engine `s / DP`.
fn locate(s: usize) -> (usize, u32) {
    (s / DP as usize, (s % DP as usize) as u32)
}

/// The streams driver `t` feeds.
fn driver_streams(t: usize) -> Vec<usize> {
    (0..STREAMS).filter(|s| s % DRIVERS == t).collect()
}

fn workload(t: usize) -> Workload {
    Workload::new(WorkloadConfig {
        seed: SEED + t as u64,
        sessions: SESSIONS_PER_STREAM * driver_streams(t).len(),
        ..WorkloadConfig::default()
    })
}

/// What one ingest phase did.
struct Ingest {
    /// Requests sent per driver.
    requests: Vec<usize>,
    /// Batches published (calls that changed the cache).
    batches: u64,
    /// Until the last driver stopped.
    publish_time: Duration,
    /// The last prompt each stream served.
    last: HashMap<usize, Vec<i32>>,
    /// CPU seconds the driver threads used.
    driver_cpu: f64,
}

/// What one driver thread did.
struct DriverOut {
    requests: usize,
    published: u64,
    last: HashMap<usize, Vec<i32>>,
    cpu: f64,
}

/// Runs the drivers against `engines`: `REQUESTS_PER_DRIVER` each, or until `INGEST_CAP`.
fn drive(engines: &[SimEngine]) -> Ingest {
    let start = Instant::now();
    let outs: Vec<DriverOut> = thread::scope(|sc| {
        let handles: Vec<_> = (0..DRIVERS)
            .map(|t| {
                let builder = thread::Builder::new().name(format!("driver-{t}"));
                builder.spawn_scoped(sc, move || {
                    let streams = driver_streams(t);
                    let mut w = workload(t);
                    let (mut n, mut published) = (0, 0);
                    let mut last = HashMap::new();
                    while n < REQUESTS_PER_DRIVER && start.elapsed() < INGEST_CAP {
                        let r = w.next_request();
                        let s = streams[r.session % streams.len()];
                        let (e, rank) = locate(s);
                        if engines[e].process(rank, &r.tokens).expect("process").is_some() {
                            published += 1;
                        }
                        last.insert(s, r.tokens);
                        n += 1;
                    }
                    let cpu = thread_cpu(std::path::Path::new("/proc/thread-self"));
                    DriverOut { requests: n, published, last, cpu }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.expect("spawn driver").join().expect("driver")).collect()
    });
    let publish_time = start.elapsed();
    let mut ingest = Ingest {
        requests: Vec::new(),
        batches: 0,
        publish_time,
        last: HashMap::new(),
        driver_cpu: 0.0,
    };
    for out in outs {
        ingest.requests.push(out.requests);
        ingest.batches += out.published;
        ingest.last.extend(out.last);
        ingest.driver_cpu += out.cpu;
    }
    ingest
}

/// Blocks and events the batches of an ingest phase carried, from `CacheModel` mirrors.
#[derive(Debug, Default)]
struct Carried {
    batches_per_stream: Vec<u64>,
    stored_blocks: u64,
    host_copies: u64,
    removed_blocks: u64,
    events: u64,
}

impl Carried {
    fn blocks(&self) -> u64 {
        self.stored_blocks + self.host_copies + self.removed_blocks
    }
}

/// Replays the requests each driver sent through mirrors of the engines' caches.
fn replay(requests: &[usize]) -> Carried {
    let config = CacheConfig {
        block_size: BLOCK_SIZE,
        device_capacity_blocks: DEVICE_BLOCKS,
        host_capacity_blocks: HOST_BLOCKS,
    };
    let mut c = Carried { batches_per_stream: vec![0; STREAMS], ..Carried::default() };
    for (t, &n) in requests.iter().enumerate() {
        let streams = driver_streams(t);
        let mut mirrors: HashMap<usize, CacheModel> = HashMap::new();
        let mut w = workload(t);
        for _ in 0..n {
            let r = w.next_request();
            let s = streams[r.session % streams.len()];
            let events =
                mirrors.entry(s).or_insert_with(|| CacheModel::new(config)).process(&r.tokens);
            if events.is_empty() {
                continue;
            }
            c.batches_per_stream[s] += 1;
            c.events += events.len() as u64;
            for ev in events {
                match ev {
                    CacheEvent::Stored { hashes, tokens, .. } if tokens.is_empty() => {
                        c.host_copies += hashes.len() as u64
                    }
                    CacheEvent::Stored { hashes, .. } => c.stored_blocks += hashes.len() as u64,
                    CacheEvent::Removed { hashes, .. } => c.removed_blocks += hashes.len() as u64,
                    CacheEvent::Cleared => {}
                }
            }
        }
    }
    c
}

/// `next_sequence` of every stream's rank, in stream order.
fn next_sequences(engines: &[SimEngine]) -> Vec<u64> {
    (0..STREAMS)
        .map(|s| {
            let (e, rank) = locate(s);
            engines[e].next_sequence(rank).expect("next_sequence")
        })
        .collect()
}

fn start_service(engines: &[SimEngine]) -> Service {
    let streams: Vec<Value> = engines
        .iter()
        .flat_map(|eng| {
            let c = eng.config();
            eng.endpoints().into_iter().enumerate().map(move |(r, ep)| {
                json!({"instance_name": c.name, "dp_rank": r, "block_size": c.block_size,
                       "endpoint": ep.event, "replay_endpoint": ep.replay, "topic": c.topic})
            })
        })
        .collect();
    let directory =
        parse_config_file(&json!({ "streams": streams }).to_string()).expect("valid config");
    let flags = Flags { http_server_port: 0, server_host: "127.0.0.1".into(), ..Flags::default() };
    Service::start(flags, Some(directory)).expect("kvdir starts")
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let t0 = Instant::now();
    println!(
        "service_load: {ENGINES} engines x {DP} DP ranks = {STREAMS} streams, block size \
         {BLOCK_SIZE}, {DEVICE_BLOCKS} Device + {HOST_BLOCKS} Host blocks per rank, {DRIVERS} \
         drivers x {REQUESTS_PER_DRIVER} requests, {QUERY_CLIENTS} query clients every {} ms; \
         loadavg {}",
        QUERY_INTERVAL.as_millis(),
        loadavg()
    );

    // 1. The engines alone.
    let engines = start_engines();
    let cpu0 = Cpu::now();
    let alone = drive(&engines);
    let cpu_alone = Cpu::now().since(&cpu0, &[("drivers", alone.driver_cpu)]);
    let alone_seq = next_sequences(&engines);
    drop(engines);

    // 2. Ingest through the service, under query load.
    let engines = start_engines();
    let svc = start_service(&engines);
    let addr = svc.http_addr();
    let sync_time = Instant::now();
    if let Err(lag) = wait_for(addr, &[None; STREAMS], sync_time) {
        panic!("streams did not synchronize: {} lagging, first {}", lag.len(), lag[0]);
    }
    let sync_time = sync_time.elapsed();
    let before = streams_report(addr);
    let bodies = query_bodies();
    let ((ingest, caught_up), busy) = with_queries(addr, &bodies, || {
        let cpu0 = Cpu::now();
        let start = Instant::now();
        let ingest = drive(&engines);
        let seq = next_sequences(&engines);
        let expected: Vec<Option<u64>> = seq.iter().map(|n| n.checked_sub(1)).collect();
        let caught_up = wait_for(addr, &expected, start);
        let wall = start.elapsed();
        let cpu = Cpu::now().since(&cpu0, &[("drivers", ingest.driver_cpu)]);
        (ingest, (caught_up, seq, cpu, wall))
    });
    let (caught_up, service_seq, cpu_ingest, ingest_wall) = caught_up;

    // Nothing at all: what 128 idle streams and 128 idle engine ranks cost.
    let cpu0 = Cpu::now();
    thread::sleep(QUIET);
    let cpu_quiet = Cpu::now().since(&cpu0, &[]);

    // 3. Queries alone.
    let cpu0 = Cpu::now();
    let ((), idle) = with_queries(addr, &bodies, || thread::sleep(IDLE_QUERIES));
    let cpu_idle = Cpu::now().since(&cpu0, &[]);

    // Correctness: each stream's last prompt against its engine's ground truth.
    let mut wrong = Vec::new();
    for (s, tokens) in &ingest.last {
        let (e, rank) = locate(*s);
        let truth = engines[e].resident(rank, tokens).expect("resident");
        let r = query(addr, &query_body(tokens));
        let m = r
            .matches
            .iter()
            .find(|m| stream_of(&m.instance_name, m.dp_rank) == *s)
            .expect("stream entry");
        if (m.device_hit_tokens, m.host_only_hit_tokens) != truth || !m.synchronized {
            wrong.push(format!("stream {s}: kvdir {m:?}, engine {truth:?}"));
        }
    }
    let after = streams_report(addr);
    svc.stop();
    // Stream threads end within one poll interval of the stop; let them go before the engines.
    thread::sleep(Duration::from_millis(200));
    drop(engines);

    let carried = replay(&ingest.requests);
    let same_work = alone.requests == ingest.requests;
    if !same_work {
        println!("the drivers hit INGEST_CAP: the two phases did different work");
    }
    let carried_alone = (!same_work).then(|| replay(&alone.requests));
    let carried_alone = carried_alone.as_ref().unwrap_or(&carried);
    assert_eq!(carried_alone.batches_per_stream, alone_seq, "mirror replay matches the engines");
    assert_eq!(carried.batches_per_stream, service_seq, "mirror replay matches the engines");

    println!("\n=== results (loadavg {}) ===", loadavg());
    println!(
        "streams synchronized {:.2} s after the HTTP port opened; {} streams served a prompt",
        sync_time.as_secs_f64(),
        ingest.last.len()
    );
    print_rates(
        "baseline: engines alone, publish time",
        alone.batches,
        carried_alone,
        alone.publish_time,
    );
    print_rates("with service: publish time", ingest.batches, &carried, ingest.publish_time);
    match caught_up {
        Ok(t) => {
            print_rates("with service: until caught up (applied)", ingest.batches, &carried, t);
            let applied = ingest.batches as f64 / t.as_secs_f64();
            let base = alone.batches as f64 / alone.publish_time.as_secs_f64();
            let applied_blocks = carried.blocks() as f64 / t.as_secs_f64();
            let base_blocks = carried_alone.blocks() as f64 / alone.publish_time.as_secs_f64();
            println!(
                "ratio applied / engines alone: {:.2} (batches/s), {:.2} (blocks/s); caught up \
                 {:.0} ms after the drivers stopped",
                applied / base,
                applied_blocks / base_blocks,
                (t.as_secs_f64() - ingest.publish_time.as_secs_f64()) * 1e3
            );
        }
        Err(lag) => {
            println!("NOT CAUGHT UP within {} s: {} streams lag", DEADLINE.as_secs(), lag.len());
            for l in lag.iter().take(10) {
                println!("  {l}");
            }
        }
    }
    print_latencies("queries during ingest (until caught up)", &busy);
    print_latencies("queries without ingest (baseline)", &idle);
    println!(
        "ratio under ingest / without: p50 {:.2}, p99 {:.2}, max {:.2}",
        us(busy.pct(50.0)) / us(idle.pct(50.0)).max(1e-9),
        us(busy.pct(99.0)) / us(idle.pct(99.0)).max(1e-9),
        us(busy.times.last().copied().unwrap_or_default())
            / us(idle.times.last().copied().unwrap_or_default()).max(1e-9),
    );
    println!(
        "live messages received during ingest: {} (published {})",
        after.iter().filter_map(|s| s["messages"].as_u64()).sum::<u64>()
            - before.iter().filter_map(|s| s["messages"].as_u64()).sum::<u64>(),
        ingest.batches
    );
    cpu_alone.print("engines alone", alone.publish_time);
    cpu_ingest.print("ingest until caught up", ingest_wall);
    cpu_quiet.print("no ingest, no queries", QUIET);
    cpu_idle.print("queries without ingest", IDLE_QUERIES);
    let service_cpu: f64 = ["stream worker threads", "actix threads (index, router, HTTP workers)"]
        .iter()
        .filter_map(|g| cpu_ingest.groups.get(g))
        .sum();
    println!(
        "service CPU during ingest (stream workers + actix threads, queries and idle polling \
         included): {service_cpu:.2} s = {:.0} µs per batch, {:.2} µs per block",
        service_cpu * 1e6 / ingest.batches.max(1) as f64,
        service_cpu * 1e6 / carried.blocks().max(1) as f64,
    );
    print_report(&after);
    if wrong.is_empty() {
        println!("ground truth: all {} streams agree with their engine", ingest.last.len());
    } else {
        println!("ground truth: {} streams DISAGREE, first: {}", wrong.len(), wrong[0]);
    }
    println!("total {:.1} s", t0.elapsed().as_secs_f64());
}
