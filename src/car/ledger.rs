//! [`WorkLedger`]: the prefill work kvdir sent to each instance and that is not done yet, for
//! the TTFT policy ([`super::ttft`]). Pure and clock-free: times come in as arguments, so the
//! replay's simulated time and the service's wall time both work.
//!
//! Per instance, in routing order, each request kvdir routed there with its uncached tokens at
//! routing (input minus the credit it was given there) and the instance's load-report count
//! at routing. Reconciliation, when a load report numbered `k` says the instance has `n`
//! requests ([`WorkLedger::report`]):
//! - the requests routed before it (report count at routing below `k`, a prefix of the list)
//!   are reconciled first in, first out: the newest `n` of them stay, the older ones are done;
//! - requests routed after it stay whole (the report cannot include them);
//! - when `n` is above the requests routed before it, the rest are *foreign* (sent by another
//!   router or client), counted at a typical uncached size (an EWMA of what kvdir routed) until
//!   the next report.
//!
//! A report with a count not above the last one applied changes nothing; a lower count is a new
//! engine process, which starts from nothing. The front door's requests also end at their first
//! byte ([`WorkLedger::first_byte`]), which teaches the instance's prefill rate: the tokens that
//! were ahead of the request plus its own, over its observed time to first token minus the
//! fixed terms of its estimate, an EWMA per instance and one over the fleet. An instance is
//! estimated at the fleet's rate unless its own rate, after at least [`MIN_OWN_SAMPLES`]
//! samples, is [`OWN_RATE_FACTOR`] times faster or slower: learning noise between equal engines
//! must not become a lasting preference, because an engine that is never chosen never
//! corrects its rate (with per-instance rates, one unlucky sample could leave an engine idle
//! while the others queue). Invariants: at most [`MAX_PER_INSTANCE`]
//! requests per instance (the oldest are dropped as done), and each instance keeps the sum of
//! its requests' uncached tokens, so [`WorkLedger::queued`] costs the same at any queue length.

use std::borrow::Borrow;
use std::collections::VecDeque;

use super::names::{InstanceKey, NameMap};

/// Most requests kept per instance.
pub const MAX_PER_INSTANCE: usize = 4096;

/// Weight of a new sample in the EWMAs (typical size and learned rate).
const EWMA_WEIGHT: f64 = 0.2;

/// Weight of a new request in the reuse EWMAs ([`WorkLedger::reuse`]): about the last 50.
const REUSE_WEIGHT: f64 = 0.02;

/// Smallest amount of work, in tokens, a first byte must cover to teach a rate.
const MIN_LEARN_TOKENS: f64 = 256.0;

/// Samples an instance needs before its own learned rate can stand apart from the fleet's.
pub const MIN_OWN_SAMPLES: u32 = 8;

/// How far (as a factor, either way) an instance's own rate must be from the fleet's to be used.
pub const OWN_RATE_FACTOR: f64 = 1.5;

/// Learned rates are kept within these bounds, in tokens per second.
pub(crate) const RATE_BOUNDS: (f64, f64) = (10.0, 1e7);

/// What one instance has queued, as [`super::ttft`] reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueuedWork {
    /// Uncached tokens of the requests ahead: kvdir's own plus the foreign ones at the
    /// typical size.
    pub tokens: f64,
    /// Requests ahead: kvdir's own plus the foreign ones.
    pub requests: u64,
    /// The prefill rate learned from observed TTFTs, tokens per second: the fleet's, or the
    /// instance's own where it stands apart ([`OWN_RATE_FACTOR`]).
    pub learned_rate: Option<f64>,
    /// The fleet's reuse: the share of the input tokens of recently routed requests that their
    /// chosen instance credited ([`WorkLedger::reuse`]), the same for every instance.
    pub fleet_reuse: f64,
    /// The typical uncached size of a routed request ([`WorkLedger::typical`]), the unit the
    /// TTFT policy measures a queue in; `None` before the first.
    pub typical_tokens: Option<f64>,
}

