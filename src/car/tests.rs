//! Unit tests of candidate selection and every policy rule and edge.

use super::*;
use crate::registry::{InstanceState, InstanceType, LoadMetrics};

fn cand(name: &str, kind: InstanceType, waiting: u64, hits: &[(u64, u64)]) -> Candidate {
    Candidate {
        name: name.into(),
        kind,
        mix_acting_prefill: true,
        state: InstanceState::Active,
        load: Some(LoadMetrics {
            waiting_requests_num: waiting,
            gpu_cache_usage_perc: 0.0,
            prefill_tokens_per_s: None,
        }),
        dp_size: hits.len().max(1) as u32,
        ttft_profile: Vec::new(),
        tpot_profile: Vec::new(),
        hits: hits
            .iter()
            .enumerate()
            .map(|(r, &(d, h))| DpHit {
                dp_rank: r as u32,
                synchronized: true,
                identity_matches: true,
                partial: false,
                device_hit_tokens: d,
                host_only_hit_tokens: h,
                predicted_hit_tokens: 0,
                approximate: false,
            })
            .collect(),
        queued: QueuedWork::default(),
        dp_routing: DpRouting::Engine,
        rank_loads: Vec::new(),
    }
}

fn params(lambda: f64, host_weight: f64) -> RouteParams {
    RouteParams { lambda, host_weight, ..RouteParams::default() }
}

fn pick(cands: &[Candidate], p: &RouteParams) -> Routed {
    route(cands, 100, p, &mut Rotation::default()).unwrap()
}

fn report<'a>(r: &'a Routed, name: &str) -> &'a CandidateReport {
    r.candidates.iter().find(|c| c.name == name).unwrap()
}

const D: InstanceType = InstanceType::Default;
const P: InstanceType = InstanceType::Prefill;

#[test]
fn the_prefill_score_follows_the_formula() {
    let cands = [cand("a", D, 2, &[(50, 0)]), cand("b", D, 4, &[(0, 0)])];
    let r = pick(&cands, &params(0.5, 0.5));
    let (a, b) = (report(&r, "a"), report(&r, "b"));
    assert_eq!((a.kv_hit_ratio, a.queue_cost), (Some(0.5), Some(0.5)));
    assert_eq!(a.score, Some(0.5 * 0.5 + 0.5 * 0.5));
    assert_eq!((b.kv_hit_ratio, b.queue_cost, b.score), (Some(0.0), Some(1.0), Some(1.0)));
    assert_eq!(r.prefill, "a");
    assert!(a.chosen && !b.chosen);
    assert_eq!(b.reason, "score 1.0000 is above the chosen 0.5000");
}

#[test]
fn empty_queues_cost_nothing_and_lambda_bounds_pick_one_term() {
    let r = pick(&[cand("a", D, 0, &[(10, 0)]), cand("b", D, 0, &[(90, 0)])], &params(0.5, 0.5));
    assert_eq!(report(&r, "a").queue_cost, Some(0.0));
    assert_eq!(r.prefill, "b");
    let busy_cached = [cand("a", D, 10, &[(100, 0)]), cand("b", D, 1, &[(0, 0)])];
    assert_eq!(pick(&busy_cached, &params(1.0, 0.5)).prefill, "a", "lambda 1: cache only");
    assert_eq!(pick(&busy_cached, &params(0.0, 0.5)).prefill, "b", "lambda 0: queue only");
}

#[test]
fn host_only_hits_are_weighted() {
    let cands = [cand("dev", D, 0, &[(40, 0)]), cand("host", D, 0, &[(0, 60)])];
    assert_eq!(pick(&cands, &params(1.0, 1.0)).prefill, "host");
    assert_eq!(pick(&cands, &params(1.0, 0.0)).prefill, "dev");
    let r = pick(&cands, &params(1.0, 0.5));
    assert_eq!(report(&r, "host").kv_hit_ratio, Some(0.3));
}

