//! Overload admission: a bounded FIFO queue that holds front door requests while every engine
//! is behind, as a pure state machine (time passed in as `now_ms`, estimates passed in).
//!
//! A request arrives with the lowest estimated time to first token over its candidates.
//! - Off (`ttft_bound_ms` = 0), or no estimate (no candidate: routing answers the error), or
//!   nothing held and the estimate within the bound: **send** it now.
//! - Otherwise, while fewer than `queue` requests are held: **hold** it, behind every request
//!   already held (FIFO: a request arriving while others wait never overtakes them, even when
//!   its own estimate is lower).
//! - Otherwise **refuse** it, with `Retry-After` = the estimate rounded up to whole seconds
//!   (at least 1): when the best engine is expected to reach this request's first token.
//!
//! The caller re-evaluates the queue when an engine frees up (a request's first byte or end, a
//! load report, a new instance snapshot) and when the oldest held request reaches its
//! deadline ([`AdmissionQueue::next_deadline_ms`]): [`AdmissionQueue::pop_due`] releases the
//! oldest request when its estimate is within the bound (`Capacity`) or when it has waited
//! `max_wait_ms` (`MaxWait`: sent anyway; it has already paid its wait, and refusing it then
//! would waste it). Releasing one at a time lets the caller count each released request's work
//! before estimating the next. Invariant: entries are in arrival order, so the oldest one is
//! also the first to reach its deadline.

use std::collections::VecDeque;

use serde::Serialize;

/// The overload settings (`--overload_ttft_ms`, `--overload_queue`, `--overload_max_wait_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OverloadParams {
    /// Hold requests whose lowest estimated TTFT is above this many ms; 0 turns overload
    /// admission off.
    pub ttft_bound_ms: u64,
    /// The most requests held at once; past it, requests are refused (429).
    pub queue: usize,
    /// The longest a request is held before it is sent anyway.
    pub max_wait_ms: u64,
}

impl Default for OverloadParams {
    fn default() -> Self {
        OverloadParams { ttft_bound_ms: 0, queue: 256, max_wait_ms: 30_000 }
    }
}

impl OverloadParams {
    /// Whether requests are ever held or refused.
    pub fn enabled(&self) -> bool {
        self.ttft_bound_ms > 0
    }
}

/// Identifies a held request, to withdraw it.
pub type HeldId = u64;

/// What to do with an arriving request.
#[derive(Debug, PartialEq)]
pub enum Arrival<T> {
    /// Send it now.
    Send(T),
    /// It is held under this id.
    Held(HeldId),
    /// The queue is full.
    Refused(T, Refusal),
}

/// Why a request was refused, for its 429.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Refusal {
    /// The request's lowest estimated TTFT, in ms.
    pub estimate_ms: f64,
    /// `Retry-After`, in seconds.
    pub retry_after_s: u64,
    /// The settings in force.
    pub params: OverloadParams,
}

/// Why a held request was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Its estimate came within the bound.
    Capacity,
    /// It waited `max_wait_ms`; sent anyway.
    MaxWait,
}

/// Counts since start, and the queue's length now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OverloadCounters {
    /// Requests held on arrival.
    pub held: u64,
    /// Held requests sent when an engine freed up.
    pub released_capacity: u64,
    /// Held requests sent anyway after `max_wait_ms`.
    pub released_max_wait: u64,
    /// Held requests whose client went away.
    pub withdrawn: u64,
    /// Requests refused with 429.
    pub refused: u64,
    /// Requests held now.
    pub queue_length: usize,
}

/// The settings and the counters, as `/v1/internal/route/recent` shows them (`overload`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct OverloadReport {
    /// The settings.
    #[serde(flatten)]
    pub params: OverloadParams,
    /// The counters and the queue's length now.
    #[serde(flatten)]
    pub counters: OverloadCounters,
}

#[derive(Debug)]
struct Entry<T> {
    id: HeldId,
    since_ms: u64,
    item: T,
}

