//! Scoring one side's candidates under the policy ([`score_side`]) and explaining each listed
//! candidate's score ([`explain`]). A side's scores also depend on terms over the whole side
//! ([`Totals`]: the longest queue, the fleet's reported rate, its busy share, the least
//! service), which the caller gives, so that a decision scoring only some candidates
//! (`prune.rs`) gives them the scores a decision over every candidate gives.

use super::policy::{kv_hit_ratio, TIE};
use super::rank::{choose_rank, RankChoice};
use super::ttft::{add_later_with, busy_share, estimate, TtftTerms};
use super::types::{Candidate, CandidateReport, Policy, RouteParams, Side};

/// The requests a candidate has waiting, as CAR's queue cost counts them.
pub(super) fn waiting(c: &Candidate) -> f64 {
    c.load.map_or(0, |l| l.waiting_requests_num) as f64
}

/// CAR's queue cost: `waiting / max(waiting over the side)`, 0 when every queue is empty.
pub(super) fn queue_cost(waiting: f64, max: f64) -> f64 {
    if max > 0.0 {
        waiting / max
    } else {
        0.0
    }
}

/// The reuse term of CAR and TTFT: the exact ratio plus the weighted predicted one.
pub(super) fn reuse(p: &RouteParams, ratio: f64, predicted: f64) -> f64 {
    ratio + p.predict_weight * predicted
}

/// CAR's prefill score.
pub(super) fn car_prefill(p: &RouteParams, reuse: f64, cost: f64) -> f64 {
    p.lambda * (1.0 - reuse) + (1.0 - p.lambda) * cost
}

/// What one side's scores depend on beyond each candidate: terms over the whole side, which a
/// decision scoring only some of its candidates (`prune.rs`) finds apart.
#[derive(Debug, Clone, Copy)]
pub(super) struct Totals {
    /// The most requests waiting at a candidate of the side (CAR's queue cost).
    pub max_waiting: f64,
    /// The fleet's reported prefill rate ([`super::ttft::fleet_reported_rate`]).
    pub reported: Option<f64>,
    /// The side's busy share ([`super::ttft::busy_share`]); `None`: from the scored ones.
    pub busy_share: Option<f64>,
    /// The least service over the side's candidates not scored here (`f64::MAX`: none).
    pub least_floor: f64,
}

impl Totals {
    /// The totals of `list`, the whole side.
    pub fn of(list: &[(usize, &Candidate)]) -> Totals {
        Totals {
            max_waiting: list.iter().map(|(_, c)| waiting(c)).fold(0.0, f64::max),
            reported: super::ttft::fleet_reported_rate(list.iter().map(|(_, c)| *c)),
            busy_share: None,
            least_floor: f64::MAX,
        }
    }
}

/// Linear interpolation of `[x, y]` samples; proportional beyond the ends.
fn interpolate(samples: &[(f64, f64)], x: f64) -> Option<f64> {
    let mut s: Vec<(f64, f64)> = samples.iter().copied().filter(|p| p.0 > 0.0).collect();
    s.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (first, last) = (*s.first()?, *s.last()?);
    if x <= first.0 {
        return Some(first.1 * x / first.0);
    }
    if x >= last.0 {
        return Some(last.1 * x / last.0);
    }
    let w = s.windows(2).find(|w| x <= w[1].0)?;
    let t = (x - w[0].0) / (w[1].0 - w[0].0);
    Some(w[0].1 + t * (w[1].1 - w[0].1))
}

fn predicted_ttft(c: &Candidate, input_tokens: usize) -> Option<f64> {
    let waiting = c.load.map_or(0, |l| l.waiting_requests_num) as f64;
    interpolate(&c.ttft_profile, input_tokens as f64).map(|t| t * (1.0 + waiting))
}

