//! Replay DEALERs open at once, bounded per process (`max_concurrent_replays`): each costs two
//! file descriptors (its mailbox and its TCP connection), and thousands of streams starting
//! together would otherwise open thousands at once.
//!
//! [`Gate`] is the pure part: free slots and a FIFO of streams waiting for one. A released
//! slot goes to the first waiter, whose thread is told ([`super::Command::Granted`]).
//! [`ReplaySlot`] is one stream's side: it asks for a slot when its recovery machine requests
//! a replay, keeps it across retries, and gives it back (or leaves the queue) on
//! `Action::CloseSnapshot`, on removal and on drop. A grant that arrives for a stream that no
//! longer waits is given back, so slots are never lost.

use std::collections::VecDeque;
use std::sync::Arc;

use super::PoolShared;

/// A stream waiting for a slot: its thread and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    /// The I/O thread serving it.
    pub thread: usize,
    /// The stream's id.
    pub stream: u64,
}

/// Free replay slots and the streams waiting for one, in order.
#[derive(Debug)]
pub struct Gate {
    free: usize,
    queue: VecDeque<Waiter>,
}

impl Gate {
    /// `capacity` slots, all free.
    pub fn new(capacity: usize) -> Gate {
        Gate { free: capacity, queue: VecDeque::new() }
    }

    /// Takes a slot for `w` when one is free and nobody waits; otherwise queues `w` (once).
    pub fn acquire(&mut self, w: Waiter) -> bool {
        if self.free > 0 && self.queue.is_empty() {
            self.free -= 1;
            return true;
        }
        if !self.queue.contains(&w) {
            self.queue.push_back(w);
        }
        false
    }

    /// Gives a slot back: to the first waiter (returned, to be told), or to the free ones.
    pub fn release(&mut self) -> Option<Waiter> {
        let next = self.queue.pop_front();
        if next.is_none() {
            self.free += 1;
        }
        next
    }

    /// `w` stops waiting.
    pub fn cancel(&mut self, w: Waiter) {
        self.queue.retain(|q| *q != w);
    }

    /// Streams waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    /// Queued, with the sequence number to ask for once a slot comes.
    Waiting(u64),
    Holding,
}

/// One stream's replay slot.
pub struct ReplaySlot {
    pool: Arc<PoolShared>,
    me: Waiter,
    state: State,
}

impl ReplaySlot {
    /// A stream's slot handle, holding nothing.
    pub(super) fn new(pool: Arc<PoolShared>, me: Waiter) -> ReplaySlot {
        ReplaySlot { pool, me, state: State::Idle }
    }

    /// The recovery machine asks for a replay from `start_seq`: `Some(start_seq)` when the
    /// stream may open its DEALER now, `None` while it waits for a slot.
    pub fn want(&mut self, start_seq: u64) -> Option<u64> {
        match self.state {
            State::Holding => return Some(start_seq),
            State::Waiting(_) => {}
            State::Idle if self.pool.acquire(self.me) => {
                self.state = State::Holding;
                return Some(start_seq);
            }
            State::Idle => {}
        }
        self.state = State::Waiting(start_seq);
        None
    }

    /// A slot was granted: the sequence number to ask for, or `None` when the stream no
    /// longer waits (the slot goes back).
    pub fn granted(&mut self) -> Option<u64> {
        match self.state {
            State::Waiting(seq) => {
                self.state = State::Holding;
                Some(seq)
            }
            State::Idle | State::Holding => {
                self.pool.release();
                None
            }
        }
    }

    /// The stream's DEALER could not open for want of a descriptor (`e`): the slot goes back,
    /// and the wait is counted (and logged once a minute).
    pub fn starved(&mut self, stream: &str, dp: u32, e: zmq::Error) {
        self.done();
        self.pool.fds.starved(stream, dp, "replay", e);
    }

    /// The replay attempt ended: the slot goes back, or the stream leaves the queue.
    pub fn done(&mut self) {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Holding => self.pool.release(),
            State::Waiting(_) => self.pool.cancel(self.me),
            State::Idle => {}
        }
    }
}

impl Drop for ReplaySlot {
    fn drop(&mut self) {
        self.done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(stream: u64) -> Waiter {
        Waiter { thread: 0, stream }
    }

    #[test]
    fn slots_go_to_waiters_in_arrival_order() {
        let mut g = Gate::new(2);
        assert!(g.acquire(w(1)) && g.acquire(w(2)), "two slots free");
        assert!(!g.acquire(w(3)) && !g.acquire(w(4)) && !g.acquire(w(3)), "queued once each");
        assert_eq!(g.waiting(), 2);
        assert_eq!(g.release(), Some(w(3)), "the first waiter gets the slot");
        assert_eq!(g.release(), Some(w(4)));
        assert_eq!(g.release(), None, "nobody waits: the slot is free again");
        assert!(g.acquire(w(5)));
        assert!(!g.acquire(w(6)), "the other slot is still held by 4");
    }

    #[test]
    fn a_cancelled_waiter_leaves_the_queue_and_a_newcomer_does_not_jump_it() {
        let mut g = Gate::new(1);
        assert!(g.acquire(w(1)));
        assert!(!g.acquire(w(2)) && !g.acquire(w(3)));
        g.cancel(w(2));
        assert_eq!(g.release(), Some(w(3)));
        assert_eq!(g.release(), None);
        assert!(g.acquire(w(4)), "the slot 3 gave back is free");
    }
}
