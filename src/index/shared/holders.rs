//! The data behind the shared view: content key -> the streams holding it, per tier.
//!
//! Layout. Every content key that some stream holds has an entry with a stable id in a slab
//! (key 16 bytes, [`Holders`] 4, reference count 4), and an index (`tag -> id`, 8 bytes a
//! slot, Robin Hood, see `flat.rs`) finds it by key: the tag is 32 bits of the key, and a
//! lookup compares the whole key in the slab entry only for a slot whose tag matches. Writers
//! keep the id (4 bytes) in their engine-hash tables instead of the 16-byte key, so that a
//! removal reaches its entry without a key probe; the peer bench (128 streams, N=32768 blocks
//! each) measured 59.4 heap bytes per (block, stream) against 76.7 with keys in both tables.
//!
//! Reference counts. An entry's count is the number of resident engine blocks, in every
//! stream's table, that name it, plus those removed whose removal is not yet published. A
//! writer takes a reference when a new block interns its key (under the view's write lock, see
//! [`IdRefs`]); it gives it back through the log, after the block's last changes, so the count
//! drops at the publish that applies them. An entry is freed (its index slot removed, its id
//! reused) when its count reaches zero, which is only ever at a publish: an id that a
//! committed or pending change names is therefore always still its key's.

//! Memory is dominated by blocks that one stream alone holds, so [`Holders`] is 4 bytes: one
//! stream's slot and tier bits inline, or the index of a [`HolderSet`] (a Device and a Host
//! `u128`) in a second slab for keys held by two streams or more.
//!
//! Counting: a stream's bit for a key on a tier is set while at least one of its engine blocks
//! with that content is resident on that tier. Two engine hashes of one stream naming the same
//! content (rare) keep the count beyond one in `extra`, keyed by (id, stream, tier), so a bit
//! flips only on a 0 <-> nonzero transition and removals stay exact.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use super::super::apply::Refs;
use super::super::blocks::{bit, Id};
use super::super::flat::{FlatKey, FlatTable, Vacancy};
use super::super::key::ContentKey;
use super::super::view::{Change, StreamStatus};
use crate::wire::Tier;

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
}

/// 32 bits of a content key, the index's key (content keys are uniform in every bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag(u32);

impl Tag {
    pub fn of(key: &ContentKey) -> Self {
        let [a, b, c, d, ..] = key.0;
        Tag(u32::from_le_bytes([a, b, c, d]))
    }
}

impl FlatKey for Tag {
    const FILLER: Self = Tag(0);

    /// The home slot is taken from the high bits: the tag there, its copy below.
    fn hash64(&self) -> u64 {
        u64::from(self.0) << 32 | u64::from(self.0)
    }
}

/// An index slot's value: id + 1 (0 is the vacant mark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Slot(u32);

impl Vacancy for Slot {
    fn is_vacant(&self) -> bool {
        self.0 == 0
    }
}

/// One content key held by some stream (or named by a pending change).
#[derive(Debug, Clone, Copy)]
struct Entry {
    key: ContentKey,
    holders: Holders,
    refs: u32,
}

/// Entries per slab chunk: the slab grows a chunk at a time, never copying what it holds (a
/// `Vec` would copy every entry under the write lock, and keep up to half its capacity spare).
const CHUNK: usize = 1 << 12;

/// Entries by id, with the ids of freed entries for reuse.
#[derive(Debug, Default)]
struct Slab {
    chunks: Vec<Vec<Entry>>,
    free: Vec<u32>,
}

impl Slab {
    fn get(&self, id: u32) -> &Entry {
        &self.chunks[id as usize / CHUNK][id as usize % CHUNK]
    }

    fn get_mut(&mut self, id: u32) -> &mut Entry {
        &mut self.chunks[id as usize / CHUNK][id as usize % CHUNK]
    }

    fn alloc(&mut self, e: Entry) -> u32 {
        if let Some(id) = self.free.pop() {
            *self.get_mut(id) = e;
            return id;
        }
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let n = self.chunks.len() - 1;
        self.chunks[n].push(e);
        (n * CHUNK + self.chunks[n].len() - 1) as u32
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum::<usize>() - self.free.len()
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct SharedData {
    pub index: FlatTable<Tag, Slot>,
    slab: Slab,
    sets: Vec<HolderSet>,
    free_sets: Vec<u32>,
    extra: HashMap<(u32, u8, u8), u32>,
    /// Streams whose hits count: synchronized and present.
    pub synced: u128,
    pub status: Vec<Option<Arc<StreamStatus>>>,
    pub labels: Vec<Option<Arc<StreamLabel>>>,
}

/// Changes whose entries are loaded in one pass before they are applied (see `view.rs`).
const AHEAD: usize = 16;

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

    /// Keys held by some stream (entries only pending changes name are not counted).
    pub fn held_keys(&self) -> usize {
        // Freed entries have no holders.
        self.slab.chunks.iter().flatten().filter(|e| !e.holders.is_vacant()).count()
    }

    /// Entries, held or only named by pending changes (for tests).
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.slab.len()
    }

