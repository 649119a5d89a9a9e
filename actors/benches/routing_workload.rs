//! Routing workload: RR vs CAR (lambda 0.5) vs CAR (lambda 1) on a shared-prefix trace.
//!
//! Not a criterion bench and not a timed test: it replays one deterministic trace through the
//! real routing path and counts what each policy's decisions were worth.
//!
//! Setup, per policy: a private etcd (one for the whole run, [`EtcdServer::private`]), its own
//! etcd namespace, four fresh simulated DEFAULT engines (one DP rank, block size 16, Device
//! 256 blocks + Host 256 blocks, so caches evict) registered with LOADMETRICS, and a kvdir
//! [`Service`] with discovery and `--load_balance_policy` set to the policy. Everything binds
//! 127.0.0.1 only.
//!
//! The trace comes from [`Workload`] with the same seed for every policy: 4 system prompts of 512
//! tokens, 16 multi-turn sessions, turns of 32..=256 tokens (user turn and answer each), 600
//! requests. For each request:
//!
//! 1. `POST /v1/internal/route` with its tokens; the chosen prefill instance takes it;
//! 2. the decision's prefix-hit tokens are the chosen engine's TRUE resident prefix at that
//!    moment (`SimEngine::resident`, Device + Host-only, complete blocks), read before the
//!    engine processes the request; the best resident prefix over all four engines is also
//!    recorded (what an oracle could have had), and kvdir's own hit figure for the chosen engine
//!    is checked against the truth;
//! 3. the chosen engine processes the request (its cache changes and it publishes events);
//! 4. queue model: every engine has `waiting`, +1 per request routed to it; after every
//!    [`STEP_REQUESTS`] requests (one trace step) every engine serves [`DRAIN_PER_STEP`] request.
//!    The fleet serves 4 requests per 3 arriving, so round robin keeps queues at 0..2 while a
//!    policy that sends everything to one engine grows its queue by 2 per step;
//! 5. every engine whose load changed publishes it with `Registration::set_load(waiting,
//!    usage)`, usage being Device blocks / Device capacity; then the bench polls
//!    `GET /v1/internal/instances` until kvdir reports every engine's current load, and the query
//!    endpoint until the chosen engine's stream has applied its last batch (sequence =
//!    `next_sequence() - 1`). Both polls have a deadline; nothing sleeps for a fixed time. So
//!    every decision sees current load and an up-to-date directory.
//!
//! Reported per policy: input tokens, prefix-hit tokens and hit rate, hit tokens against the
//! best available, requests per engine and their balance (max / mean), the queue lengths the
//! router saw (max and mean over all engines and decisions, and the mean queue a request
//! joined), and the hit tokens of each policy relative to RR's in the same run.
//!
//! Run: `cargo bench -p kvdir-service --bench routing_workload` (about 10 s; needs `etcd` on `PATH`, Debian
//! package `etcd-server`). Without `--bench` (as `cargo test --benches` runs it) it replays only
//! [`SMOKE_REQUESTS`] requests as a smoke test.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use kvdir::car::{Policy, RouteParams, Routed};
use kvdir::config::{parse_config_file, Flags};
use kvdir::query::QueryResponse;
use kvdir_service::Service;
use kvdir_sim::workload::{Request, Workload, WorkloadConfig};
use kvdir_sim::{EngineConfig, Registration, RegistrationOptions, SimEngine};
use kvdir_testkit::etcd::EtcdServer;
use kvdir_testkit::Patience;
use serde_json::{json, Value};

/// Engines per fleet.
const ENGINES: usize = 4;
/// Tokens per block.
const BLOCK_SIZE: u32 = 16;
/// Device tier capacity per engine, in blocks.
const DEVICE_BLOCKS: usize = 256;
/// Host tier capacity per engine, in blocks.
const HOST_BLOCKS: usize = 256;
/// Requests in the trace.
const REQUESTS: usize = 600;
/// Requests in the trace when run as a smoke test.
const SMOKE_REQUESTS: usize = 24;
/// Requests per trace step (the queue model's time unit).
const STEP_REQUESTS: usize = 3;
/// Requests every engine serves per trace step.
const DRAIN_PER_STEP: u64 = 1;
/// Seed of the trace.
const SEED: u64 = 42;
/// Longest wait for kvdir to show a change.
const DEADLINE: Duration = Duration::from_secs(20);
/// Time between two polls of kvdir.
const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// Timeout of one HTTP request.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// The trace's shape.
fn workload_config() -> WorkloadConfig {
    WorkloadConfig {
        seed: SEED,
        system_prompts: 4,
        system_prompt_tokens: 512,
        sessions: 16,
        turn_tokens: 32..=256,
        ..WorkloadConfig::default()
    }
}

