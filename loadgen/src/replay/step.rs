//! One policy run's request loop ([`Replayer`]): for each trace request, in trace order,
//! 1. advance the simulated clock to its arrival and report every engine's queue (requests in
//!    its system) and Device usage as its load (LOADMETRICS and heartbeats, as an engine would);
//! 2. ask kvdir `POST /v1/internal/route` and time the answer (the decision cost); with several
//!    kvdir replicas (`--routers`), request `n` goes to replica `n mod R`; with `--concurrent
//!    K`, K consecutive requests are asked at once, each on its own connection, after one load
//!    report at the first's arrival (concurrent arrivals: no answer sees the others' effect);
//! 3. pick the DP rank of the chosen instance: the rank kvdir predicts the longest Device hit
//!    on, ties and policies without predictions to the rank free first;
//! 4. ask the engine what it has cached for the prompt (the realized hit), then run the
//!    prefill, which publishes its KV events to kvdir;
//! 5. queue it on the rank's FIFO server ([`Servers`]) for its TTFT.
//!
//! The engine caches a request's blocks when it admits it, not when its prefill finishes in
//! simulated time: a later request can hit blocks still being computed, as with engines that
//! share in-flight prefixes.
//!
//! A refused or failed route is an error keyed by `HTTP <status>` or `transport: ...`; the
//! request is skipped. An engine failure ends the run.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::super::clients::{Kind, KindStats};
use super::super::fleet::Fleet;
use super::super::http::Conn;
use super::super::BenchError;
use super::clock::Servers;
use super::trace::TraceRequest;
use super::ReplayOptions;

/// What happened to one routed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Engine index.
    pub engine: usize,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Tokens the engine had on Device at execution.
    pub hit_tokens: u64,
    /// Device hit kvdir predicted on the chosen rank; `None` without a prediction (RR).
    pub predicted: Option<u64>,
    /// Simulated time to first token.
    pub ttft: Duration,
    /// The kvdir replica that routed it.
    pub router: usize,
}

/// What a finished request loop measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// Every routed request, in trace order.
    pub outcomes: Vec<Outcome>,
    /// Route latencies (sorted) and errors, one per kvdir replica.
    pub routes: Vec<KindStats>,
    /// How far the loop fell behind the paced schedule at worst.
    pub max_lag: Duration,
    /// Per engine, its busy share over the arrivals' span ([`Servers::busy_shares`]).
    pub busy: Vec<f64>,
}

/// The request loop of one run.
pub struct Replayer<'a> {
    fleet: &'a Fleet,
    conns: Vec<Conn>,
    sent: usize,
    servers: Servers,
    dp_size: usize,
    capacity: f64,
    engines: HashMap<String, usize>,
    reported: Vec<Option<u64>>,
    usage: Vec<f64>,
    outcomes: Vec<Outcome>,
    routes: Vec<KindStats>,
    max_lag: Duration,
}

