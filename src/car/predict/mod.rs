//! [`Predictions`]: predict-on-route. When the router sends a request to an instance, the
//! request's content keys are *expected* there before the engine's KV events can say so; a
//! sibling (the same prompt again within milliseconds: parallel sampling, agent fan-out,
//! retries) routed during that gap then sees the first one's placement.
//!
//! Rules:
//! - **Key space.** A prediction is a content key of the request (the keys the query path
//!   computes, in the request's namespace), so predictions and events share one key space.
//! - **Instances, not ranks.** A prediction is recorded for the chosen instance and applies to
//!   every one of its DP ranks: kvdir cannot know which rank the engine's DP scheduler picks,
//!   and CAR takes the minimum over ranks, so a prediction on one rank would give no credit.
//!   (Where kvdir chooses the rank itself, [`super::choose_rank`], the prediction still covers
//!   every rank: a sibling sees its prefix expected on each, and the ranks' loads decide.)
//! - **Confirmation.** Once the exact directory credits a key on any rank of the instance, the
//!   engine has placed it; the prediction is dropped and the exact term takes over
//!   ([`Predictions::confirm`]). Confirmation is lazy: it happens when a later request reads
//!   those keys; keys no request reads again just expire.
//! - **Expiry.** A prediction lives `ttl_ms` from its latest recording; a read never sees an
//!   expired one, and expired ones are purged from the front of the recording queue whenever
//!   something is recorded.
//! - **Bound.** At most `capacity` predictions (key and instance pairs) live; recording past it
//!   drops the least recently recorded first. A refresh leaves a stale item in the recording
//!   queue, skipped when it reaches the front; when stale items make the queue longer than
//!   twice the capacity it is compacted (amortized O(1) per recording), so memory stays under
//!   `capacity` times about 170 bytes (two queue items of 48 bytes, a map entry of 32 plus the
//!   hash table's control byte and slack). Approximate credit ([`super::ApproxCache`]) keeps
//!   one store per engine with the engine's capacity in blocks: the same LRU with a TTL.
//! - **Credit.** [`Predictions::predicted_blocks`] is the length of the longest predicted
//!   prefix of the request's keys: keys chain, so the instance is expected to hold every block
//!   up to the last predicted one. The CAR term it feeds is [`predicted_hit_ratio`].
//!
//! Time is passed in (monotonic milliseconds), so everything here is pure.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::hash::Hash;

use super::names::{InstanceKey, KeyMap, NameMap};
use super::Candidate;
use crate::index::ContentKey;

/// One recording, oldest first in the queue.
#[derive(Debug, Clone)]
struct Queued<I> {
    expires_ms: u64,
    instance: I,
    key: u128,
}

/// Expected content keys by instance (its name or id: `K`), with a TTL and a bound.
#[derive(Debug)]
pub struct Predictions<K: ?Sized + InstanceKey = str> {
    ttl_ms: u64,
    capacity: usize,
    /// Instance -> key -> expiry of its latest recording.
    by_instance: NameMap<K::Owned, KeyMap<u64>>,
    /// Recordings in time order; an item whose expiry differs from its map entry's is stale.
    queue: VecDeque<Queued<K::Owned>>,
    /// Live predictions: the entries of `by_instance`.
    live: usize,
    counters: PredictCounters,
}

/// What happened to predictions since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PredictCounters {
    /// Keys recorded (a refresh counts again).
    pub recorded: u64,
    /// Keys dropped because the exact directory now credits them.
    pub confirmed: u64,
    /// Keys dropped at their TTL.
    pub expired: u64,
    /// Keys dropped early to stay within the bound.
    pub evicted: u64,
}

impl<K: ?Sized + InstanceKey> Clone for Predictions<K> {
    fn clone(&self) -> Self {
        Predictions {
            by_instance: self.by_instance.clone(),
            queue: self.queue.clone(),
            counters: self.counters,
            ..Predictions::new(self.ttl_ms, self.capacity)
        }
        .with_live(self.live)
    }
}

impl<K: ?Sized + InstanceKey> Default for Predictions<K> {
    fn default() -> Self {
        Predictions::new(0, 0)
    }
}

impl<K: ?Sized + InstanceKey> Predictions<K> {
    /// How many predictions are kept unless told otherwise (about 22 MB at most).
    pub const DEFAULT_CAPACITY: usize = 1 << 17;

    /// A store whose predictions live `ttl_ms` (0 turns prediction off) and that keeps at most
    /// `capacity` of them.
    pub fn new(ttl_ms: u64, capacity: usize) -> Self {
        Predictions {
            ttl_ms,
            capacity,
            by_instance: NameMap::default(),
            queue: VecDeque::new(),
            live: 0,
            counters: PredictCounters::default(),
        }
    }

    fn with_live(self, live: usize) -> Self {
        Predictions { live, ..self }
    }
}

impl<K: ?Sized + InstanceKey + Eq + Hash> Predictions<K> {
    /// Whether anything is ever recorded.
    pub fn enabled(&self) -> bool {
        self.ttl_ms > 0 && self.capacity > 0
    }

    /// Live and not yet purged predictions (key and instance pairs).
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no prediction is held.
    pub fn is_empty(&self) -> bool {
        self.by_instance.is_empty()
    }

    /// The counters since start.
    pub fn counters(&self) -> PredictCounters {
        self.counters
    }

