//! End-to-end load of the running service (no criterion; `harness = false`): simulated engines
//! publish over real ZeroMQ into a real `kvdir_actors::Service` with 128 static streams, while
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
//! Run: `cargo bench -p kvdir-actors --bench service_load`. `RUST_LOG` filters the service's
//! logs (default `warn`, on stderr).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kvdir::config::{parse_config_file, Flags};
use kvdir::query::QueryResponse;
use kvdir_actors::Service;
use kvdir_sim::cache::CacheConfig;
use kvdir_sim::workload::{Workload, WorkloadConfig};
use kvdir_sim::{CacheEvent, CacheModel, EngineConfig, SimEngine};
use serde_json::{json, Value};

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

/// One request on a fresh connection (`kvdir_sim::http::request`); returns status and body.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let text = std::str::from_utf8(body).expect("request bodies are JSON text");
    let body = (!body.is_empty()).then_some(text);
    let timeout = Duration::from_secs(10);
    let r = kvdir_sim::http::request(&addr.to_string(), method, path, &[], body, timeout)?;
    Ok((r.status, r.body.into_bytes()))
}

fn query_body(tokens: &[i32]) -> Vec<u8> {
    json!({ "token_ids": tokens }).to_string().into_bytes()
}

fn query(addr: SocketAddr, body: &[u8]) -> QueryResponse {
    let (status, body) = http(addr, "POST", "/v1/internal/kv-cache/query", body).expect("query");
    assert_eq!(status, 200, "query failed: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).expect("a query response")
}

fn streams_report(addr: SocketAddr) -> Vec<Value> {
    let (status, body) = http(addr, "GET", "/v1/internal/streams", b"").expect("streams");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).expect("streams JSON");
    v["streams"].as_array().cloned().unwrap_or_default()
}

/// Stream index of a query entry.
fn stream_of(instance: &str, rank: u32) -> usize {
    let e: usize = instance.trim_start_matches("eng-").parse().expect("engine name");
    e * DP as usize + rank as usize
}

/// Streams not yet synchronized at `expected` (`None`: no batch published yet).
fn lagging(addr: SocketAddr, expected: &[Option<u64>]) -> Vec<String> {
    let r = query(addr, &query_body(&[]));
    assert_eq!(r.matches.len(), STREAMS, "every stream answers");
    r.matches
        .iter()
        .filter_map(|m| {
            let want = expected[stream_of(&m.instance_name, m.dp_rank)];
            (!m.synchronized || m.sequence != want).then(|| {
                format!(
                    "{}/{}: synchronized {} sequence {:?} want {:?} error {:?}",
                    m.instance_name, m.dp_rank, m.synchronized, m.sequence, want, m.error
                )
            })
        })
        .collect()
}

/// Polls until every stream is at `expected`; returns the time since `since` or the laggards.
fn wait_for(
    addr: SocketAddr,
    expected: &[Option<u64>],
    since: Instant,
) -> Result<Duration, Vec<String>> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let lag = lagging(addr, expected);
        if lag.is_empty() {
            return Ok(since.elapsed());
        }
        if Instant::now() >= deadline {
            return Err(lag);
        }
        thread::sleep(POLL);
    }
}

/// Latencies of one query phase.
#[derive(Default)]
struct Latencies {
    times: Vec<Duration>,
    errors: u64,
    late: u64,
    wall: Duration,
}

impl Latencies {
    fn merge(&mut self, other: Latencies) {
        self.times.extend(other.times);
        self.errors += other.errors;
        self.late += other.late;
        self.wall = self.wall.max(other.wall);
    }

    fn pct(&self, p: f64) -> Duration {
        if self.times.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * self.times.len() as f64).ceil() as usize;
        self.times[rank.clamp(1, self.times.len()) - 1]
    }

    fn qps(&self) -> f64 {
        self.times.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// One client: a query every `QUERY_INTERVAL` until `stop`, latency from connect to the last
/// response byte.
fn query_client(
    addr: SocketAddr,
    bodies: &[Vec<u8>],
    client: usize,
    stop: &AtomicBool,
) -> Latencies {
    let mut lat = Latencies::default();
    let start = Instant::now();
    let mut next = start + QUERY_INTERVAL.mul_f64(client as f64 / QUERY_CLIENTS as f64);
    let mut k = client;
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        } else if now - next > QUERY_INTERVAL {
            lat.late += 1;
            next = now;
        }
        next += QUERY_INTERVAL;
        let body = &bodies[k % bodies.len()];
        k += QUERY_CLIENTS;
        let t0 = Instant::now();
        match http(addr, "POST", "/v1/internal/kv-cache/query", body) {
            Ok((200, b)) if !b.is_empty() => lat.times.push(t0.elapsed()),
            _ => lat.errors += 1,
        }
    }
    lat.wall = start.elapsed();
    lat
}

/// Runs `during` while the query clients run; the clients stop when it returns.
fn with_queries<T>(
    addr: SocketAddr,
    bodies: &[Vec<u8>],
    during: impl FnOnce() -> T,
) -> (T, Latencies) {
    let stop = AtomicBool::new(false);
    thread::scope(|sc| {
        let clients: Vec<_> = (0..QUERY_CLIENTS)
            .map(|i| {
                let stop = &stop;
                let builder = thread::Builder::new().name(format!("query-client-{i}"));
                builder.spawn_scoped(sc, move || query_client(addr, bodies, i, stop))
            })
            .collect();
        let out = during();
        stop.store(true, Ordering::Release);
        let mut all = Latencies::default();
        for c in clients {
            all.merge(c.expect("spawn query client").join().expect("query client"));
        }
        all.times.sort();
        (out, all)
    })
}

