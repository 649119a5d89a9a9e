//! The replay's report ([`ReplayReport`], one [`PolicyRun`] per policy), as text or JSON.
//!
//! - hit share: prompt tokens the engine had cached on Device when it ran the request (as it
//!   reports them, complete blocks only), over all prompt tokens of the routed requests;
//! - bound: the same share with one cache that never evicts ([`Trace::bound`]), which no
//!   router over finite engines can beat;
//! - per-engine LRU bound: the same share with one LRU per engine of the run's capacity and a
//!   router with perfect affinity ([`affinity::per_engine_lru`]), the capacity bound the run
//!   is judged against; and one LRU with the fleet's pooled capacity, for reference;
//! - busy share: each engine's simulated service time over the trace's span, mean and max
//!   over the engines (how loaded the run was);
//! - TTFT: simulated, from the FIFO model ([`super::clock`]): p50, p99, max and mean (past
//!   saturation the mean follows the work done, and a p50 below another policy's at an equal
//!   mean comes from unequal engines);
//! - imbalance: the most requests any engine got over the mean per engine (1 = even);
//! - prediction: of the requests kvdir gave a Device hit for on the chosen rank, the share
//!   whose prediction equalled what the engine then reported (stale when events are in flight);
//! - decision cost: wall latency of `POST /v1/internal/route`, as the tool saw it;
//! - per router (kvdir replica): the requests it routed, their hit share, its decision cost and
//!   its streams' health ([`RouterRun`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use super::super::clients::{percentile, KindStats};
use super::super::report::Applied;
use super::affinity::{self, Reference, AFFINITY_SLACK};
use super::flags::{policy_name, ReplayOptions};
use super::step::{Finished, Outcome};
use super::trace::{Bound, Trace};
use kvdir::car::Policy;

/// What a run was.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSetup {
    /// The policy kvdir ran with.
    pub policy: Policy,
    /// Its name in the report, with its lambda when the run set one (`CAR 0.8`).
    pub label: String,
    /// Engines in the fleet.
    pub engines: usize,
    /// The pacing, `None` without.
    pub speed: Option<f64>,
}

/// What one policy run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyRun {
    /// The policy kvdir ran with.
    pub policy: Policy,
    /// Its name in the report ([`RunSetup::label`]).
    pub label: String,
    /// Routed (and executed) requests.
    pub routed: u64,
    /// Prompt tokens of the routed requests.
    pub input_tokens: u64,
    /// Of those, cached on Device at execution.
    pub hit_tokens: u64,
    /// Simulated TTFTs, sorted.
    pub ttfts: Vec<Duration>,
    /// Requests per engine, in engine order.
    pub per_engine: Vec<u64>,
    /// Requests with a prediction, and those whose prediction matched.
    pub predicted: (u64, u64),
    /// Route latencies (sorted) and failures, over all replicas.
    pub routes: KindStats,
    /// Worst lag behind the paced schedule.
    pub max_lag: Duration,
    /// The pacing, `None` without.
    pub speed: Option<f64>,
    /// Per engine, its busy share.
    pub busy: Vec<f64>,
    /// One per kvdir replica.
    pub routers: Vec<RouterRun>,
}

/// What one kvdir replica of a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterRun {
    /// Requests it routed.
    pub routed: u64,
    /// Their prompt tokens.
    pub input_tokens: u64,
    /// Of those, cached on Device at execution.
    pub hit_tokens: u64,
    /// Its route latencies (sorted) and failures.
    pub routes: KindStats,
    /// What it applied, with its streams' fault counters.
    pub applied: Applied,
}

impl RouterRun {
    fn json(&self, index: usize) -> Value {
        json!({
            "router": index,
            "routed": self.routed,
            "route_errors": self.routes.errors,
            "hit_share": self.hit_tokens as f64 / self.input_tokens.max(1) as f64,
            "decision_ms": {
                "p50": ms(self.routes.percentile(50.0)),
                "p99": ms(self.routes.percentile(99.0)),
            },
            "caught_up": self.applied.caught_up,
            "stream_faults": self.applied.faults().into_iter().collect::<BTreeMap<_, _>>(),
        })
    }
}

