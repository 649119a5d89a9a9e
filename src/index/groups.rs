//! The KV cache groups of a hybrid stream, and what each of its blocks holds in each.
//!
//! vLLM's hybrid allocator keeps one group of blocks per attention kind of a model; a block's
//! hash is the same in every group, and a hit needs each group's own rule to hold
//! (protocol.md, *Hybrid attention*). A stream is hybrid from its first event of a group other
//! than the default (group 0, full attention), and then:
//! - groups of one kind form a **class** (vLLM's `SpecGroup`): a class holds a block on a tier
//!   only while every group of the class holds a copy there;
//! - each located block ([`Residency`]) counts its copies per (group, tier): a group holds the
//!   same hash twice when a request misses in one group and recomputes the block, and vLLM
//!   then removes the two copies one at a time;
//! - the view gets one entry per (class, tier) that holds the block: the block's own content
//!   key for the full-attention class, and [`class_key`] of it for any other, so a reader can
//!   probe each class apart while one map serves every stream;
//! - a hash that no store has located yet (a sliding-window store lists the blocks its window
//!   keeps, but its token ids cover the whole range) waits in [`Unlocated`] with its copies,
//!   and gives no credit, until a store of another group locates it.

use std::collections::HashMap;

use super::key::ContentKey;
use crate::wire::{AttentionKind, EngineHash, Tier};

/// Classes a stream may have (two bits each in [`Residency::emitted`]).
pub(crate) const MAX_CLASSES: usize = 8;

/// One attention class of a hybrid stream, as readers need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionClass {
    /// The kind its groups share.
    pub kind: AttentionKind,
    /// Its groups, one bit per group index.
    pub groups: u32,
}

/// The view key under which class `kind` holds the block of content `key`: the key itself for
/// full attention, else the key mixed with a tag of the kind (a different 128-bit value that
/// no block's content key can be, but by a 2^-128 chance).
pub fn class_key(key: ContentKey, kind: AttentionKind) -> ContentKey {
    let tag: u128 = match kind {
        AttentionKind::Full => return key,
        AttentionKind::SlidingWindow { window } => {
            0x5357_0000_0000_0000_9e37_79b9_7f4a_7c15 ^ (u128::from(window) << 64)
        }
        AttentionKind::Unmodelled(_) => 0x554e_4d4f_4445_4c4c_4544_0000_0000_0001,
    };
    ContentKey::from_u128(xxhash_rust::xxh3::xxh3_128_with_seed(&key.0, tag as u64) ^ tag)
}

/// Copies of one block held by one group on one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Copies {
    pub group: u8,
    pub tier: Tier,
    pub n: u32,
}

/// A located block of a hybrid stream: its content and its copies.
#[derive(Debug, Clone)]
pub(crate) struct Residency {
    pub key: ContentKey,
    pub copies: Vec<Copies>,
    /// The (class, tier) entries this block has in the view: bit `2 * class + tier`.
    pub emitted: u16,
}

impl Residency {
    /// A block of content `key` with no copy yet.
    pub fn new(key: ContentKey) -> Self {
        Residency { key, copies: Vec::new(), emitted: 0 }
    }

    /// Adds one copy held by `group` on `tier`.
    pub fn add(&mut self, group: u8, tier: Tier, n: u32) {
        match self.copies.iter_mut().find(|c| c.group == group && c.tier == tier) {
            Some(c) => c.n += n,
            None => self.copies.push(Copies { group, tier, n }),
        }
    }

    /// Takes one copy of `group` on `tier` away; false when it held none.
    pub fn remove(&mut self, group: u8, tier: Tier) -> bool {
        let Some(i) = self.copies.iter().position(|c| c.group == group && c.tier == tier) else {
            return false;
        };
        self.copies[i].n -= 1;
        if self.copies[i].n == 0 {
            self.copies.swap_remove(i);
        }
        true
    }

    /// Drops every copy on `tier`.
    pub fn clear_tier(&mut self, tier: Tier) {
        self.copies.retain(|c| c.tier != tier);
    }

    /// The tier bits (of `blocks::bit`) some group holds the block on.
    pub fn tiers(&self) -> u8 {
        self.copies.iter().fold(0, |t, c| t | super::blocks::bit(c.tier))
    }

    /// The groups holding a copy on `tier`, one bit per group.
    fn groups_on(&self, tier: Tier) -> u32 {
        self.copies.iter().filter(|c| c.tier == tier).fold(0, |g, c| g | 1 << c.group)
    }

    /// The (class, tier) entries the block should have in the view under `classes`.
    pub fn entries(&self, classes: &[AttentionClass]) -> u16 {
        let mut bits = 0;
        for (i, class) in classes.iter().enumerate() {
            if matches!(class.kind, AttentionKind::Unmodelled(_)) {
                continue; // never credited, so never in the view
            }
            for (t, tier) in Tier::ALL.iter().enumerate() {
                if self.groups_on(*tier) & class.groups == class.groups {
                    bits |= 1 << (2 * i + t);
                }
            }
        }
        bits
    }
}

/// Copies of hashes that no store has located yet, bounded by the stream's block limit.
#[derive(Debug, Clone, Default)]
pub(crate) struct Unlocated {
    pub copies: HashMap<EngineHash, Vec<Copies>>,
}

