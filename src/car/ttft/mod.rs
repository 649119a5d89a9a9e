//! The TTFT policy's estimate ([`estimate`]): each prefill candidate's time to first token,
//! from the work queued ahead of the request ([`super::WorkLedger`]), the request's own
//! uncached tokens there, the instance's prefill rate and two fixed terms. The policy's score
//! adds what the request's work there costs the requests that will queue behind it
//! ([`add_later`]); smallest wins.
//!
//! ```text
//! own_uncached = input_tokens * (1 - clamp(kv_hit_ratio + predict_weight * predicted_hit_ratio, 0, 1))
//! estimate_ms  = 1000 * (queued_tokens / dp_size + own_uncached) / prefill_tokens_per_s
//!                + overhead_ms_per_request * (queued_requests / dp_size + 1)
//!                + decode_ms_at_full_kv * gpu_cache_usage_perc
//! service_ms   = 1000 * own_uncached / prefill_tokens_per_s + overhead_ms_per_request
//! extra_ms     = service_ms - the least service_ms over candidates
//! ahead_ms     = 1000 * queued_tokens / dp_size / prefill_tokens_per_s
//!                + overhead_ms_per_request * queued_requests / dp_size
//! typical_ms   = 1000 * typical_uncached / prefill_tokens_per_s + overhead_ms_per_request
//! ahead        = ahead_ms / typical_ms     (queued_requests / dp_size before a typical size)
//! busy_share   = mean over candidates of min(1, ahead)
//! pressure     = min(busy_share / (1 - busy_share), MAX_PRESSURE)
//! reuse_bump   = (4 * fleet_reuse * (1 - fleet_reuse))^3      (1 at a reuse of 0.5, 0 at 0 and 1)
//! later_ms     = pressure * (later_weight * reuse_bump * extra_ms
//!                            + queue_weight * service_ms * queued_requests / dp_size)
//! score        = estimate_ms + later_ms
//! ```
//! - `queued_tokens`, `queued_requests`: kvdir's own routed requests not done yet, each with
//!   its uncached tokens at routing, plus the requests the instance reports beyond them at a
//!   typical size ([`super::WorkLedger`]). The DP ranks drain the queue in parallel; the
//!   request's own prefill runs on one rank.
//! - `prefill_tokens_per_s`: per DP rank; learned from the front door's observed TTFTs when
//!   there are any for the instance, else `--ttft_prefill_tokens_per_s`.
//! - Decode pressure: `gpu_cache_usage_perc` is the share of the instance's KV cache in use,
//!   mostly by the running (decoding) requests whose steps share the engine with every
//!   prefill. The term is the same for instances with the same usage, so it never changes a
//!   choice between equally used instances.
//! - The later cost (docs/design.md): on a fleet busy a share `rho` of the time, about `rho /
//!   (1 - rho)` requests wait per server. Work a request adds delays them: its miss (the
//!   service beyond the best candidate's) takes capacity from the whole fleet, and its service
//!   on a queue of `n` also delays the requests that arrive while those `n` drain, the tail.
//!   An idle fleet (pressure 0) chooses on the estimate alone; the pressure is bounded, so a
//!   request still leaves a cached instance whose queue costs more.
//! - The busy share is measured in time, as `ahead` typical requests, not in requests: between
//!   two load reports the ledger keeps every request routed since the last one, and at light
//!   load most of those are small ones long done. Counted as requests they made a fleet 9 %
//!   busy look saturated (pressure 9), and the queue term then sent long prompts behind one
//!   long prefill (docs/design.md). The queue term itself still counts requests: past
//!   saturation it keeps long prompts off queues of many short ones, which wins p50.

use serde::{Deserialize, Serialize};

use super::ledger::RATE_BOUNDS;
use super::types::Candidate;

/// The largest pressure a loaded fleet puts on added work (a busy share of 0.9).
pub const MAX_PRESSURE: f64 = 9.0;

/// Settings of the TTFT policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftParams {
    /// `--ttft_prefill_tokens_per_s`: prefill rate of one DP rank until one is learned.
    pub tokens_per_s: f64,
    /// `--ttft_overhead_ms`: fixed cost of every request (scheduling, the first decode step).
    pub overhead_ms: f64,
    /// `--ttft_decode_ms`: the decode term of an instance whose KV cache is full.
    pub decode_ms: f64,
    /// `--ttft_later_weight`: weight of the capacity a miss takes from a loaded fleet, its
    /// service beyond the best candidate's ([`add_later`]).
    pub later_weight: f64,
    /// `--ttft_queue_weight`: weight of the delay its service adds to the requests arriving
    /// while the queue ahead of it drains ([`add_later`]).
    pub queue_weight: f64,
}

