//! Unit tests of the prediction store (TTL, confirmation, bound), of the rank rule and of CAR
//! with the predicted term.

use super::*;
use crate::car::{route, CandidateReport, DpHit, DpRouting, Rotation, RouteParams, Routed};
use crate::registry::{InstanceState, InstanceType, LoadMetrics};

fn keys(n: u128) -> Vec<ContentKey> {
    (1..=n).map(ContentKey::from_u128).collect()
}

#[test]
fn a_prediction_lives_for_its_ttl_from_its_latest_recording() {
    let mut p = Predictions::new(100, 1000);
    let k = keys(4);
    p.record(1_000, "a", &k);
    assert_eq!(p.predicted_blocks(1_000, "a", &k), 4);
    assert_eq!(p.predicted_blocks(1_099, "a", &k), 4);
    assert_eq!(p.predicted_blocks(1_099, "b", &k), 0, "only on the instance it was sent to");
    assert_eq!(p.predicted_blocks(1_100, "a", &k), 0, "expired at the TTL, before any purge");
    p.record(1_050, "a", &k[..2]);
    assert_eq!(p.predicted_blocks(1_120, "a", &k), 2, "the refreshed prefix lives on");
    p.record(1_200, "b", &k[..1]);
    assert_eq!(p.len(), 1, "recording purged what expired");
    assert_eq!(p.counters().expired, 4);
    p.purge(10_000);
    assert!(p.is_empty());
}

#[test]
fn the_longest_predicted_prefix_counts_since_keys_chain() {
    let mut p = Predictions::new(100, 1000);
    let k = keys(6);
    p.record(0, "a", &k[2..4]);
    assert_eq!(p.predicted_blocks(0, "a", &k), 4, "blocks 3 and 4 imply 1 and 2");
    let other = keys(2);
    assert_eq!(p.predicted_blocks(0, "a", &other), 0, "a prompt sharing none of them");
}

#[test]
fn confirmed_keys_are_dropped_and_the_rest_stays_expected() {
    let mut p = Predictions::new(100, 1000);
    let k = keys(5);
    p.record(0, "a", &k);
    assert_eq!(p.confirm("a", &k[..3]), 3);
    assert_eq!(p.confirm("b", &k), 0, "nothing was expected on b");
    assert_eq!(p.predicted_blocks(1, "a", &k), 5, "blocks 4 and 5 are still on their way");
    assert_eq!(p.confirm("a", &k), 2);
    assert_eq!((p.predicted_blocks(1, "a", &k), p.len()), (0, 0));
    assert_eq!(p.counters().confirmed, 5);
    // The queue's stale items are skipped: nothing counts as expired later.
    p.purge(1_000);
    assert_eq!(p.counters().expired, 0);
}

#[test]
fn recording_past_the_bound_drops_the_oldest_first() {
    let mut p = Predictions::new(1_000, 8);
    for i in 0..100u128 {
        p.record(i as u64, "a", &[ContentKey::from_u128(i)]);
        assert!(p.queue.len() <= 8 && p.len() <= 8);
    }
    let newest: Vec<ContentKey> = (92..100).map(ContentKey::from_u128).collect();
    assert_eq!(p.predicted_blocks(100, "a", &newest), 8, "the newest eight are kept");
    assert_eq!(p.predicted_blocks(100, "a", &[ContentKey::from_u128(91)]), 0);
    assert_eq!(p.counters().evicted, 92);
    // Refreshing the same key in the same millisecond takes no room.
    let mut q = Predictions::new(1_000, 2);
    for _ in 0..10 {
        q.record(5, "a", &keys(2));
    }
    assert_eq!((q.queue.len(), q.counters().evicted), (2, 0));
}

#[test]
fn a_zero_ttl_records_nothing() {
    let mut p = Predictions::new(0, 1000);
    p.record(0, "a", &keys(3));
    assert!(!p.enabled() && p.is_empty());
    assert_eq!(p.predicted_blocks(0, "a", &keys(3)), 0);
}

