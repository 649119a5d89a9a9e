//! A decision that scores only what can win ([`route_pruned`]): the instances credited with
//! part of the prompt, built in full, and the others from what a prompt does not change.
//!
//! Why it decides as [`super::route_listed`] over every candidate (compact), step by step:
//! - An instance the caller gives no candidate for (*plain*) is credited with no part of the
//!   prompt: its engine picks the rank and some rank holds none of it, no predicted tokens, no
//!   siblings in flight. Its reuse is 0, so its score needs only its queue (CAR:
//!   `lambda + (1 - lambda) * waiting / max_waiting`) or its load, ranks and queued work
//!   (TTFT: the estimate and its later cost), computed here by the same functions as for a
//!   built candidate (`score.rs`, `ttft/`).
//! - The terms over the whole prefill side (the longest queue, the fleet's reported rate, the
//!   busy share, the least service) are found over every eligible instance in position order,
//!   as the full decision sums them, so every float is the same; the plain instances' TTFT
//!   estimates (reported under every policy) read only their load, ranks and queued work.
//! - The choice ([`super::policy::pick`]) and the compact listing (`listing.rs`) are given
//!   every eligible instance's score in position order, so ties rotate as before; only the
//!   listed plain instances are built, and scored with the same totals.
//! - The rank counter moves only where kvdir chooses a rank and two ranks tie. A plain
//!   instance whose engine picks its own rank never touches it. One whose rank kvdir chooses
//!   holds none of the prompt on any rank (else it is built), so its ranks score alike but for
//!   their reported loads, its reuse is 0 whichever wins, and its score is a plain one; the
//!   ranks are chosen in position order over built and plain rows, a plain row moving the
//!   counter where its ranks tie (`rank.rs`, without building its scores), and a listed plain
//!   instance is given the counter it found, so every rank and the final counter are the same.
//!
//! It does not apply (`None`: the caller decides over every candidate) under RR or SLO_AWARE,
//! when any decode-side instance is eligible (its side is scored whole), or when no instance
//! can prefill (the full decision says why). A unit test (`tests.rs`) compares both decisions
//! on random fleets.

use super::listing::{chosen_first, RouteSummary, ROUTE_LIST};
use super::policy::{answer, ineligible, pick, side, Listed, Rotation, RouteError};
use super::rank::{choose_rank, uncredited_ranks_tie, RankChoice};
use super::score::{car_prefill, queue_cost, reuse, score_ranked, waiting, Totals};
use super::ttft::{add_later_with, busy_share, estimate, fleet_reported_rate, TtftTerms};
use super::{Candidate, DpRouting, Policy, QueuedWork, RouteParams, Routed, Side};
use crate::registry::{InstanceType, LoadMetrics};

/// The instances a decision may choose, by position, as [`route_pruned`] reads them.
pub trait Fleet {
    /// How many instances there are (positions `0..len`).
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Instance `i` as known between requests: its queue and queued work aside.
    fn base(&self, i: usize) -> &Candidate;

    /// The requests waiting at `i`, as a decision counts them for a prompt without siblings in
    /// flight there.
    fn waiting(&self, i: usize) -> u64;

    /// The work queued at `i`.
    fn queued(&self, i: usize) -> QueuedWork;

    /// Instance `i`'s candidate for the request, which credits it nothing: [`Self::base`] with
    /// [`Self::waiting`] and [`Self::queued`], and hits on fewer ranks than it has, if any
    /// (a missing rank makes both ratios 0 where its engine picks the rank; none where kvdir
    /// chooses it), its rank [`Self::pinned`] where kvdir chooses it.
    fn plain(&self, i: usize) -> Candidate;

    /// The rank the client pinned, if any: every instance whose rank kvdir chooses is scored
    /// on that rank alone ([`DpRouting::Pinned`]).
    fn pinned(&self) -> Option<u32> {
        None
    }
}

/// [`Fleet::plain`] without what a TTFT estimate does not read (name, profiles, hits, rank loads):
/// nothing to allocate.
fn light(base: &Candidate, waiting: u64, queued: QueuedWork) -> Candidate {
    Candidate {
        name: String::new(),
        kind: base.kind,
        mix_acting_prefill: base.mix_acting_prefill,
        state: base.state,
        load: base.load.map(|l| LoadMetrics { waiting_requests_num: waiting, ..l }),
        dp_size: base.dp_size,
        ttft_profile: Vec::new(),
        tpot_profile: Vec::new(),
        hits: Vec::new(),
        queued,
        dp_routing: base.dp_routing,
        rank_loads: Vec::new(),
    }
}

/// One eligible prefill instance: its position, its built candidate's place in `credited`
/// (plain: none), and for a plain one its queue and queued work, and whether kvdir chooses its
/// rank.
struct Row {
    i: usize,
    built: Option<usize>,
    waiting: u64,
    queued: QueuedWork,
    ranked: bool,
}