impl Default for TtftParams {
    fn default() -> Self {
        TtftParams {
            tokens_per_s: 10_000.0,
            overhead_ms: 5.0,
            decode_ms: 10.0,
            later_weight: 12.0,
            queue_weight: 0.05,
        }
    }
}

/// Where a candidate's prefill rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateSource {
    /// `--ttft_prefill_tokens_per_s`.
    Configured,
    /// Learned from the front door's observed TTFTs of streamed answers: the fleet's rate, or
    /// this instance's own where it stands apart ([`super::ledger`]).
    Learned,
    /// Reported by the engine (`LoadMetrics::prefill_tokens_per_s`, from vLLM's `/metrics`),
    /// where the front door has learned none.
    Reported,
}

/// Every term of one prefill candidate's TTFT estimate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TtftTerms {
    /// Uncached tokens queued ahead of the request.
    pub queued_tokens: f64,
    /// Requests queued ahead of it.
    pub queued_requests: u64,
    /// Its own uncached tokens on this candidate.
    pub own_uncached_tokens: f64,
    /// DP ranks draining the queue.
    pub dp_size: u32,
    /// Prefill rate of one rank, tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Where the rate came from.
    pub rate_source: RateSource,
    /// The per-request overhead of the queued requests and its own.
    pub overhead_ms: f64,
    /// The decode term.
    pub decode_ms: f64,
    /// The estimate: prefill time of the queue and of its own tokens, plus both terms.
    pub estimate_ms: f64,
    /// The fleet's reuse ([`super::WorkLedger::reuse`]), for the operator.
    pub fleet_reuse: f64,
    /// Its own service on this candidate, ms: its prefill plus one request's overhead.
    pub service_ms: f64,
    /// Its service beyond the least over the prefill candidates, ms: what its miss costs the
    /// fleet's capacity; 0 for the best cached.
    pub extra_ms: f64,
    /// The time one rank needs for the work queued ahead of the request, ms: its prefill and
    /// its requests' overheads.
    #[serde(default)]
    pub ahead_ms: f64,
    /// That queue in typical requests: `ahead_ms` over a typical request's service
    /// ([`super::QueuedWork::typical_tokens`]); the requests per rank before one is known.
    #[serde(default)]
    pub ahead: f64,
    /// The fleet's busy share as the queues show it: the mean over the prefill candidates of
    /// `min(1, ahead)`.
    pub busy_share: f64,
    /// [`pressure`] of the busy share.
    pub pressure: f64,
    /// The later cost: `pressure * (later_weight * reuse_bump * extra_ms + queue_weight *
    /// service_ms * queued_requests / dp_size)`.
    pub later_ms: f64,
}

impl TtftTerms {
    /// The estimate's fixed part (overheads and decode), which a learned rate leaves out.
    pub fn fixed_ms(&self) -> f64 {
        self.overhead_ms + self.decode_ms
    }

    /// The queued tokens one rank has ahead of the request.
    pub fn ahead_per_rank(&self) -> f64 {
        self.queued_tokens / f64::from(self.dp_size.max(1))
    }
}