/// A lag behind the schedule worth a warning.
const LATE: Duration = Duration::from_secs(1);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl PolicyRun {
    /// Sums a finished loop over `run.engines` engines; `applied` holds one entry per replica.
    pub fn new(run: RunSetup, finished: Finished, applied: Vec<Applied>) -> PolicyRun {
        let outcomes = &finished.outcomes;
        let mut routes = KindStats::new(super::super::clients::Kind::Route);
        finished.routes.iter().for_each(|r| routes.merge(r.clone()));
        routes.latencies.sort();
        let routers = finished.routes.into_iter().zip(applied).enumerate();
        let routers =
            routers.map(|(i, (routes, applied))| router_run(i, outcomes, routes, applied));
        let mut per_engine = vec![0; run.engines];
        outcomes.iter().for_each(|o| per_engine[o.engine] += 1);
        let with = outcomes.iter().filter_map(|o| Some((o.predicted?, o.hit_tokens)));
        let (n, matched) = with.fold((0, 0), |(n, m), (p, h)| (n + 1, m + u64::from(p == h)));
        let mut ttfts: Vec<Duration> = outcomes.iter().map(|o| o.ttft).collect();
        ttfts.sort();
        PolicyRun {
            policy: run.policy,
            label: run.label,
            routed: outcomes.len() as u64,
            input_tokens: outcomes.iter().map(|o| o.input_tokens).sum(),
            hit_tokens: outcomes.iter().map(|o| o.hit_tokens).sum(),
            ttfts,
            per_engine,
            predicted: (n, matched),
            routes,
            max_lag: finished.max_lag,
            speed: run.speed,
            busy: finished.busy,
            routers: routers.collect(),
        }
    }

    /// Whether every replica applied every batch.
    pub fn caught_up(&self) -> bool {
        self.routers.iter().all(|r| r.applied.caught_up)
    }

    /// The streams' fault counters summed over the replicas.
    pub fn faults(&self) -> BTreeMap<&'static str, u64> {
        let mut sum = BTreeMap::new();
        for (k, v) in self.routers.iter().flat_map(|r| r.applied.faults()) {
            *sum.entry(k).or_default() += v;
        }
        sum
    }

    /// Mean and max of the engines' busy shares.
    pub fn busy_share(&self) -> (f64, f64) {
        let mean = self.busy.iter().sum::<f64>() / self.busy.len().max(1) as f64;
        (mean, self.busy.iter().copied().fold(0.0, f64::max))
    }

    /// Hit tokens over input tokens.
    pub fn hit_share(&self) -> f64 {
        self.hit_tokens as f64 / self.input_tokens.max(1) as f64
    }

    /// Most requests on one engine over the mean.
    pub fn imbalance(&self) -> f64 {
        let max = self.per_engine.iter().copied().max().unwrap_or(0) as f64;
        let mean = self.routed as f64 / self.per_engine.len().max(1) as f64;
        max / mean.max(1e-9)
    }

    /// Share of predictions that matched; `None` without predictions.
    pub fn prediction_share(&self) -> Option<f64> {
        let (n, matched) = self.predicted;
        (n > 0).then(|| matched as f64 / n as f64)
    }

    fn json(&self, bound: f64, per_engine_bound: f64) -> Value {
        let (busy_mean, busy_max) = self.busy_share();
        let ttft_sum: f64 = self.ttfts.iter().map(|t| ms(*t)).sum();
        let ttft_mean = ttft_sum / self.ttfts.len().max(1) as f64;
        json!({
            "policy": policy_name(self.policy),
            "label": self.label,
            "routed": self.routed,
            "route_errors": self.routes.errors,
            "input_tokens": self.input_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_share": self.hit_share(),
            "share_of_bound": self.hit_share() / bound.max(1e-9),
            "share_of_per_engine_bound": self.hit_share() / per_engine_bound.max(1e-9),
            "busy_share": { "mean": busy_mean, "max": busy_max },
            "ttft_ms": {
                "p50": ms(percentile(&self.ttfts, 50.0)),
                "p99": ms(percentile(&self.ttfts, 99.0)),
                "max": ms(self.ttfts.last().copied().unwrap_or_default()),
                "mean": ttft_mean,
            },
            "requests_per_engine": self.per_engine,
            "imbalance": self.imbalance(),
            "prediction": {
                "requests": self.predicted.0,
                "matched": self.predicted.1,
                "share": self.prediction_share(),
            },
            "decision_ms": {
                "p50": ms(self.routes.percentile(50.0)),
                "p99": ms(self.routes.percentile(99.0)),
                "max": ms(self.routes.max()),
            },
            "wall_seconds": self.routes.wall.as_secs_f64(),
            "max_lag_ms": ms(self.max_lag),
            "caught_up": self.caught_up(),
            "stream_faults": self.faults(),
            "routers": self.routers.iter().enumerate().map(|(i, r)| r.json(i)).collect::<Vec<_>>(),
        })
    }

    fn text(&self, per_engine_bound: f64, t: &mut String) {
        let share = self.hit_share();
        let (busy_mean, busy_max) = self.busy_share();
        let _ = writeln!(
            t,
            "{:<9} routed {}  hit share {:.1} % ({:.0} % of the per-engine LRU bound)  TTFT p50 \
             {:.0} ms p99 {:.0} ms  busy {:.0} % (max {:.0} %)  imbalance {:.2}  predicted = \
             realized {}  route p50 {:.2} ms p99 {:.2} ms",
            self.label,
            self.routed,
            share * 100.0,
            share / per_engine_bound.max(1e-9) * 100.0,
            ms(percentile(&self.ttfts, 50.0)),
            ms(percentile(&self.ttfts, 99.0)),
            busy_mean * 100.0,
            busy_max * 100.0,
            self.imbalance(),
            self.prediction_share().map_or("n/a".to_string(), |s| format!("{:.1} %", s * 100.0)),
            ms(self.routes.percentile(50.0)),
            ms(self.routes.percentile(99.0)),
        );
        if self.routers.len() > 1 {
            for (i, r) in self.routers.iter().enumerate() {
                let _ = writeln!(
                    t,
                    "  router {i}: routed {}  hit share {:.1} %  route p50 {:.2} ms p99 {:.2} ms",
                    r.routed,
                    r.hit_tokens as f64 / r.input_tokens.max(1) as f64 * 100.0,
                    ms(r.routes.percentile(50.0)),
                    ms(r.routes.percentile(99.0)),
                );
            }
        }
        let mut warnings = Vec::new();
        if !self.routes.errors.is_empty() {
            warnings.push(format!("route errors {:?}", self.routes.errors));
        }
        if !self.faults().is_empty() {
            warnings.push(format!(
                "stream counters moved {:?} (a periodic resync, every resync_interval_ms, is a \
                 recovery too)",
                self.faults()
            ));
        }
        if let Some(speed) = self.speed.filter(|_| self.max_lag > LATE) {
            warnings.push(format!(
                "the tool fell up to {:.0} ms behind the trace at --speed {speed}; lower it",
                ms(self.max_lag)
            ));
        }
        if !self.caught_up() {
            warnings.push("kvdir had not applied every batch at the end".to_string());
        }
        for w in warnings {
            let _ = writeln!(t, "WARNING ({}): {w}", self.label);
        }
    }
}

