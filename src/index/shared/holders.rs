//! The data behind the shared view: content key -> the streams holding it, per tier.
//!
//! Memory is dominated by blocks that one stream alone holds, so a map value is 4 bytes
//! ([`Holders`]): one stream's slot and tier bits inline, or the index of a [`HolderSet`]
//! (a Device and a Host `u128`) in a slab for keys held by two streams or more. A key held
//! by one stream therefore costs 20 bytes per copy (16 key + 4), not 48. The writers' tables
//! repeat the 16-byte key; holding a 4-byte id of a stable entry instead saved a fifth of the
//! heap but made every query key cost two misses, so it was not kept (BENCHMARKS.md, *The
//! shared index against the peers*).
//!
//! Counting: a stream's bit for a key on a tier is set while at least one of its engine blocks
//! with that content is resident on that tier. Two engine hashes of one stream naming the same
//! content (rare) keep the count beyond one in `extra`, keyed by (key, stream, tier), so a bit
//! flips only on a 0 <-> nonzero transition and removals stay exact.

use std::collections::HashMap;
use std::sync::Arc;

use super::super::apply::Change;
use super::super::blocks::bit;
use super::super::flat::{FlatKey, FlatTable, Vacancy};
use super::super::key::ContentKey;
use super::super::StreamStatus;
use crate::wire::Tier;

impl FlatKey for ContentKey {
    const FILLER: Self = ContentKey([0; 16]);

    /// Content keys are XXH3 digests, uniform in every bit: the low 64 bits need no mixing.
    fn hash64(&self) -> u64 {
        let [a, b, c, d, e, f, g, h, ..] = self.0;
        u64::from_le_bytes([a, b, c, d, e, f, g, h])
    }
}

/// How far ahead of the change being applied its map slot is prefetched: the map does not fit
/// in cache, and misses started early overlap with the work on the changes before them.
const AHEAD: usize = 16;

/// Before `changes[i]` is applied to `map`: prefetches the slot of the change [`AHEAD`]
/// places on, and before the first change, those of the first [`AHEAD`].
fn prefetch_ahead<V: Vacancy>(map: &FlatTable<ContentKey, V>, changes: &[Change], i: usize) {
    if i == 0 {
        changes.iter().take(AHEAD).for_each(|c| map.prefetch(&c.key));
    }
    if let Some(ahead) = changes.get(i + AHEAD) {
        map.prefetch(&ahead.key);
    }
}

/// Streams a shared index can hold (one bit each in a `u128`).
pub const MAX_STREAMS: usize = 128;

/// Marks a [`Holders`] that indexes the slab.
const SET: u32 = 1 << 31;

/// Holders of one key: `SET | slab index`, or `slot << 2 | tiers` for one stream (tiers is
/// never 0 there, so 0 is the vacant mark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Holders(u32);

impl Vacancy for Holders {
    fn is_vacant(&self) -> bool {
        self.0 == 0
    }
}

impl Holders {
    fn inline(slot: u8, tiers: u8) -> Self {
        Holders(u32::from(slot) << 2 | u32::from(tiers))
    }
}

/// The streams holding one key on each tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HolderSet {
    pub device: u128,
    pub host: u128,
}

impl HolderSet {
    fn tier(&mut self, t: Tier) -> &mut u128 {
        match t {
            Tier::Device => &mut self.device,
            Tier::Host => &mut self.host,
        }
    }
}

/// Who a slot belongs to: instance, DP rank and, for discovered streams, the engine process
/// the stream was started for. It is published in the view beside the
/// slot's status, so a reader never pairs a reused slot's bits with the stream that held it
/// before.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamLabel {
    /// The instance name.
    pub instance_name: String,
    /// The DP rank.
    pub dp_rank: u32,
    /// The engine process (discovery only; static streams have none).
    pub identity: Option<crate::registry::Identity>,
    /// The model the engine serves; empty answers queries for any model.
    pub model: String,
    /// The tenant (`tenant_id` of `POST /register`); empty: the default tenant.
    pub tenant: String,
    /// A number for the instance name, given by whoever adds the stream (`kvdir-service`'s
    /// directory: one per name, never given to another), so that a read groups and orders a
    /// prompt's streams by a number instead of comparing names.
    pub instance_handle: u32,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct SharedData {
    pub map: FlatTable<ContentKey, Holders>,
    sets: Vec<HolderSet>,
    free_sets: Vec<u32>,
    extra: HashMap<(ContentKey, u8, u8), u32>,
    /// Streams whose hits count: synchronized and present.
    pub synced: u128,
    /// Hybrid streams (their status lists attention classes): each class is probed apart.
    pub hybrid: u128,
    pub status: Vec<Option<Arc<StreamStatus>>>,
    pub labels: Vec<Option<Arc<StreamLabel>>>,
    /// The labeled slots ordered by instance name, then DP rank (then slot): the order answers
    /// list streams in, kept here because labels change only when streams come and go, while
    /// every query would otherwise sort them again.
    pub order: Vec<u8>,
}