/// What kvdir knew when it routed a request, for learning from its first byte.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoutedWork {
    /// Its input tokens.
    pub input: f64,
    /// Its own uncached tokens on the chosen instance.
    pub uncached: f64,
    /// Tokens queued ahead of it there.
    pub ahead_tokens: f64,
    /// Its estimate's fixed part, ms (overheads and decode term).
    pub fixed_ms: f64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The front door's id; `None` for `/v1/internal/route`.
    key: Option<u64>,
    reports_at_route: u64,
    routed_ms: u64,
    work: RoutedWork,
}

#[derive(Debug, Default)]
struct Instance {
    entries: VecDeque<Entry>,
    /// The sum of the entries' uncached tokens, so reading it costs the same at any length.
    tokens: f64,
    /// The load-report count last applied.
    reports: u64,
    /// Requests the last report counted beyond kvdir's own.
    foreign: u64,
    rate: Option<f64>,
    /// Samples behind `rate`.
    samples: u32,
}

impl Instance {
    /// A new process of the instance: nothing queued, the learned rate kept.
    fn restarted(&self) -> Instance {
        Instance { rate: self.rate, samples: self.samples, ..Instance::default() }
    }

    fn push(&mut self, entry: Entry) {
        if self.entries.len() == MAX_PER_INSTANCE {
            self.drop_oldest(1);
        }
        self.tokens += entry.work.uncached;
        self.entries.push_back(entry);
    }

    fn drop_oldest(&mut self, n: usize) {
        for e in self.entries.drain(..n) {
            self.tokens -= e.work.uncached;
        }
        self.resum();
    }

    fn take(&mut self, key: u64) -> Option<Entry> {
        let at = self.entries.iter().position(|e| e.key == Some(key))?;
        let entry = self.entries.remove(at)?;
        self.tokens -= entry.work.uncached;
        self.resum();
        Some(entry)
    }

    /// Clears the rounding an emptied queue may have left in the sum.
    fn resum(&mut self) {
        if self.entries.is_empty() {
            self.tokens = 0.0;
        }
    }
}

/// Per-instance work kvdir routed and not done yet, by instance name or id (`K`).
#[derive(Debug)]
pub struct WorkLedger<K: ?Sized + InstanceKey = str> {
    instances: NameMap<K::Owned, Instance>,
    /// EWMA of the uncached tokens of routed requests.
    typical: Option<f64>,
    /// EWMA of every instance's rate samples.
    fleet_rate: Option<f64>,
    /// Slow EWMAs of routed requests' credited and input tokens, for [`Self::reuse`].
    credited: f64,
    input: f64,
}

impl<K: ?Sized + InstanceKey> Default for WorkLedger<K> {
    fn default() -> Self {
        WorkLedger {
            instances: NameMap::default(),
            typical: None,
            fleet_rate: None,
            credited: 0.0,
            input: 0.0,
        }
    }
}

/// An exponentially weighted moving average: `sample` weighs `weight`, the first is taken whole.
pub fn ewma(old: Option<f64>, sample: f64, weight: f64) -> f64 {
    old.map_or(sample, |o| o + weight * (sample - o))
}

impl<K: ?Sized + InstanceKey + Eq + std::hash::Hash> WorkLedger<K> {
    /// The work queued at `instance`.
    pub fn queued(&self, instance: &K) -> QueuedWork {
        let (fleet_reuse, typical_tokens) = (self.reuse(), self.typical);
        let Some(i) = self.instances.get(instance) else {
            let learned_rate = self.fleet_rate;
            return QueuedWork { learned_rate, fleet_reuse, typical_tokens, ..Default::default() };
        };
        QueuedWork {
            tokens: i.tokens.max(0.0) + i.foreign as f64 * self.typical.unwrap_or(0.0),
            requests: i.entries.len() as u64 + i.foreign,
            learned_rate: self.rate_of(i),
            fleet_reuse,
            typical_tokens,
        }
    }