/// The eligible prefill instances in position order, how many instances are ineligible and
/// how many are candidates (not excluded); `None` where pruning does not apply.
fn prefill_rows<F: Fleet + ?Sized>(
    fleet: &F,
    credited: &[(usize, Candidate)],
    excluded: &[usize],
) -> Option<(Vec<Row>, u64, u64)> {
    let mut next = credited.iter().enumerate().peekable();
    let (mut rows, mut ineligibles, mut candidates) = (Vec::with_capacity(fleet.len()), 0, 0);
    for i in 0..fleet.len() {
        let built = next.next_if(|(_, (at, _))| *at == i).map(|(k, _)| k);
        if excluded.contains(&i) {
            continue;
        }
        candidates += 1;
        let c = built.map_or_else(|| fleet.base(i), |k| &credited[k].1);
        if ineligible(c).is_some() {
            ineligibles += 1;
            continue;
        }
        if side(c) == Side::Decode {
            return None;
        }
        if c.kind != InstanceType::Default {
            // No decode instance: only a DEFAULT instance may serve alone.
            ineligibles += 1;
            continue;
        }
        let row = match built {
            Some(_) => Row { i, built, waiting: 0, queued: QueuedWork::default(), ranked: false },
            None => {
                let (waiting, queued) = (fleet.waiting(i), fleet.queued(i));
                Row { i, built, waiting, queued, ranked: c.dp_routing != DpRouting::Engine }
            }
        };
        rows.push(row);
    }
    debug_assert!(next.peek().is_none(), "credited candidates are in position order");
    (!rows.is_empty()).then_some((rows, ineligibles, candidates))
}

/// [`super::route_listed`] with `compact` over every instance of `fleet`, excluding the
/// positions `excluded`, where `credited` (in position order) holds the candidates of every
/// instance with a part of the prompt, exact or predicted, or siblings in flight; the others
/// are read from `fleet` and built only when listed (module documentation). `None` when
/// pruning does not apply: the caller then decides over every candidate.
pub fn route_pruned<F: Fleet + ?Sized>(
    fleet: &F,
    credited: &[(usize, Candidate)],
    excluded: &[usize],
    input_tokens: usize,
    p: &RouteParams,
    rot: &mut Rotation,
) -> Option<Result<Routed, RouteError>> {
    if !matches!(p.policy, Policy::Car | Policy::Ttft) {
        return None;
    }
    let (rows, ineligibles, candidates) = prefill_rows(fleet, credited, excluded)?;
    let d = Decision { fleet, credited, rows, input_tokens, p };
    let totals = d.totals();
    let (ranks, counters) = d.ranks(&mut rot.rank);
    let with: Vec<(usize, &Candidate)> =
        d.rows.iter().filter_map(|r| r.built.map(|k| (r.i, d.built(k)))).collect();
    let mut scored = score_ranked(&with, ranks, Side::Prefill, input_tokens, p, &totals);
    // From here on the least service is over every candidate.
    let least = scored.iter().filter_map(|s| s.ttft).map(|t| t.service_ms);
    let totals = Totals { least_floor: least.fold(totals.least_floor, f64::min), ..totals };
    let mut of_built = scored.iter();
    let scores: Vec<(usize, Option<f64>)> = (d.rows.iter())
        .map(|r| match r.built {
            Some(_) => of_built.next().map_or((r.i, None), |s| (s.index, s.score)),
            None => (r.i, d.plain_score(r, &totals)),
        })
        .collect();
    let prefill = pick(&scores, &mut rot.prefill);
    let listed = chosen_first(&[prefill], scores.iter().copied(), ROUTE_LIST);
    // The listed plain instances, built and scored with the same totals.
    let plains: Vec<(usize, Candidate)> = (listed.iter())
        .filter(|&&i| d.is_built(i).is_none())
        .map(|&i| (i, fleet.plain(i)))
        .collect();
    debug_assert!(plains.iter().all(|(_, c)| c.hits.len() < c.dp_size.max(1) as usize));
    let with: Vec<(usize, &Candidate)> = plains.iter().map(|(i, c)| (*i, c)).collect();
    // Each listed plain instance's rank as the full decision chose it: with the counter it found.
    let ranks = (plains.iter())
        .map(|(i, c)| {
            let at = counters.binary_search_by_key(i, |(at, _)| *at);
            let mut counter = at.map_or(0, |k| counters[k].1);
            choose_rank(c, input_tokens, p, &mut counter)
        })
        .collect();
    let more = score_ranked(&with, ranks, Side::Prefill, input_tokens, p, &totals);
    debug_assert!(more.iter().all(|s| scores.iter().any(|t| (t.0, t.1) == (s.index, s.score))));
    let with_credit = scored.iter().filter(|s| s.credited()).count() as u64;
    scored.extend(more);
    let prefills = d.rows.len() as u64;
    let summary = RouteSummary {
        candidates,
        prefill: prefills,
        decode: 0,
        ineligible: ineligibles,
        with_credit,
    };
    let listed = d.listed(&listed, &plains);
    let answered = answer(
        p,
        input_tokens,
        (&listed, fleet.len()),
        [&scored, &[]],
        (prefill, None),
        Some(summary),
    );
    Some(Ok(answered))
}

