//! Candidate filtering and the four policies. Everything here is a pure function of its
//! inputs plus a [`Rotation`] that the caller keeps between calls (for RR and for ties).

use super::listing::{chosen_first, RouteSummary, ROUTE_LIST};
use super::rank::{choose_rank, RankChoice};
use super::ttft::{add_later, estimate, TtftTerms};
use super::types::{Candidate, CandidateReport, Policy, RouteParams, Routed, Side};
use crate::registry::{InstanceState, InstanceType};

/// Two scores closer than this are equal (they come from the same formula).
const TIE: f64 = 1e-12;

/// No instance can take the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No eligible prefill-side instance.
    #[error("no instance can prefill this request: {0}")]
    NoPrefill(String),
}

/// Counters kept between calls: RR positions and tie rotation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rotation {
    /// Prefill-side counter.
    pub prefill: u64,
    /// Decode-side counter.
    pub decode: u64,
    /// DP-rank counter (ties between an instance's ranks).
    pub rank: u64,
}

fn side(c: &Candidate) -> Side {
    match c.kind.prefills(c.mix_acting_prefill) {
        true => Side::Prefill,
        false => Side::Decode,
    }
}

/// Why a candidate cannot be scheduled at all, if it cannot.
fn ineligible(c: &Candidate) -> Option<String> {
    if c.state == InstanceState::Suspect {
        return Some("SUSPECT: not schedulable".into());
    }
    match c.load {
        None => Some("no load report yet".into()),
        Some(l) if !l.is_valid() => {
            Some(format!("invalid load: gpu_cache_usage_perc = {}", l.gpu_cache_usage_perc))
        }
        Some(_) => None,
    }
}

/// The CAR hit ratio: the minimum over the DP ranks, 0 for a missing, unsynchronized or
/// stale-identity rank.
pub fn kv_hit_ratio(c: &Candidate, input_tokens: usize, host_weight: f64) -> f64 {
    // Hits hold at most one entry per rank, so fewer entries than ranks means a missing rank;
    // checking first also keeps a hostile `dp_size` (up to 2^32 - 1) from costing a loop.
    if input_tokens == 0 || c.hits.len() < c.dp_size.max(1) as usize {
        return 0.0;
    }
    (0..c.dp_size.max(1))
        .map(|rank| match c.hits.iter().find(|h| h.dp_rank == rank) {
            Some(h) if h.synchronized && h.identity_matches => {
                let hit = h.device_hit_tokens as f64 + host_weight * h.host_only_hit_tokens as f64;
                (hit / input_tokens as f64).clamp(0.0, 1.0)
            }
            _ => 0.0,
        })
        .fold(f64::INFINITY, f64::min)
}

/// Picks the smallest score, rotating between equal ones; `None` scores come last. The
/// rotation moves only when it breaks a tie, so decisions with a clear winner (the siblings
/// of a prompt following its prediction, say) do not decide which instance the next tie picks.
fn pick(scores: &[(usize, Option<f64>)], counter: &mut u64) -> usize {
    let best = scores.iter().filter_map(|s| s.1).fold(f64::INFINITY, f64::min);
    let tied: Vec<usize> = scores
        .iter()
        .filter(|s| match s.1 {
            Some(v) => (v - best).abs() <= TIE,
            None => best.is_infinite(),
        })
        .map(|s| s.0)
        .collect();
    let i = tied[(*counter % tied.len() as u64) as usize];
    if tied.len() > 1 {
        *counter += 1;
    }
    i
}