    /// The share of the input tokens of recently routed requests (about the last 50, weighted
    /// by size) that their chosen instance credited: how much the fleet lives on its cache.
    /// 0 before the first request.
    pub fn reuse(&self) -> f64 {
        match self.input > 0.0 {
            true => (self.credited / self.input).clamp(0.0, 1.0),
            false => 0.0,
        }
    }

    /// The rate `i` is estimated at: its own where it stands apart from the fleet's.
    fn rate_of(&self, i: &Instance) -> Option<f64> {
        match (i.rate, self.fleet_rate) {
            (Some(own), Some(fleet))
                if i.samples >= MIN_OWN_SAMPLES
                    && (own / fleet).max(fleet / own) >= OWN_RATE_FACTOR =>
            {
                Some(own)
            }
            (_, fleet) => fleet,
        }
    }

    /// The typical uncached size of a routed request (EWMA); `None` before the first.
    pub fn typical(&self) -> Option<f64> {
        self.typical
    }

    /// A request routed to `instance`, whose load reports numbered `reports` so far, at
    /// `now_ms`; `key` is the front door's id for [`Self::first_byte`].
    pub fn routed(
        &mut self,
        instance: &K,
        reports: u64,
        now_ms: u64,
        work: RoutedWork,
        key: Option<u64>,
    ) {
        self.typical = Some(ewma(self.typical, work.uncached, EWMA_WEIGHT));
        let credited = (work.input - work.uncached).max(0.0);
        self.credited += REUSE_WEIGHT * (credited - self.credited);
        self.input += REUSE_WEIGHT * (work.input - self.input);
        let i = self.instances.entry(instance.owned()).or_default();
        if reports < i.reports {
            *i = i.restarted();
        }
        i.push(Entry { key, reports_at_route: reports, routed_ms: now_ms, work });
    }

    /// Load report number `reports` of `instance` says it has `waiting` requests.
    pub fn report(&mut self, instance: &K, reports: u64, waiting: u64) {
        let i = self.instances.entry(instance.owned()).or_default();
        if reports < i.reports {
            // A new process: nothing routed to the old one is queued at it.
            *i = i.restarted();
        } else if reports == i.reports {
            return;
        }
        i.reports = reports;
        let before = i.entries.iter().take_while(|e| e.reports_at_route < reports).count();
        i.drop_oldest(before.saturating_sub(waiting as usize));
        i.foreign = waiting.saturating_sub(before as u64);
    }

    /// The front door's request `key` to `instance` produced its first byte at `now_ms`: it
    /// is done, and its time teaches the instance's rate.
    pub fn first_byte(&mut self, instance: &K, key: u64, now_ms: u64) {
        let Some(i) = self.instances.get_mut(instance) else { return };
        let Some(e) = i.take(key) else { return };
        let tokens = e.work.ahead_tokens + e.work.uncached;
        let seconds = (now_ms.saturating_sub(e.routed_ms) as f64 - e.work.fixed_ms) / 1000.0;
        if tokens >= MIN_LEARN_TOKENS && seconds > 0.0 {
            let rate = (tokens / seconds).clamp(RATE_BOUNDS.0, RATE_BOUNDS.1);
            i.rate = Some(ewma(i.rate, rate, EWMA_WEIGHT));
            i.samples = i.samples.saturating_add(1);
            self.fleet_rate = Some(ewma(self.fleet_rate, rate, EWMA_WEIGHT));
        }
    }

    /// The front door's request `key` ended without a first byte (failed or cancelled).
    pub fn forget(&mut self, instance: &K, key: u64) {
        if let Some(i) = self.instances.get_mut(instance) {
            i.take(key);
        }
    }

