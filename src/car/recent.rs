//! [`RecentRoutes`]: the last few routing decisions, newest first, for the status page and
//! `GET /v1/internal/route/recent`.
//!
//! Invariants: at most `capacity` records are held (the oldest is dropped first), so memory is
//! bounded by `capacity` times one decision's explanation (one [`CandidateReport`] per known
//! instance). A record keeps the prompt's token count only, never its tokens. Time is passed in.
//!
//! [`CandidateReport`]: super::CandidateReport

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{RouteError, Routed};

/// One routing decision as the status page shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteRecord {
    /// 1 for the first decision since start, counting every decision (also dropped ones).
    pub id: u64,
    /// When it was decided, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Tokens in the request (the tokens themselves are not kept).
    pub input_tokens: usize,
    /// The decision with its per-candidate explanation; `None` when no instance could take it.
    pub routed: Option<Routed>,
    /// Why no instance could take it.
    pub error: Option<String>,
}

/// The recent decisions as `GET /v1/internal/route/recent` answers them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecentRoutesReport {
    /// How many records are kept.
    pub capacity: usize,
    /// Decisions since start (the ids run up to this).
    pub total: u64,
    /// The kept records, newest first.
    pub routes: Vec<RouteRecord>,
}

/// A bounded ring of the latest decisions.
#[derive(Debug, Clone)]
pub struct RecentRoutes {
    capacity: usize,
    total: u64,
    ring: VecDeque<RouteRecord>,
}

impl Default for RecentRoutes {
    fn default() -> Self {
        RecentRoutes::new(RecentRoutes::DEFAULT_CAPACITY)
    }
}

impl RecentRoutes {
    /// How many decisions the router keeps unless told otherwise.
    pub const DEFAULT_CAPACITY: usize = 20;

    /// A ring keeping the last `capacity` decisions (0 keeps none).
    pub fn new(capacity: usize) -> Self {
        RecentRoutes { capacity, total: 0, ring: VecDeque::with_capacity(capacity) }
    }

    /// Records a decision (or the refusal) for a request of `input_tokens` tokens.
    pub fn record(
        &mut self,
        unix_ms: u64,
        input_tokens: usize,
        outcome: &Result<Routed, RouteError>,
    ) {
        self.total += 1;
        if self.capacity == 0 {
            return;
        }
        if self.ring.len() == self.capacity {
            self.ring.pop_back();
        }
        let (routed, error) = match outcome {
            Ok(r) => (Some(r.clone()), None),
            Err(e) => (None, Some(e.to_string())),
        };
        self.ring.push_front(RouteRecord { id: self.total, unix_ms, input_tokens, routed, error });
    }

    /// The kept decisions, newest first.
    pub fn report(&self) -> RecentRoutesReport {
        RecentRoutesReport {
            capacity: self.capacity,
            total: self.total,
            routes: self.ring.iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::car::Policy;

    fn routed(tokens: usize) -> Result<Routed, RouteError> {
        Ok(Routed {
            policy: Policy::Car,
            input_tokens: tokens,
            prefill: "a".into(),
            dp_rank: None,
            decode: None,
            candidates: Vec::new(),
            summary: None,
        })
    }

    #[test]
    fn keeps_only_the_newest_capacity_records_newest_first() {
        let mut recent = RecentRoutes::new(3);
        for i in 1..=5u64 {
            recent.record(1000 + i, i as usize, &routed(i as usize));
        }
        let report = recent.report();
        assert_eq!((report.capacity, report.total), (3, 5));
        let ids: Vec<u64> = report.routes.iter().map(|r| r.id).collect();
        assert_eq!(ids, [5, 4, 3]);
        let times: Vec<u64> = report.routes.iter().map(|r| r.unix_ms).collect();
        assert_eq!(times, [1005, 1004, 1003]);
        assert_eq!(report.routes[0].routed.as_ref().map(|r| r.input_tokens), Some(5));
    }

    #[test]
    fn a_refusal_is_recorded_with_its_reason() {
        let mut recent = RecentRoutes::default();
        recent.record(7, 12, &Err(RouteError::NoPrefill("none registered".into())));
        let r = &recent.report().routes[0];
        assert_eq!((r.input_tokens, r.routed.is_none()), (12, true));
        assert_eq!(
            r.error.as_deref(),
            Some("no instance can prefill this request: none registered")
        );
    }

    #[test]
    fn capacity_zero_keeps_nothing_but_counts() {
        let mut recent = RecentRoutes::new(0);
        recent.record(1, 1, &routed(1));
        let report = recent.report();
        assert_eq!((report.total, report.routes.len()), (1, 0));
    }

    #[test]
    fn the_ring_never_grows_past_capacity() {
        let mut recent = RecentRoutes::default();
        for i in 0..1000 {
            recent.record(i, 1, &routed(1));
            assert!(recent.ring.len() <= RecentRoutes::DEFAULT_CAPACITY);
        }
        assert_eq!(recent.ring.len(), RecentRoutes::DEFAULT_CAPACITY);
        assert!(recent.ring.capacity() < 2 * RecentRoutes::DEFAULT_CAPACITY);
    }
}
