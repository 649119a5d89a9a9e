//! Applying the events of a hybrid stream (see `groups.rs`): stores and removals per KV cache
//! group, copies counted, and the view's entries per attention class.
//!
//! A store is located by its own token ids and parent when they cover its blocks exactly (a
//! full-attention store, or a window's store at dense retention); otherwise (a sliding-window
//! store at vLLM's default retention lists only the blocks its window keeps, with the token ids
//! of the whole range), or when it has no token ids, each hash is located by the block table,
//! where a store of the same hash by another group put it, or waits unlocated for one.
//! Locating a hash never trusts a window store's partial shape, so a wrong guess cannot key a
//! block with the wrong content.

use super::super::blocks::{bit, Block};
use super::super::groups::{class_key, AttentionClass, Groups, Residency};
use super::super::key::ContentKey;
use super::super::IndexError;
use super::{same_content, unknown_parent, ApplyStats, Change, Ctx, Table};
use crate::wire::{AttentionKind, Batch, EngineHash, Group, Stored, Tier};

impl Table {
    /// Whether events of `group` take the hybrid path; the first event of a group other than
    /// the default makes the stream hybrid for good.
    pub(super) fn hybrid_for(&mut self, group: &Group) -> bool {
        if self.groups.is_none() && !group.is_default() {
            self.become_hybrid();
        }
        self.groups.is_some()
    }

    /// Turns a dense stream hybrid: what it holds was stored by group 0, full attention, whose
    /// view entries (the content keys) are already there.
    fn become_hybrid(&mut self) {
        let mut groups = Groups::default();
        groups.learn(0, Some(AttentionKind::Full));
        for (h, block) in self.blocks.entries().filter(|(_, b)| !b.is_out_of_scope()) {
            let mut r = Residency::new(block.key);
            for tier in Tier::ALL.into_iter().filter(|t| block.tiers & bit(*t) != 0) {
                r.add(0, tier, 1);
            }
            r.emitted = r.entries(&groups.classes);
            groups.blocks.insert(h, r);
        }
        self.groups = Some(Box::new(groups));
    }

    fn groups_mut(&mut self) -> &mut Groups {
        self.groups.as_mut().expect("a hybrid stream has groups")
    }

    /// A `BlockStored` of a hybrid stream.
    pub(super) fn hybrid_stored(
        &mut self,
        batch: &Batch,
        s: &Stored,
        ctx: &mut Ctx<'_>,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        let group = s.group.idx as u8;
        let old = self.groups_mut().classes.clone();
        if self.groups_mut().learn(group, s.group.kind) {
            self.reclassify(&old, out);
        }
        if matches!(s.group.kind, Some(AttentionKind::Unmodelled(_))) {
            // Never credited (the stream credits nothing while it has such a group), so its
            // blocks are not kept: a Mamba group's partial blocks are not even of the stream's
            // block size.
            return Ok(());
        }
        let b = ctx.hasher.block_size();
        if s.block_size as usize != b {
            return Err(IndexError::BlockSize { expected: b as u32, got: s.block_size });
        }
        let (hashes, tokens) = (batch.hashes(s.hashes), batch.tokens(s.tokens));
        let exact = tokens.len() == hashes.len() * b;
        if !tokens.is_empty() && (tokens.len() % b != 0 || tokens.len() < hashes.len() * b) {
            return Err(IndexError::TokenCount {
                tokens: tokens.len(),
                blocks: hashes.len(),
                expected: hashes.len() * b,
                block_size: b as u32,
            });
        }
        if tokens.is_empty() || !exact {
            for h in hashes {
                self.locate_by_table(*h, group, s.tier, ctx.max_blocks, out, stats)?;
            }
            return Ok(());
        }
        let mut prev = match s.parent {
            None => None,
            Some(p) => match self.parent(p) {
                Some(block) if block.is_out_of_scope() => {
                    stats.out_of_scope += 1;
                    return self.out_of_scope(hashes, s.tier, ctx.max_blocks);
                }
                Some(block) => Some(block.key),
                // A window group's parent may be a block it never stored (masked out), and
                // one no other group located: the hashes are then located as a window's are.
                None if self.groups_mut().classes[0].kind != AttentionKind::Full => {
                    for h in hashes {
                        self.locate_by_table(*h, group, s.tier, ctx.max_blocks, out, stats)?;
                    }
                    return Ok(());
                }
                None => return unknown_parent(p, hashes.len(), ctx.mode, stats),
            },
        };
        for (h, block) in hashes.iter().zip(tokens.chunks_exact(b)) {
            let key = ctx.hasher.hasher(s.lora, s.salt).chain(prev, block);
            self.add_copy(*h, key, group, s.tier, ctx.max_blocks, out, stats)?;
            prev = Some(key);
        }
        Ok(())
    }

    /// A hash stored without content of its own: located by the table (or the retired memory),
    /// else remembered unlocated.
    fn locate_by_table(
        &mut self,
        h: EngineHash,
        group: u8,
        tier: Tier,
        max_blocks: usize,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        let known = match self.blocks.get(h) {
            Some(block) => Some(*block),
            None => self.retired.get(h).map(|e| e.block(0)),
        };
        match known {
            Some(block) if block.is_out_of_scope() => {
                stats.out_of_scope += 1;
                self.out_of_scope(&[h], tier, max_blocks)
            }
            Some(block) => self.add_copy(h, block.key, group, tier, max_blocks, out, stats),
            None => {
                let room = max_blocks.saturating_sub(self.blocks.len());
                // Kept while there is room; a copy dropped can only under-credit.
                self.groups_mut().unlocated.add(h, group, tier, room);
                stats.unlocated += 1;
                Ok(())
            }
        }
    }

