//! A query and a route over 4,096 streams, in one process (no HTTP, no criterion): what a
//! large fleet's read costs kvdir, apart from the network and the machine's other load.
//!
//! Setup: 1,024 instances x 4 DP ranks = 4,096 synchronized streams (32 shared indexes of 128),
//! block size 128. Each stream holds one of 4 system prompts (8 blocks), a conversation of 24
//! blocks after it and 32 blocks of its own, and 3 sessions of a random system prompt and 8
//! blocks (as `kvdir-bench`'s engines, whose 4 sessions a stream pick their system prompts at
//! random): 112 blocks, 458,752 in all. The router knows the 1,024 instances (DEFAULT, active,
//! idle, their processes those of the streams). Prompts are 256 blocks: system prompt 0 and
//! random blocks (`shared`: rank 0 of every instance and 58 % of the others hold its first 8
//! blocks, about 2,800 streams and every rank of about 200 instances), or one stream's
//! conversation and random blocks (`deep`: one stream holds 32).
//!
//! Cases, each timed `TIMED` times, one call at a time (p50 / p99 / max, and the mean CPU time
//! of a call, which a loaded machine inflates less than the wall time):
//! - `query`: `Directory::query_json_in`, the query endpoint's work: the compact answer
//!   (past 128 streams) and, with `"list": "all"`, the answer of every stream;
//! - `route`: `Directory::read_route`, the router's decision (on the caller's thread, under the
//!   router's lock, as the route handler decides) and the answer's JSON: compact and, with
//!   `"list": "all"`, every candidate and stream; under CAR, then (`ttft`) under TTFT.
//!
//! `cargo bench -p kvdir-service --bench fleet_query` (about a minute);
//! `FLEET_QUERY_CASE="route shared compact"` runs that case alone, `FLEET_QUERY_TIMED=N` times
//! it N times (under `valgrind --tool=callgrind`, the difference of two N is a call's
//! instructions, which a busy machine does not change).

#[path = "../../benches/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use actix::prelude::*;
use common::{percentile, Rng, BLOCK_SIZE};
use kvdir::car::{Candidate, DpRouting, Policy, RouteParams};
use kvdir::index::{IndexConfig, StreamLabel, StreamWriter};
use kvdir::query::{ListMode, QueryScope};
use kvdir::registry::{Identity, InstanceState, InstanceType, LoadMetrics};
use kvdir::wire::{Batch, EngineHash, Tier};
use kvdir_service::directory::Directory;
use kvdir_service::router::{InstanceInfo, RouteRequest, RouterActor, SetCandidates};

/// Instances and their DP ranks.
const INSTANCES: usize = 1024;
const DP: usize = 4;
/// Blocks per prompt.
const PROMPT_BLOCKS: usize = 256;
/// Calls timed per case.
const TIMED: usize = 2000;
/// Sessions of a random system prompt each stream also holds.
const SESSIONS: usize = 3;

/// What every stream holds: system prompt `s % 4`, its conversation, its own blocks.
struct Contents {
    system: Vec<Vec<i32>>,
    conversations: Vec<Vec<i32>>,
}

fn contents(rng: &mut Rng) -> Contents {
    let b = BLOCK_SIZE as usize;
    let system = (0..4).map(|_| rng.tokens(8 * b)).collect();
    let conversations = (0..INSTANCES * DP).map(|_| rng.tokens(24 * b)).collect();
    Contents { system, conversations }
}

/// Stream `s`'s snapshot: the chain system prompt + conversation, and 32 blocks apart.
fn snapshot(c: &Contents, s: usize, rng: &mut Rng) -> Batch {
    let mut b = Batch::default();
    let chain: Vec<i32> = [&c.system[s % 4][..], &c.conversations[s][..]].concat();
    let base = (s as u128) << 32;
    let hashes: Vec<EngineHash> = (0..32).map(|i| EngineHash(base + i)).collect();
    b.push_stored(&hashes, None, &chain, BLOCK_SIZE, Tier::Device);
    let own: Vec<EngineHash> = (32..64).map(|i| EngineHash(base + i)).collect();
    b.push_stored(&own, None, &rng.tokens(32 * BLOCK_SIZE as usize), BLOCK_SIZE, Tier::Device);
    for k in 0..SESSIONS as u128 {
        let system = &c.system[rng.below(4) as usize];
        let chain = [&system[..], &rng.tokens(8 * BLOCK_SIZE as usize)[..]].concat();
        let hashes: Vec<EngineHash> = (0..16).map(|i| EngineHash(base + 64 + 16 * k + i)).collect();
        b.push_stored(&hashes, None, &chain, BLOCK_SIZE, Tier::Device);
    }
    b
}

fn identity(instance: usize) -> Identity {
    Identity { incarnation_id: Some(format!("p{instance}")), register_ts_ms: None }
}

