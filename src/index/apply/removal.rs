//! Removals and clears: blocks leaving a tier, and the view changes they make. A block that
//! leaves its last tier is retired (see `retired.rs`), keeping its out-of-scope mark; a block
//! removed from a tier it is not on is left as it is (an out-of-scope block keeps its mark on
//! the tier where it is).

use super::super::blocks::{bit, Block, TIER_BITS};
use super::{ApplyStats, Change, Sink, Table, AHEAD};
use crate::wire::{EngineHash, Tier};

impl Table {
    /// A `BlockRemoved`. Each block that goes is also retired, so the retired memory's slots
    /// are prefetched with the table's.
    pub(super) fn removed(
        &mut self,
        hashes: &[EngineHash],
        tier: Tier,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) {
        for h in &hashes[..hashes.len().min(AHEAD)] {
            self.blocks.prefetch(*h);
            self.retired.prefetch(*h);
        }
        for (i, h) in hashes.iter().enumerate() {
            if let Some(next) = hashes.get(i + AHEAD) {
                self.blocks.prefetch(*next);
                self.retired.prefetch(*next);
            }
            self.remove(*h, tier, out, stats);
        }
    }

    pub(super) fn remove(
        &mut self,
        h: EngineHash,
        tier: Tier,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) {
        let Ok(slot) = self.blocks.find(h) else {
            stats.unknown_removals += 1;
            return;
        };
        let block = self.blocks.at_mut(slot);
        if block.tiers & bit(tier) == 0 {
            return;
        }
        block.tiers &= !bit(tier);
        let block = *block;
        let (key, gone, in_scope) =
            (block.key, block.tiers & TIER_BITS == 0, !block.is_out_of_scope());
        if in_scope {
            *self.tier_count(tier) -= 1;
            out.push(Change { key, tier, add: false });
            stats.removed += 1;
        }
        if gone {
            self.retired.retire(h, &block);
            self.blocks.remove_at(slot);
        }
    }

    /// One change per resident (block, tier): `add` for all of them, or their removal.
    /// Out-of-scope blocks are never in the view, so they make no change.
    pub fn changes_of_all(&self, add: bool, out: &mut Vec<Change>) {
        if self.groups.is_some() {
            return self.hybrid_changes(None, add, out);
        }
        for tier in [Tier::Device, Tier::Host] {
            self.changes_of_tier(tier, add, out);
        }
    }

    /// One change per in-scope block resident on `tier`.
    fn changes_of_tier(&self, tier: Tier, add: bool, out: &mut Vec<Change>) {
        if self.groups.is_some() {
            return self.hybrid_changes(Some(tier), add, out);
        }
        let on = |b: &&Block| b.tiers & bit(tier) != 0 && !b.is_out_of_scope();
        out.extend(self.blocks.iter().filter(on).map(|b| Change { key: b.key, tier, add }));
    }

    /// Empties `tier`, or with `None` the whole stream and its retired memory (a new epoch:
    /// `AllBlocksCleared`, or a reset).
    pub fn clear(&mut self, tier: Option<Tier>, sink: &mut impl Sink) {
        if sink.clears_per_block() {
            let mut out = Vec::new();
            match tier {
                None => self.changes_of_all(false, &mut out),
                Some(t) => self.changes_of_tier(t, false, &mut out),
            }
            sink.changes(&mut out);
        }
        match tier {
            None => {
                if let Some(groups) = &mut self.groups {
                    groups.blocks.clear();
                    groups.unlocated.copies.clear();
                }
                self.blocks.clear();
                self.retired.clear();
                (self.device, self.host) = (0, 0);
            }
            Some(t) => {
                if self.groups.is_some() {
                    self.hybrid_clear_tier(t);
                }
                let retired = &mut self.retired;
                self.blocks.retain(|h, b| {
                    b.tiers &= !bit(t);
                    if b.tiers & TIER_BITS == 0 {
                        retired.retire(h, b);
                        b.tiers = 0; // vacant, as `retain` requires of what it removes
                    }
                    b.tiers != 0
                });
                match t {
                    Tier::Device => self.device = 0,
                    Tier::Host => self.host = 0,
                }
            }
        }
    }
}