/// One HTTP exchange with kvdir; `Err` for a transport error or a status other than 200.
fn call(addr: &str, method: &str, path: &str, body: Option<&str>) -> Result<String, String> {
    let r = kvdir_sim::http::request(addr, method, path, &[], body, HTTP_TIMEOUT)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    if r.status == 200 {
        Ok(r.body)
    } else {
        Err(format!("{method} {path}: {} {}", r.status, r.body))
    }
}

/// [`Patience::eventually`] with the bench's deadline and fast polling (setup waits sit between
/// measured phases).
fn eventually<T>(what: &str, probe: impl FnMut() -> Result<T, String>) -> T {
    Patience::new(DEADLINE).polling_every(POLL_INTERVAL).eventually(what, probe)
}

/// Hands out HTTP ports whose derived event (+10000) and snapshot (+30000) ports are free.
struct Ports(u16);

impl Ports {
    fn new() -> Ports {
        Ports(30_000 + (std::process::id() % 50) as u16 * 100)
    }

    /// Starts an engine on the next free port triple (retrying if a port is taken meanwhile).
    fn engine(&mut self) -> SimEngine {
        let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
        let mut last = String::from("no free port triple");
        while self.0 < 35_500 {
            let p = self.0;
            self.0 += 1;
            if !(free(p) && free(p + 10_000) && free(p + 30_000)) {
                continue;
            }
            let config = EngineConfig {
                http_port: p,
                block_size: BLOCK_SIZE,
                device_capacity_blocks: DEVICE_BLOCKS,
                host_capacity_blocks: HOST_BLOCKS,
                ..EngineConfig::default()
            };
            match SimEngine::start(config) {
                Ok(e) => return e,
                Err(e) => last = e.to_string(),
            }
        }
        panic!("cannot start a simulated engine: {last}");
    }
}

/// The load an engine publishes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Load {
    waiting: u64,
    usage: f64,
}

/// One policy's fleet: kvdir, four engines and their registrations (dropped in that order).
struct Fleet {
    _svc: Service,
    regs: Vec<Registration>,
    engines: Vec<SimEngine>,
    names: Vec<String>,
    addr: String,
}

impl Fleet {
    fn start(etcd: &EtcdServer, namespace: &str, route: RouteParams, ports: &mut Ports) -> Fleet {
        let config = json!({"discovery": {"enabled": true, "block_size": BLOCK_SIZE,
            "topic": "xllm-kv", "refresh_interval_ms": 100}});
        let directory = parse_config_file(&config.to_string()).expect("a valid discovery config");
        let flags = Flags {
            http_server_port: 0,
            server_host: "127.0.0.1".into(),
            etcd_addr: etcd.endpoint.clone(),
            etcd_namespace: namespace.into(),
            route,
            ..Flags::default()
        };
        let svc = Service::start(flags, Some(directory)).expect("kvdir starts");
        let addr = svc.http_addr().to_string();
        let engines: Vec<SimEngine> = (0..ENGINES).map(|_| ports.engine()).collect();
        let regs = engines
            .iter()
            .map(|e| {
                let opts = RegistrationOptions {
                    etcd: etcd.endpoint.clone(),
                    namespace: namespace.into(),
                    kind: 0,
                    write_loadmetrics: true,
                    ..RegistrationOptions::default()
                };
                Registration::start(e, opts).expect("the engine registers")
            })
            .collect();
        let names = engines.iter().map(SimEngine::instance_name).collect();
        let fleet = Fleet { _svc: svc, regs, engines, names, addr };
        let idle = vec![Load { waiting: 0, usage: 0.0 }; ENGINES];
        for (r, l) in fleet.regs.iter().zip(&idle) {
            r.set_load(l.waiting, l.usage);
        }
        fleet.wait_loads(&idle);
        eventually("every stream to be synchronized", || {
            let q = fleet.query(&[1; BLOCK_SIZE as usize])?;
            let synced = fleet
                .names
                .iter()
                .all(|n| q.matches.iter().any(|m| &m.instance_name == n && m.synchronized));
            if synced {
                Ok(())
            } else {
                Err(format!("{:?}", q.matches))
            }
        });
        fleet
    }

    fn route(&self, tokens: &[i32]) -> Routed {
        let body = json!({ "token_ids": tokens }).to_string();
        let answer = call(&self.addr, "POST", "/v1/internal/route", Some(&body))
            .unwrap_or_else(|e| panic!("routing failed: {e}"));
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"))
    }