    /// The id of `key`'s entry.
    pub fn find(&self, key: &ContentKey) -> Option<u32> {
        let at = self.index.find_by(&Tag::of(key), |s| self.slab.get(s.0 - 1).key == *key);
        at.ok().map(|at| self.index.at(at).0 - 1)
    }

    /// The id of the first entry whose tag is `key`'s, without comparing keys: a query resolves
    /// a group of keys this way to load their entries, then checks each with [`Self::holders`].
    #[inline]
    pub fn guess(&self, key: &ContentKey) -> Option<u32> {
        let tag = Tag::of(key);
        let at = self.index.home_hit(&tag).map_or_else(|| self.index.find_by(&tag, |_| true), Ok);
        at.ok().map(|at| self.index.at(at).0 - 1)
    }

    /// The holders of `key` if `id` is its entry (a [`Self::guess`] that was right).
    #[inline]
    pub fn holders_if(&self, id: u32, key: &ContentKey) -> Option<Holders> {
        let e = self.slab.get(id);
        (e.key == *key).then_some(e.holders)
    }

    /// The holders of `key`, if any stream holds it.
    #[inline]
    pub fn holders(&self, key: &ContentKey) -> Option<Holders> {
        let h = self.slab.get(self.find(key)?).holders;
        (!h.is_vacant()).then_some(h)
    }

    /// Loads the slab entry of `id` (see [`FlatTable::touch`]).
    #[inline]
    pub fn touch_entry(&self, id: u32) -> bool {
        self.slab.get(id).holders.is_vacant()
    }

    /// Applies one stream's changes, in order.
    pub fn apply_changes(&mut self, slot: u8, changes: &[Change<Id>]) {
        for group in changes.chunks(AHEAD) {
            black_box(group.iter().fold(false, |acc, c| acc ^ self.touch_entry(c.key.get())));
            for c in group {
                if c.add {
                    self.add(c.key.get(), slot, c.tier);
                } else {
                    self.remove(c.key.get(), slot, c.tier);
                }
            }
        }
    }

    /// Gives back references of blocks whose removal has been applied, freeing the entries
    /// that no block names any more. By groups: the entries are loaded first, then the index
    /// slots of those freed.
    pub fn release_all(&mut self, ids: &[Id]) {
        let mut freed = [0u32; AHEAD];
        for group in ids.chunks(AHEAD) {
            black_box(group.iter().fold(false, |acc, id| acc ^ self.touch_entry(id.get())));
            let mut n = 0;
            for id in group {
                if self.release(id.get()) {
                    freed[n] = id.get();
                    n += 1;
                }
            }
            let tags = |id: &u32| Tag::of(&self.slab.get(*id).key);
            black_box(freed[..n].iter().fold(false, |acc, id| acc ^ self.index.touch(&tags(id))));
            for &id in &freed[..n] {
                self.free(id);
            }
        }
    }

    /// Takes a reference to `key`'s entry, creating it (held by nobody) if there is none.
    pub fn intern(&mut self, key: ContentKey) -> u32 {
        let tag = Tag::of(&key);
        match self.index.find_by(&tag, |s| self.slab.get(s.0 - 1).key == key) {
            Ok(at) => {
                let id = self.index.at(at).0 - 1;
                self.slab.get_mut(id).refs += 1;
                id
            }
            Err(at) => {
                let id = self.slab.alloc(Entry { key, holders: Holders::default(), refs: 1 });
                self.index.insert_at(at, tag, Slot(id + 1));
                id
            }
        }
    }

    /// Gives back a reference; whether it was the last (the entry is then to be [`Self::free`]d).
    fn release(&mut self, id: u32) -> bool {
        let e = self.slab.get_mut(id);
        debug_assert!(e.refs > 0, "releasing an entry nothing references");
        e.refs -= 1;
        debug_assert!(e.refs > 0 || e.holders.is_vacant(), "an entry with holders is referenced");
        e.refs == 0
    }

    /// Removes an entry no block names from the index, and its id for reuse.
    fn free(&mut self, id: u32) {
        let key = self.slab.get(id).key;
        if let Ok(at) = self.index.find_by(&Tag::of(&key), |s| s.0 == id + 1) {
            self.index.remove_at(at);
        }
        self.slab.free.push(id);
    }

    /// Sets a stream's status (`None`: removed, with its label) and its synchronized bit.
    pub fn set_status(&mut self, slot: u8, status: Option<Arc<StreamStatus>>) {
        let i = usize::from(slot);
        if self.status.len() <= i {
            self.status.resize(i + 1, None);
        }
        let synced = status.as_ref().is_some_and(|s| s.synchronized);
        if status.is_none() && i < self.labels.len() {
            self.labels[i] = None;
        }
        self.status[i] = status;
        let b = 1u128 << slot;
        self.synced = if synced { self.synced | b } else { self.synced & !b };
    }

