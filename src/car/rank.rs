//! Routing to a DP rank: where the engine accepts the rank with the request (vLLM's and
//! SGLang's `X-data-parallel-rank` header), kvdir chooses the instance *and* the rank, and
//! credits that rank's own hit; elsewhere the engine picks the rank itself and an instance is
//! credited the minimum over its ranks (the seed's rule, [`super::kv_hit_ratio`]).
//!
//! The rank's score, smallest wins, ties rotate ([`choose_rank`]):
//! ```text
//! reuse_r  = kv_hit_ratio_r + predict_weight * predicted_hit_ratio_r   (that rank's own hit)
//! load_r   = (waiting_r / max(waiting over the instance's ranks) + kv_usage_r) / 2
//!            (0 where the engine reports no per-rank load)
//! score_r  = lambda * (1 - reuse_r) + (1 - lambda) * load_r
//! ```
//! Invariants: a rank gives credit only when its own stream is synchronized and started for the
//! instance's current process; another rank's missing or stale stream costs it nothing. A rank
//! the client pinned ([`DpRouting::Pinned`]) is the only one scored. Pure: the caller keeps the
//! tie counter.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use super::types::{Candidate, DpHit, RouteParams};

/// Ranks scored per instance at most: a hostile `dp_size` (up to 2^32 - 1) costs no loop.
pub const MAX_SCORED_RANKS: u32 = 1024;

/// Who picks an instance's DP rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "by", content = "rank")]
pub enum DpRouting {
    /// The engine (its own balancer): credit is the minimum over its ranks.
    #[default]
    Engine,
    /// kvdir: the engine accepts the rank with the request, and kvdir scores every rank.
    Kvdir,
    /// The client sent the rank itself; it is passed through and credited.
    Pinned(u32),
}

/// One DP rank's load, as the engine reports it per rank (vLLM's `engine="r"` label, SGLang's
/// `dp_rank="r"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankLoad {
    /// The rank.
    pub dp_rank: u32,
    /// Requests waiting plus running on it.
    pub waiting: u64,
    /// Its KV cache usage in 0..=1.
    pub kv_usage: f64,
}

/// One rank's score and its terms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankScore {
    /// The rank.
    pub dp_rank: u32,
    /// Its own exact hit ratio.
    pub kv_hit_ratio: f64,
    /// Its predicted ratio beyond the exact one.
    pub predicted_hit_ratio: f64,
    /// Its load term (0 without a per-rank report).
    pub load: f64,
    /// Its reported load, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<RankLoad>,
    /// The score; smallest wins.
    pub score: f64,
}

/// The rank chosen for an instance and every scored rank.
#[derive(Debug, Clone, PartialEq)]
pub struct RankChoice {
    /// The chosen rank.
    pub dp_rank: u32,
    /// Every scored rank, in rank order.
    pub scores: Vec<RankScore>,
}

impl RankChoice {
    /// The chosen rank's score.
    pub fn chosen(&self) -> Option<&RankScore> {
        self.scores.iter().find(|s| s.dp_rank == self.dp_rank)
    }
}

/// A rank's exact and predicted ratios: 0 when its stream is missing, unsynchronized or was
/// started for another process.
pub(crate) fn rank_ratios(
    hit: Option<&DpHit>,
    input_tokens: usize,
    host_weight: f64,
) -> (f64, f64) {
    match hit {
        Some(h) if h.synchronized && h.identity_matches && input_tokens > 0 => {
            let exact = h.device_hit_tokens as f64 + host_weight * h.host_only_hit_tokens as f64;
            let input = input_tokens as f64;
            let exact_ratio = (exact / input).clamp(0.0, 1.0);
            let expected = ((exact + h.predicted_hit_tokens as f64) / input).clamp(0.0, 1.0);
            (exact_ratio, (expected - exact_ratio).max(0.0))
        }
        _ => (0.0, 0.0),
    }
}

/// Chooses `c`'s rank when kvdir routes to ranks there ([`DpRouting`]); `None` when its engine
/// picks. `counter` rotates between equal scores and moves only when it breaks a tie.
pub fn choose_rank(
    c: &Candidate,
    input_tokens: usize,
    p: &RouteParams,
    counter: &mut u64,
) -> Option<RankChoice> {
    let ranks = scored_ranks(c)?;
    let most_waiting = most_waiting(c, ranks.clone());
    let scores: Vec<RankScore> = ranks
        .map(|r| {
            let hit = c.hits.iter().find(|h| h.dp_rank == r);
            rank_score(c, r, hit, most_waiting, input_tokens, p)
        })
        .collect();
    let best = scores.iter().map(|s| s.score).fold(f64::INFINITY, f64::min);
    let tied: Vec<u32> = scores.iter().filter(|s| tied(s.score, best)).map(|s| s.dp_rank).collect();
    let dp_rank = tied[(*counter % tied.len() as u64) as usize];
    if tied.len() > 1 {
        *counter += 1;
    }
    Some(RankChoice { dp_rank, scores })
}