/// The bounded FIFO of held requests.
#[derive(Debug)]
pub struct AdmissionQueue<T> {
    params: OverloadParams,
    held: VecDeque<Entry<T>>,
    next_id: HeldId,
    counters: OverloadCounters,
}

impl<T> Default for AdmissionQueue<T> {
    fn default() -> Self {
        AdmissionQueue::new(OverloadParams::default())
    }
}

impl<T> AdmissionQueue<T> {
    /// An empty queue with `params`.
    pub fn new(params: OverloadParams) -> Self {
        let counters = OverloadCounters::default();
        AdmissionQueue { params, held: VecDeque::new(), next_id: 0, counters }
    }

    /// The settings.
    pub fn params(&self) -> OverloadParams {
        self.params
    }

    /// Whether `estimate_ms` (none: no candidate) lets a request go now.
    fn within(&self, estimate_ms: Option<f64>) -> bool {
        estimate_ms.is_none_or(|e| e <= self.params.ttft_bound_ms as f64)
    }

    /// Decides for a request arriving at `now_ms` whose lowest estimated TTFT is `estimate_ms`.
    pub fn arrive(&mut self, now_ms: u64, estimate_ms: Option<f64>, item: T) -> Arrival<T> {
        if !self.params.enabled() || (self.held.is_empty() && self.within(estimate_ms)) {
            return Arrival::Send(item);
        }
        let estimate_ms = estimate_ms.unwrap_or(0.0);
        if self.held.len() >= self.params.queue {
            self.counters.refused += 1;
            let retry_after_s = ((estimate_ms / 1000.0).ceil() as u64).max(1);
            let refusal = Refusal { estimate_ms, retry_after_s, params: self.params };
            return Arrival::Refused(item, refusal);
        }
        self.next_id += 1;
        self.held.push_back(Entry { id: self.next_id, since_ms: now_ms, item });
        self.counters.held += 1;
        Arrival::Held(self.next_id)
    }

    /// The oldest held request, to estimate it.
    pub fn head(&self) -> Option<&T> {
        self.held.front().map(|e| &e.item)
    }

    /// Releases the oldest held request if its estimate (`head_estimate_ms`, computed by the
    /// caller for [`Self::head`]) is within the bound or it has waited `max_wait_ms` by `now_ms`.
    pub fn pop_due(&mut self, now_ms: u64, head_estimate_ms: Option<f64>) -> Option<(T, Release)> {
        let head = self.held.front()?;
        let why = if self.within(head_estimate_ms) {
            Release::Capacity
        } else if now_ms.saturating_sub(head.since_ms) >= self.params.max_wait_ms {
            Release::MaxWait
        } else {
            return None;
        };
        match why {
            Release::Capacity => self.counters.released_capacity += 1,
            Release::MaxWait => self.counters.released_max_wait += 1,
        }
        self.held.pop_front().map(|e| (e.item, why))
    }

    /// Removes a held request whose client went away; `None` when it is no longer held.
    pub fn withdraw(&mut self, id: HeldId) -> Option<T> {
        let at = self.held.iter().position(|e| e.id == id)?;
        self.counters.withdrawn += 1;
        self.held.remove(at).map(|e| e.item)
    }

    /// Removes every held request for which `gone` says its client went away.
    pub fn withdraw_where(&mut self, mut gone: impl FnMut(&T) -> bool) {
        let before = self.held.len();
        self.held.retain(|e| !gone(&e.item));
        self.counters.withdrawn += (before - self.held.len()) as u64;
    }

    /// When the oldest held request reaches `max_wait_ms`, if any is held.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.held.front().map(|e| e.since_ms.saturating_add(self.params.max_wait_ms))
    }

    /// Requests held now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The counters, with the queue's length now.
    pub fn counters(&self) -> OverloadCounters {
        OverloadCounters { queue_length: self.held.len(), ..self.counters }
    }

    /// The settings and the counters.
    pub fn report(&self) -> OverloadReport {
        OverloadReport { params: self.params, counters: self.counters() }
    }
}

#[cfg(test)]
mod tests;