    /// Forgets every instance `keep` rejects (removed from the registry).
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.instances.retain(|name, _| keep(name.borrow()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(uncached: f64) -> RoutedWork {
        RoutedWork { uncached, ..RoutedWork::default() }
    }

    fn ledger(routes: &[(u64, f64)]) -> WorkLedger {
        let mut l = WorkLedger::default();
        for &(reports, uncached) in routes {
            l.routed("e", reports, 0, work(uncached), None);
        }
        l
    }

    #[test]
    fn a_report_keeps_the_newest_requests_routed_before_it_and_every_later_one() {
        // Three requests routed after report 1, one after report 2.
        let mut l = ledger(&[(1, 100.0), (1, 200.0), (1, 300.0), (2, 400.0)]);
        assert_eq!(l.queued("e").tokens, 1000.0);
        assert_eq!(l.queued("e").requests, 4);
        // Report 2 was counted before the last request: of the three before it, one is left.
        l.report("e", 2, 1);
        assert_eq!((l.queued("e").tokens, l.queued("e").requests), (700.0, 2), "300 + 400");
        l.report("e", 2, 0);
        assert_eq!(l.queued("e").requests, 2, "the same report count again changes nothing");
        l.report("e", 3, 0);
        let empty = QueuedWork { typical_tokens: l.typical(), ..QueuedWork::default() };
        assert_eq!(l.queued("e"), empty, "report 3 includes every request");
        assert_eq!(l.queued("other"), empty);
        assert!((l.typical().unwrap() - 204.8).abs() < 1e-9, "100, then 20 % of each next");
    }

    #[test]
    fn requests_beyond_kvdirs_own_count_at_the_typical_size_until_the_next_report() {
        let mut l = ledger(&[(0, 1000.0), (0, 1000.0)]);
        l.report("e", 1, 5);
        let q = l.queued("e");
        assert_eq!(q.requests, 5, "kvdir's two and three foreign ones");
        assert_eq!(q.tokens, 5.0 * 1000.0, "foreign ones at the typical 1000 tokens");
        l.report("e", 2, 1);
        assert_eq!((l.queued("e").requests, l.queued("e").tokens), (1, 1000.0));
    }

    #[test]
    fn a_lower_report_count_is_a_new_process_that_starts_empty() {
        let mut l = WorkLedger::default();
        l.report("e", 7, 0);
        l.routed("e", 7, 0, work(100.0), None);
        l.routed("e", 7, 0, work(100.0), None);
        l.report("e", 2, 0);
        assert_eq!(l.queued("e").requests, 0);
        l.routed("e", 2, 0, work(50.0), None);
        l.report("e", 3, 1);
        assert_eq!(l.queued("e").tokens, 50.0);
        // A route after a restart, before any report of the new process, starts it too.
        l.routed("e", 0, 0, work(10.0), None);
        assert_eq!(l.queued("e").tokens, 10.0);
    }

    #[test]
    fn the_first_byte_ends_a_request_and_teaches_the_rate() {
        let mut l = WorkLedger::default();
        let w =
            RoutedWork { input: 1000.0, uncached: 1000.0, ahead_tokens: 3000.0, fixed_ms: 10.0 };
        l.routed("e", 0, 1_000, w, Some(7));
        l.routed("e", 0, 1_000, work(100.0), Some(8));
        // 4000 tokens in 410 - 10 ms: 10,000 tokens per second.
        l.first_byte("e", 7, 1_410);
        let q = l.queued("e");
        assert_eq!((q.requests, q.tokens), (1, 100.0));
        assert_eq!(q.learned_rate, Some(10_000.0));
        // Too little work to learn from; unknown ids and instances are ignored.
        l.first_byte("e", 8, 5_000);
        l.first_byte("e", 99, 5_000);
        l.first_byte("x", 8, 5_000);
        assert_eq!(l.queued("e").learned_rate, Some(10_000.0));
        assert_eq!(l.queued("e").requests, 0);
        // A second sample moves the EWMA by a fifth: 20,000 tokens/s -> 12,000.
        l.routed("e", 0, 0, RoutedWork { uncached: 2000.0, ..RoutedWork::default() }, Some(9));
        l.first_byte("e", 9, 100);
        assert_eq!(l.queued("e").learned_rate, Some(12_000.0));
        assert_eq!(l.queued("f").learned_rate, Some(12_000.0), "the fleet's, for an unseen one");
    }

    /// Teaches `instance` one sample of `rate` tokens per second.
    fn sample(l: &mut WorkLedger, instance: &str, rate: f64) {
        l.routed(instance, 0, 0, RoutedWork { uncached: rate, ..RoutedWork::default() }, Some(1));
        l.first_byte(instance, 1, 1000);
    }

    #[test]
    fn equal_engines_share_the_fleet_rate_whatever_their_noise() {
        let mut l = WorkLedger::default();
        // One slow sample on "a" (the first after a restart, say), then normal ones everywhere.
        sample(&mut l, "a", 2_000.0);
        for _ in 0..20 {
            sample(&mut l, "a", 10_000.0);
            sample(&mut l, "b", 11_000.0);
        }
        let (a, b) = (l.queued("a").learned_rate, l.queued("b").learned_rate);
        assert_eq!(a, b, "no lasting preference between engines within the factor");
        let fleet = a.unwrap();
        assert!((9_000.0..12_000.0).contains(&fleet), "{fleet}");
    }

    #[test]
    fn an_engine_far_from_the_fleet_keeps_its_own_rate_after_enough_samples() {
        let mut l = WorkLedger::default();
        for _ in 0..20 {
            sample(&mut l, "fast", 10_000.0);
        }
        for k in 1..=MIN_OWN_SAMPLES {
            sample(&mut l, "slow", 2_000.0);
            let own = l.queued("slow").learned_rate.unwrap();
            match k < MIN_OWN_SAMPLES {
                true => assert!(own > 3_000.0, "the fleet's until {MIN_OWN_SAMPLES} samples"),
                false => assert!(own < 3_000.0, "its own after them: {own}"),
            }
        }
        assert!(l.queued("fast").learned_rate.unwrap() > 3_000.0);
    }

    #[test]
    fn forgotten_requests_and_removed_instances_leave_nothing() {
        let mut l = WorkLedger::default();
        l.routed("e", 0, 0, work(100.0), Some(1));
        l.routed("f", 0, 0, work(100.0), None);
        l.forget("e", 1);
        assert_eq!(l.queued("e").requests, 0);
        l.retain(|name| name != "f");
        assert_eq!((l.queued("f").requests, l.queued("f").tokens), (0, 0.0));
        assert_eq!(l.typical(), Some(100.0));
    }

    #[test]
    fn the_fleet_reuse_is_the_recently_credited_share_of_routed_tokens() {
        let mut l = WorkLedger::default();
        assert_eq!(l.queued("e").fleet_reuse, 0.0, "nothing routed yet");
        let credited = |input: f64, uncached: f64| RoutedWork { input, uncached, ..work(0.0) };
        for _ in 0..10 {
            l.routed("e", 0, 0, credited(1000.0, 750.0), None);
        }
        assert!((l.reuse() - 0.25).abs() < 1e-9, "a quarter credited: {}", l.reuse());
        assert_eq!(l.queued("e").fleet_reuse, l.reuse());
        assert_eq!(l.queued("unseen").fleet_reuse, l.reuse(), "the fleet's, for every instance");
        // A large request weighs more: 9000 of 10,000 tokens credited.
        l.routed("f", 0, 0, credited(10_000.0, 1000.0), None);
        assert!(l.reuse() > 0.4, "{}", l.reuse());
        // Then nothing credited for a while: the share fades toward 0.
        for _ in 0..300 {
            l.routed("e", 0, 0, credited(1000.0, 1000.0), None);
        }
        assert!(l.reuse() < 0.01, "{}", l.reuse());
    }

    #[test]
    fn an_instance_keeps_at_most_its_bound_of_requests() {
        let mut l = WorkLedger::default();
        for _ in 0..MAX_PER_INSTANCE + 10 {
            l.routed("e", 0, 0, work(1.0), None);
        }
        let q = l.queued("e");
        assert_eq!((q.requests, q.tokens), (MAX_PER_INSTANCE as u64, MAX_PER_INSTANCE as f64));
    }
}
