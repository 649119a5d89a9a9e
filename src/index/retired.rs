//! The retired memory of one stream: engine hash -> content key of the blocks that left their
//! last tier, bounded, so that a later store naming one of them as its parent still keys its
//! blocks.
//!
//! Why: vLLM stores a block again when it recomputes a prompt's last block (a second physical
//! copy under the same hash), and publishes `BlockRemoved` for the hash when the older copy is
//! evicted although the newer one stays; later stores then name that hash as their parent. The
//! index cannot tell copies apart (`kv_cache_report_mode: full` re-publishes stores of reused
//! blocks without a new copy, so counting stores would keep a block after its last removal:
//! stale credit), so a removal always removes, and the block's key is kept here instead. Its
//! children are then keyed and credited; the retired block itself is not in the view
//! (under-credit, never stale). A tokenless store of a retired hash brings it back on that tier.
//!
//! Bound: [`capacity`] entries per stream, `max(4096, max_blocks / 4)`, of 25 bytes with a
//! 64-bit engine hash (33 with a longer one) in a flat table at most 3/4 full: at the default
//! 262,144 blocks, 65,536 entries in about 2.2 MB, a quarter of the block table's bytes, and
//! allocated only as blocks retire. Eviction is CLOCK (second chance): an entry enters marked
//! used, a lookup as a parent marks it again, and the hand clears the mark as it passes, so an
//! entry lives at least one turn of the hand (on the order of `capacity` retirements) and longer
//! while children keep naming it (the last block of a hot prefix whose older copy was evicted).
//!
//! An entry is only read while its hash is not resident (the block table is asked first): a
//! hash stored again shadows its entry, and retiring it again overwrites it, so the store path
//! pays no extra lookup. `AllBlocksCleared`, a reset and a snapshot install forget everything.

use super::blocks::{key, Block, Key, Narrow, Wide, OUT_OF_SCOPE};
use super::flat::{FlatKey, FlatTable, Vacancy};
use super::key::ContentKey;
use crate::wire::EngineHash;

/// Set on every entry: vacant slots are all zero.
const HELD: u8 = 1;
/// Set when an entry enters or is looked up; the clock hand clears it before it evicts.
const USED: u8 = 2;

/// Entries one stream remembers (see the module documentation).
pub(crate) fn capacity(max_blocks: usize) -> usize {
    (max_blocks / 4).max(4096)
}

/// A retired block: its content key and whether it was out of scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    key: ContentKey,
    flags: u8,
}

impl Default for Entry {
    fn default() -> Self {
        Entry { key: ContentKey([0; 16]), flags: 0 }
    }
}

impl Entry {
    /// The block as it re-enters the table on `tiers` (bits of [`super::blocks::bit`]).
    pub fn block(&self, tiers: u8) -> Block {
        Block { key: self.key, tiers: tiers | (self.flags & OUT_OF_SCOPE) }
    }
}

impl Vacancy for Entry {
    fn is_vacant(&self) -> bool {
        self.flags == 0
    }
}

/// One width's table and its clock hand.
#[derive(Debug, Clone)]
struct Clock<K: FlatKey + std::fmt::Debug> {
    table: FlatTable<K, Entry>,
    hand: usize,
}

impl<K: FlatKey + std::fmt::Debug> Clock<K> {
    fn new(limit: usize) -> Self {
        Clock { table: FlatTable::with_limit(limit), hand: 0 }
    }

    fn get(&mut self, k: &K) -> Option<Entry> {
        let e = self.table.get_mut(k)?;
        e.flags |= USED;
        Some(*e)
    }

    /// Overwrites `k`'s entry if it has one.
    /// Overwrites `k`'s entry or, below capacity (`full` false), inserts it, with one probe
    /// either way; at capacity hands `k` back, to be inserted once an eviction made room (an
    /// eviction may move entries, so the place is found again after it).
    fn put(&mut self, k: K, e: Entry, full: bool) -> Option<K> {
        match self.table.find(&k) {
            Ok(slot) => *self.table.at_mut(slot) = e,
            Err(_) if full => return Some(k),
            Err(at) => {
                self.table.insert_at(at, k, e);
            }
        }
        None
    }

    fn insert(&mut self, k: K, e: Entry) {
        let at = self.table.find(&k).expect_err("replace() found no entry");
        self.table.insert_at(at, k, e);
    }

    /// Removes the first entry at or after the hand that is not marked used, clearing the
    /// marks it passes. Needs an entry; ends within two turns.
    fn evict(&mut self) {
        debug_assert!(self.table.len() > 0);
        loop {
            if self.hand >= self.table.slot_count() {
                self.hand = 0;
            }
            match self.table.slot_mut(self.hand) {
                Some(e) if e.flags & USED != 0 => e.flags &= !USED,
                // The entry displaced behind it moves into `hand`: look at it next.
                Some(_) => return self.table.remove_at(self.hand),
                None => {}
            }
            self.hand += 1;
        }
    }