/// The whole replay.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// One line describing the setup.
    pub setup: String,
    /// Requests replayed.
    pub requests: usize,
    /// Their prompt tokens.
    pub input_tokens: u64,
    /// The one-cache bound.
    pub bound: Bound,
    /// One LRU per engine with perfect affinity ([`affinity::per_engine_lru`]).
    pub per_engine_lru: Reference,
    /// Its blocks per engine: `--cache_blocks`.
    pub engine_blocks: usize,
    /// One LRU with the fleet's capacity ([`affinity::pooled_lru`]).
    pub pooled_lru: Reference,
    /// That LRU's blocks: `--engines x --cache_blocks`.
    pub pooled_blocks: usize,
    /// kvdir replicas per run.
    pub routers: usize,
    /// One run per policy, in order.
    pub runs: Vec<PolicyRun>,
}

impl ReplayReport {
    /// The report of `runs` over `trace`.
    pub fn new(o: &ReplayOptions, trace: &Trace, runs: Vec<PolicyRun>) -> ReplayReport {
        let speed = o.speed.map_or("no pacing".to_string(), |s| format!("speed {s}x"));
        let setup = format!(
            "{} requests of {}; {} engines x {} DP, {} Device blocks of 512 tokens per engine; \
             prefill {} µs per uncached token + {} ms per request (simulated); {speed}; {} kvdir \
             replica(s)",
            trace.requests.len(),
            o.trace.display(),
            o.engines,
            o.dp_size,
            o.cache_blocks,
            o.cost.per_token.as_micros(),
            o.cost.overhead.as_millis(),
            o.routers,
        );
        let requests = trace.requests.len();
        let (engines, pooled_blocks) = (o.engines as usize, o.cache_blocks * o.engines as usize);
        ReplayReport {
            setup,
            requests,
            input_tokens: trace.input_tokens(),
            bound: trace.bound(),
            per_engine_lru: affinity::per_engine_lru(
                trace,
                engines,
                o.cache_blocks,
                Some(AFFINITY_SLACK),
            ),
            engine_blocks: o.cache_blocks,
            pooled_lru: affinity::pooled_lru(trace, pooled_blocks),
            pooled_blocks,
            routers: o.routers,
            runs,
        }
    }