    /// One more copy of block `h` (content `key`) held by `group` on `tier`.
    #[allow(clippy::too_many_arguments)]
    fn add_copy(
        &mut self,
        h: EngineHash,
        key: ContentKey,
        group: u8,
        tier: Tier,
        max_blocks: usize,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        match self.blocks.find(h) {
            Ok(slot) => same_content(self.blocks.at_mut(slot), h, key)?,
            Err(at) => {
                if self.blocks.len() + self.groups_mut().unlocated.copies.len() >= max_blocks {
                    return Err(IndexError::LimitExceeded { limit: max_blocks });
                }
                self.blocks.insert_at(at, h, Block { key, tiers: bit(tier) });
            }
        }
        let groups = self.groups_mut();
        let res = groups.blocks.entry(h).or_insert_with(|| Residency::new(key));
        let before = res.tiers();
        if let Some(waiting) = groups.unlocated.copies.remove(&h) {
            waiting.iter().for_each(|c| res.add(c.group, c.tier, c.n));
        }
        res.add(group, tier, 1);
        self.settle(h, before, out, stats);
        Ok(())
    }

    /// A `BlockRemoved` of a hybrid stream: one copy of each block leaves `group`'s `tier`.
    pub(super) fn hybrid_removed(
        &mut self,
        hashes: &[EngineHash],
        tier: Tier,
        group: &Group,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) {
        let g = group.idx as u8;
        for h in hashes {
            let groups = self.groups_mut();
            if groups.unlocated.remove(*h, g, tier) {
                continue;
            }
            let Some(res) = groups.blocks.get_mut(h) else {
                // Out-of-scope blocks are held by hash alone, as in a dense stream.
                self.remove(*h, tier, out, stats);
                continue;
            };
            let before = res.tiers();
            if !res.remove(g, tier) {
                stats.unknown_removals += 1;
                continue;
            }
            self.settle(*h, before, out, stats);
        }
    }

    /// After `h`'s copies changed (its tiers were `before`): the view's entries, the tier
    /// counts and the block table follow; a block with no copy left retires.
    fn settle(&mut self, h: EngineHash, before: u8, out: &mut Vec<Change>, stats: &mut ApplyStats) {
        let groups = self.groups.as_mut().expect("hybrid");
        let res = groups.blocks.get_mut(&h).expect("settled blocks are located");
        let entries = res.entries(&groups.classes);
        push_entries(res.key, &groups.classes, res.emitted & !entries, false, out);
        push_entries(res.key, &groups.classes, entries & !res.emitted, true, out);
        res.emitted = entries;
        let (after, key) = (res.tiers(), res.key);
        if after == 0 {
            groups.blocks.remove(&h);
        }
        for tier in Tier::ALL {
            match (before & bit(tier) != 0, after & bit(tier) != 0) {
                (false, true) => {
                    *self.tier_count(tier) += 1;
                    stats.stored += 1;
                }
                (true, false) => {
                    *self.tier_count(tier) -= 1;
                    stats.removed += 1;
                }
                _ => {}
            }
        }
        if let Ok(slot) = self.blocks.find(h) {
            self.blocks.at_mut(slot).tiers = after;
            if after == 0 {
                self.retired.retire(h, &Block { key, tiers: 0 });
                self.blocks.remove_at(slot);
            }
        }
    }

    /// The classes changed from `old`: every block's entries move to the new ones.
    fn reclassify(&mut self, old: &[AttentionClass], out: &mut Vec<Change>) {
        let groups = self.groups_mut();
        for res in groups.blocks.values_mut() {
            push_entries(res.key, old, res.emitted, false, out);
            res.emitted = res.entries(&groups.classes);
            push_entries(res.key, &groups.classes, res.emitted, true, out);
        }
    }

    /// A hybrid stream's view entries, as additions or removals, on `tier` or on both.
    pub(super) fn hybrid_changes(&self, tier: Option<Tier>, add: bool, out: &mut Vec<Change>) {
        let Some(groups) = &self.groups else { return };
        let mask = match tier {
            None => 0xffff,
            Some(Tier::Device) => 0x5555,
            Some(Tier::Host) => 0xaaaa,
        };
        for res in groups.blocks.values() {
            push_entries(res.key, &groups.classes, res.emitted & mask, add, out);
        }
    }

    /// Empties `tier` of a hybrid stream (the view's removals were sent by the caller).
    pub(super) fn hybrid_clear_tier(&mut self, tier: Tier) {
        let groups = self.groups.as_mut().expect("hybrid");
        groups.unlocated.copies.values_mut().for_each(|c| c.retain(|c| c.tier != tier));
        groups.unlocated.copies.retain(|_, c| !c.is_empty());
        let mask = match tier {
            Tier::Device => 0x5555,
            Tier::Host => 0xaaaa,
        };
        for res in groups.blocks.values_mut() {
            res.clear_tier(tier);
            res.emitted &= !mask;
        }
        groups.blocks.retain(|_, r| !r.copies.is_empty());
    }
}

/// One change per set bit of `bits` (bit `2 * class + tier`) for the block of content `key`.
fn push_entries(
    key: ContentKey,
    classes: &[AttentionClass],
    bits: u16,
    add: bool,
    out: &mut Vec<Change>,
) {
    let mut bits = bits;
    while bits != 0 {
        let i = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        let (class, tier) = (classes[i / 2], Tier::ALL[i % 2]);
        out.push(Change { key: class_key(key, class.kind), tier, add });
    }
}
