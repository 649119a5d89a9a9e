//! Which candidates a route answer lists: every one for a small fleet, a few for a large one.
//!
//! A route answer explains its decision with a report per candidate. For a fleet of a thousand
//! instances that is a thousand reports, each with its reason and per-rank hits, written on
//! every request: more time than the decision itself. A compact answer ([`route_listed`]
//! with `compact`) lists the chosen instances first, then the best-scored others, at most
//! [`ROUTE_LIST`] in all, and counts the rest in a [`RouteSummary`]; the decision is the same
//! either way.
//!
//! [`route_listed`]: super::route_listed

use serde::{Deserialize, Serialize};

/// Candidates a compact route answer lists.
pub const ROUTE_LIST: usize = 16;

/// Every candidate of a compact route answer, listed or not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteSummary {
    /// Every known instance.
    pub candidates: u64,
    /// Eligible prefill-side candidates.
    pub prefill: u64,
    /// Eligible decode-side candidates.
    pub decode: u64,
    /// Instances that cannot be scheduled (no load report, SUSPECT, ...).
    pub ineligible: u64,
    /// Prefill candidates credited with part of the prompt (`kv_hit_ratio` or
    /// `predicted_hit_ratio` above 0).
    pub with_credit: u64,
}

/// The candidates to list: `chosen` first, then the others of `scored` (candidate index and
/// score) by score, smallest first and unscored last, at most `limit` in all. The best are
/// selected before they are sorted: a thousand candidates are not sorted for sixteen.
pub(super) fn chosen_first(
    chosen: &[usize],
    scored: impl Iterator<Item = (usize, Option<f64>)>,
    limit: usize,
) -> Vec<usize> {
    let order = |a: &(usize, Option<f64>), b: &(usize, Option<f64>)| match (a.1, b.1) {
        (Some(x), Some(y)) => x.total_cmp(&y).then(a.0.cmp(&b.0)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.0.cmp(&b.0),
    };
    let mut others: Vec<(usize, Option<f64>)> =
        scored.filter(|(i, _)| !chosen.contains(i)).collect();
    let room = limit.saturating_sub(chosen.len());
    if others.len() > room && room > 0 {
        others.select_nth_unstable_by(room - 1, order);
    }
    others.truncate(room);
    others.sort_by(order);
    let mut out: Vec<usize> = chosen.to_vec();
    out.extend(others.iter().map(|o| o.0));
    out
}

#[cfg(test)]
mod tests {
    use super::super::{route, route_listed, Candidate, Rotation, RouteParams};
    use super::*;

    #[test]
    fn a_compact_answer_decides_alike_and_lists_the_same_reports() {
        // 40 idle instances of 2 ranks; every third holds 0 tokens, the others more and more.
        let cands: Vec<Candidate> = (0..40)
            .map(|i| Candidate::test_idle(&format!("e{i:02}"), 2, (i % 3 != 0) as u64 * i * 4))
            .collect();
        let p = RouteParams::default();
        let full = route(&cands, 200, &p, &mut Rotation::default()).unwrap();
        let compact = route_listed(&cands, 200, &p, &mut Rotation::default(), true).unwrap();
        assert_eq!((&compact.prefill, compact.dp_rank), (&full.prefill, full.dp_rank));
        assert_eq!(compact.candidates.len(), ROUTE_LIST);
        assert_eq!(compact.candidates[0].name, compact.prefill, "the chosen one first");
        for c in &compact.candidates {
            let same = full.candidates.iter().find(|f| f.name == c.name).unwrap();
            assert_eq!(c, same, "a listed report is the full answer's");
        }
        let scores: Vec<f64> = compact.candidates.iter().map(|c| c.score.unwrap()).collect();
        assert!(scores.windows(2).all(|w| w[0] <= w[1]), "best scores first: {scores:?}");
        let summary = compact.summary.unwrap();
        let want = RouteSummary { candidates: 40, prefill: 40, with_credit: 26, ..summary };
        assert_eq!((summary, full.summary), (want, None));
    }

    #[test]
    fn the_chosen_come_first_then_the_best_scores() {
        let scored = [(0, Some(0.5)), (1, None), (2, Some(0.1)), (3, Some(0.3)), (4, Some(0.1))];
        assert_eq!(chosen_first(&[3], scored.into_iter(), 4), [3, 2, 4, 0]);
        assert_eq!(chosen_first(&[3, 1], scored.into_iter(), 10), [3, 1, 2, 4, 0]);
        assert_eq!(chosen_first(&[], scored.into_iter(), 10), [2, 4, 3, 0, 1], "unscored last");
        assert_eq!(chosen_first(&[1], scored.into_iter(), 1), [1]);
        let many: Vec<(usize, Option<f64>)> =
            (0..1000).map(|i| (i, (i % 7 != 0).then(|| ((i * 37) % 101) as f64))).collect();
        let mut all: Vec<usize> = chosen_first(&[], many.iter().copied(), 1000);
        let best = chosen_first(&[], many.iter().copied(), 16);
        all.truncate(16);
        assert_eq!(best, all, "selecting the best gives the first of the whole order");
    }
}
