//! `--siblings K`: the chat load as sibling bursts (parallel sampling, agent fan-out, retries).
//!
//! `--requests` is cut into groups of K; group `g` is one new prompt
//! ([`Workload::sibling_body`]) sent K times at once by K threads released together by a
//! barrier, so a group's sends land within a few milliseconds (the report gives the largest
//! gap seen), before any engine's KV events for the prompt exist. `--clients` groups run at a
//! time. A group counts when all K are served; its siblings on its most used instance add to
//! [`ChatStats::siblings_together`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use reqwest::blocking::Client;

use super::super::BenchError;
use super::flags::ChatOptions;
use super::load::{http_client, one, Answer, ChatStats, Targets, Workload};

/// Runs the sibling groups until every group is taken or `o.duration` passes.
pub fn run_groups(
    o: &ChatOptions,
    work: &Workload,
    targets: &Targets,
) -> Result<ChatStats, BenchError> {
    let next = AtomicU64::new(0);
    let groups = (o.requests / u64::from(o.siblings)).max(1);
    let deadline = Instant::now() + o.duration;
    let client = http_client()?;
    let start = Instant::now();
    let mut stats = thread::scope(|scope| {
        let handles: Vec<_> = (0..o.clients)
            .map(|_| {
                let (client, next) = (client.clone(), &next);
                scope.spawn(move || {
                    let mut stats = ChatStats::default();
                    loop {
                        let g = next.fetch_add(1, Ordering::Relaxed);
                        if g >= groups || Instant::now() >= deadline {
                            return Ok::<_, BenchError>(stats);
                        }
                        stats.merge(group(&client, o, work, targets, g)?);
                    }
                })
            })
            .collect();
        let mut stats = ChatStats::default();
        for handle in handles {
            stats.merge(handle.join().map_err(|_| BenchError::Panicked("a sibling client"))??);
        }
        Ok::<_, BenchError>(stats)
    })?;
    stats.latencies.sort();
    stats.ttft.sort();
    stats.wall = start.elapsed();
    Ok(stats)
}

/// Sends group `g`'s K siblings at once.
fn group(
    client: &Client,
    o: &ChatOptions,
    work: &Workload,
    targets: &Targets,
    g: u64,
) -> Result<ChatStats, BenchError> {
    let k = u64::from(o.siblings);
    let barrier = Barrier::new(o.siblings as usize);
    let body = work.sibling_body(g);
    type Sent = (Instant, Result<(Answer, Duration), String>, String);
    let sent: Vec<Sent> = thread::scope(|scope| {
        let handles: Vec<_> = (0..k)
            .map(|i| {
                let (client, barrier, body) = (client.clone(), &barrier, body.clone());
                let addr = &targets.addrs[((g * k + i) % targets.addrs.len() as u64) as usize];
                scope.spawn(move || {
                    barrier.wait();
                    let t0 = Instant::now();
                    let answer = one(&client, addr, body, o.stream);
                    (t0, answer.map(|a| (a, t0.elapsed())), addr.clone())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| BenchError::Panicked("a sibling")))
            .collect::<Result<Vec<Sent>, BenchError>>()
    })?;
    let mut stats = ChatStats::default();
    let mut on: BTreeMap<String, u64> = BTreeMap::new();
    let first = sent.iter().map(|s| s.0).min();
    let last = sent.iter().map(|s| s.0).max();
    for (t0, answer, addr) in sent {
        match answer {
            Ok((a, latency)) => {
                stats.latencies.push(latency);
                stats.ttft.push(a.first.map_or(latency, |f| f - t0));
                stats.prompt_tokens += a.prompt_tokens;
                stats.cached_tokens += a.cached_tokens;
                let instance = if targets.direct { addr } else { a.instance };
                *stats.instances.entry(instance.clone()).or_default() += 1;
                *on.entry(instance).or_default() += 1;
            }
            Err(e) => *stats.errors.entry(e).or_default() += 1,
        }
    }
    if on.values().sum::<u64>() == k {
        stats.sibling_groups = 1;
        stats.siblings_together = on.values().copied().max().unwrap_or(0);
    }
    stats.sibling_spread = last.zip(first).map(|(l, f)| l - f).unwrap_or_default();
    Ok(stats)
}