    fn query(&self, tokens: &[i32]) -> Result<QueryResponse, String> {
        let body = json!({ "token_ids": tokens }).to_string();
        let answer = call(&self.addr, "POST", "/v1/internal/kv-cache/query", Some(&body))?;
        serde_json::from_str(&answer).map_err(|e| format!("{e}: {answer}"))
    }

    /// Waits until kvdir reports every engine ACTIVE with its stream and exactly `loads`.
    fn wait_loads(&self, loads: &[Load]) {
        eventually("kvdir to report the current loads", || {
            let body = call(&self.addr, "GET", "/v1/internal/instances", None)?;
            let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            let list = v["instances"].as_array().ok_or_else(|| body.clone())?;
            for (name, load) in self.names.iter().zip(loads) {
                let i = list.iter().find(|i| i["name"] == name.as_str());
                let current = i.is_some_and(|i| {
                    i["state"] == "ACTIVE"
                        && i["streams"] == json!([0])
                        && i["waiting_requests_num"].as_u64() == Some(load.waiting)
                        && i["gpu_cache_usage_perc"]
                            .as_f64()
                            .is_some_and(|u| (u - load.usage).abs() < 1e-9)
                });
                if !current {
                    return Err(format!("{name}: want {load:?}, kvdir has {i:?}"));
                }
            }
            Ok(())
        });
    }

    /// Waits until kvdir's stream of engine `k` has applied the engine's last batch.
    fn wait_directory(&self, k: usize) {
        let next = self.engines[k].next_sequence(0).expect("the engine answers");
        let Some(last) = next.checked_sub(1) else { return };
        let name = &self.names[k];
        eventually("kvdir to apply the chosen engine's last batch", || {
            let q = self.query(&[1; BLOCK_SIZE as usize])?;
            let m = q.matches.iter().find(|m| &m.instance_name == name);
            match m {
                Some(m) if m.synchronized && m.sequence.is_some_and(|s| s >= last) => Ok(()),
                _ => Err(format!("want sequence {last}, kvdir has {m:?}")),
            }
        });
    }
}

/// What one policy's run measured.
#[derive(Debug, Default)]
struct Outcome {
    label: String,
    requests: usize,
    input_tokens: u64,
    hit_tokens: u64,
    best_hit_tokens: u64,
    directory_agreed: usize,
    per_engine: Vec<u64>,
    max_queue: u64,
    queue_sum: u64,
    queue_samples: u64,
    joined_queue_sum: u64,
    wall: Duration,
}

impl Outcome {
    fn hit_rate(&self) -> f64 {
        self.hit_tokens as f64 / self.input_tokens.max(1) as f64
    }

    fn balance(&self) -> f64 {
        let max = self.per_engine.iter().copied().max().unwrap_or(0) as f64;
        let mean = self.per_engine.iter().sum::<u64>() as f64 / self.per_engine.len() as f64;
        if mean > 0.0 {
            max / mean
        } else {
            0.0
        }
    }

    fn mean_queue(&self) -> f64 {
        self.queue_sum as f64 / self.queue_samples.max(1) as f64
    }

    fn mean_joined(&self) -> f64 {
        self.joined_queue_sum as f64 / self.requests.max(1) as f64
    }
}