impl<'a> Replayer<'a> {
    /// A loop over `fleet`, routing through `conns` in turn; connection `j` reaches replica
    /// `j mod --routers`.
    pub fn new(o: &ReplayOptions, fleet: &'a Fleet, conns: Vec<Conn>) -> Replayer<'a> {
        let n = fleet.engines.len();
        let engines = fleet.engines.iter().enumerate().map(|(i, e)| (e.instance_name(), i));
        Replayer {
            fleet,
            routes: (0..o.routers).map(|_| KindStats::new(Kind::Route)).collect(),
            conns,
            sent: 0,
            servers: Servers::new(n, o.dp_size as usize, o.cost),
            dp_size: o.dp_size as usize,
            capacity: o.cache_blocks as f64,
            engines: engines.collect(),
            reported: vec![None; n],
            usage: vec![0.0; n],
            outcomes: Vec::new(),
            max_lag: Duration::ZERO,
        }
    }

    /// Ends the loop; `span` is the simulated time from the first arrival to the last.
    pub fn finish(self, span: Duration) -> Finished {
        let mut routes = self.routes;
        routes.iter_mut().for_each(|r| r.latencies.sort());
        let busy = self.servers.busy_shares(span);
        Finished { outcomes: self.outcomes, routes, max_lag: self.max_lag, busy }
    }

    /// Waits until `r`'s arrival on the wall clock started at `start`, at `speed`.
    pub fn pace(&mut self, arrival: Duration, start: Instant, speed: Option<f64>) {
        let Some(speed) = speed else { return };
        let due = start + arrival.div_f64(speed);
        let now = Instant::now();
        match due.checked_duration_since(now) {
            Some(ahead) => thread::sleep(ahead),
            None => self.max_lag = self.max_lag.max(now - due),
        }
    }

    /// Routes the requests of `batch`, each with its arrival (simulated), at once (after one
    /// load report at the first's arrival), then runs each on its engine in order.
    pub fn step(&mut self, batch: &[(&TraceRequest, Duration)]) -> Result<(), BenchError> {
        let Some(&(_, first)) = batch.first() else { return Ok(()) };
        self.servers.advance(first);
        self.report_loads();
        let prompts: Vec<Vec<i32>> = batch.iter().map(|(r, _)| r.tokens()).collect();
        let slots: Vec<usize> =
            (0..batch.len()).map(|k| (self.sent + k) % self.conns.len()).collect();
        self.sent += batch.len();
        let answers = self.route_all(&slots, &prompts);
        for (k, (slot, (latency, answer))) in slots.iter().zip(answers).enumerate() {
            let router = slot % self.routes.len();
            let Some(routed) = self.record(router, latency, answer) else { continue };
            self.run(&routed, &prompts[k], batch[k].1, router)?;
        }
        Ok(())
    }

    /// Asks each prompt's route on its connection `slots[k]` (distinct), at once when several.
    fn route_all(&mut self, slots: &[usize], prompts: &[Vec<i32>]) -> Vec<Answer> {
        if let ([slot], [prompt]) = (slots, prompts) {
            return vec![post_route(&mut self.conns[*slot], prompt)];
        }
        let mut answers: Vec<Option<Answer>> = vec![None; slots.len()];
        thread::scope(|scope| {
            let handles: Vec<_> = self
                .conns
                .iter_mut()
                .enumerate()
                .filter_map(|(slot, conn)| {
                    let k = slots.iter().position(|s| *s == slot)?;
                    Some((k, scope.spawn(move || post_route(conn, &prompts[k]))))
                })
                .collect();
            for (k, handle) in handles {
                let failed = || (Duration::ZERO, Err("transport: panicked".to_string()));
                answers[k] = Some(handle.join().unwrap_or_else(|_| failed()));
            }
        });
        answers.into_iter().map(|a| a.expect("one connection per request")).collect()
    }

    /// Counts a route's answer for replica `router`; its JSON, or `None` after a failure.
    fn record(&mut self, router: usize, latency: Duration, answer: Answered) -> Option<Value> {
        let stats = &mut self.routes[router];
        match answer {
            Ok(value) => {
                stats.latencies.push(latency);
                Some(value)
            }
            Err(error) => {
                *stats.errors.entry(error).or_default() += 1;
                None
            }
        }
    }

    /// Runs a routed request arriving at `arrival` on the engine kvdir chose.
    fn run(
        &mut self,
        routed: &Value,
        tokens: &[i32],
        arrival: Duration,
        router: usize,
    ) -> Result<(), BenchError> {
        self.servers.advance(arrival);
        let engine = self.engine_of(routed)?;
        let (rank, predicted) = self.rank(engine, routed);
        let sim = &self.fleet.engines[engine];
        let hit_tokens = sim.resident(rank as u32, tokens)?.0;
        sim.process(rank as u32, tokens)?;
        let uncached = tokens.len() as u64 - hit_tokens;
        let ttft = self.servers.admit(engine, rank, arrival, uncached);
        let used: u64 =
            (0..self.dp_size as u32).map(|k| sim.counts(k).map(|c| c.0)).sum::<Result<_, _>>()?;
        self.usage[engine] = used as f64 / self.capacity;
        let input_tokens = tokens.len() as u64;
        let outcome = Outcome { engine, input_tokens, hit_tokens, predicted, ttft, router };
        self.outcomes.push(outcome);
        Ok(())
    }

    /// Sets the load of every engine whose queue changed since its last report.
    fn report_loads(&mut self) {
        for engine in 0..self.reported.len() {
            let waiting = self.servers.in_system(engine);
            if self.reported[engine] != Some(waiting) {
                self.fleet.set_load(engine, waiting, self.usage[engine]);
                self.reported[engine] = Some(waiting);
            }
        }
    }

    fn engine_of(&self, routed: &Value) -> Result<usize, BenchError> {
        let name = routed["prefill"].as_str().unwrap_or_default();
        self.engines.get(name).copied().ok_or_else(|| {
            BenchError::Kvdir(format!("route chose {name:?}, which is not an engine of this run"))
        })
    }

    /// The chosen rank and kvdir's predicted Device hit on it.
    fn rank(&self, engine: usize, routed: &Value) -> (usize, Option<u64>) {
        choose_rank(routed, self.dp_size, |rank| self.servers.free_at(engine, rank))
    }
}

/// A route's JSON, or the failure's key (`HTTP <status>`, `transport: ..`).
type Answered = Result<Value, String>;

/// A route's wall latency and what it answered.
type Answer = (Duration, Answered);

/// Asks `conn` to route `tokens`.
fn post_route(conn: &mut Conn, tokens: &[i32]) -> Answer {
    let body = json!({ "token_ids": tokens }).to_string().into_bytes();
    let sent = Instant::now();
    let answer = match conn.post(Kind::Route.path(), &body) {
        Ok(reply) if reply.status == 200 => {
            serde_json::from_slice(&reply.body).map_err(|e| format!("transport: bad JSON: {e}"))
        }
        Ok(reply) => Err(format!("HTTP {}", reply.status)),
        Err(e) => Err(format!("transport: {}", e.kind())),
    };
    (sent.elapsed(), answer)
}

/// The rank of the chosen instance (`prefill`) with the longest predicted Device hit in the
/// route answer's `dp_hits`, ties to the rank `free_at` first; without predictions, the rank
/// free first. Returns it with its prediction.
fn choose_rank(
    routed: &Value,
    dp_size: usize,
    free_at: impl Fn(usize) -> Duration,
) -> (usize, Option<u64>) {
    let name = &routed["prefill"];
    let candidates = routed["candidates"].as_array().into_iter().flatten();
    let chosen = candidates.into_iter().find(|c| c["name"] == *name);
    let hits = chosen.and_then(|c| c["dp_hits"].as_array()).into_iter().flatten();
    let hits = hits.filter_map(|h| {
        let rank = h["dp_rank"].as_u64().filter(|r| *r < dp_size as u64)? as usize;
        Some((rank, h["device_hit_tokens"].as_u64()?))
    });
    let best = hits.max_by_key(|(rank, hit)| (*hit, std::cmp::Reverse(free_at(*rank))));
    match best {
        Some((rank, hit)) => (rank, Some(hit)),
        None => ((0..dp_size).min_by_key(|k| free_at(*k)).unwrap_or(0), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(hits: &[(u64, u64)]) -> Value {
        let dp_hits: Vec<Value> =
            hits.iter().map(|(r, h)| json!({"dp_rank": r, "device_hit_tokens": h})).collect();
        json!({"prefill": "e1", "candidates": [
            {"name": "e0", "dp_hits": [{"dp_rank": 0, "device_hit_tokens": 9999}]},
            {"name": "e1", "dp_hits": dp_hits},
        ]})
    }

    #[test]
    fn the_rank_with_the_longest_predicted_hit_of_the_chosen_instance_wins() {
        let free = |rank: usize| Duration::from_millis([30, 10, 20][rank]);
        assert_eq!(choose_rank(&routed(&[(0, 512), (1, 0), (2, 1024)]), 3, free), (2, Some(1024)));
        assert_eq!(
            choose_rank(&routed(&[(0, 512), (1, 512), (2, 0)]), 3, free),
            (1, Some(512)),
            "a tie goes to the rank free first"
        );
        assert_eq!(choose_rank(&routed(&[]), 3, free), (1, None), "no prediction: free first");
        assert_eq!(choose_rank(&routed(&[(7, 512)]), 3, free), (1, None), "ranks out of range");
    }
}