/// Query prompts: driver 0's first requests (they share the system prompts every stream caches),
/// cut to `QUERY_TOKENS`.
fn query_bodies() -> Vec<Vec<u8>> {
    let mut w = workload(0);
    (0..QUERY_POOL)
        .map(|_| {
            let t = w.next_request().tokens;
            query_body(&t[..t.len().min(QUERY_TOKENS)])
        })
        .collect()
}

/// CPU seconds (user + system) of the whole process, from `/proc/self/stat` (USER_HZ = 100;
/// exited threads included).
fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> =
        stat.rfind(')').map_or(Vec::new(), |close| stat[close + 1..].split_whitespace().collect());
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// CPU seconds a thread has run, from the first field of its `schedstat` (nanoseconds, exact;
/// the tick-sampled times in `task/*/stat` miss much of what short-sleeping threads use).
fn thread_cpu(task: &std::path::Path) -> f64 {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()))
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// The thread group a thread name belongs to.
fn thread_group(name: &str) -> &'static str {
    [
        ("sim-", "engine rank threads"),
        ("kvdir-", "stream worker threads"),
        // Index and router arbiters and the HTTP workers are all `actix-rt|system:0|arbiter:N`.
        ("actix-rt", "actix threads (index, router, HTTP workers)"),
        ("actix-server", "HTTP acceptor"),
        ("query-client", "query clients"),
        // The runtime thread of the shared blocking client behind `http` does the clients' I/O.
        ("reqwest-", "query clients"),
        ("driver-", "drivers"),
    ]
    .iter()
    .find(|(prefix, _)| name.starts_with(prefix))
    // libzmq's I/O threads keep the process name.
    .map_or("other (main, ZeroMQ I/O)", |(_, group)| group)
}

/// CPU seconds of the live threads by group, and of the whole process (exited threads too).
#[derive(Default)]
struct Cpu {
    groups: BTreeMap<&'static str, f64>,
    process: f64,
}

impl Cpu {
    fn now() -> Cpu {
        let mut cpu = Cpu::default();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                *cpu.groups.entry(thread_group(name.trim())).or_default() +=
                    thread_cpu(&task.path());
            }
        }
        cpu.process = process_cpu();
        cpu
    }

    /// What was used since `before`, by groups alive at the end (`extra` adds exited ones).
    fn since(&self, before: &Cpu, extra: &[(&'static str, f64)]) -> Cpu {
        let mut groups: BTreeMap<&'static str, f64> = self
            .groups
            .iter()
            .map(|(g, s)| (*g, s - before.groups.get(g).copied().unwrap_or(0.0)))
            .collect();
        for (g, s) in extra {
            *groups.entry(g).or_default() += s;
        }
        Cpu { groups, process: self.process - before.process }
    }

    fn print(&self, label: &str, wall: Duration) {
        let parts: Vec<String> = self
            .groups
            .iter()
            .filter(|(_, s)| **s >= 0.005)
            .map(|(g, s)| format!("{g} {s:.2}"))
            .collect();
        println!(
            "CPU s {label} ({:.2} s wall, {:.2} cores busy in this process): {}",
            wall.as_secs_f64(),
            self.process / wall.as_secs_f64(),
            parts.join(", ")
        );
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.trim().to_string()).unwrap_or_default()
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn print_rates(label: &str, batches: u64, c: &Carried, time: Duration) {
    let t = time.as_secs_f64();
    println!(
        "{label:<44} {batches:>7} batches {:>9} blocks ({} stored, {} host copies, {} removed), \
         {:.2} s: {:>8.0} batches/s {:>10.0} blocks/s {:>8.0} events/s",
        c.blocks(),
        c.stored_blocks,
        c.host_copies,
        c.removed_blocks,
        t,
        batches as f64 / t,
        c.blocks() as f64 / t,
        c.events as f64 / t,
    );
}

fn print_latencies(label: &str, l: &Latencies) {
    println!(
        "{label:<44} {:>6} queries {:>6.0} q/s  p50 {:>8.0} µs  p99 {:>8.0} µs  max {:>8.0} µs  \
         errors {} late {}",
        l.times.len(),
        l.qps(),
        us(l.pct(50.0)),
        us(l.pct(99.0)),
        us(l.times.last().copied().unwrap_or_default()),
        l.errors,
        l.late,
    );
}

/// Sums the numeric counters of the streams report and lists what is not healthy.
fn print_report(streams: &[Value]) {
    let counters = [
        "messages",
        "decode_errors",
        "gaps",
        "recoveries",
        "snapshot_failures",
        "dropped_batches",
        "skipped_events",
        "restarts",
    ];
    let sums: Vec<String> = counters
        .iter()
        .map(|k| format!("{k} {}", streams.iter().filter_map(|s| s[k].as_u64()).sum::<u64>()))
        .collect();
    println!("streams report, summed over {} streams: {}", streams.len(), sums.join(", "));
    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    let mut faults: BTreeMap<String, usize> = BTreeMap::new();
    for s in streams {
        *phases.entry(s["phase"].as_str().unwrap_or("?").to_string()).or_default() += 1;
        if let Some(f) = s["last_fault"].as_str() {
            *faults.entry(f.to_string()).or_default() += 1;
        }
        let bad = ["gaps", "dropped_batches", "decode_errors", "restarts"]
            .iter()
            .any(|k| s[*k].as_u64().unwrap_or(0) > 0)
            || s["recoveries"].as_u64().unwrap_or(0) != 1;
        if bad {
            println!("  unhealthy stream: {s}");
        }
    }
    println!("phases: {phases:?}; last faults: {faults:?}");
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