impl SharedData {
    /// The holders of a present key, as sets.
    #[inline]
    pub fn sets_of(&self, h: Holders) -> HolderSet {
        if h.0 & SET != 0 {
            return self.sets[(h.0 & !SET) as usize];
        }
        let s = 1u128 << (h.0 >> 2);
        let tiers = h.0 & 3;
        HolderSet {
            device: if tiers & 1 != 0 { s } else { 0 },
            host: if tiers & 2 != 0 { s } else { 0 },
        }
    }

    /// Sets in the slab (keys held by two streams or more), for tests and memory accounting.
    pub fn shared_keys(&self) -> usize {
        self.sets.len() - self.free_sets.len()
    }

    /// Applies one stream's changes, in order.
    pub fn apply_changes(&mut self, slot: u8, changes: &[Change]) {
        for (i, c) in changes.iter().enumerate() {
            prefetch_ahead(&self.map, changes, i);
            if c.add {
                self.add(c.key, slot, c.tier);
            } else {
                self.remove(c.key, slot, c.tier);
            }
        }
    }

    /// Sets a stream's status (`None`: removed, with its label) and its synchronized bit.
    pub fn set_status(&mut self, slot: u8, status: Option<Arc<StreamStatus>>) {
        let i = usize::from(slot);
        if self.status.len() <= i {
            self.status.resize(i + 1, None);
        }
        let synced = status.as_ref().is_some_and(|s| s.synchronized);
        let hybrid = status.as_ref().is_some_and(|s| !s.attention.is_empty());
        if status.is_none() && i < self.labels.len() && self.labels[i].take().is_some() {
            self.order.retain(|&s| s != slot);
        }
        self.status[i] = status;
        let b = 1u128 << slot;
        self.synced = if synced { self.synced | b } else { self.synced & !b };
        self.hybrid = if hybrid { self.hybrid | b } else { self.hybrid & !b };
    }

    /// Sets who holds a slot.
    pub fn set_label(&mut self, slot: u8, label: Arc<StreamLabel>) {
        let i = usize::from(slot);
        if self.labels.len() <= i {
            self.labels.resize(i + 1, None);
        }
        self.labels[i] = Some(label);
        self.order.retain(|&s| s != slot);
        let labels = &self.labels;
        let key =
            |s: u8| labels[usize::from(s)].as_deref().map(|l| (&l.instance_name, l.dp_rank, s));
        let at = self.order.partition_point(|&s| key(s) < key(slot));
        self.order.insert(at, slot);
    }

    fn add(&mut self, key: ContentKey, slot: u8, tier: Tier) {
        let at = match self.map.find(&key) {
            Err(at) => {
                self.map.insert_at(at, key, Holders::inline(slot, bit(tier)));
                return;
            }
            Ok(at) => at,
        };
        let h = *self.map.at_mut(at);
        let mut set = self.sets_of(h);
        let b = 1u128 << slot;
        if *set.tier(tier) & b != 0 {
            *self.extra.entry((key, slot, bit(tier))).or_insert(0) += 1;
            return;
        }
        *set.tier(tier) |= b;
        let new = self.store_set(h, set);
        *self.map.at_mut(at) = new;
    }

    fn remove(&mut self, key: ContentKey, slot: u8, tier: Tier) {
        let Ok(at) = self.map.find(&key) else {
            debug_assert!(false, "removing a key no stream holds");
            return;
        };
        if let Some(n) = self.extra.get_mut(&(key, slot, bit(tier))) {
            *n -= 1;
            if *n == 0 {
                self.extra.remove(&(key, slot, bit(tier)));
            }
            return;
        }
        let h = *self.map.at_mut(at);
        let mut set = self.sets_of(h);
        *set.tier(tier) &= !(1u128 << slot);
        let new = self.store_set(h, set);
        if new.is_vacant() {
            self.map.remove_at(at);
        } else {
            *self.map.at_mut(at) = new;
        }
    }