fn queue_costs(cands: &[Candidate], list: &[usize]) -> Vec<f64> {
    let waiting = |i: usize| cands[i].load.map_or(0, |l| l.waiting_requests_num) as f64;
    let max = list.iter().map(|&i| waiting(i)).fold(0.0, f64::max);
    list.iter().map(|&i| if max > 0.0 { waiting(i) / max } else { 0.0 }).collect()
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
struct Scored {
    /// Its position in the candidates.
    index: usize,
    /// The policy's score; `None`: no score (RR, missing profile).
    score: Option<f64>,
    /// CAR queue cost.
    cost: f64,
    /// CAR hit ratio and predicted ratio (P only).
    ratios: Option<(f64, f64)>,
    /// TTFT estimate (P only).
    ttft: Option<TtftTerms>,
    /// The rank kvdir chose on it (P only, where the engine accepts one).
    rank: Option<RankChoice>,
}

/// Scores each candidate of `list` (one side) under the policy, in the list's order.
fn score_side(
    cands: &[Candidate],
    list: &[usize],
    side: Side,
    input_tokens: usize,
    p: &RouteParams,
    rank_counter: &mut u64,
) -> Vec<Scored> {
    let costs = queue_costs(cands, list);
    let prefill = side == Side::Prefill;
    let mut ranks: Vec<Option<RankChoice>> = list
        .iter()
        .map(|&i| prefill.then(|| choose_rank(&cands[i], input_tokens, p, rank_counter)).flatten())
        .collect();
    let ratio = |f: fn(&Candidate, usize, f64) -> f64, of_rank: fn(&RankChoice) -> f64| {
        let on = p.directory_enabled;
        list.iter()
            .zip(&ranks)
            .map(|(&i, rank)| match (on, rank.as_ref().and_then(|r| r.chosen().map(|_| r))) {
                (false, _) => 0.0,
                (true, Some(r)) => of_rank(r),
                (true, None) => f(&cands[i], input_tokens, p.host_weight),
            })
            .collect::<Vec<f64>>()
    };
    let ratios = ratio(kv_hit_ratio, |r| r.chosen().map_or(0.0, |s| s.kv_hit_ratio));
    let predicted =
        ratio(super::predicted_hit_ratio, |r| r.chosen().map_or(0.0, |s| s.predicted_hit_ratio));
    let reuse = |k: usize| ratios[k] + p.predict_weight * predicted[k];
    let reported = super::ttft::fleet_reported_rate(list.iter().map(|&i| &cands[i]));
    let mut ttft: Vec<Option<TtftTerms>> = list
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let c = &cands[i];
            (side == Side::Prefill).then(|| estimate(c, input_tokens, reuse(k), reported, &p.ttft))
        })
        .collect();
    add_later(&mut ttft, &p.ttft);
    let scores: Vec<Option<f64>> = list
        .iter()
        .enumerate()
        .map(|(k, &i)| match (p.policy, side) {
            (Policy::Rr, _) => None,
            (Policy::Car, Side::Prefill) => {
                Some(p.lambda * (1.0 - reuse(k)) + (1.0 - p.lambda) * costs[k])
            }
            (Policy::Car | Policy::Ttft, Side::Decode) => {
                Some(cands[i].load.map_or(0.0, |l| l.gpu_cache_usage_perc) + costs[k])
            }
            (Policy::Ttft, Side::Prefill) => ttft[k].map(|t| t.score()),
            (Policy::SloAware, Side::Prefill) => predicted_ttft(&cands[i], input_tokens),
            (Policy::SloAware, Side::Decode) => predicted_tpot(&cands[i], input_tokens),
        })
        .collect();
    (0..list.len())
        .map(|k| Scored {
            index: list[k],
            score: scores[k],
            cost: costs[k],
            ratios: prefill.then_some((ratios[k], predicted[k])),
            ttft: ttft[k],
            rank: ranks[k].take(),
        })
        .collect()
}

fn choose(scored: &[Scored], policy: Policy, counter: &mut u64) -> usize {
    if policy == Policy::Rr {
        let i = scored[(*counter % scored.len() as u64) as usize].index;
        *counter += 1;
        return i;
    }
    let pairs: Vec<(usize, Option<f64>)> = scored.iter().map(|s| (s.index, s.score)).collect();
    pick(&pairs, counter)
}

/// Routes a request of `input_tokens` tokens, with a report on every candidate.
pub fn route(
    cands: &[Candidate],
    input_tokens: usize,
    p: &RouteParams,
    rot: &mut Rotation,
) -> Result<Routed, RouteError> {
    route_listed(cands, input_tokens, p, rot, false)
}