fn predicted_tpot(c: &Candidate, input_tokens: usize) -> Option<f64> {
    let batch = c.load.map_or(0, |l| l.waiting_requests_num) as f64 + 1.0;
    let len = input_tokens as f64;
    let dist = |p: &(f64, f64, f64)| {
        ((p.0 - len) / len.max(1.0)).powi(2) + ((p.1 - batch) / batch).powi(2)
    };
    let nearest =
        c.tpot_profile.iter().filter(|p| p.1 > 0.0).min_by(|a, b| dist(a).total_cmp(&dist(b)))?;
    Some(nearest.2 * batch / nearest.1)
}

/// One candidate's score on its side and the terms behind it.
#[derive(Debug, Clone)]
pub(super) struct Scored {
    /// Its position in the candidates.
    pub index: usize,
    /// The policy's score; `None`: no score (RR, missing profile).
    pub score: Option<f64>,
    /// CAR queue cost.
    pub cost: f64,
    /// CAR hit ratio and predicted ratio (P only).
    pub ratios: Option<(f64, f64)>,
    /// TTFT estimate (P only).
    pub ttft: Option<TtftTerms>,
    /// The rank kvdir chose on it (P only, where the engine accepts one).
    pub rank: Option<RankChoice>,
}

impl Scored {
    /// Whether the candidate is credited with part of the prompt (exact or predicted).
    pub fn credited(&self) -> bool {
        self.ratios.is_some_and(|(k, p)| k > 0.0 || p > 0.0)
    }
}

/// Scores each candidate of `list` (one side: candidate index and candidate) under the
/// policy, in the list's order, with the side's `totals`.
pub(super) fn score_side(
    list: &[(usize, &Candidate)],
    side: Side,
    input_tokens: usize,
    p: &RouteParams,
    totals: &Totals,
    rank_counter: &mut u64,
) -> Vec<Scored> {
    let prefill = side == Side::Prefill;
    let ranks: Vec<Option<RankChoice>> = list
        .iter()
        .map(|(_, c)| prefill.then(|| choose_rank(c, input_tokens, p, rank_counter)).flatten())
        .collect();
    score_ranked(list, ranks, side, input_tokens, p, totals)
}

/// [`score_side`] with the rank chosen on each candidate, in the list's order
/// ([`choose_rank`]; `None` on the decode side and where the engine picks).
pub(super) fn score_ranked(
    list: &[(usize, &Candidate)],
    mut ranks: Vec<Option<RankChoice>>,
    side: Side,
    input_tokens: usize,
    p: &RouteParams,
    totals: &Totals,
) -> Vec<Scored> {
    let costs: Vec<f64> =
        list.iter().map(|(_, c)| queue_cost(waiting(c), totals.max_waiting)).collect();
    let prefill = side == Side::Prefill;
    let ratio = |f: fn(&Candidate, usize, f64) -> f64, of_rank: fn(&RankChoice) -> f64| {
        let on = p.directory_enabled;
        list.iter()
            .zip(&ranks)
            .map(|((_, c), rank)| match (on, rank.as_ref().and_then(|r| r.chosen().map(|_| r))) {
                (false, _) => 0.0,
                (true, Some(r)) => of_rank(r),
                (true, None) => f(c, input_tokens, p.host_weight),
            })
            .collect::<Vec<f64>>()
    };
    let ratios = ratio(kv_hit_ratio, |r| r.chosen().map_or(0.0, |s| s.kv_hit_ratio));
    let predicted =
        ratio(super::predicted_hit_ratio, |r| r.chosen().map_or(0.0, |s| s.predicted_hit_ratio));
    let reuse = |k: usize| reuse(p, ratios[k], predicted[k]);
    let mut ttft: Vec<Option<TtftTerms>> = list
        .iter()
        .enumerate()
        .map(|(k, (_, c))| {
            prefill.then(|| estimate(c, input_tokens, reuse(k), totals.reported, &p.ttft))
        })
        .collect();
    let busy = totals.busy_share.unwrap_or_else(|| busy_share(ttft.iter().flatten().copied()));
    add_later_with(&mut ttft, &p.ttft, busy, totals.least_floor);
    let scores: Vec<Option<f64>> = list
        .iter()
        .enumerate()
        .map(|(k, (_, c))| match (p.policy, side) {
            (Policy::Rr, _) => None,
            (Policy::Car, Side::Prefill) => Some(car_prefill(p, reuse(k), costs[k])),
            (Policy::Car | Policy::Ttft, Side::Decode) => {
                Some(c.load.map_or(0.0, |l| l.gpu_cache_usage_perc) + costs[k])
            }
            (Policy::Ttft, Side::Prefill) => ttft[k].map(|t| t.score()),
            (Policy::SloAware, Side::Prefill) => predicted_ttft(c, input_tokens),
            (Policy::SloAware, Side::Decode) => predicted_tpot(c, input_tokens),
        })
        .collect();
    (0..list.len())
        .map(|k| Scored {
            index: list[k].0,
            score: scores[k],
            cost: costs[k],
            ratios: prefill.then_some((ratios[k], predicted[k])),
            ttft: ttft[k],
            rank: ranks[k].take(),
        })
        .collect()
}

