//! Simulated time of a replay ([`Servers`]): every DP rank of every engine is a FIFO server, so
//! TTFT comes from the trace's arrivals, the prefill cost of the tokens the engine did not have
//! cached, and the queue in front of the request. Sans-IO: arrivals go in with their time, TTFTs
//! come out; nothing sleeps.
//!
//! Model, per rank: a request arriving at `a` starts at `max(a, free)` where `free` is when the
//! rank finishes its previous request, takes `overhead + per_token * uncached_tokens`, and its
//! TTFT is its finish minus `a` (decode is not modelled: a request leaves the rank at its first
//! token). Invariant: `free` only grows, and a request counts as in the system of its rank from
//! its arrival until its finish.
//!
//! Busy share ([`Servers::busy_shares`]): an engine's summed service times over its ranks times
//! the span of the arrivals, i.e. the offered load; above 1 the engine cannot keep up and its
//! queue grows without bound.

use std::collections::VecDeque;
use std::time::Duration;

/// The cost model of one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Fixed cost of every request (scheduling, the first decode step).
    pub overhead: Duration,
    /// Prefill cost of one uncached prompt token.
    pub per_token: Duration,
}

impl Cost {
    /// Service time of a request with `uncached` tokens to prefill.
    pub fn service(&self, uncached: u64) -> Duration {
        self.overhead + self.per_token.saturating_mul(uncached.min(u64::from(u32::MAX)) as u32)
    }
}

/// One rank's queue: the finish times of the requests still in its system, in order.
#[derive(Debug, Clone, Default)]
struct Rank {
    finishes: VecDeque<Duration>,
    busy: Duration,
}

impl Rank {
    fn free(&self) -> Duration {
        self.finishes.back().copied().unwrap_or_default()
    }

    fn advance(&mut self, now: Duration) {
        while self.finishes.front().is_some_and(|f| *f <= now) {
            self.finishes.pop_front();
        }
    }
}

/// Every rank of the fleet, indexed `(engine, rank)`.
#[derive(Debug, Clone)]
pub struct Servers {
    cost: Cost,
    dp_size: usize,
    ranks: Vec<Rank>,
}

impl Servers {
    /// `engines x dp_size` idle ranks.
    pub fn new(engines: usize, dp_size: usize, cost: Cost) -> Servers {
        Servers { cost, dp_size, ranks: vec![Rank::default(); engines * dp_size] }
    }

    /// Forgets the requests that finished by `now` (arrivals must come in time order).
    pub fn advance(&mut self, now: Duration) {
        self.ranks.iter_mut().for_each(|r| r.advance(now));
    }

    /// Requests in the system of `engine` (all its ranks) at the last [`Servers::advance`].
    pub fn in_system(&self, engine: usize) -> u64 {
        let ranks = &self.ranks[engine * self.dp_size..(engine + 1) * self.dp_size];
        ranks.iter().map(|r| r.finishes.len() as u64).sum()
    }

    /// When `rank` of `engine` finishes what it has.
    pub fn free_at(&self, engine: usize, rank: usize) -> Duration {
        self.ranks[engine * self.dp_size + rank].free()
    }

    /// Queues a request arriving at `arrival` with `uncached` tokens to prefill; its TTFT.
    pub fn admit(
        &mut self,
        engine: usize,
        rank: usize,
        arrival: Duration,
        uncached: u64,
    ) -> Duration {
        let r = &mut self.ranks[engine * self.dp_size + rank];
        let service = self.cost.service(uncached);
        let finish = r.free().max(arrival) + service;
        r.busy += service;
        r.finishes.push_back(finish);
        finish - arrival
    }

    /// Per engine, its service time over `span` times its ranks (0 for an empty span).
    pub fn busy_shares(&self, span: Duration) -> Vec<f64> {
        let capacity = span.as_secs_f64() * self.dp_size as f64;
        let engines = self.ranks.chunks(self.dp_size.max(1));
        let busy = |ranks: &[Rank]| ranks.iter().map(|r| r.busy.as_secs_f64()).sum::<f64>();
        engines.map(|ranks| if capacity > 0.0 { busy(ranks) / capacity } else { 0.0 }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn servers() -> Servers {
        let cost = Cost { overhead: 5 * MS, per_token: MS / 10 };
        Servers::new(2, 2, cost)
    }

    #[test]
    fn a_request_waits_for_the_ones_before_it_on_its_rank_only() {
        let mut s = servers();
        assert_eq!(s.admit(0, 0, Duration::ZERO, 1000), 105 * MS, "5 ms + 1000 x 0.1 ms");
        assert_eq!(s.admit(0, 0, 5 * MS, 0), 105 * MS, "waits 100 ms, then 5 ms");
        assert_eq!(s.admit(0, 1, 5 * MS, 0), 5 * MS, "another rank is idle");
        assert_eq!(s.free_at(0, 0), 110 * MS);
        s.advance(10 * MS);
        assert_eq!((s.in_system(0), s.in_system(1)), (2, 0), "rank 1's request finished at 10");
        s.advance(105 * MS);
        assert_eq!(s.in_system(0), 1);
        assert_eq!(s.admit(0, 0, 200 * MS, 0), 5 * MS, "an idle rank serves at once");
        let busy = s.busy_shares(100 * MS);
        assert!((busy[0] - 0.6).abs() < 1e-9, "(105 + 5 + 5 + 5) ms over 2 ranks x 100 ms");
        assert_eq!(busy[1], 0.0);
    }
}
