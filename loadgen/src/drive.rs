//! The ingest side: `--drivers` threads send the shared-prefix workload
//! ([`kvdir_sim::workload`]) to the engines, each call publishing at most one live batch, at
//! `--rate` requests per second in all (or back to back) until the end of the load.
//!
//! Driver `t` owns the streams `s` with `s % drivers == t` and has its own generator, seeded
//! `seed + t`, with [`SESSIONS_PER_STREAM`] sessions per stream; a session always goes to the
//! same stream, so its turns extend what that rank cached. The workload scales with the block
//! size like `kvdir-sim`'s: 4 system prompts of 8 blocks, turns of a quarter block to 4 blocks.
//! Client prompts ([`prompts`]) are the first requests of the same generators, so they share
//! their prefixes with what the engines cache; `--query_blocks N` cuts each to N blocks or
//! extends it with random ids, so a long prompt matches only its cached start.
//!
//! A driver sends in bursts: every [`TICK`] (or, unpaced, [`MAX_BURST`] at a time) it queues the
//! requests that are due ([`kvdir_sim::SimEngine::process_queued`]) and then waits for all of them,
//! so one wake-up of a rank thread serves many requests. At 10,000 batches/s a request at a
//! time cost the tool more CPU in thread wake-ups than in building and sending batches.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use super::flags::BenchOptions;
use super::fleet::Fleet;
use super::BenchError;
use kvdir_sim::workload::{Workload, WorkloadConfig};
use kvdir_sim::SimError;

/// Workload sessions per stream.
pub const SESSIONS_PER_STREAM: usize = 4;
/// Client prompts taken from each driver's generator.
const PROMPTS_PER_DRIVER: usize = 32;
/// How often registered engines report their load during the run.
const LOAD_EVERY: Duration = Duration::from_secs(1);
/// A paced driver wakes at most this often and sends every request due since.
const TICK: Duration = Duration::from_millis(1);
/// Most requests a driver queues before waiting for them.
const MAX_BURST: usize = 64;

fn driver_streams(streams: usize, drivers: usize, t: usize) -> Vec<usize> {
    (0..streams).filter(|s| s % drivers == t).collect()
}

fn workload(o: &BenchOptions, t: usize, streams: usize) -> Workload {
    let block = o.block_size as usize;
    Workload::new(WorkloadConfig {
        seed: o.seed.wrapping_add(t as u64),
        sessions: SESSIONS_PER_STREAM * streams.max(1),
        system_prompt_tokens: 8 * block,
        turn_tokens: (block / 4).max(1)..=4 * block,
        ..WorkloadConfig::default()
    })
}

/// Query and route bodies `{"token_ids": [...]}`: the first requests of every driver.
pub fn prompts(o: &BenchOptions, streams: usize) -> Vec<Vec<u8>> {
    let drivers = (o.drivers as usize).min(streams).max(1);
    let mut bodies = Vec::new();
    for t in 0..drivers {
        let mut w = workload(o, t, driver_streams(streams, drivers, t).len());
        for k in 0..PROMPTS_PER_DRIVER {
            let mut tokens = w.next_request().tokens;
            if o.query_blocks > 0 {
                let salt = (t * PROMPTS_PER_DRIVER + k) as u64;
                sized(&mut tokens, o.query_blocks * o.block_size as usize, salt);
            }
            bodies.push(json!({ "token_ids": tokens }).to_string().into_bytes());
        }
    }
    bodies
}

/// Cuts `tokens` to `len`, or extends them to it with ids in 0..150,000 drawn from `salt` and
/// the position, the same on every run.
fn sized(tokens: &mut Vec<i32>, len: usize, salt: u64) {
    tokens.truncate(len);
    let random = |i: usize| {
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(&(i as u64).to_le_bytes(), salt);
        (h % 150_000) as i32
    };
    tokens.extend((tokens.len()..len).map(random));
}