impl Unlocated {
    /// Remembers one copy of `h`; false when the memory is full (the copy is then dropped,
    /// which can only under-credit).
    pub fn add(&mut self, h: EngineHash, group: u8, tier: Tier, limit: usize) -> bool {
        if !self.copies.contains_key(&h) && self.copies.len() >= limit {
            return false;
        }
        let copies = self.copies.entry(h).or_default();
        match copies.iter_mut().find(|c| c.group == group && c.tier == tier) {
            Some(c) => c.n += 1,
            None => copies.push(Copies { group, tier, n: 1 }),
        }
        true
    }

    /// Takes one copy of `h` held by `group` on `tier` away; false when there was none.
    pub fn remove(&mut self, h: EngineHash, group: u8, tier: Tier) -> bool {
        let Some(copies) = self.copies.get_mut(&h) else { return false };
        let Some(i) = copies.iter().position(|c| c.group == group && c.tier == tier) else {
            return false;
        };
        copies[i].n -= 1;
        if copies[i].n == 0 {
            copies.swap_remove(i);
        }
        if copies.is_empty() {
            self.copies.remove(&h);
        }
        true
    }
}

/// What a hybrid stream knows of its groups, and its blocks' residency.
#[derive(Debug, Clone, Default)]
pub(crate) struct Groups {
    /// Each group's kind, by group index, once a store has named it.
    pub kinds: Vec<Option<AttentionKind>>,
    /// The classes, full attention first (vLLM looks it up first), then by first group.
    pub classes: Vec<AttentionClass>,
    /// Located blocks.
    pub blocks: HashMap<EngineHash, Residency>,
    /// Copies of hashes not located yet.
    pub unlocated: Unlocated,
}

impl Groups {
    /// Records that `group` is of `kind`; true when the classes changed (a new group, or a
    /// group whose kind changed), so every block's entries must be recomputed.
    pub fn learn(&mut self, group: u8, kind: Option<AttentionKind>) -> bool {
        let i = usize::from(group);
        if self.kinds.len() <= i {
            self.kinds.resize(i + 1, None);
        }
        let kind = kind.unwrap_or(AttentionKind::Full);
        if self.kinds[i] == Some(kind) {
            return false;
        }
        self.kinds[i] = Some(kind);
        self.classes = classes_of(&self.kinds);
        true
    }
}

/// The classes of groups with these kinds (see [`Groups::classes`]), at most [`MAX_CLASSES`]:
/// kinds past that are folded into one unmodelled class, which credits nothing.
fn classes_of(kinds: &[Option<AttentionKind>]) -> Vec<AttentionClass> {
    let mut classes: Vec<AttentionClass> = Vec::new();
    for (g, kind) in kinds.iter().enumerate() {
        let Some(kind) = *kind else { continue };
        let known = classes.iter().position(|c| c.kind == kind);
        match known {
            Some(i) => classes[i].groups |= 1 << g,
            None if classes.len() < MAX_CLASSES => {
                classes.push(AttentionClass { kind, groups: 1 << g })
            }
            None => {
                let last = classes.last_mut().expect("MAX_CLASSES > 0");
                last.kind = AttentionKind::Unmodelled(crate::wire::Unmodelled::Other);
                last.groups |= 1 << g;
            }
        }
    }
    classes.sort_by_key(|c| c.kind != AttentionKind::Full);
    classes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_holds_a_block_only_while_each_of_its_groups_does() {
        let mut groups = Groups::default();
        let sw = AttentionKind::SlidingWindow { window: 64 };
        assert!(groups.learn(0, Some(sw)));
        assert!(groups.learn(1, Some(AttentionKind::Full)));
        assert!(groups.learn(2, Some(sw)));
        assert!(!groups.learn(2, Some(sw)), "known already");
        assert_eq!(groups.classes[0], AttentionClass { kind: AttentionKind::Full, groups: 0b010 });
        assert_eq!(groups.classes[1], AttentionClass { kind: sw, groups: 0b101 });
        let mut r = Residency::new(ContentKey::from_u128(7));
        r.add(1, Tier::Device, 1);
        r.add(0, Tier::Device, 1);
        assert_eq!(r.entries(&groups.classes), 0b0001, "full on Device; group 2 lacks it");
        r.add(2, Tier::Device, 1);
        assert_eq!(r.entries(&groups.classes), 0b0101);
        r.add(2, Tier::Device, 1);
        assert!(r.remove(2, Tier::Device));
        assert_eq!(r.entries(&groups.classes), 0b0101, "a second copy keeps it");
        assert!(r.remove(2, Tier::Device));
        assert!(!r.remove(2, Tier::Device), "none left");
        assert_eq!(r.entries(&groups.classes), 0b0001);
    }

    #[test]
    fn class_keys_differ_by_kind_and_window_and_full_attention_keeps_the_key() {
        let k = ContentKey::from_u128(42);
        let sw = |window| class_key(k, AttentionKind::SlidingWindow { window });
        assert_eq!(class_key(k, AttentionKind::Full), k);
        assert_ne!(sw(64), k);
        assert_ne!(sw(64), sw(128));
        assert_eq!(sw(64), sw(64));
    }

    #[test]
    fn unlocated_copies_are_bounded_and_counted() {
        let mut u = Unlocated::default();
        assert!(u.add(EngineHash(1), 0, Tier::Device, 1));
        assert!(u.add(EngineHash(1), 0, Tier::Device, 1), "a second copy of a known hash");
        assert!(!u.add(EngineHash(2), 0, Tier::Device, 1), "full");
        assert!(u.remove(EngineHash(1), 0, Tier::Device));
        assert!(u.remove(EngineHash(1), 0, Tier::Device));
        assert!(u.copies.is_empty());
        assert!(!u.remove(EngineHash(1), 0, Tier::Device));
    }
}