/// [`route`]; with `compact`, the answer reports on the chosen instances and the best-scored
/// others only, and sums up the rest (`listing.rs`). The decision is the same.
pub fn route_listed(
    cands: &[Candidate],
    input_tokens: usize,
    p: &RouteParams,
    rot: &mut Rotation,
    compact: bool,
) -> Result<Routed, RouteError> {
    let mut reasons: Vec<Option<String>> = cands.iter().map(ineligible).collect();
    let on = |s: Side, reasons: &[Option<String>]| -> Vec<usize> {
        (0..cands.len()).filter(|&i| reasons[i].is_none() && side(&cands[i]) == s).collect()
    };
    let d_list = on(Side::Decode, &reasons);
    if d_list.is_empty() {
        for (i, c) in cands.iter().enumerate() {
            if reasons[i].is_none() && side(c) == Side::Prefill && c.kind != InstanceType::Default {
                reasons[i] =
                    Some("no decode instance: only a DEFAULT instance may serve alone".into());
            }
        }
    }
    let p_list = on(Side::Prefill, &reasons);
    if p_list.is_empty() {
        let why: Vec<String> = cands
            .iter()
            .zip(&reasons)
            .map(|(c, r)| format!("{}: {}", c.name, r.as_deref().unwrap_or("decode side")))
            .collect();
        let why =
            if why.is_empty() { "no instances are known".to_string() } else { why.join("; ") };
        return Err(RouteError::NoPrefill(why));
    }
    let p_scored = score_side(cands, &p_list, Side::Prefill, input_tokens, p, &mut rot.rank);
    let prefill = choose(&p_scored, p.policy, &mut rot.prefill);
    let d_scored = score_side(cands, &d_list, Side::Decode, input_tokens, p, &mut rot.rank);
    let decode = (!d_list.is_empty()).then(|| choose(&d_scored, p.policy, &mut rot.decode));
    let (listed, summary) = match compact {
        false => ((0..cands.len()).collect(), None),
        true => {
            let chosen: Vec<usize> = std::iter::once(prefill).chain(decode).collect();
            let scores = p_scored.iter().chain(&d_scored).map(|s| (s.index, s.score));
            let credited = |s: &&Scored| s.ratios.is_some_and(|(k, p)| k > 0.0 || p > 0.0);
            let summary = RouteSummary {
                candidates: cands.len() as u64,
                prefill: p_list.len() as u64,
                decode: d_list.len() as u64,
                ineligible: reasons.iter().filter(|r| r.is_some()).count() as u64,
                with_credit: p_scored.iter().filter(credited).count() as u64,
            };
            (chosen_first(&chosen, scores, ROUTE_LIST), Some(summary))
        }
    };
    // Each candidate's place in `reports`, if it is listed.
    let mut at: Vec<Option<usize>> = vec![None; cands.len()];
    listed.iter().enumerate().for_each(|(k, &i)| at[i] = Some(k));
    let mut reports: Vec<CandidateReport> = listed
        .iter()
        .map(|&i| (&cands[i], &reasons[i]))
        .map(|(c, r)| CandidateReport {
            name: c.name.clone(),
            role: c.kind,
            side: side(c),
            kv_hit_ratio: None,
            predicted_hit_ratio: None,
            dp_hits: if side(c) == Side::Prefill { c.hits.clone() } else { Vec::new() },
            queue_cost: None,
            score: None,
            meets_slo: None,
            estimated_ttft_ms: None,
            ttft: None,
            dp_rank: None,
            rank_scores: Vec::new(),
            chosen: false,
            reason: r.clone().unwrap_or_default(),
        })
        .collect();
    let sides =
        [(&p_scored, Some(prefill), p.target_ttft_ms), (&d_scored, decode, p.target_tpot_ms)];
    for (scored, chosen, target) in sides {
        explain(&mut reports, &at, scored, chosen, p.policy);
        if p.policy == Policy::SloAware {
            explain_slo(&mut reports, &at, scored, target);
        }
    }
    let dp_rank = p_scored.iter().find(|s| s.index == prefill).and_then(|s| s.rank.as_ref());
    Ok(Routed {
        policy: p.policy,
        input_tokens,
        prefill: cands[prefill].name.clone(),
        dp_rank: dp_rank.map(|r| r.dp_rank),
        decode: decode.map(|i| cands[i].name.clone()),
        candidates: reports,
        summary,
    })
}

/// SLO_AWARE: classifies each prediction against its `target` (ms) and says so when the
/// chosen one misses it.
fn explain_slo(
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
fn explain(
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