/// The fleet's reported prefill rate: the mean of the rates `cands` report
/// (`LoadMetrics::prefill_tokens_per_s`), each within the learned rates' bounds. One value for
/// every candidate, as the learned fleet rate is: an engine's own report moves only while it
/// prefills, so a slow one (a restart's warm-up) would otherwise never be chosen again.
pub fn fleet_reported_rate<'a>(cands: impl Iterator<Item = &'a Candidate>) -> Option<f64> {
    let rates = cands.filter_map(|c| c.load.and_then(|l| l.prefill_tokens_per_s));
    let (sum, n) = rates
        .filter(|r| r.is_finite() && *r > 0.0)
        .fold((0.0, 0u32), |(s, n), r| (s + r.clamp(RATE_BOUNDS.0, RATE_BOUNDS.1), n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

/// The estimate for candidate `c` (with its queued work, `c.queued`), for a request of
/// `input_tokens` of which the share `reuse` (CAR's reuse term: exact hit ratio plus weighted
/// predicted ratio) is credited there; `reported` is the fleet's reported prefill rate
/// ([`fleet_reported_rate`]), used where no rate was learned.
pub fn estimate(
    c: &Candidate,
    input_tokens: usize,
    reuse: f64,
    reported: Option<f64>,
    p: &TtftParams,
) -> TtftTerms {
    let (dp, queued) = (c.dp_size.max(1), &c.queued);
    let (rate, rate_source) = match (queued.learned_rate, reported) {
        (Some(r), _) => (r, RateSource::Learned),
        (None, Some(r)) => (r, RateSource::Reported),
        (None, None) => (p.tokens_per_s, RateSource::Configured),
    };
    let input = input_tokens as f64;
    let own = input - input * reuse.clamp(0.0, 1.0);
    let (ranks, ms_per_token) = (f64::from(dp), 1000.0 / rate.max(1e-9));
    let per_rank = queued.requests as f64 / ranks;
    let ahead_ms = ms_per_token * queued.tokens / ranks + p.overhead_ms * per_rank;
    let typical_ms = queued.typical_tokens.map(|t| ms_per_token * t + p.overhead_ms);
    let ahead = match typical_ms {
        Some(t) if t > 0.0 => ahead_ms / t,
        _ => per_rank,
    };
    let decode_ms = p.decode_ms * c.load.map_or(0.0, |l| l.gpu_cache_usage_perc);
    let service_ms = ms_per_token * own + p.overhead_ms;
    TtftTerms {
        queued_tokens: queued.tokens,
        queued_requests: queued.requests,
        own_uncached_tokens: own,
        dp_size: dp,
        prefill_tokens_per_s: rate,
        rate_source,
        overhead_ms: p.overhead_ms * (per_rank + 1.0),
        decode_ms,
        estimate_ms: ahead_ms + service_ms + decode_ms,
        fleet_reuse: queued.fleet_reuse.clamp(0.0, 1.0),
        service_ms,
        extra_ms: 0.0,
        ahead_ms,
        ahead,
        busy_share: 0.0,
        pressure: 0.0,
        later_ms: 0.0,
    }
}

impl TtftTerms {
    /// The TTFT policy's score: the estimate plus the miss cost.
    pub fn score(&self) -> f64 {
        self.estimate_ms + self.later_ms
    }

    /// Its share of the fleet's busy ranks: the typical requests queued per rank, at most 1.
    fn busy(&self) -> f64 {
        self.ahead.min(1.0)
    }
}

/// Sets each estimate's later cost, `later_ms` (module doc): the fleet's pressure times its
/// weighted miss (service beyond the least) and its weighted service times the requests ahead
/// of it. An idle fleet (pressure 0) chooses on the estimate alone; the pressure is at most
/// [`MAX_PRESSURE`].
pub fn add_later(estimates: &mut [Option<TtftTerms>], p: &TtftParams) {
    let share = busy_share(estimates.iter().flatten().copied());
    add_later_with(estimates, p, share, f64::MAX);
}

/// The mean busy share of `terms` (each its own, at most 1), summed in their order.
pub(crate) fn busy_share(terms: impl Iterator<Item = TtftTerms>) -> f64 {
    let shares: Vec<f64> = terms.map(|t| t.busy()).collect();
    shares.iter().sum::<f64>() / shares.len().max(1) as f64
}

/// [`add_later`] with the fleet's busy share and a least service found beyond `estimates`
/// (`least_floor`; `f64::MAX` when there is none): a decision that scores only some of the
/// candidates (`prune.rs`) gives each the terms a decision over all of them gives.
pub(crate) fn add_later_with(
    estimates: &mut [Option<TtftTerms>],
    p: &TtftParams,
    busy_share: f64,
    least_floor: f64,
) {
    let pressure = pressure(busy_share);
    let least = estimates.iter().flatten().map(|t| t.service_ms).fold(least_floor, f64::min);
    for t in estimates.iter_mut().flatten() {
        t.extra_ms = t.service_ms - least;
        t.busy_share = busy_share;
        t.pressure = pressure;
        let miss = p.later_weight * reuse_bump(t.fleet_reuse) * t.extra_ms;
        let ahead = t.queued_requests as f64 / f64::from(t.dp_size.max(1));
        let delay = miss + p.queue_weight * t.service_ms * ahead;
        t.later_ms = pressure * delay;
    }
}

/// How much a miss matters at the fleet's reuse `r`: `(4 r (1 - r))^3`, 1 at 0.5, vanishing
/// towards 0 (a miss costs its own prefill, which the estimate counts) and 1 (a session that
/// moves pays its context once, then lives on the new instance). docs/design.md.
pub fn reuse_bump(r: f64) -> f64 {
    let r = r.clamp(0.0, 1.0);
    (4.0 * r * (1.0 - r)).powi(3)
}

/// `rho / (1 - rho)`, the mean queue of a FIFO server busy a share `rho` of the time, at most
/// [`MAX_PRESSURE`].
pub fn pressure(rho: f64) -> f64 {
    match rho < 1.0 {
        true => (rho.max(0.0) / (1.0 - rho)).min(MAX_PRESSURE),
        false => MAX_PRESSURE,
    }
}

#[cfg(test)]
mod tests;
