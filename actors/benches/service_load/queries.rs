//! The load's HTTP side: requests on fresh connections, waiting until every stream has caught
//! up, and the query clients with their latencies.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kvdir::query::QueryResponse;
use serde_json::{json, Value};

use crate::{
    workload, DEADLINE, DP, POLL, QUERY_CLIENTS, QUERY_INTERVAL, QUERY_POOL, QUERY_TOKENS, STREAMS,
};

/// One request on a fresh connection (`kvdir_sim::http::request`); returns status and body.
pub(crate) fn http(
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

pub(crate) fn query_body(tokens: &[i32]) -> Vec<u8> {
    json!({ "token_ids": tokens }).to_string().into_bytes()
}

pub(crate) fn query(addr: SocketAddr, body: &[u8]) -> QueryResponse {
    let (status, body) = http(addr, "POST", "/v1/internal/kv-cache/query", body).expect("query");
    assert_eq!(status, 200, "query failed: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).expect("a query response")
}

pub(crate) fn streams_report(addr: SocketAddr) -> Vec<Value> {
    let (status, body) = http(addr, "GET", "/v1/internal/streams", b"").expect("streams");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).expect("streams JSON");
    v["streams"].as_array().cloned().unwrap_or_default()
}

/// Stream index of a query entry.
pub(crate) fn stream_of(instance: &str, rank: u32) -> usize {
    let e: usize = instance.trim_start_matches("eng-").parse().expect("engine name");
    e * DP as usize + rank as usize
}

/// Streams not yet synchronized at `expected` (`None`: no batch published yet).
pub(crate) fn lagging(addr: SocketAddr, expected: &[Option<u64>]) -> Vec<String> {
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
pub(crate) fn wait_for(
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
pub(crate) struct Latencies {
    pub(crate) times: Vec<Duration>,
    pub(crate) errors: u64,
    pub(crate) late: u64,
    pub(crate) wall: Duration,
}

impl Latencies {
    pub(crate) fn merge(&mut self, other: Latencies) {
        self.times.extend(other.times);
        self.errors += other.errors;
        self.late += other.late;
        self.wall = self.wall.max(other.wall);
    }

    pub(crate) fn pct(&self, p: f64) -> Duration {
        if self.times.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * self.times.len() as f64).ceil() as usize;
        self.times[rank.clamp(1, self.times.len()) - 1]
    }

    pub(crate) fn qps(&self) -> f64 {
        self.times.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// One client: a query every `QUERY_INTERVAL` until `stop`, latency from connect to the last
/// response byte.
pub(crate) fn query_client(
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
pub(crate) fn with_queries<T>(
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
pub(crate) fn query_bodies() -> Vec<Vec<u8>> {
    let mut w = workload(0);
    (0..QUERY_POOL)
        .map(|_| {
            let t = w.next_request().tokens;
            query_body(&t[..t.len().min(QUERY_TOKENS)])
        })
        .collect()
}