/// Whether [`choose_rank`] of `c` credited with nothing on any rank (no hits) would find a
/// tie, and so move its counter: the same scores, without building them.
pub(crate) fn uncredited_ranks_tie(c: &Candidate, input_tokens: usize, p: &RouteParams) -> bool {
    let Some(ranks) = scored_ranks(c) else { return false };
    let most_waiting = most_waiting(c, ranks.clone());
    let score = |r| rank_score(c, r, None, most_waiting, input_tokens, p).score;
    let best = ranks.clone().map(score).fold(f64::INFINITY, f64::min);
    ranks.filter(|&r| tied(score(r), best)).nth(1).is_some()
}

/// The ranks [`choose_rank`] scores: `None` where the engine picks.
fn scored_ranks(c: &Candidate) -> Option<RangeInclusive<u32>> {
    match c.dp_routing {
        DpRouting::Engine => None,
        DpRouting::Pinned(r) => Some(r..=r),
        DpRouting::Kvdir => Some(0..=c.dp_size.clamp(1, MAX_SCORED_RANKS) - 1),
    }
}

fn reported(c: &Candidate, r: u32) -> Option<RankLoad> {
    c.rank_loads.iter().find(|l| l.dp_rank == r).copied()
}

/// The longest reported queue over `ranks`.
fn most_waiting(c: &Candidate, ranks: RangeInclusive<u32>) -> Option<u64> {
    ranks.filter_map(|r| reported(c, r)).map(|l| l.waiting).max()
}

/// Whether `score` ties the `best` one.
fn tied(score: f64, best: f64) -> bool {
    (score - best).abs() <= 1e-12
}