/// Runs the drivers until `end`; meanwhile this thread reports the engines' load in etcd
/// mode. Returns the requests sent.
pub fn run(fleet: &Fleet, o: &BenchOptions, end: Instant) -> Result<u64, BenchError> {
    let ranks = fleet.ranks();
    let drivers = (o.drivers as usize).min(ranks.len()).max(1);
    let interval = o.rate.map(|r| Duration::from_secs_f64(drivers as f64 / r));
    thread::scope(|scope| {
        let handles: Vec<_> = (0..drivers)
            .map(|t| {
                let owned: Vec<(usize, u32)> =
                    driver_streams(ranks.len(), drivers, t).into_iter().map(|s| ranks[s]).collect();
                let builder = thread::Builder::new().name(format!("bench-driver-{t}"));
                builder.spawn_scoped(scope, move || {
                    if o.engines_nice > 0 {
                        // Lowered like the engines' other threads (`nice.rs`); best effort.
                        let _ = crate::nice::lower_this_thread(o.engines_nice);
                    }
                    let w = workload(o, t, owned.len());
                    drive(fleet, &owned, w, interval, end)
                })
            })
            .collect();
        let loads = report_loads(fleet, end);
        let mut requests = 0;
        for handle in handles {
            let handle = handle.map_err(|e| BenchError::Kvdir(format!("spawn a driver: {e}")))?;
            requests += handle.join().map_err(|_| BenchError::Panicked("a driver"))??;
        }
        loads?;
        Ok(requests)
    })
}

/// One driver: bursts of requests to its streams, paced by `interval` when given.
fn drive(
    fleet: &Fleet,
    streams: &[(usize, u32)],
    mut workload: Workload,
    interval: Option<Duration>,
    end: Instant,
) -> Result<u64, SimError> {
    let mut next = Instant::now();
    let mut requests = 0;
    let mut pending = Vec::with_capacity(MAX_BURST);
    while Instant::now() < end {
        let due = match interval {
            None => MAX_BURST,
            Some(interval) => {
                let now = Instant::now();
                if next > now {
                    thread::sleep((next - now).max(TICK).min(end - now));
                    continue;
                }
                // Behind schedule by more than a burst: do not make up for lost time.
                let burst = interval * MAX_BURST as u32;
                let base = next.max(now.checked_sub(burst).unwrap_or(now));
                let late = (now - base).as_secs_f64() / interval.as_secs_f64();
                let due = (late as usize + 1).min(MAX_BURST);
                next = base + interval * due as u32;
                due
            }
        };
        for _ in 0..due {
            let request = workload.next_request();
            let (e, rank) = streams[request.session % streams.len()];
            pending.push(fleet.engines[e].process_queued(rank, &request.tokens)?);
        }
        for answer in pending.drain(..) {
            answer.wait()?;
            requests += 1;
        }
    }
    Ok(requests)
}

/// Sets every registered engine's load every [`LOAD_EVERY`] until `end`.
fn report_loads(fleet: &Fleet, end: Instant) -> Result<(), SimError> {
    loop {
        fleet.report_load()?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        thread::sleep(LOAD_EVERY.min(end - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drivers_split_the_streams_and_prompts_share_the_workload() {
        assert_eq!(driver_streams(5, 2, 0), vec![0, 2, 4]);
        assert_eq!(driver_streams(5, 2, 1), vec![1, 3]);
        let o = BenchOptions { block_size: 4, drivers: 2, ..BenchOptions::default() };
        let bodies = prompts(&o, 5);
        assert_eq!(bodies.len(), 2 * PROMPTS_PER_DRIVER);
        let first = workload(&o, 0, 3).next_request().tokens;
        assert_eq!(bodies[0], json!({ "token_ids": first }).to_string().into_bytes());
        assert!(first.len() >= 8 * 4, "a prompt starts with a system prompt of 8 blocks");
        let long = BenchOptions { query_blocks: 256, ..o };
        let bodies = prompts(&long, 5);
        let tokens = |b: &[u8]| -> Vec<i32> {
            let v: serde_json::Value = serde_json::from_slice(b).unwrap();
            serde_json::from_value(v["token_ids"].clone()).unwrap()
        };
        let (a, b) = (tokens(&bodies[0]), tokens(&bodies[1]));
        assert_eq!((a.len(), b.len()), (256 * 4, 256 * 4));
        assert_eq!(a[..first.len()], first[..], "the workload's prompt, then random ids");
        assert_ne!(a[first.len()..], b[first.len()..], "each prompt's own tail");
    }
}