    /// The representation of `set` (inline when one stream or none holds it), reusing or
    /// freeing the slab entry of `old`.
    fn store_set(&mut self, old: Holders, set: HolderSet) -> Holders {
        let any = set.device | set.host;
        let old_set = (old.0 & SET != 0).then_some(old.0 & !SET);
        if any.count_ones() <= 1 {
            if let Some(i) = old_set {
                self.free_sets.push(i);
            }
            if any == 0 {
                return Holders::default();
            }
            let slot = any.trailing_zeros() as u8;
            let tiers = u8::from(set.device != 0) | u8::from(set.host != 0) << 1;
            return Holders::inline(slot, tiers);
        }
        let i = match old_set {
            Some(i) => i,
            None => match self.free_sets.pop() {
                Some(i) => i,
                None => {
                    self.sets.push(HolderSet::default());
                    (self.sets.len() - 1) as u32
                }
            },
        };
        self.sets[i as usize] = set;
        Holders(SET | i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(v: u128) -> ContentKey {
        ContentKey::from_u128(v.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
    }

    fn change(data: &mut SharedData, slot: u8, key: u128, tier: Tier, add: bool) {
        data.apply_changes(slot, &[Change { key: k(key), tier, add }]);
    }

    fn holders(data: &SharedData, key: u128) -> Option<HolderSet> {
        data.map.get(&k(key)).map(|h| data.sets_of(*h))
    }

    #[test]
    fn a_key_of_one_stream_is_inline_and_a_second_stream_moves_it_to_the_slab_and_back() {
        let mut d = SharedData::default();
        change(&mut d, 127, 1, Tier::Host, true);
        assert_eq!(holders(&d, 1), Some(HolderSet { device: 0, host: 1 << 127 }));
        assert_eq!(d.shared_keys(), 0);
        change(&mut d, 3, 1, Tier::Device, true);
        assert_eq!(holders(&d, 1), Some(HolderSet { device: 1 << 3, host: 1 << 127 }));
        assert_eq!(d.shared_keys(), 1);
        change(&mut d, 127, 1, Tier::Host, false);
        assert_eq!(holders(&d, 1), Some(HolderSet { device: 1 << 3, host: 0 }));
        assert_eq!(d.shared_keys(), 0, "back inline, slab entry freed");
        change(&mut d, 3, 1, Tier::Device, false);
        assert_eq!(holders(&d, 1), None);
        assert_eq!(d.map.len(), 0);
    }

    #[test]
    fn a_bit_flips_only_when_the_last_engine_block_of_its_content_leaves() {
        let mut d = SharedData::default();
        change(&mut d, 0, 7, Tier::Device, true);
        change(&mut d, 0, 7, Tier::Device, true); // a second engine hash, same content
        change(&mut d, 0, 7, Tier::Device, false);
        assert_eq!(holders(&d, 7), Some(HolderSet { device: 1, host: 0 }));
        change(&mut d, 0, 7, Tier::Device, false);
        assert_eq!(holders(&d, 7), None);
        assert!(d.extra.is_empty());
    }

    #[test]
    fn freed_slab_entries_are_reused() {
        let mut d = SharedData::default();
        for key in 0..3 {
            change(&mut d, 0, key, Tier::Device, true);
            change(&mut d, 1, key, Tier::Device, true);
        }
        assert_eq!(d.shared_keys(), 3);
        change(&mut d, 1, 0, Tier::Device, false);
        change(&mut d, 2, 9, Tier::Device, true);
        change(&mut d, 3, 9, Tier::Host, true);
        assert_eq!((d.sets.len(), d.shared_keys()), (3, 3));
    }

    #[test]
    fn labeled_slots_stay_ordered_by_instance_then_rank_as_streams_come_and_go() {
        let mut d = SharedData::default();
        let label = |name: &str, dp_rank| {
            Arc::new(StreamLabel { instance_name: name.into(), dp_rank, ..Default::default() })
        };
        let st = || Some(Arc::new(StreamStatus::default()));
        for (slot, name, rank) in [(4, "b", 1), (0, "b", 0), (9, "a", 3), (2, "c", 0), (7, "a", 0)]
        {
            d.set_label(slot, label(name, rank));
            d.set_status(slot, st());
        }
        assert_eq!(d.order, [7, 9, 0, 4, 2]);
        d.set_status(0, None);
        assert_eq!(d.order, [7, 9, 4, 2], "a removed stream leaves the order");
        d.set_label(0, label("a", 1));
        assert_eq!(d.order, [7, 0, 9, 4, 2], "a reused slot takes its new label's place");
        d.set_label(4, label("0", 0));
        assert_eq!(d.order, [4, 7, 0, 9, 2], "a relabeled slot moves");
    }

    #[test]
    fn status_sets_and_clears_the_synchronized_mask() {
        let mut d = SharedData::default();
        let st = |synchronized| Some(Arc::new(StreamStatus { synchronized, ..Default::default() }));
        d.set_status(5, st(true));
        assert_eq!(d.synced, 1 << 5);
        d.set_status(5, st(false));
        assert_eq!(d.synced, 0);
        d.set_status(5, st(true));
        d.set_status(5, None);
        assert_eq!((d.synced, d.status[5].is_none()), (0, true));
    }
}