/// Rank `r`'s score on `c` with its `hit`, if any.
fn rank_score(
    c: &Candidate,
    r: u32,
    hit: Option<&DpHit>,
    most_waiting: Option<u64>,
    input_tokens: usize,
    p: &RouteParams,
) -> RankScore {
    let (exact, predicted) = match p.directory_enabled {
        true => rank_ratios(hit, input_tokens, p.host_weight),
        false => (0.0, 0.0),
    };
    let reported = reported(c, r);
    let load = reported.map_or(0.0, |l| {
        let queue = most_waiting.filter(|&m| m > 0).map_or(0.0, |m| l.waiting as f64 / m as f64);
        (queue + l.kv_usage.clamp(0.0, 1.0)) / 2.0
    });
    let reuse = exact + p.predict_weight * predicted;
    let score = p.lambda * (1.0 - reuse) + (1.0 - p.lambda) * load;
    RankScore {
        dp_rank: r,
        kv_hit_ratio: exact,
        predicted_hit_ratio: predicted,
        load,
        reported,
        score,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vLLM-like instance of `hits.len()` ranks routed by kvdir, with `loads` per rank.
    fn ranked(hits: &[u64], loads: &[(u64, f64)]) -> Candidate {
        let mut c = Candidate::test_idle("a", hits.len() as u32, 0);
        for (h, &t) in c.hits.iter_mut().zip(hits) {
            h.device_hit_tokens = t;
        }
        c.dp_routing = DpRouting::Kvdir;
        c.rank_loads = loads
            .iter()
            .enumerate()
            .map(|(r, &(waiting, kv_usage))| RankLoad { dp_rank: r as u32, waiting, kv_usage })
            .collect();
        c
    }

    fn choose(c: &Candidate, counter: &mut u64) -> RankChoice {
        choose_rank(c, 100, &RouteParams::default(), counter).unwrap()
    }

    #[test]
    fn the_rank_holding_the_prompt_wins_and_its_score_follows_the_formula() {
        let c = ranked(&[0, 80], &[]);
        let choice = choose(&c, &mut 0);
        assert_eq!(choice.dp_rank, 1);
        let s = choice.chosen().unwrap();
        assert_eq!((s.kv_hit_ratio, s.load, s.score), (0.8, 0.0, 0.5 * (1.0 - 0.8)));
        assert_eq!(choice.scores[0].score, 0.5, "rank 0 holds nothing");
    }

    #[test]
    fn a_loaded_rank_loses_to_an_idle_one_with_the_same_hit() {
        let c = ranked(&[50, 50], &[(4, 0.5), (1, 0.1)]);
        let choice = choose(&c, &mut 0);
        assert_eq!(choice.dp_rank, 1);
        assert_eq!(choice.scores[0].load, (1.0 + 0.5) / 2.0);
        assert_eq!(choice.scores[1].load, (0.25 + 0.1) / 2.0);
        // A long enough hit outweighs the queue (lambda 0.5).
        let c = ranked(&[90, 0], &[(4, 0.5), (0, 0.0)]);
        assert_eq!(choose(&c, &mut 0).dp_rank, 0);
    }

    #[test]
    fn ties_rotate_and_an_engine_that_picks_its_rank_gets_no_choice() {
        let c = ranked(&[0, 0, 0], &[]);
        let mut counter = 0;
        let picks: Vec<u32> = (0..4).map(|_| choose(&c, &mut counter).dp_rank).collect();
        assert_eq!(picks, [0, 1, 2, 0]);
        let engine = Candidate { dp_routing: DpRouting::Engine, ..c };
        assert_eq!(choose_rank(&engine, 100, &RouteParams::default(), &mut 0), None);
    }

    #[test]
    fn another_ranks_unsynchronized_stream_costs_the_chosen_rank_nothing() {
        let mut c = ranked(&[70, 90], &[]);
        c.hits[1].synchronized = false;
        let choice = choose(&c, &mut 0);
        assert_eq!((choice.dp_rank, choice.chosen().unwrap().kv_hit_ratio), (0, 0.7));
        c.hits.remove(1);
        assert_eq!(choose(&c, &mut 0).dp_rank, 0, "rank 1 has no stream at all");
    }

    #[test]
    fn an_uncredited_instance_ties_exactly_where_choose_rank_moves_its_counter() {
        let loads: [&[(u64, f64)]; 5] = [
            &[],
            &[(1, 0.5)],
            &[(2, 0.5), (2, 0.5)],
            &[(0, 0.0), (3, 0.2), (3, 0.2)],
            &[(1, 0.5), (0, 0.0)],
        ];
        let mut seen = [0; 2];
        for dp in 1..=4 {
            for l in loads {
                for routing in [DpRouting::Kvdir, DpRouting::Pinned(1), DpRouting::Engine] {
                    let mut c = ranked(&vec![0; dp], l);
                    c.hits.clear();
                    c.dp_routing = routing;
                    let p = RouteParams { lambda: 0.3, ..RouteParams::default() };
                    let mut counter = 7;
                    choose_rank(&c, 100, &p, &mut counter);
                    let ties = uncredited_ranks_tie(&c, 100, &p);
                    assert_eq!(ties, counter == 8, "{dp} ranks, loads {l:?}, {routing:?}");
                    seen[usize::from(ties)] += 1;
                }
            }
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
    }

    #[test]
    fn a_pinned_rank_is_the_only_one_scored() {
        let mut c = ranked(&[0, 80], &[]);
        c.dp_routing = DpRouting::Pinned(0);
        let choice = choose(&c, &mut 0);
        assert_eq!((choice.dp_rank, choice.scores.len()), (0, 1));
        assert_eq!(choice.scores[0].kv_hit_ratio, 0.0);
    }

    #[test]
    fn a_hostile_rank_count_costs_no_loop() {
        let mut c = ranked(&[10], &[]);
        c.dp_size = u32::MAX;
        assert_eq!(choose(&c, &mut 0).scores.len(), MAX_SCORED_RANKS as usize);
    }

    #[test]
    fn an_instance_whose_rank_kvdir_chooses_is_credited_that_ranks_hit_not_the_minimum() {
        use crate::car::{route, CacheState, Rotation};
        let b = Candidate::test_idle("b", 2, 60);
        let mut a = ranked(&[0, 80], &[]);
        let p = RouteParams { lambda: 1.0, ..RouteParams::default() };
        let engine_picks = Candidate { dp_routing: DpRouting::Engine, ..a.clone() };
        let r = route(&[engine_picks, b.clone()], 100, &p, &mut Rotation::default()).unwrap();
        assert_eq!((r.prefill.as_str(), r.dp_rank), ("b", None), "the minimum rule: a has 0");
        let r = route(&[a.clone(), b.clone()], 100, &p, &mut Rotation::default()).unwrap();
        assert_eq!((r.prefill.as_str(), r.dp_rank), ("a", Some(1)));
        let chosen = &r.candidates[0];
        assert_eq!((chosen.kv_hit_ratio, chosen.dp_rank), (Some(0.8), Some(1)));
        assert_eq!(chosen.cached_tokens(), (80, CacheState::Exact), "rank 1's hit, exactly");
        assert_eq!(chosen.rank_scores.len(), 2);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["dp_rank"], 1);
        assert_eq!(json["candidates"][0]["rank_scores"][1]["kv_hit_ratio"], 0.8);
        assert!(json["candidates"][1].get("dp_rank").is_none(), "b's engine picks its rank");
        // Rank 0 unsynchronized: rank 1's credit stands.
        a.hits[0].synchronized = false;
        let r = route(&[a, b], 100, &p, &mut Rotation::default()).unwrap();
        assert_eq!(r.candidates[0].cached_tokens(), (80, CacheState::Exact));
    }
}