#[test]
fn a_multi_dp_instance_gets_its_minimum_and_bad_ranks_give_zero() {
    let c = cand("m", D, 0, &[(80, 0), (20, 0)]);
    assert_eq!(kv_hit_ratio(&c, 100, 0.5), 0.2, "the minimum, never the best or a sum");
    let mut unsynced = c.clone();
    unsynced.hits[1].synchronized = false;
    assert_eq!(kv_hit_ratio(&unsynced, 100, 0.5), 0.0);
    let mut stale = c.clone();
    stale.hits[0].identity_matches = false;
    assert_eq!(kv_hit_ratio(&stale, 100, 0.5), 0.0);
    let mut missing = c.clone();
    missing.dp_size = 3;
    assert_eq!(kv_hit_ratio(&missing, 100, 0.5), 0.0);
    let over = cand("o", D, 0, &[(500, 0)]);
    assert_eq!(kv_hit_ratio(&over, 100, 0.5), 1.0, "clamped");
    assert_eq!(kv_hit_ratio(&over, 0, 0.5), 0.0);
}

#[test]
fn the_front_door_reports_the_chosen_instances_minimum_and_its_stream_state() {
    let c = cand("m", D, 0, &[(80, 16), (64, 0)]);
    let routed = pick(std::slice::from_ref(&c), &params(0.5, 0.5));
    let r = report(&routed, "m");
    assert_eq!(r.cached_tokens(), (64, CacheState::Exact), "Host-only tokens count too");
    let mut partial = r.clone();
    partial.dp_hits[1].partial = true;
    assert_eq!(partial.cached_tokens(), (64, CacheState::Partial));
    let mut stale = r.clone();
    stale.dp_hits[0].identity_matches = false;
    assert_eq!(stale.cached_tokens(), (0, CacheState::Unsynchronized));
    let mut unsynced = r.clone();
    unsynced.dp_hits[1].synchronized = false;
    assert_eq!(unsynced.cached_tokens(), (0, CacheState::Unsynchronized));
}

#[test]
fn a_hostile_dp_size_gives_zero_at_once_instead_of_a_four_billion_rank_loop() {
    let mut hostile = cand("h", D, 0, &[(100, 0)]);
    hostile.dp_size = u32::MAX;
    let started = std::time::Instant::now();
    assert_eq!(kv_hit_ratio(&hostile, 100, 0.5), 0.0, "its other ranks are missing");
    let routed = pick(&[hostile, cand("b", D, 1, &[(0, 0)])], &params(0.5, 0.5));
    assert_eq!(report(&routed, "h").kv_hit_ratio, Some(0.0));
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
}

#[test]
fn equal_scores_rotate_between_calls() {
    let cands =
        [cand("a", D, 0, &[(0, 0)]), cand("b", D, 0, &[(0, 0)]), cand("c", D, 0, &[(0, 0)])];
    let mut rot = Rotation::default();
    let picks: Vec<String> = (0..4)
        .map(|_| route(&cands, 10, &RouteParams::default(), &mut rot).unwrap().prefill)
        .collect();
    assert_eq!(picks, ["a", "b", "c", "a"]);
}

#[test]
fn a_decision_with_a_clear_winner_does_not_move_the_tie_rotation() {
    let tied = [cand("a", D, 0, &[(0, 0)]), cand("b", D, 0, &[(0, 0)]), cand("c", D, 0, &[(0, 0)])];
    let mut clear = tied.clone();
    clear[2].hits[0].device_hit_tokens = 10; // "c" holds the whole prompt
    let mut rot = Rotation::default();
    let mut next =
        |cands: &[Candidate]| route(cands, 10, &RouteParams::default(), &mut rot).unwrap().prefill;
    assert_eq!(next(&tied), "a");
    // Four requests that all follow the cache, as a burst of siblings would.
    for _ in 0..4 {
        assert_eq!(next(&clear), "c");
    }
    // The next tie goes on from where the last tie left off.
    assert_eq!(next(&tied), "b");
    assert_eq!(next(&tied), "c");
}

