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
mod tests {
    use super::*;
    use crate::car::{route, Policy, QueuedWork, Rotation, RouteParams, Routed};
    use crate::registry::LoadMetrics;

    /// An instance with `hit` Device tokens on each of `dp` ranks, `queued` work and `usage`.
    fn cand(name: &str, hit: u64, dp: u32, queued: (f64, u64), usage: f64) -> Candidate {
        let mut c = Candidate::test_idle(name, dp, hit);
        c.load = Some(LoadMetrics {
            waiting_requests_num: 0,
            gpu_cache_usage_perc: usage,
            prefill_tokens_per_s: None,
        });
        c.queued = QueuedWork { tokens: queued.0, requests: queued.1, ..QueuedWork::default() };
        c
    }

    /// Routes a 10,000-token request with TTFT, choosing on the estimate alone.
    fn ttft(cands: &[Candidate]) -> Routed {
        ttft_with(cands, 0.0)
    }

    fn ttft_with(cands: &[Candidate], later_weight: f64) -> Routed {
        let ttft = TtftParams { later_weight, queue_weight: 0.0, ..TtftParams::default() };
        let p = RouteParams { policy: Policy::Ttft, ttft, ..RouteParams::default() };
        route(cands, 10_000, &p, &mut Rotation::default()).unwrap()
    }