fn fleet(c: &Contents, rng: &mut Rng) -> (Directory, Vec<StreamWriter>) {
    let directory = Directory::default();
    let writers = (0..INSTANCES * DP)
        .map(|s| {
            let label = StreamLabel {
                instance_name: format!("engine-{:04}", s / DP),
                dp_rank: (s % DP) as u32,
                identity: Some(identity(s / DP)),
                ..StreamLabel::default()
            };
            let config = IndexConfig { block_size: BLOCK_SIZE, ..IndexConfig::default() };
            let mut w = directory.add_stream(config, label).expect("room");
            w.load_snapshot(&snapshot(c, s, rng), 0).expect("the snapshot applies");
            w.publish();
            w
        })
        .collect();
    (directory, writers)
}

fn instances() -> Vec<InstanceInfo> {
    (0..INSTANCES)
        .map(|i| InstanceInfo {
            candidate: Candidate {
                name: format!("engine-{i:04}"),
                kind: InstanceType::Default,
                mix_acting_prefill: false,
                state: InstanceState::Active,
                load: Some(LoadMetrics {
                    waiting_requests_num: (i % 3) as u64,
                    gpu_cache_usage_perc: 0.5,
                    prefill_tokens_per_s: None,
                }),
                dp_size: DP as u32,
                ttft_profile: Vec::new(),
                tpot_profile: Vec::new(),
                hits: Vec::new(),
                queued: Default::default(),
                dp_routing: DpRouting::Engine,
                rank_loads: Vec::new(),
            },
            identity: identity(i),
            load_reports: 1,
            url: None,
        })
        .collect()
}

/// This thread's CPU time so far (`/proc/thread-self/schedstat`: nanoseconds on a CPU).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = stat.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
    Duration::from_nanos(ns)
}

/// Times `f` `TIMED` times and prints p50 / p99 / max, the mean CPU time of a call (what the
/// machine's other load does not inflate) and the answer's size (only the cases whose label
/// contains `$FLEET_QUERY_CASE`, when set: one case under `perf`).
fn time(label: &str, mut f: impl FnMut() -> usize) {
    if std::env::var("FLEET_QUERY_CASE").is_ok_and(|c| !label.contains(&c)) {
        return;
    }
    let timed = std::env::var("FLEET_QUERY_TIMED").ok().and_then(|v| v.parse().ok());
    let timed: usize = timed.unwrap_or(TIMED);
    let mut bytes = 0;
    let cpu = thread_cpu();
    let mut times: Vec<Duration> = (0..timed)
        .map(|_| {
            let start = Instant::now();
            bytes = f();
            start.elapsed()
        })
        .collect();
    let cpu = (thread_cpu() - cpu) / timed as u32;
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{label:<22} p50 {:>7.1} µs  p99 {:>7.1} µs  max {:>8.1} µs  cpu {:>7.1} µs  answer {:>7} B",
        us(percentile(&times, 50.0)),
        us(percentile(&times, 99.0)),
        us(times[times.len() - 1]),
        us(cpu),
        bytes
    );
}

fn main() {
    let mut rng = Rng::new(7);
    let c = contents(&mut rng);
    let built = Instant::now();
    let (directory, _writers) = fleet(&c, &mut rng);
    println!("{} streams in {:.1} s", INSTANCES * DP, built.elapsed().as_secs_f64());
    let tail = |head: &[i32], rng: &mut Rng| {
        let rest = PROMPT_BLOCKS * BLOCK_SIZE as usize - head.len();
        [head, &rng.tokens(rest)[..]].concat()
    };
    let shared = tail(&c.system[0], &mut rng);
    let deep = tail(&[&c.system[1][..], &c.conversations[5][..]].concat(), &mut rng);
    let all = QueryScope { list: ListMode::All, ..QueryScope::default() };
    let compact = QueryScope::default();
    let directory = std::sync::Arc::new(directory);
    for (name, prompt) in [("shared", &shared), ("deep", &deep)] {
        for (shape, scope) in [("compact", &compact), ("all", &all)] {
            time(&format!("query {name} {shape}"), || directory.query_json_in(prompt, scope).len());
        }
    }
    let sys = System::new();
    let ttft = RouteParams { policy: Policy::Ttft, ..RouteParams::default() };
    for (policy, params) in [("", RouteParams::default()), (" ttft", ttft)] {
        let actor = RouterActor::new(directory.clone(), params, Policy::Car);
        let router = actor.shared();
        sys.block_on(async {
            let r = actor.start();
            r.send(SetCandidates(instances())).await.expect("the router runs");
        });
        for (name, prompt) in [("shared", &shared), ("deep", &deep)] {
            for (shape, scope) in [("compact", &compact), ("all", &all)] {
                time(&format!("route {name} {shape}{policy}"), || {
                    let read = directory.read_route(prompt, scope);
                    let msg = RouteRequest { input_tokens: prompt.len(), read };
                    let routed = router.route(msg).0.expect("routed");
                    serde_json::to_vec(&routed).expect("JSON").len()
                });
            }
        }
    }
}
