//! Unit tests of the TTFT estimate, the busy share and the later cost's pressure.

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
    let fleet = [reporting("a", Some(6000.0)), reporting("b", Some(2000.0)), reporting("c", None)];
    let reported = fleet_reported_rate(fleet.iter());
    assert_eq!(reported, Some(4000.0), "the mean of the engines that report one");
    let t = estimate(&fleet[1], 1000, 0.0, reported, &p);
    assert_eq!((t.rate_source, t.prefill_tokens_per_s), (RateSource::Reported, 4000.0));
    assert_eq!(t.estimate_ms, 1000.0 * 1000.0 / 4000.0 + 5.0);
    let learned = QueuedWork { learned_rate: Some(2000.0), ..fleet[0].queued };
    let t = estimate(&Candidate { queued: learned, ..fleet[0].clone() }, 1000, 0.0, reported, &p);
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
    assert_eq!((a.queued_tokens, a.queued_requests, a.own_uncached_tokens), (3000.0, 1, 2000.0));
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
    assert_eq!(a.reason, "score 1110.0 ms (estimate plus miss cost) is above the chosen 1005.0 ms");
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
    let p = |queue_weight| TtftParams { later_weight: 0.25, queue_weight, ..TtftParams::default() };
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