    fn terms<'a>(r: &'a Routed, name: &str) -> &'a TtftTerms {
        r.candidates.iter().find(|c| c.name == name).and_then(|c| c.ttft.as_ref()).unwrap()
    }

    #[test]
    fn the_estimate_follows_the_formula() {
        let p = TtftParams { tokens_per_s: 1000.0, decode_ms: 20.0, ..TtftParams::default() };
        let c = cand("a", 0, 2, (4000.0, 4), 0.5);
        let t = estimate(&c, 1000, 0.25, None, &p);
        assert_eq!(t.own_uncached_tokens, 750.0, "a quarter of 1000 tokens is credited");
        assert_eq!(t.overhead_ms, 5.0 * (4.0 / 2.0 + 1.0), "two ranks share four requests");
        assert_eq!(t.decode_ms, 10.0, "half of a full cache's 20 ms");
        assert_eq!(t.estimate_ms, 1000.0 * (2000.0 + 750.0) / 1000.0 + 15.0 + 10.0);
        assert_eq!((t.rate_source, t.prefill_tokens_per_s), (RateSource::Configured, 1000.0));
        let learned = QueuedWork { learned_rate: Some(2000.0), ..c.queued };
        let t = estimate(&Candidate { queued: learned, ..c }, 1000, 1.5, None, &p);
        assert_eq!((t.rate_source, t.own_uncached_tokens), (RateSource::Learned, 0.0));
        assert_eq!(t.estimate_ms, 1000.0 * 2000.0 / 2000.0 + 15.0 + 10.0);
    }

    #[test]
    fn the_fleets_reported_rate_comes_after_a_learned_one_and_before_the_setting() {
        let p = TtftParams::default();
        let reporting = |name, rate| {
            let mut c = cand(name, 0, 1, (0.0, 0), 0.0);
            c.load = c.load.map(|l| LoadMetrics { prefill_tokens_per_s: rate, ..l });
            c
        };
        let fleet =
            [reporting("a", Some(6000.0)), reporting("b", Some(2000.0)), reporting("c", None)];
        let reported = fleet_reported_rate(fleet.iter());
        assert_eq!(reported, Some(4000.0), "the mean of the engines that report one");
        let t = estimate(&fleet[1], 1000, 0.0, reported, &p);
        assert_eq!((t.rate_source, t.prefill_tokens_per_s), (RateSource::Reported, 4000.0));
        assert_eq!(t.estimate_ms, 1000.0 * 1000.0 / 4000.0 + 5.0);
        let learned = QueuedWork { learned_rate: Some(2000.0), ..fleet[0].queued };
        let t =
            estimate(&Candidate { queued: learned, ..fleet[0].clone() }, 1000, 0.0, reported, &p);
        assert_eq!((t.rate_source, t.prefill_tokens_per_s), (RateSource::Learned, 2000.0));
        let nan = reporting("d", Some(f64::NAN));
        assert_eq!(fleet_reported_rate([nan].iter()), None);
    }

    #[test]
    fn a_cached_prefix_wins_until_the_work_queued_ahead_of_it_costs_more() {
        // 8000 of 10,000 tokens cached on a, which has 3000 tokens queued: 5000 tokens to wait
        // for there against 10,000 on the idle b.
        let r = ttft(&[cand("a", 8000, 1, (3000.0, 1), 0.0), cand("b", 0, 1, (0.0, 0), 0.0)]);
        assert_eq!(r.prefill, "a");
        let (a, b) = (terms(&r, "a"), terms(&r, "b"));
        assert_eq!(
            (a.queued_tokens, a.queued_requests, a.own_uncached_tokens),
            (3000.0, 1, 2000.0)
        );
        assert_eq!(a.estimate_ms, 500.0 + 10.0, "5000 tokens at 10,000 per s and two overheads");
        assert_eq!(b.estimate_ms, 1000.0 + 5.0);
        let chosen = r.candidates.iter().find(|c| c.chosen).unwrap();
        assert_eq!(chosen.estimated_ttft_ms, Some(510.0));
        assert_eq!(chosen.score, Some(510.0));
        assert_eq!(chosen.reason, "lowest estimated time to first token plus miss cost");
        // 9000 queued tokens: 11,000 to wait for on a.
        let r = ttft(&[cand("a", 8000, 1, (9000.0, 1), 0.0), cand("b", 0, 1, (0.0, 0), 0.0)]);
        assert_eq!(r.prefill, "b");
        let a = r.candidates.iter().find(|c| c.name == "a").unwrap();
        assert_eq!(
            a.reason,
            "score 1110.0 ms (estimate plus miss cost) is above the chosen 1005.0 ms"
        );
    }

    #[test]
    fn an_idle_fleet_chooses_on_the_estimate_alone() {
        // a holds 50 of the 10,000 tokens but decodes at 90 % KV usage: b's estimate is lower.
        let idle = [cand("a", 50, 2, (0.0, 0), 0.9), cand("b", 0, 1, (0.0, 0), 0.0)];
        let r = ttft_with(&idle, 10.0);
        assert_eq!(r.prefill, "b", "{r:?}");
        let (a, b) = (terms(&r, "a"), terms(&r, "b"));
        assert_eq!((b.busy_share, b.pressure, b.later_ms, a.later_ms), (0.0, 0.0, 0.0, 0.0));
        assert_eq!((a.service_ms, b.service_ms), (1000.0, 1005.0), "9950 or 10,000 tokens + 5 ms");
        assert_eq!((a.extra_ms, b.extra_ms), (0.0, 5.0), "50 tokens at 10,000/s");
    }

    /// a holds 8000 of 10,000 tokens and has `queued_a` tokens in 3 requests; b has 1000 in 1;
    /// the fleet reuses half its tokens (a miss weighs fully).
    fn cached_and_busy(queued_a: f64) -> [Candidate; 2] {
        let mut cands = [cand("a", 8000, 1, (queued_a, 3), 0.0), cand("b", 0, 1, (1000.0, 1), 0.0)];
        cands.iter_mut().for_each(|c| c.queued.fleet_reuse = 0.5);
        cands
    }

    #[test]
    fn a_loaded_fleet_keeps_a_request_on_its_cached_instance_while_the_miss_costs_more() {
        // Estimates: a 1400 + 20 ms, b 1100 + 10 ms. Both busy: pressure 9.
        assert_eq!(ttft_with(&cached_and_busy(12_000.0), 0.0).prefill, "b", "estimate alone");
        let r = ttft_with(&cached_and_busy(12_000.0), 0.25);
        assert_eq!(r.prefill, "a", "b's miss of 8000 more tokens costs the fleet more: {r:?}");
        let (a, b) = (terms(&r, "a"), terms(&r, "b"));
        assert_eq!((a.busy_share, a.pressure), (1.0, MAX_PRESSURE));
        assert_eq!((a.extra_ms, a.later_ms), (0.0, 0.0), "a misses least");
        assert_eq!((b.service_ms, b.extra_ms), (1005.0, 800.0));
        assert_eq!(b.later_ms, MAX_PRESSURE * 0.25 * 800.0);
        let score = |name: &str| r.candidates.iter().find(|c| c.name == name).unwrap().score;
        assert_eq!(score("b"), Some(b.estimate_ms + 1800.0));
        assert_eq!(r.candidates[1].estimated_ttft_ms, Some(1110.0), "the estimate alone");
        // The miss cost is bounded: once a's queue costs more (30,000 tokens: 3.2 s), b.
        assert_eq!(ttft_with(&cached_and_busy(30_000.0), 0.25).prefill, "b");
    }

    #[test]
    fn a_miss_weighs_most_at_middling_reuse() {
        assert_eq!([0.0, 0.5, 1.0, 2.0].map(reuse_bump), [0.0, 1.0, 0.0, 0.0]);
        assert!((reuse_bump(0.25) - 0.421875).abs() < 1e-12, "0.75^3");
        assert!((reuse_bump(0.1) - reuse_bump(0.9)).abs() < 1e-12, "symmetric");
        let reusing = |reuse| {
            let mut cands = cached_and_busy(12_000.0);
            cands.iter_mut().for_each(|c| c.queued.fleet_reuse = reuse);
            ttft_with(&cands, 0.25)
        };
        let r = reusing(0.5);
        assert_eq!(terms(&r, "b").later_ms, MAX_PRESSURE * 0.25 * 800.0);
        assert_eq!(r.prefill, "a", "b costs 1110 + 1800 ms, a 1420 ms");
        for reuse in [0.05, 0.95] {
            assert_eq!(reusing(reuse).prefill, "b", "little to protect, or a refunded move");
        }
    }

    #[test]
    fn the_queue_weight_prices_a_service_by_the_requests_ahead_of_it() {
        let p =
            |queue_weight| TtftParams { later_weight: 0.25, queue_weight, ..TtftParams::default() };
        let route_with = |cands: &[Candidate], ttft| {
            let p = RouteParams { policy: Policy::Ttft, ttft, ..RouteParams::default() };
            route(cands, 10_000, &p, &mut Rotation::default()).unwrap()
        };
        // a's 205 ms of service waits behind 3 requests, b's 1005 ms behind 1: at weight 0.5
        // a costs 9 * (0.5 * 205 * 3) = 2767.5 ms more, b 9 * (0.25 * 800 + 0.5 * 1005) = 6322.5.
        let r = route_with(&cached_and_busy(12_000.0), p(0.5));
        assert_eq!(terms(&r, "a").later_ms, 2767.5);
        assert_eq!(terms(&r, "b").later_ms, 6322.5);
        assert_eq!(r.prefill, "a");
        // Four more requests ahead of a (7): 6457.5 ms, and its queue decides for b.
        let mut cands = cached_and_busy(12_000.0);
        cands[0].queued.requests = 7;
        let r = route_with(&cands, p(0.5));
        assert_eq!((r.prefill.as_str(), terms(&r, "a").later_ms), ("b", 6457.5));
    }

    /// Routes a 10,000-token request with the default TTFT weights.
    fn ttft_default(cands: &[Candidate]) -> Routed {
        let p = RouteParams { policy: Policy::Ttft, ..RouteParams::default() };
        route(cands, 10_000, &p, &mut Rotation::default()).unwrap()
    }

    /// a has 8 small requests of 100 tokens routed since its last report, b one long prefill
    /// of 10,000; the fleet's typical request is `typical` uncached tokens, and nothing is
    /// cached anywhere (reuse 0: no miss weight).
    fn phantoms_and_one_long(typical: Option<f64>) -> [Candidate; 2] {
        let mut cands = [cand("a", 0, 1, (800.0, 8), 0.0), cand("b", 0, 1, (10_000.0, 1), 0.0)];
        cands.iter_mut().for_each(|c| c.queued.typical_tokens = typical);
        cands
    }

    #[test]
    fn small_requests_long_done_do_not_make_a_light_fleet_look_saturated() {
        // Typical request: 10,000 tokens, 1005 ms. a's queue is 120 ms (0.12 typical requests),
        // b's 1005 ms (one): busy share 0.56, pressure 1.27.
        let r = ttft_default(&phantoms_and_one_long(Some(10_000.0)));
        let (a, b) = (terms(&r, "a"), terms(&r, "b"));
        assert!((a.ahead_ms - 120.0).abs() < 1e-9 && (b.ahead_ms - 1005.0).abs() < 1e-9);
        assert!((a.ahead - 120.0 / 1005.0).abs() < 1e-12 && (b.ahead - 1.0).abs() < 1e-12);
        let share = (120.0 / 1005.0 + 1.0) / 2.0;
        assert!((a.busy_share - share).abs() < 1e-12, "{a:?}");
        assert!((a.pressure - share / (1.0 - share)).abs() < 1e-9);
        // Estimates a 1125, b 2010 ms; the queue term (0.05 of the service per request ahead)
        // adds 1.27 * 402 = 511 ms to a and 64 to b: a.
        assert_eq!(r.prefill, "a", "{r:?}");
        // Counted as requests (no typical size yet), both look busy: pressure 9 adds 3618 ms
        // to a and 452 to b, and the request would wait behind b's long prefill.
        let r = ttft_default(&phantoms_and_one_long(None));
        assert_eq!((terms(&r, "a").ahead, terms(&r, "a").pressure), (8.0, MAX_PRESSURE));
        assert_eq!(r.prefill, "b");
    }

    #[test]
    fn queues_of_typical_requests_are_as_busy_in_time_as_in_requests() {
        // One and three typical requests queued: every rank busy, the pressure at its bound.
        let mut cands = [cand("a", 0, 1, (10_000.0, 1), 0.0), cand("b", 0, 2, (60_000.0, 6), 0.0)];
        cands.iter_mut().for_each(|c| c.queued.typical_tokens = Some(10_000.0));
        let r = ttft_default(&cands);
        let (a, b) = (terms(&r, "a"), terms(&r, "b"));
        assert!((a.ahead - 1.0).abs() < 1e-12 && (b.ahead - 3.0).abs() < 1e-12, "{a:?} {b:?}");
        assert_eq!((a.busy_share, a.pressure), (1.0, MAX_PRESSURE));
    }

    #[test]
    fn the_pressure_grows_with_the_busy_share_up_to_its_bound() {
        assert_eq!([0.0, 0.5, 0.75, 0.9, 0.95, 1.0].map(pressure), [0.0, 1.0, 3.0, 9.0, 9.0, 9.0]);
        // One of a's two ranks and none of b's: a quarter of the ranks, counted per candidate.
        let r = ttft_with(&[cand("a", 0, 2, (100.0, 1), 0.0), cand("b", 0, 1, (0.0, 0), 0.0)], 1.0);
        assert_eq!((terms(&r, "a").busy_share, terms(&r, "b").busy_share), (0.25, 0.25));
        assert_eq!(terms(&r, "a").pressure, 0.25 / 0.75);
    }

    #[test]
    fn decode_pressure_moves_only_unequally_used_instances() {
        let same = ttft(&[cand("a", 50, 1, (0.0, 0), 0.9), cand("b", 0, 1, (0.0, 0), 0.9)]);
        assert_eq!(same.prefill, "a", "equal usage: the 50 cached tokens decide");
        let r = ttft(&[cand("a", 50, 1, (0.0, 0), 0.9), cand("b", 0, 1, (0.0, 0), 0.0)]);
        assert_eq!(r.prefill, "b", "9 ms of decode outweigh 50 tokens (5 ms at 10,000/s)");
        assert_eq!((terms(&r, "a").decode_ms, terms(&r, "b").decode_ms), (9.0, 0.0));
    }

    #[test]
    fn every_policy_reports_the_estimate_and_car_chooses_as_before() {
        let cands = [cand("a", 8000, 1, (9000.0, 1), 0.0), cand("b", 0, 1, (0.0, 0), 0.0)];
        let p = RouteParams { lambda: 1.0, ..RouteParams::default() };
        let r = route(&cands, 10_000, &p, &mut Rotation::default()).unwrap();
        assert_eq!(r.prefill, "a", "CAR at lambda 1 follows the cache");
        assert_eq!(r.candidates[1].estimated_ttft_ms, Some(1005.0));
        assert!(r.candidates.iter().all(|c| c.ttft.is_some()));
    }
}