    /// Records `keys` as expected on `instance` from `now_ms` for the TTL.
    pub fn record(&mut self, now_ms: u64, instance: &K, keys: &[ContentKey]) {
        if !self.enabled() || keys.is_empty() {
            return;
        }
        self.purge(now_ms);
        let expires_ms = now_ms.saturating_add(self.ttl_ms);
        let name: K::Owned = match self.by_instance.get_key_value(instance) {
            Some((name, _)) => name.clone(),
            None => instance.owned(),
        };
        let map = self.by_instance.entry(name.clone()).or_default();
        for k in keys {
            let key = k.to_u128();
            self.counters.recorded += 1;
            // The same key recorded again in the same millisecond needs no second item.
            match map.insert(key, expires_ms) {
                Some(old) if old == expires_ms => continue,
                Some(_) => {}
                None => self.live += 1,
            }
            self.queue.push_back(Queued { expires_ms, instance: name.clone(), key });
        }
        while self.live > self.capacity {
            let oldest = self.queue.pop_front().expect("a live prediction is queued");
            if self.drop_if_live(&oldest) {
                self.counters.evicted += 1;
            }
        }
        if self.queue.len() > 2 * self.capacity {
            self.compact();
        }
    }

    /// Drops the queue's stale items (refreshed or confirmed since), keeping the order.
    fn compact(&mut self) {
        let by_instance = &self.by_instance;
        self.queue.retain(|q| {
            let instance: &K = q.instance.borrow();
            by_instance.get(instance).and_then(|m| m.get(&q.key)) == Some(&q.expires_ms)
        });
    }

    /// Drops what expired by `now_ms`.
    pub fn purge(&mut self, now_ms: u64) {
        while self.queue.front().is_some_and(|q| q.expires_ms <= now_ms) {
            let item = self.queue.pop_front().expect("checked above");
            if self.drop_if_live(&item) {
                self.counters.expired += 1;
            }
        }
    }

    /// Removes the item's key if this item is its latest recording.
    fn drop_if_live(&mut self, item: &Queued<K::Owned>) -> bool {
        let instance: &K = item.instance.borrow();
        let Some(map) = self.by_instance.get_mut(instance) else { return false };
        if map.get(&item.key) != Some(&item.expires_ms) {
            return false;
        }
        map.remove(&item.key);
        if map.is_empty() {
            self.by_instance.remove(instance);
        }
        self.live -= 1;
        true
    }

    /// The exact directory credits `held` (a prefix of the request's keys) on some rank of
    /// `instance`: those predictions are confirmed and dropped. Returns how many were.
    pub fn confirm(&mut self, instance: &K, held: &[ContentKey]) -> usize {
        let Some(map) = self.by_instance.get_mut(instance) else { return 0 };
        let before = map.len();
        for k in held {
            map.remove(&k.to_u128());
        }
        let confirmed = before - map.len();
        if map.is_empty() {
            self.by_instance.remove(instance);
        }
        self.live -= confirmed;
        self.counters.confirmed += confirmed as u64;
        // Their queue items are stale now and are skipped when they reach the front.
        confirmed
    }

    /// The instances with predictions held (live or not yet purged): the only ones
    /// [`Self::predicted_blocks`] can credit.
    pub fn instances(&self) -> impl Iterator<Item = &K> {
        self.by_instance.keys().map(|name| name.borrow())
    }

    /// Forgets `instance`'s predictions (removed: its key may be given to another); their queue
    /// items are stale now.
    pub fn forget(&mut self, instance: &K) {
        if let Some(map) = self.by_instance.remove(instance) {
            self.live -= map.len();
        }
    }

    /// The longest prefix of `keys` (in blocks) expected on `instance` at `now_ms`.
    pub fn predicted_blocks(&self, now_ms: u64, instance: &K, keys: &[ContentKey]) -> usize {
        let Some(map) = self.by_instance.get(instance) else { return 0 };
        keys.iter()
            .rposition(|k| map.get(&k.to_u128()).is_some_and(|&exp| exp > now_ms))
            .map_or(0, |i| i + 1)
    }
}

/// The CAR predicted term of a candidate: what its worst rank is expected to hold (exact or
/// predicted, whichever is longer) minus what its worst rank holds exactly, as a share of
/// `input_tokens`. A missing, unsynchronized or stale-identity rank makes it 0, as it makes
/// the exact ratio 0. With no prediction it is 0; it never counts a block twice.
pub fn predicted_hit_ratio(c: &Candidate, input_tokens: usize, host_weight: f64) -> f64 {
    if input_tokens == 0 || c.hits.len() < c.dp_size.max(1) as usize {
        return 0.0;
    }
    let exact = super::kv_hit_ratio(c, input_tokens, host_weight);
    let expected = (0..c.dp_size.max(1))
        .map(|rank| match c.hits.iter().find(|h| h.dp_rank == rank) {
            Some(h) if h.synchronized && h.identity_matches => {
                let hit = h.device_hit_tokens as f64
                    + host_weight * h.host_only_hit_tokens as f64
                    + h.predicted_hit_tokens as f64;
                (hit / input_tokens as f64).clamp(0.0, 1.0)
            }
            _ => 0.0,
        })
        .fold(f64::INFINITY, f64::min);
    (expected - exact).max(0.0)
}

#[cfg(test)]
mod tests;