/// Replays `trace` under `route` on a fresh fleet in `namespace`.
fn run(
    label: &str,
    route: RouteParams,
    namespace: &str,
    trace: &[Request],
    etcd: &EtcdServer,
    ports: &mut Ports,
) -> Outcome {
    let fleet = Fleet::start(etcd, namespace, route, ports);
    let started = Instant::now();
    let mut out =
        Outcome { label: label.into(), per_engine: vec![0; ENGINES], ..Outcome::default() };
    let mut loads = vec![Load { waiting: 0, usage: 0.0 }; ENGINES];
    for (i, req) in trace.iter().enumerate() {
        let tokens = &req.tokens;
        let decision = fleet.route(tokens);
        let k = fleet
            .names
            .iter()
            .position(|n| *n == decision.prefill)
            .unwrap_or_else(|| panic!("kvdir chose an unknown instance: {decision:?}"));
        let truth: Vec<(u64, u64)> = fleet
            .engines
            .iter()
            .map(|e| e.resident(0, tokens).expect("the engine answers"))
            .collect();
        let seen = decision
            .candidates
            .iter()
            .find(|c| c.name == decision.prefill)
            .and_then(|c| c.dp_hits.iter().find(|h| h.dp_rank == 0))
            .map(|h| (h.device_hit_tokens, h.host_only_hit_tokens));
        out.directory_agreed += usize::from(seen == Some(truth[k]));
        out.requests += 1;
        out.input_tokens += tokens.len() as u64;
        out.hit_tokens += truth[k].0 + truth[k].1;
        out.best_hit_tokens += truth.iter().map(|t| t.0 + t.1).max().unwrap_or(0);
        out.per_engine[k] += 1;
        for l in &loads {
            out.max_queue = out.max_queue.max(l.waiting);
            out.queue_sum += l.waiting;
            out.queue_samples += 1;
        }
        out.joined_queue_sum += loads[k].waiting;

        fleet.engines[k].process(0, tokens).expect("the engine processes the request");
        let mut next = loads.clone();
        next[k].waiting += 1;
        if (i + 1) % STEP_REQUESTS == 0 {
            for l in &mut next {
                l.waiting = l.waiting.saturating_sub(DRAIN_PER_STEP);
            }
        }
        let (device, _) = fleet.engines[k].counts(0).expect("the engine answers");
        next[k].usage = device as f64 / DEVICE_BLOCKS as f64;
        for ((reg, old), new) in fleet.regs.iter().zip(&loads).zip(&next) {
            if old != new {
                reg.set_load(new.waiting, new.usage);
            }
        }
        loads = next;
        fleet.wait_loads(&loads);
        fleet.wait_directory(k);
    }
    out.wall = started.elapsed();
    out
}

fn print_table(outcomes: &[Outcome]) {
    println!(
        "| policy | requests | input tokens | prefix-hit tokens | hit rate | of best available \
         | requests per engine | balance (max/mean) | max queue | mean queue | mean queue joined \
         | kvdir hits = truth | wall |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        let per: Vec<String> = o.per_engine.iter().map(u64::to_string).collect();
        println!(
            "| {} | {} | {} | {} | {:.1} % | {:.1} % | {} | {:.2} | {} | {:.2} | {:.2} | {}/{} | {:.1} s |",
            o.label,
            o.requests,
            o.input_tokens,
            o.hit_tokens,
            100.0 * o.hit_rate(),
            100.0 * o.hit_tokens as f64 / o.best_hit_tokens.max(1) as f64,
            per.join(" / "),
            o.balance(),
            o.max_queue,
            o.mean_queue(),
            o.mean_joined(),
            o.directory_agreed,
            o.requests,
            o.wall.as_secs_f64(),
        );
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let requests = if full { REQUESTS } else { SMOKE_REQUESTS };
    let cfg = workload_config();
    let mut workload = Workload::new(cfg.clone());
    let trace: Vec<Request> = (0..requests).map(|_| workload.next_request()).collect();
    println!(
        "routing_workload{}: {requests} requests (seed {}, {} system prompts of {} tokens, {} \
         sessions, turns of {:?} tokens, at most {} turns); {ENGINES} DEFAULT engines per policy, \
         block size {BLOCK_SIZE}, Device {DEVICE_BLOCKS} + Host {HOST_BLOCKS} blocks; queues +1 \
         per routed request, -{DRAIN_PER_STEP} per engine every {STEP_REQUESTS} requests",
        if full { "" } else { " (smoke run; pass --bench for the full trace)" },
        cfg.seed,
        cfg.system_prompts,
        cfg.system_prompt_tokens,
        cfg.sessions,
        cfg.turn_tokens,
        cfg.max_turns,
    );
    let etcd = EtcdServer::private();
    let mut ports = Ports::new();
    let policies = [
        ("RR", RouteParams { policy: Policy::Rr, ..RouteParams::default() }),
        ("CAR lambda 0.5", RouteParams { policy: Policy::Car, lambda: 0.5, ..Default::default() }),
        ("CAR lambda 1", RouteParams { policy: Policy::Car, lambda: 1.0, ..Default::default() }),
    ];
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for (n, (label, params)) in policies.into_iter().enumerate() {
        let o = run(label, params, &format!("bench-route-{n}"), &trace, &etcd, &mut ports);
        eprintln!("{label}: done in {:.1} s", o.wall.as_secs_f64());
        outcomes.push(o);
    }
    println!();
    print_table(&outcomes);
    println!();
    println!("ratios measured in this run (prefix-hit tokens / RR's):");
    let rr = outcomes[0].hit_tokens.max(1) as f64;
    for o in &outcomes {
        println!("  {}: {:.2}x", o.label, o.hit_tokens as f64 / rr);
    }
    println!("total wall time {:.1} s", started.elapsed().as_secs_f64());
}