/// One pruned decision's inputs.
struct Decision<'a, F: ?Sized> {
    fleet: &'a F,
    credited: &'a [(usize, Candidate)],
    rows: Vec<Row>,
    input_tokens: usize,
    p: &'a RouteParams,
}

impl<F: Fleet + ?Sized> Decision<'_, F> {
    /// The `k`th credited candidate.
    fn built(&self, k: usize) -> &Candidate {
        &self.credited[k].1
    }

    /// The place in `credited` of the instance at position `i`, if it is built.
    fn is_built(&self, i: usize) -> Option<usize> {
        self.credited.binary_search_by_key(&i, |(at, _)| *at).ok()
    }

    /// The rank chosen on each built candidate and, for each plain row whose rank kvdir
    /// chooses, the counter it found, in position order as the full decision chooses them;
    /// `counter` is left where the full decision leaves it. A plain row's ranks score alike but
    /// for their reported loads, so where two or more tie its choice moves the counter
    /// ([`uncredited_ranks_tie`]); a pinned rank never ties.
    fn ranks(&self, counter: &mut u64) -> (Vec<Option<RankChoice>>, Vec<(usize, u64)>) {
        let (mut ranks, mut counters) = (Vec::new(), Vec::new());
        let free = self.fleet.pinned().is_none();
        for r in &self.rows {
            match r.built {
                Some(k) => {
                    ranks.push(choose_rank(self.built(k), self.input_tokens, self.p, counter));
                }
                None if r.ranked => {
                    counters.push((r.i, *counter));
                    let base = self.fleet.base(r.i);
                    if free && uncredited_ranks_tie(base, self.input_tokens, self.p) {
                        *counter += 1;
                    }
                }
                None => {}
            }
        }
        (ranks, counters)
    }

    /// The requests waiting at a row's instance, as CAR's queue cost counts them.
    fn counted(&self, r: &Row) -> f64 {
        r.built.map_or(r.waiting as f64, |k| waiting(self.built(k)))
    }

    /// A plain row's TTFT estimate (reuse 0).
    fn estimate(&self, r: &Row, reported: Option<f64>) -> TtftTerms {
        let (p, reuse) = (self.p, reuse(self.p, 0.0, 0.0));
        let c = light(self.fleet.base(r.i), r.waiting, r.queued);
        estimate(&c, self.input_tokens, reuse, reported, &p.ttft)
    }

    /// The prefill side's totals over every eligible instance, in position order as the full
    /// decision takes them; the least service over the plain ones.
    fn totals(&self) -> Totals {
        let max_waiting = self.rows.iter().map(|r| self.counted(r)).fold(0.0, f64::max);
        let cand = |r: &Row| r.built.map_or_else(|| self.fleet.base(r.i), |k| self.built(k));
        let reported = fleet_reported_rate(self.rows.iter().map(cand));
        let (reuse, mut least_floor) = (reuse(self.p, 0.0, 0.0), f64::MAX);
        let busy = busy_share(self.rows.iter().map(|r| match r.built {
            Some(k) => estimate(self.built(k), self.input_tokens, reuse, reported, &self.p.ttft),
            None => {
                let t = self.estimate(r, reported);
                least_floor = least_floor.min(t.service_ms);
                t
            }
        }));
        Totals { max_waiting, reported, busy_share: Some(busy), least_floor }
    }

    /// A plain row's score, with the side's `totals` (the least service over every candidate).
    fn plain_score(&self, r: &Row, totals: &Totals) -> Option<f64> {
        let p = self.p;
        match p.policy {
            Policy::Ttft => {
                let mut t = [Some(self.estimate(r, totals.reported))];
                let busy = totals.busy_share.unwrap_or_default();
                add_later_with(&mut t, &p.ttft, busy, totals.least_floor);
                t[0].map(|t| t.score())
            }
            _ => {
                let cost = queue_cost(self.counted(r), totals.max_waiting);
                Some(car_prefill(p, reuse(p, 0.0, 0.0), cost))
            }
        }
    }

    /// The listed candidates (positions `listed`), built or among `plains`, all eligible.
    fn listed<'b>(&'b self, listed: &[usize], plains: &'b [(usize, Candidate)]) -> Vec<Listed<'b>> {
        const ELIGIBLE: &Option<String> = &None;
        let plain = |i: usize| &plains.iter().find(|(at, _)| *at == i).expect("built").1;
        (listed.iter())
            .map(|&i| (i, self.is_built(i).map_or_else(|| plain(i), |k| self.built(k)), ELIGIBLE))
            .collect()
    }
}

#[cfg(test)]
mod tests;
