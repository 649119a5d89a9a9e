//! The engine-hash table of one stream (engine hash -> content key and tiers), split by width.
//!
//! Integer engine hashes (vLLM's and xLLM's usual form) fit in 64 bits and are stored in 8
//! bytes; only long `bin` hashes (reduced to 128 bits) need 16. Two flat tables, one per width,
//! make an entry 25 bytes instead of 33 for the usual case, which is a quarter less memory and
//! fewer cache lines per probe; the wide table stays empty and unallocated unless used.

use super::flat::{FlatKey, FlatTable, Vacancy};
use super::key::ContentKey;
use crate::wire::{EngineHash, Tier};

/// The bits of `tiers` that are tiers.
pub(crate) const TIER_BITS: u8 = 1 | 2;

/// Set in `tiers` for a block outside the index's scope (multimodal context, or
/// a descendant of such a block). Its key is meaningless and it is never in the view; it is
/// kept so that its children and replicas are recognized, and counts against `max_blocks`.
pub(crate) const OUT_OF_SCOPE: u8 = 4;

/// The bit of `tiers` for a tier.
pub(crate) fn bit(t: Tier) -> u8 {
    match t {
        Tier::Device => 1,
        Tier::Host => 2,
    }
}

/// murmur3's 64-bit finalizer: engine hashes may be small sequential integers, so they are
/// mixed before they pick a slot.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// An engine hash below 2^64, as bytes so that entries need no alignment padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Narrow([u8; 8]);

impl FlatKey for Narrow {
    const FILLER: Self = Narrow([0; 8]);

    fn hash64(&self) -> u64 {
        mix(u64::from_le_bytes(self.0))
    }
}

/// An engine hash of 2^64 or more, as bytes so that entries need no alignment padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wide([u8; 16]);

impl FlatKey for Wide {
    const FILLER: Self = Wide([0; 16]);

    fn hash64(&self) -> u64 {
        let v = u128::from_le_bytes(self.0);
        mix((v as u64) ^ ((v >> 64) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

/// One resident engine block; `tiers == 0` only marks a vacant slot, and a resident block has
/// at least one tier bit (plus [`OUT_OF_SCOPE`] when it is outside the index's scope).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub key: ContentKey,
    pub tiers: u8,
}

impl Block {
    /// Whether the block is outside the index's scope (see [`OUT_OF_SCOPE`]).
    pub fn is_out_of_scope(&self) -> bool {
        self.tiers & OUT_OF_SCOPE != 0
    }
}

impl Default for Block {
    fn default() -> Self {
        Block { key: ContentKey([0; 16]), tiers: 0 }
    }
}

impl Vacancy for Block {
    fn is_vacant(&self) -> bool {
        self.tiers == 0
    }
}

/// A slot of one of the two tables.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Slot {
    Narrow(usize),
    Wide(usize),
}

/// Engine hash -> block, 8-byte keys where they fit.
#[derive(Debug, Clone)]
pub(crate) struct Blocks {
    narrow: FlatTable<Narrow, Block>,
    wide: FlatTable<Wide, Block>,
}

/// The key of `h` in the table of its width.
pub(super) enum Key {
    Narrow(Narrow),
    Wide(Wide),
}

impl Narrow {
    /// The engine hash this key stands for.
    pub(super) fn hash(&self) -> EngineHash {
        EngineHash(u128::from(u64::from_le_bytes(self.0)))
    }
}

impl Wide {
    /// The engine hash this key stands for.
    pub(super) fn hash(&self) -> EngineHash {
        EngineHash(u128::from_le_bytes(self.0))
    }
}

/// `h` as the key of the table of its width.
pub(super) fn key(h: EngineHash) -> Key {
    match u64::try_from(h.0) {
        Ok(v) => Key::Narrow(Narrow(v.to_le_bytes())),
        Err(_) => Key::Wide(Wide(h.0.to_le_bytes())),
    }
}

impl Blocks {
    /// Empty, with room for `blocks` (integer-hashed) blocks, for a stream of `max_blocks`.
    pub fn with_capacity(blocks: usize, max_blocks: usize) -> Self {
        Blocks {
            narrow: FlatTable::with_capacity(blocks, max_blocks),
            wide: FlatTable::with_limit(max_blocks),
        }
    }

    pub fn len(&self) -> usize {
        self.narrow.len() + self.wide.len()
    }

    /// `Ok(slot)` of `h`, or `Err(slot)` to pass to [`Self::insert_at`].
    pub fn find(&self, h: EngineHash) -> Result<Slot, Slot> {
        match key(h) {
            Key::Narrow(k) => self.narrow.find(&k).map(Slot::Narrow).map_err(Slot::Narrow),
            Key::Wide(k) => self.wide.find(&k).map(Slot::Wide).map_err(Slot::Wide),
        }
    }

    pub fn get(&self, h: EngineHash) -> Option<&Block> {
        match key(h) {
            Key::Narrow(k) => self.narrow.get(&k),
            Key::Wide(k) => self.wide.get(&k),
        }
    }

    /// The block in a slot that [`Self::find`] returned as `Ok`.
    pub fn at_mut(&mut self, slot: Slot) -> &mut Block {
        match slot {
            Slot::Narrow(i) => self.narrow.at_mut(i),
            Slot::Wide(i) => self.wide.at_mut(i),
        }
    }

    /// Inserts an absent `h` where [`Self::find`] said (its `Err`), with no change since.
    pub fn insert_at(&mut self, slot: Slot, h: EngineHash, block: Block) {
        match (slot, key(h)) {
            (Slot::Narrow(i), Key::Narrow(k)) => self.narrow.insert_at(i, k, block),
            (Slot::Wide(i), Key::Wide(k)) => self.wide.insert_at(i, k, block),
            _ => unreachable!("a slot is of its hash's width"),
        };
    }

    pub fn remove_at(&mut self, slot: Slot) {
        match slot {
            Slot::Narrow(i) => self.narrow.remove_at(i),
            Slot::Wide(i) => self.wide.remove_at(i),
        }
    }

    /// See [`FlatTable::retain`]; `f` also sees each block's engine hash.
    pub fn retain(&mut self, mut f: impl FnMut(EngineHash, &mut Block) -> bool) {
        self.narrow.retain(|k, b| f(k.hash(), b));
        self.wide.retain(|k, b| f(k.hash(), b));
    }

    /// Every block with its engine hash, narrow hashes first.
    pub fn entries(&self) -> impl Iterator<Item = (EngineHash, &Block)> {
        let narrow = self.narrow.iter().map(|(k, b)| (k.hash(), b));
        narrow.chain(self.wide.iter().map(|(k, b)| (k.hash(), b)))
    }

    /// Every block, narrow hashes first.
    pub fn iter(&self) -> impl Iterator<Item = &Block> {
        self.narrow.iter().map(|(_, b)| b).chain(self.wide.iter().map(|(_, b)| b))
    }

    pub fn clear(&mut self) {
        self.narrow.clear();
        self.wide.clear();
    }

    /// See [`FlatTable::prefetch`].
    #[inline]
    pub fn prefetch(&self, h: EngineHash) {
        match key(h) {
            Key::Narrow(k) => self.narrow.prefetch(&k),
            Key::Wide(k) => self.wide.prefetch(&k),
        }
    }
}