/// SLO_AWARE: classifies each prediction against its `target` (ms) and says so when the
/// chosen one misses it.
pub(super) fn explain_slo(
    reports: &mut [CandidateReport],
    at: &[Option<usize>],
    scored: &[Scored],
    target: f64,
) {
    for s in scored {
        let Some(r) = at[s.index].map(|k| &mut reports[k]) else { continue };
        r.meets_slo = r.score.map(|s| s <= target);
        if r.chosen && r.meets_slo == Some(false) {
            r.reason = format!(
                "lowest score, but its prediction {:.1} ms is above the target {target} ms: no \
                 candidate meets it",
                r.score.unwrap_or_default()
            );
        } else if r.chosen && r.meets_slo == Some(true) {
            r.reason = format!("lowest score; within the target {target} ms");
        }
    }
}

/// Writes each listed candidate's score, terms and reason (`at`: its place in `reports`).
pub(super) fn explain(
    reports: &mut [CandidateReport],
    at: &[Option<usize>],
    scored: &[Scored],
    chosen: Option<usize>,
    policy: Policy,
) {
    let best = scored.iter().find(|s| Some(s.index) == chosen).and_then(|s| s.score);
    for s in scored {
        let (i, score) = (s.index, s.score);
        let Some(r) = at[i].map(|k| &mut reports[k]) else { continue };
        r.score = score;
        r.kv_hit_ratio = s.ratios.map(|v| v.0);
        r.predicted_hit_ratio = s.ratios.map(|v| v.1);
        r.ttft = s.ttft;
        r.estimated_ttft_ms = s.ttft.map(|t| t.estimate_ms);
        r.dp_rank = s.rank.as_ref().map(|c| c.dp_rank);
        r.rank_scores = s.rank.as_ref().map_or_else(Vec::new, |c| c.scores.clone());
        if policy == Policy::Car || (policy == Policy::Ttft && r.side == Side::Decode) {
            r.queue_cost = Some(s.cost);
        }
        r.chosen = chosen == Some(i);
        r.reason = match (r.chosen, policy, score, best) {
            (true, Policy::Rr, _, _) => "next in round-robin order".into(),
            (true, Policy::Ttft, Some(_), _) if r.side == Side::Prefill => {
                "lowest estimated time to first token plus miss cost".into()
            }
            (true, _, Some(_), _) => "lowest score".into(),
            (true, _, None, _) => "no candidate has a score; rotated".into(),
            (false, Policy::Rr, _, _) => "not its turn in round-robin order".into(),
            (false, _, Some(s), Some(b)) if (s - b).abs() <= TIE => {
                "tied; another took its turn".into()
            }
            (false, Policy::Ttft, Some(s), Some(b)) if r.side == Side::Prefill => {
                format!("score {s:.1} ms (estimate plus miss cost) is above the chosen {b:.1} ms")
            }
            (false, _, Some(s), Some(b)) => format!("score {s:.4} is above the chosen {b:.4}"),
            (false, Policy::SloAware, None, _) => "no profiling data".into(),
            (false, _, _, _) => "not chosen".into(),
        };
    }
}
