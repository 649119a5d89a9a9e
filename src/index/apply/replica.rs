//! Stores that bring no content of their own: tokenless replicas of known blocks (usually a
//! Host copy), which the table or the retired memory locates, and out-of-scope blocks
//! (multimodal context), remembered by hash on their tiers and never in the view.

use super::super::blocks::{bit, Block, OUT_OF_SCOPE};
use super::super::key::ContentKey;
use super::super::IndexError;
use super::{ApplyStats, Change, Ctx, Mode, Table};
use crate::wire::{EngineHash, Tier};

impl Table {
    /// A tokenless store: known blocks (resident, or retired: the engine says it holds the
    /// block again, and its content is known) are put on `tier`.
    pub(super) fn tokenless(
        &mut self,
        hashes: &[EngineHash],
        tier: Tier,
        ctx: &Ctx<'_>,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        let mut replicas_out_of_scope = false;
        for h in hashes {
            let block = match self.blocks.find(*h) {
                Ok(slot) => self.blocks.at_mut(slot),
                Err(at) => match self.retired.get(*h) {
                    Some(e) => {
                        let block = e.block(bit(tier));
                        self.insert(at, *h, block, ctx.max_blocks, out, stats)?;
                        replicas_out_of_scope |= block.is_out_of_scope();
                        continue;
                    }
                    None if ctx.mode == Mode::Snapshot => {
                        stats.orphans += 1;
                        continue;
                    }
                    None if ctx.mode == Mode::Partial => {
                        stats.unknown_parents += 1;
                        continue;
                    }
                    None => return Err(IndexError::UnknownHash(*h)),
                },
            };
            if block.is_out_of_scope() {
                block.tiers |= bit(tier);
                replicas_out_of_scope = true;
            } else {
                Self::add_tier_counts(&mut self.device, &mut self.host, block, tier, out, stats)
            }
        }
        stats.out_of_scope += u64::from(replicas_out_of_scope);
        Ok(())
    }

    /// Remembers out-of-scope blocks on `tier`. The same hash held in scope is a conflict: an
    /// engine hash covers the block's context, so one block cannot be both.
    pub(super) fn out_of_scope(
        &mut self,
        hashes: &[EngineHash],
        tier: Tier,
        max_blocks: usize,
    ) -> Result<(), IndexError> {
        for h in hashes {
            match self.blocks.find(*h) {
                Ok(slot) => {
                    let block = self.blocks.at_mut(slot);
                    if !block.is_out_of_scope() {
                        return Err(IndexError::HashConflict(*h));
                    }
                    block.tiers |= bit(tier);
                }
                Err(at) => {
                    if self.blocks.len() >= max_blocks {
                        return Err(IndexError::LimitExceeded { limit: max_blocks });
                    }
                    let block = Block { key: ContentKey([0; 16]), tiers: bit(tier) | OUT_OF_SCOPE };
                    self.blocks.insert_at(at, *h, block);
                }
            }
        }
        Ok(())
    }
}