    /// Sets who holds a slot.
    pub fn set_label(&mut self, slot: u8, label: Arc<StreamLabel>) {
        let i = usize::from(slot);
        if self.labels.len() <= i {
            self.labels.resize(i + 1, None);
        }
        self.labels[i] = Some(label);
    }

    fn add(&mut self, id: u32, slot: u8, tier: Tier) {
        let h = self.slab.get(id).holders;
        if h.is_vacant() {
            self.slab.get_mut(id).holders = Holders::inline(slot, bit(tier));
            return;
        }
        let mut set = self.sets_of(h);
        let b = 1u128 << slot;
        if *set.tier(tier) & b != 0 {
            *self.extra.entry((id, slot, bit(tier))).or_insert(0) += 1;
            return;
        }
        *set.tier(tier) |= b;
        let new = self.store_set(h, set);
        self.slab.get_mut(id).holders = new;
    }

    fn remove(&mut self, id: u32, slot: u8, tier: Tier) {
        if let Some(n) = self.extra.get_mut(&(id, slot, bit(tier))) {
            *n -= 1;
            if *n == 0 {
                self.extra.remove(&(id, slot, bit(tier)));
            }
            return;
        }
        let h = self.slab.get(id).holders;
        debug_assert!(!h.is_vacant(), "removing a key no stream holds");
        let mut set = self.sets_of(h);
        *set.tier(tier) &= !(1u128 << slot);
        let new = self.store_set(h, set);
        self.slab.get_mut(id).holders = new;
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

/// A writer's references into the view while it applies, under the view's write lock: keys
/// are interned at once, references given back are collected in `released` for the log (see
/// the module documentation).
pub(crate) struct IdRefs<'a> {
    pub data: &'a mut SharedData,
    pub released: &'a mut Vec<Id>,
}

impl Refs<Id> for IdRefs<'_> {
    fn key(&self, r: Id) -> ContentKey {
        self.data.slab.get(r.get()).key
    }

    fn find(&self, key: &ContentKey) -> Option<Id> {
        self.data.find(key).map(Id::new)
    }

    fn intern(&mut self, key: ContentKey) -> Id {
        Id::new(self.data.intern(key))
    }

    fn release(&mut self, r: Id) {
        self.released.push(r);
    }

    fn touch(&self, key: &ContentKey) -> bool {
        self.data.index.touch(&Tag::of(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(v: u128) -> ContentKey {
        ContentKey::from_u128(v.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
    }

    /// One change of a writer, published: an add interns the key for its new block (the
    /// block's reference), a removal gives the block's reference back after it.
    fn change(data: &mut SharedData, slot: u8, key: u128, tier: Tier, add: bool) {
        let id = if add { data.intern(k(key)) } else { data.find(&k(key)).expect("held") };
        data.apply_changes(slot, &[Change { key: Id::new(id), tier, add }]);
        if !add {
            data.release_all(&[Id::new(id)]);
        }
    }

    fn holders(data: &SharedData, key: u128) -> Option<HolderSet> {
        data.holders(&k(key)).map(|h| data.sets_of(h))
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
        assert_eq!(
            (d.index.len(), d.entries()),
            (0, 0),
            "the entry is freed with its last reference"
        );
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
    fn an_entry_a_pending_change_names_outlives_its_last_block() {
        let mut d = SharedData::default();
        // Stream 0 stores and removes a block; neither change is published yet.
        let id = d.intern(k(5));
        let add = Change { key: Id::new(id), tier: Tier::Device, add: true };
        let remove = Change { add: false, ..add };
        // Stream 1 stores and removes the same content, published at once.
        change(&mut d, 1, 5, Tier::Device, true);
        change(&mut d, 1, 5, Tier::Device, false);
        assert_eq!(d.find(&k(5)), Some(id), "stream 0's pending changes still name it");
        d.apply_changes(0, &[add, remove]);
        d.release_all(&[Id::new(id)]);
        assert_eq!((d.find(&k(5)), d.entries()), (None, 0));
    }

    #[test]
    fn keys_whose_tags_collide_stay_apart() {
        let mut d = SharedData::default();
        let (a, b) = (ContentKey::from_u128(1 << 64 | 7), ContentKey::from_u128(2 << 64 | 7));
        assert_eq!(Tag::of(&a), Tag::of(&b));
        let (ia, ib) = (d.intern(a), d.intern(b));
        assert_ne!(ia, ib);
        assert_eq!((d.find(&a), d.find(&b)), (Some(ia), Some(ib)));
        d.apply_changes(2, &[Change { key: Id::new(ib), tier: Tier::Host, add: true }]);
        assert_eq!(d.holders(&a), None);
        assert_eq!(d.holders(&b).map(|h| d.sets_of(h).host), Some(1 << 2));
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
