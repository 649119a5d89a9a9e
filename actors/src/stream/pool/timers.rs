//! [`Timers`]: one I/O thread's recovery deadlines, a min-heap of `(when, stream)` with lazy
//! deletion. A stream's deadline moves (a resync, a reply that ends a snapshot attempt) by
//! pushing the new one; the thread keeps each stream's current deadline and skips popped
//! entries that no longer match it, so no turn scans all streams. Stale entries are dropped
//! when they come due, or all at once when they outnumber the streams.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// Deadlines of one thread's streams, by stream id.
#[derive(Debug, Default)]
pub struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Timers {
    /// Schedules `stream` at `at` (an earlier entry for it becomes stale, not removed).
    pub fn push(&mut self, at: Instant, stream: u64) {
        self.heap.push(Reverse((at, stream)));
    }

    /// The earliest entry's time, stale or not (a stale one costs one spurious wake-up).
    pub fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The earliest entry due at `now`, removed.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, u64)> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// Entries held, stale ones included.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Keeps only the entries `current` says are still wanted (called when stale entries pile
    /// up: more than a few per stream).
    pub fn retain(&mut self, current: impl Fn(Instant, u64) -> bool) {
        self.heap.retain(|Reverse((at, id))| current(*at, *id));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn entries_come_due_in_time_order_and_only_when_due() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut t = Timers::default();
        t.push(ms(30), 3);
        t.push(ms(10), 1);
        t.push(ms(20), 2);
        assert_eq!(t.next(), Some(ms(10)));
        assert_eq!(t.pop_due(ms(5)), None, "nothing is due before its time");
        assert_eq!(t.pop_due(ms(20)), Some((ms(10), 1)));
        assert_eq!(t.pop_due(ms(20)), Some((ms(20), 2)));
        assert_eq!(t.pop_due(ms(20)), None);
        assert_eq!(t.next(), Some(ms(30)));
    }

    #[test]
    fn retain_drops_stale_entries() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        for i in 0..10 {
            t.push(t0 + Duration::from_millis(i), 7);
        }
        t.push(t0, 8);
        let current = t0 + Duration::from_millis(9);
        t.retain(|at, id| id == 8 || at == current);
        assert_eq!(t.len(), 2);
        assert_eq!(t.pop_due(current), Some((t0, 8)));
        assert_eq!(t.pop_due(current), Some((current, 7)));
    }
}