#[test]
fn without_decode_only_default_serves_alone() {
    let cands = [cand("p", P, 0, &[(100, 0)]), cand("d", D, 5, &[(0, 0)])];
    let r = pick(&cands, &RouteParams::default());
    assert_eq!((r.prefill.as_str(), r.decode.as_deref()), ("d", None));
    assert_eq!(
        report(&r, "p").reason,
        "no decode instance: only a DEFAULT instance may serve alone"
    );
    let err =
        route(&cands[..1], 10, &RouteParams::default(), &mut Rotation::default()).unwrap_err();
    assert!(err.to_string().contains("only a DEFAULT instance may serve alone"), "{err}");
    let none = route(&[], 10, &RouteParams::default(), &mut Rotation::default()).unwrap_err();
    assert_eq!(none.to_string(), "no instance can prefill this request: no instances are known");
}

#[test]
fn decode_candidates_are_scored_by_usage_and_queue() {
    let mut d1 = cand("d1", InstanceType::Decode, 4, &[]);
    d1.load = Some(LoadMetrics {
        waiting_requests_num: 4,
        gpu_cache_usage_perc: 0.1,
        prefill_tokens_per_s: None,
    });
    let mut d2 = cand("d2", InstanceType::Decode, 1, &[]);
    d2.load = Some(LoadMetrics {
        waiting_requests_num: 1,
        gpu_cache_usage_perc: 0.9,
        prefill_tokens_per_s: None,
    });
    let mut mix = cand("mix", InstanceType::Mix, 0, &[]);
    mix.mix_acting_prefill = false;
    mix.load = Some(LoadMetrics {
        waiting_requests_num: 0,
        gpu_cache_usage_perc: 0.95,
        prefill_tokens_per_s: None,
    });
    let cands = [cand("p", P, 0, &[(0, 0)]), d1, d2, mix];
    let r = pick(&cands, &RouteParams::default());
    assert_eq!(report(&r, "d1").score, Some(0.1 + 1.0));
    assert_eq!(report(&r, "d2").score, Some(0.9 + 0.25));
    assert_eq!(report(&r, "mix").side, Side::Decode);
    assert_eq!(r.decode.as_deref(), Some("mix"), "0.95 + 0 is the smallest");
    assert_eq!(r.prefill, "p", "a PREFILL instance serves when there is a decode side");
}

#[test]
fn missing_invalid_or_suspect_instances_are_not_candidates() {
    let mut no_load = cand("none", D, 0, &[(100, 0)]);
    no_load.load = None;
    let mut bad = cand("bad", D, 0, &[(100, 0)]);
    bad.load = Some(LoadMetrics {
        waiting_requests_num: 0,
        gpu_cache_usage_perc: f64::NAN,
        prefill_tokens_per_s: None,
    });
    let mut suspect = cand("sus", D, 0, &[(100, 0)]);
    suspect.state = InstanceState::Suspect;
    let r = pick(&[no_load, bad, suspect, cand("ok", D, 9, &[])], &RouteParams::default());
    assert_eq!(r.prefill, "ok");
    assert_eq!(report(&r, "none").reason, "no load report yet");
    assert!(report(&r, "bad").reason.starts_with("invalid load"));
    assert_eq!(report(&r, "sus").reason, "SUSPECT: not schedulable");
}

#[test]
fn a_disabled_directory_gives_zero_ratios() {
    let cands = [cand("a", D, 1, &[(100, 0)]), cand("b", D, 0, &[(0, 0)])];
    let p = RouteParams { directory_enabled: false, ..RouteParams::default() };
    let r = pick(&cands, &p);
    assert_eq!(report(&r, "a").kv_hit_ratio, Some(0.0));
    assert_eq!(r.prefill, "b");
}

#[test]
fn round_robin_cycles_each_list() {
    let cands =
        [cand("a", P, 0, &[]), cand("b", P, 0, &[]), cand("d", InstanceType::Decode, 0, &[])];
    let p = RouteParams { policy: Policy::Rr, ..RouteParams::default() };
    let mut rot = Rotation::default();
    let picks: Vec<(String, Option<String>)> = (0..3)
        .map(|_| route(&cands, 10, &p, &mut rot).map(|r| (r.prefill, r.decode)).unwrap())
        .collect();
    assert_eq!(picks[0], ("a".into(), Some("d".into())));
    assert_eq!(picks[1].0, "b");
    assert_eq!(picks[2].0, "a");
}