fn cand(name: &str, waiting: u64, ranks: &[(u64, u64)]) -> Candidate {
    Candidate {
        name: name.into(),
        kind: InstanceType::Default,
        mix_acting_prefill: false,
        state: InstanceState::Active,
        load: Some(LoadMetrics {
            waiting_requests_num: waiting,
            gpu_cache_usage_perc: 0.0,
            prefill_tokens_per_s: None,
        }),
        dp_size: ranks.len().max(1) as u32,
        ttft_profile: Vec::new(),
        tpot_profile: Vec::new(),
        hits: ranks
            .iter()
            .enumerate()
            .map(|(r, &(exact, predicted))| DpHit {
                dp_rank: r as u32,
                synchronized: true,
                identity_matches: true,
                partial: false,
                device_hit_tokens: exact,
                host_only_hit_tokens: 0,
                predicted_hit_tokens: predicted,
                approximate: false,
            })
            .collect(),
        queued: crate::car::QueuedWork::default(),
        dp_routing: DpRouting::Engine,
        rank_loads: Vec::new(),
    }
}

#[test]
fn the_predicted_term_is_the_worst_ranks_expectation_beyond_the_exact_minimum() {
    // One rank holds the prompt exactly, the other is only expected to: the instance is
    // expected whole, of which none is exact on every rank.
    let two = cand("m", 0, &[(100, 0), (0, 100)]);
    assert_eq!(super::super::kv_hit_ratio(&two, 100, 0.5), 0.0);
    assert_eq!(predicted_hit_ratio(&two, 100, 0.5), 1.0);
    // Both ranks expected 60 of which 20 exact on both: 0.4 beyond the exact 0.2.
    let partial = cand("p", 0, &[(20, 40), (20, 40)]);
    assert!((predicted_hit_ratio(&partial, 100, 0.5) - 0.4).abs() < 1e-12);
    // A rank with no prediction bounds the instance as for exact hits.
    let one = cand("o", 0, &[(0, 100), (0, 0)]);
    assert_eq!(predicted_hit_ratio(&one, 100, 0.5), 0.0);
    let mut unsynced = cand("u", 0, &[(0, 100)]);
    unsynced.hits[0].synchronized = false;
    assert_eq!(predicted_hit_ratio(&unsynced, 100, 0.5), 0.0);
    assert_eq!(predicted_hit_ratio(&cand("z", 0, &[(0, 100)]), 0, 0.5), 0.0);
}

fn report<'a>(r: &'a Routed, name: &str) -> &'a CandidateReport {
    r.candidates.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn car_credits_a_prediction_down_weighted_and_explains_it_apart_from_the_exact_hit() {
    let cands = [cand("expected", 0, &[(0, 100)]), cand("cold", 0, &[(0, 0)])];
    let p = RouteParams { predict_weight: 0.5, ..RouteParams::default() };
    let r = route(&cands, 100, &p, &mut Rotation::default()).unwrap();
    assert_eq!(r.prefill, "expected");
    let e = report(&r, "expected");
    assert_eq!((e.kv_hit_ratio, e.predicted_hit_ratio), (Some(0.0), Some(1.0)));
    assert_eq!(e.score, Some(0.5 * (1.0 - 0.5)));
    assert_eq!(e.dp_hits[0].predicted_hit_tokens, 100);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["candidates"][0]["predicted_hit_ratio"], 1.0);
    assert_eq!(json["candidates"][0]["kv_hit_ratio"], 0.0);
    // An exact hit beats a prediction of the same length (weight < 1).
    let cands = [cand("expected", 0, &[(0, 100)]), cand("exact", 0, &[(100, 0)])];
    assert_eq!(route(&cands, 100, &p, &mut Rotation::default()).unwrap().prefill, "exact");
    // Weight 0: reported, not used.
    let off = RouteParams { predict_weight: 0.0, ..RouteParams::default() };
    let cands = [cand("cold", 0, &[(0, 0)]), cand("expected", 0, &[(0, 100)])];
    let r = route(&cands, 100, &off, &mut Rotation::default()).unwrap();
    assert_eq!(r.prefill, "cold", "a tie, and cold comes first");
    assert_eq!(report(&r, "expected").predicted_hit_ratio, Some(1.0));
}