    /// The first run's hit share over RR's, when both ran.
    pub fn over_rr(&self) -> Option<f64> {
        let rr = self.runs.iter().skip(1).find(|r| r.policy == Policy::Rr)?;
        Some(self.runs[0].hit_share() / rr.hit_share().max(1e-9))
    }

    /// The report as JSON.
    pub fn json(&self) -> Value {
        let bound = self.bound.token_share;
        let per_engine = self.per_engine_lru.token_share;
        json!({
            "setup": self.setup,
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "routers": self.routers,
            "bound": { "token_share": bound, "block_share": self.bound.block_share },
            "per_engine_lru_bound": {
                "token_share": per_engine,
                "blocks_per_engine": self.engine_blocks,
                "slack": AFFINITY_SLACK,
                "imbalance": self.per_engine_lru.imbalance(),
            },
            "pooled_lru_token_share": self.pooled_lru.token_share,
            "runs": self.runs.iter().map(|r| r.json(bound, per_engine)).collect::<Vec<_>>(),
            "hit_share_over_rr": self.over_rr(),
        })
    }

    /// The plain-text report.
    pub fn text(&self) -> String {
        let mut t = format!("kvdir-bench replay: {}\n", self.setup);
        let _ = writeln!(
            t,
            "bound (one cache that never evicts): {:.1} % of input tokens, {:.1} % of blocks",
            self.bound.token_share * 100.0,
            self.bound.block_share * 100.0
        );
        let _ = writeln!(
            t,
            "per-engine LRU bound (one LRU of {} blocks per engine, perfect affinity, at most \
             {:.1}x the mean requests per engine): {:.1} % of input tokens",
            self.engine_blocks,
            1.0 + AFFINITY_SLACK,
            self.per_engine_lru.token_share * 100.0
        );
        let _ = writeln!(
            t,
            "reference (one LRU with the fleet's {} blocks): {:.1} % of input tokens",
            self.pooled_blocks,
            self.pooled_lru.token_share * 100.0
        );
        let per_engine = self.per_engine_lru.token_share;
        self.runs.iter().for_each(|r| r.text(per_engine, &mut t));
        if let Some(x) = self.over_rr() {
            let _ = writeln!(t, "hit share {} / RR: {x:.2}x", self.runs[0].label);
        }
        t
    }
}

/// The requests replica `index` routed, summed, with its stats.
fn router_run(
    index: usize,
    outcomes: &[Outcome],
    routes: KindStats,
    applied: Applied,
) -> RouterRun {
    let mine = outcomes.iter().filter(|o| o.router == index);
    let (routed, input_tokens, hit_tokens) =
        mine.fold((0, 0, 0), |(n, i, h), o| (n + 1, i + o.input_tokens, h + o.hit_tokens));
    RouterRun { routed, input_tokens, hit_tokens, routes, applied }
}