    fn clear(&mut self) {
        self.table.clear();
        self.hand = 0;
    }
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct Retired {
    narrow: Clock<Narrow>,
    wide: Clock<Wide>,
    capacity: usize,
}

impl Retired {
    /// An empty memory for a stream of `max_blocks` blocks; it allocates as blocks retire.
    pub fn new(max_blocks: usize) -> Self {
        let capacity = capacity(max_blocks);
        Retired { narrow: Clock::new(capacity), wide: Clock::new(capacity), capacity }
    }

    /// Retired blocks remembered.
    pub fn len(&self) -> usize {
        self.narrow.table.len() + self.wide.table.len()
    }

    /// The retired block `h`, marked used.
    pub fn get(&mut self, h: EngineHash) -> Option<Entry> {
        match key(h) {
            Key::Narrow(k) => self.narrow.get(&k),
            Key::Wide(k) => self.wide.get(&k),
        }
    }

    /// Remembers `block`, which just left its last tier, as `h`, evicting an entry if full.
    pub fn retire(&mut self, h: EngineHash, block: &Block) {
        let e = Entry { key: block.key, flags: HELD | USED | (block.tiers & OUT_OF_SCOPE) };
        let full = self.len() >= self.capacity;
        match key(h) {
            Key::Narrow(k) => {
                if let Some(k) = self.narrow.put(k, e, full) {
                    self.make_room(true);
                    self.narrow.insert(k, e);
                }
            }
            Key::Wide(k) => {
                if let Some(k) = self.wide.put(k, e, full) {
                    self.make_room(false);
                    self.wide.insert(k, e);
                }
            }
        }
    }

    fn make_room(&mut self, narrow: bool) {
        if self.len() < self.capacity {
            return;
        }
        if (narrow && self.narrow.table.len() > 0) || self.wide.table.len() == 0 {
            self.narrow.evict();
        } else {
            self.wide.evict();
        }
    }

    /// Starts loading the slot of `h` (see [`FlatTable::prefetch`]).
    #[inline]
    pub fn prefetch(&self, h: EngineHash) {
        match key(h) {
            Key::Narrow(k) => self.narrow.table.prefetch(&k),
            Key::Wide(k) => self.wide.table.prefetch(&k),
        }
    }

    /// Forgets every entry, keeping the memory allocated.
    pub fn clear(&mut self) {
        self.narrow.clear();
        self.wide.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(k: u8) -> Block {
        Block { key: ContentKey([k; 16]), tiers: 1 }
    }

    fn has(r: &Retired, h: u128) -> bool {
        // A clone, so that asking does not mark the entry used.
        r.clone().get(EngineHash(h)).is_some()
    }

    #[test]
    fn entries_stay_within_capacity_and_a_used_one_outlives_the_others() {
        let mut r = Retired::new(0);
        let cap = capacity(0) as u128;
        assert_eq!(cap, 4096);
        for h in 0..cap {
            r.retire(EngineHash(h), &block(1));
        }
        assert_eq!(r.len() as u128, cap);
        // A long hash shares the bound: it takes the place of a 64-bit one.
        r.retire(EngineHash(u128::MAX), &block(9));
        assert_eq!(r.len() as u128, cap);
        for round in 0..4 * cap {
            // Hash 7 is named as a parent between every two retirements.
            assert!(r.get(EngineHash(7)).is_some(), "evicted at round {round}");
            r.retire(EngineHash(cap + round), &block(2));
            assert_eq!(r.len() as u128, cap);
        }
        let old = (0..cap).filter(|h| *h != 7 && has(&r, *h)).count();
        assert_eq!(old, 0, "entries nobody named were evicted");
        assert!(has(&r, u128::MAX), "evictions take the inserted width while it has entries");
        assert!(has(&r, 5 * cap - 1), "the latest is kept");
    }

    #[test]
    fn an_entry_is_25_bytes_with_a_64_bit_hash_as_documented() {
        assert_eq!(std::mem::size_of::<(Narrow, Entry)>(), 25);
        assert_eq!(std::mem::size_of::<(Wide, Entry)>(), 33);
        assert_eq!(capacity(262_144), 65_536);
    }

    #[test]
    fn retiring_again_overwrites_and_the_scope_mark_is_kept() {
        let mut r = Retired::new(100);
        r.retire(EngineHash(3), &block(1));
        r.retire(EngineHash(3), &Block { key: ContentKey([5; 16]), tiers: 2 | OUT_OF_SCOPE });
        assert_eq!(r.len(), 1);
        let b = r.get(EngineHash(3)).unwrap().block(1);
        assert_eq!((b.key, b.tiers), (ContentKey([5; 16]), 1 | OUT_OF_SCOPE));
        r.clear();
        assert!(r.get(EngineHash(3)).is_none());
    }
}