#[test]
fn slo_aware_uses_profiles_and_load() {
    let mut fast = cand("fast", D, 3, &[]);
    fast.ttft_profile = vec![(100.0, 40.0), (1000.0, 400.0)];
    let mut slow = cand("slow", D, 0, &[]);
    slow.ttft_profile = vec![(100.0, 100.0)];
    let unprofiled = cand("none", D, 0, &[]);
    let p = RouteParams { policy: Policy::SloAware, ..RouteParams::default() };
    let r = route(&[fast, slow, unprofiled], 550, &p, &mut Rotation::default()).unwrap();
    assert_eq!(report(&r, "fast").score, Some(220.0 * 4.0));
    assert_eq!(report(&r, "slow").score, Some(550.0));
    assert_eq!(r.prefill, "slow");
    assert_eq!(report(&r, "none").reason, "no profiling data");
    assert_eq!(report(&r, "slow").meets_slo, Some(true), "550 ms is within the 1000 ms target");
    assert_eq!(report(&r, "fast").meets_slo, Some(true), "880 ms too, though it loses");
    assert_eq!(report(&r, "none").meets_slo, None, "no prediction, no verdict");
    assert_eq!(report(&r, "slow").reason, "lowest score; within the target 1000 ms");
    assert_eq!("SLO_AWARE".parse::<Policy>(), Ok(Policy::SloAware));
    assert!("car".parse::<Policy>().unwrap_err().contains("not one of RR, SLO_AWARE, CAR"));
}

#[test]
fn slo_aware_says_when_no_candidate_meets_the_targets() {
    let mut a = cand("a", D, 1, &[]);
    a.ttft_profile = vec![(100.0, 300.0)];
    let p =
        RouteParams { policy: Policy::SloAware, target_ttft_ms: 200.0, ..RouteParams::default() };
    let r = route(&[a], 100, &p, &mut Rotation::default()).unwrap();
    let a = report(&r, "a");
    assert_eq!((a.chosen, a.meets_slo), (true, Some(false)));
    assert_eq!(
        a.reason,
        "lowest score, but its prediction 600.0 ms is above the target 200 ms: no candidate meets it"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["candidates"][0]["meets_slo"], false);
    let car =
        route(&[cand("b", D, 1, &[])], 100, &RouteParams::default(), &mut Rotation::default());
    let json = serde_json::to_value(car.unwrap()).unwrap();
    assert!(json["candidates"][0].get("meets_slo").is_none(), "only SLO_AWARE reports it");
}

#[test]
fn an_engine_reuses_the_whole_blocks_within_all_but_the_last_token() {
    assert_eq!(reusable_limit(864, 32), 832, "27 whole blocks cached: 26 reused");
    assert_eq!(reusable_limit(865, 32), 864, "a partial last block costs nothing more");
    assert_eq!(reusable_limit(33, 32), 32);
    assert_eq!(reusable_limit(32, 32), 0, "one block, all of the prompt: nothing");
    assert_eq!((reusable_limit(1, 32), reusable_limit(0, 32)), (0, 0));
    assert_eq!(reusable_limit(5, 0), 4, "a block size of 0 counts as 1");
    let hit = |d, h| cand("a", InstanceType::Default, 0, &[(d, h)]).hits[0].clone();
    let within = |d, h, limit| {
        let w = hit(d, h).within(limit);
        (w.device_hit_tokens, w.host_only_hit_tokens)
    };
    assert_eq!(within(864, 0, 832), (832, 0));
    assert_eq!(within(800, 64, 832), (800, 32), "Device first, then Host-only");
    assert_eq!(within(0, 864, 832), (0, 832));
    assert_eq!(within(320, 64, 832), (320, 64), "below the limit: unchanged");
}
