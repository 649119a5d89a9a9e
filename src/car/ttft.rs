//! The TTFT policy's estimate ([`estimate`]): each prefill candidate's time to first token,
//! from the work queued ahead of the request ([`super::WorkLedger`]), the request's own
//! uncached tokens there, the instance's prefill rate and two fixed terms. The policy's score
//! adds the delay the request's own prefill adds to later requests ([`add_later`]); smallest
//! wins.
//!
//! ```text
//! own_uncached = input_tokens * (1 - clamp(kv_hit_ratio + predict_weight * predicted_hit_ratio, 0, 1))
//! estimate_ms  = 1000 * (queued_tokens / dp_size + own_uncached) / prefill_tokens_per_s
//!                + overhead_ms_per_request * (queued_requests / dp_size + 1)
//!                + decode_ms_at_full_kv * gpu_cache_usage_perc
//! later_ms     = later_weight * own_prefill_ms * mean over candidates of queued_requests / dp_size
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

use serde::{Deserialize, Serialize};

use super::types::Candidate;

/// Settings of the TTFT policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftParams {
    /// `--ttft_prefill_tokens_per_s`: prefill rate of one DP rank until one is learned.
    pub tokens_per_s: f64,
    /// `--ttft_overhead_ms`: fixed cost of every request (scheduling, the first decode step).
    pub overhead_ms: f64,
    /// `--ttft_decode_ms`: the decode term of an instance whose KV cache is full.
    pub decode_ms: f64,
    /// `--ttft_later_weight`: weight of the delay the request's own prefill adds to the
    /// requests expected to queue behind it ([`add_later`]); 0 chooses on the estimate alone.
    pub later_weight: f64,
}

