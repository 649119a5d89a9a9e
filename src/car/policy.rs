//! Candidate filtering and the four policies. Everything here is a pure function of its
//! inputs plus a [`Rotation`] that the caller keeps between calls (for RR and for ties).

use super::listing::{chosen_first, RouteSummary, ROUTE_LIST};
use super::score::{explain, explain_slo, score_side, Scored, Totals};
use super::types::{Candidate, CandidateReport, Policy, RouteParams, Routed, Side};
use crate::registry::{InstanceState, InstanceType};

/// Two scores closer than this are equal (they come from the same formula).
pub(super) const TIE: f64 = 1e-12;

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

pub(super) fn side(c: &Candidate) -> Side {
    match c.kind.prefills(c.mix_acting_prefill) {
        true => Side::Prefill,
        false => Side::Decode,
    }
}

/// Why a candidate cannot be scheduled at all, if it cannot.
pub(super) fn ineligible(c: &Candidate) -> Option<String> {
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
pub(super) fn pick(scores: &[(usize, Option<f64>)], counter: &mut u64) -> usize {
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
    let with = |list: &[usize]| list.iter().map(|&i| (i, &cands[i])).collect::<Vec<_>>();
    let (p_with, d_with) = (with(&p_list), with(&d_list));
    let (p_totals, d_totals) = (Totals::of(&p_with), Totals::of(&d_with));
    let p_scored = score_side(&p_with, Side::Prefill, input_tokens, p, &p_totals, &mut rot.rank);
    let prefill = choose(&p_scored, p.policy, &mut rot.prefill);
    let d_scored = score_side(&d_with, Side::Decode, input_tokens, p, &d_totals, &mut rot.rank);
    let decode = (!d_list.is_empty()).then(|| choose(&d_scored, p.policy, &mut rot.decode));
    let (listed, summary) = match compact {
        false => ((0..cands.len()).collect(), None),
        true => {
            let chosen: Vec<usize> = std::iter::once(prefill).chain(decode).collect();
            let scores = p_scored.iter().chain(&d_scored).map(|s| (s.index, s.score));
            let summary = RouteSummary {
                candidates: cands.len() as u64,
                prefill: p_list.len() as u64,
                decode: d_list.len() as u64,
                ineligible: reasons.iter().filter(|r| r.is_some()).count() as u64,
                with_credit: p_scored.iter().filter(|s| s.credited()).count() as u64,
            };
            (chosen_first(&chosen, scores, ROUTE_LIST), Some(summary))
        }
    };
    let listed: Vec<Listed> = listed.into_iter().map(|i| (i, &cands[i], &reasons[i])).collect();
    let scored = [&p_scored[..], &d_scored[..]];
    Ok(answer(p, input_tokens, (&listed, cands.len()), scored, (prefill, decode), summary))
}

/// A listed candidate: its index, itself, and why it is ineligible, if it is.
pub(super) type Listed<'a> = (usize, &'a Candidate, &'a Option<String>);

/// The decision's answer: a report on each `listed` candidate (index, candidate and why it is
/// ineligible, if it is; `n`: every index is below it) with its score and terms from
/// `scored` (each side's), and the chosen `prefill` and `decode` instances.
pub(super) fn answer(
    p: &RouteParams,
    input_tokens: usize,
    (listed, n): (&[Listed<'_>], usize),
    [p_scored, d_scored]: [&[Scored]; 2],
    (prefill, decode): (usize, Option<usize>),
    summary: Option<RouteSummary>,
) -> Routed {
    // Each candidate's place in `reports`, if it is listed.
    let mut at: Vec<Option<usize>> = vec![None; n];
    listed.iter().enumerate().for_each(|(k, &(i, _, _))| at[i] = Some(k));
    let mut reports: Vec<CandidateReport> = listed.iter().map(|&(_, c, r)| report(c, r)).collect();
    let sides = [(p_scored, Some(prefill), p.target_ttft_ms), (d_scored, decode, p.target_tpot_ms)];
    for (scored, chosen, target) in sides {
        explain(&mut reports, &at, scored, chosen, p.policy);
        if p.policy == Policy::SloAware {
            explain_slo(&mut reports, &at, scored, target);
        }
    }
    let name = |i: usize| listed.iter().find(|l| l.0 == i).map(|l| l.1.name.clone());
    let dp_rank = p_scored.iter().find(|s| s.index == prefill).and_then(|s| s.rank.as_ref());
    Routed {
        policy: p.policy,
        input_tokens,
        prefill: name(prefill).unwrap_or_default(),
        dp_rank: dp_rank.map(|r| r.dp_rank),
        decode: decode.and_then(name),
        candidates: reports,
        summary,
    }
}

/// A listed candidate's report before its scores are written.
fn report(c: &Candidate, reason: &Option<String>) -> CandidateReport {
    CandidateReport {
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
        reason: reason.clone().unwrap_or_default(),
    }
}