impl Default for TtftParams {
    fn default() -> Self {
        TtftParams { tokens_per_s: 10_000.0, overhead_ms: 5.0, decode_ms: 10.0, later_weight: 10.0 }
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
    /// Requests expected to queue behind it: the mean queued requests per rank over the
    /// prefill candidates.
    pub behind_requests: f64,
    /// The delay its own prefill adds to them, times `--ttft_later_weight`.
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

/// The estimate for candidate `c` (with its queued work, `c.queued`), for a request of
/// `input_tokens` of which the share `reuse` (CAR's reuse term: exact hit ratio plus weighted
/// predicted ratio) is credited there.
pub fn estimate(c: &Candidate, input_tokens: usize, reuse: f64, p: &TtftParams) -> TtftTerms {
    let (dp, queued) = (c.dp_size.max(1), &c.queued);
    let (rate, rate_source) = match queued.learned_rate {
        Some(r) => (r, RateSource::Learned),
        None => (p.tokens_per_s, RateSource::Configured),
    };
    let input = input_tokens as f64;
    let own = input - input * reuse.clamp(0.0, 1.0);
    let ranks = f64::from(dp);
    let prefill_ms = 1000.0 * (queued.tokens / ranks + own) / rate.max(1e-9);
    let overhead_ms = p.overhead_ms * (queued.requests as f64 / ranks + 1.0);
    let decode_ms = p.decode_ms * c.load.map_or(0.0, |l| l.gpu_cache_usage_perc);
    TtftTerms {
        queued_tokens: queued.tokens,
        queued_requests: queued.requests,
        own_uncached_tokens: own,
        dp_size: dp,
        prefill_tokens_per_s: rate,
        rate_source,
        overhead_ms,
        decode_ms,
        estimate_ms: prefill_ms + overhead_ms + decode_ms,
        behind_requests: 0.0,
        later_ms: 0.0,
    }
}

impl TtftTerms {
    /// The TTFT policy's score: the estimate plus the delay to later requests.
    pub fn score(&self) -> f64 {
        self.estimate_ms + self.later_ms
    }

    /// Its own prefill time, ms.
    pub fn own_prefill_ms(&self) -> f64 {
        1000.0 * self.own_uncached_tokens / self.prefill_tokens_per_s.max(1e-9)
    }
}

/// Sets each estimate's delay to later requests: `weight * own_prefill_ms * behind`, where
/// `behind` is the mean over the candidates of their queued requests per rank. Under load a
/// request's prefill delays every request that queues behind it (about the mean queue length,
/// as in a FIFO queue, `rho / (1 - rho)`), so a cache miss costs more than its own time; an
/// idle fleet adds nothing.
pub fn add_later(estimates: &mut [Option<TtftTerms>], weight: f64) {
    let per_rank = |t: &TtftTerms| t.queued_requests as f64 / f64::from(t.dp_size.max(1));
    let queues: Vec<f64> = estimates.iter().flatten().map(per_rank).collect();
    let behind = queues.iter().sum::<f64>() / queues.len().max(1) as f64;
    for t in estimates.iter_mut().flatten() {
        t.behind_requests = behind;
        t.later_ms = weight * t.own_prefill_ms() * behind;
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
        c.load = Some(LoadMetrics { waiting_requests_num: 0, gpu_cache_usage_perc: usage });
        c.queued = QueuedWork { tokens: queued.0, requests: queued.1, learned_rate: None };
        c
    }

    /// Routes a 10,000-token request with TTFT, choosing on the estimate alone.
    fn ttft(cands: &[Candidate]) -> Routed {
        ttft_with(cands, 0.0)
    }

    fn ttft_with(cands: &[Candidate], later_weight: f64) -> Routed {
        let ttft = TtftParams { later_weight, ..TtftParams::default() };
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
        let t = estimate(&c, 1000, 0.25, &p);
        assert_eq!(t.own_uncached_tokens, 750.0, "a quarter of 1000 tokens is credited");
        assert_eq!(t.overhead_ms, 5.0 * (4.0 / 2.0 + 1.0), "two ranks share four requests");
        assert_eq!(t.decode_ms, 10.0, "half of a full cache's 20 ms");
        assert_eq!(t.estimate_ms, 1000.0 * (2000.0 + 750.0) / 1000.0 + 15.0 + 10.0);
        assert_eq!((t.rate_source, t.prefill_tokens_per_s), (RateSource::Configured, 1000.0));
        let learned = QueuedWork { learned_rate: Some(2000.0), ..c.queued };
        let t = estimate(&Candidate { queued: learned, ..c }, 1000, 1.5, &p);
        assert_eq!((t.rate_source, t.own_uncached_tokens), (RateSource::Learned, 0.0));
        assert_eq!(t.estimate_ms, 1000.0 * 2000.0 / 2000.0 + 15.0 + 10.0);
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
        assert_eq!(
            chosen.reason,
            "lowest estimated time to first token plus delay to later requests"
        );
        // 9000 queued tokens: 11,000 to wait for on a.
        let r = ttft(&[cand("a", 8000, 1, (9000.0, 1), 0.0), cand("b", 0, 1, (0.0, 0), 0.0)]);
        assert_eq!(r.prefill, "b");
        let a = r.candidates.iter().find(|c| c.name == "a").unwrap();
        assert_eq!(a.reason, "score 1110.0 ms (estimate plus later) is above the chosen 1005.0 ms");
    }

    #[test]
    fn under_load_a_miss_also_counts_the_delay_it_adds_to_the_requests_behind_it() {
        // The same choice as above, but with 2 requests queued on average per candidate.
        let cands = [cand("a", 8000, 1, (9000.0, 3), 0.0), cand("b", 0, 1, (0.0, 1), 0.0)];
        assert_eq!(ttft(&cands).prefill, "b", "on the estimate alone b is sooner");
        let r = ttft_with(&cands, 0.5);
        let (a, b) = (terms(&r, "a"), terms(&r, "b"));
        assert_eq!((a.behind_requests, b.behind_requests), (2.0, 2.0));
        assert_eq!(a.later_ms, 0.5 * 200.0 * 2.0, "its 2000 tokens delay two requests");
        assert_eq!(b.later_ms, 0.5 * 1000.0 * 2.0);
        assert_eq!(r.prefill, "a", "a's miss of 2000 tokens costs the fleet less: {r:?}");
        let score = |name: &str| r.candidates.iter().find(|c| c.name == name).unwrap().score;
        assert_eq!(score("a"), Some(a.estimate_ms + 200.0));
        assert_eq!(r.candidates[0].estimated_ttft_ms, Some(a.estimate_ms), "the estimate alone");
        // An idle fleet: nothing behind, nothing added.
        let idle = ttft_with(&[cand("a", 0, 2, (0.0, 0), 0.0)], 5.0);
        assert_eq!(terms(&idle, "a").later_ms, 0.0);
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
