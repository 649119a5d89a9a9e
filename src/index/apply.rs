//! Applying events to one stream's block table (engine hash -> content key and tiers).
//!
//! The same code serves live batches and snapshots; [`Mode`] holds the two differences: a live
//! batch that names an unknown parent or tokenless hash is an error (an event was missed), a
//! snapshot skips such orphans and keeps every other prefix. Changes to the content-key view go
//! through a [`Sink`], which is either the live view's operation log or a map built aside.

use std::collections::HashMap;

use super::key::{ContentKey, KeyHasher};
use super::view::{apply_to_map, PresenceMap, ViewOp};
use super::{BuildMix, IndexError};
use crate::wire::{Batch, EngineHash, Event, Stored, Tier};

/// Live deltas or snapshot contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Live,
    Snapshot,
}

/// What applying a batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Block residencies added (a new block, or a known block on a new tier).
    pub stored: u64,
    /// Block residencies removed.
    pub removed: u64,
    /// Removals naming a block this stream does not hold. They cannot grant false credit and
    /// follow, for instance, LoRA blocks whose stores were skipped, so they are only counted.
    pub unknown_removals: u64,
    /// Snapshot blocks skipped because their parent is absent from the snapshot.
    pub orphans: u64,
}

impl ApplyStats {
    /// Adds another batch's figures.
    pub fn add(&mut self, o: &ApplyStats) {
        self.stored += o.stored;
        self.removed += o.removed;
        self.unknown_removals += o.unknown_removals;
        self.orphans += o.orphans;
    }
}

/// Receives content-key changes.
pub(crate) trait Sink {
    fn op(&mut self, op: ViewOp);
}

impl Sink for PresenceMap {
    fn op(&mut self, op: ViewOp) {
        apply_to_map(self, &op);
    }
}

fn bit(t: Tier) -> u8 {
    match t {
        Tier::Device => 1,
        Tier::Host => 2,
    }
}

/// An engine hash packed into bytes, so map entries need no 16-byte alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct HashKey([u8; 16]);

impl From<EngineHash> for HashKey {
    fn from(h: EngineHash) -> Self {
        HashKey(h.0.to_le_bytes())
    }
}

/// One resident engine block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    key: ContentKey,
    tiers: u8,
}

/// The writer's truth for one stream.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    blocks: HashMap<HashKey, Block, BuildMix>,
    pub device: u64,
    pub host: u64,
}

/// The fixed inputs of applying: the stream's block size, hasher and limit.
pub(crate) struct Ctx<'a> {
    pub hasher: &'a mut KeyHasher,
    pub max_blocks: usize,
    pub mode: Mode,
}

impl Table {
    /// Engine blocks held (the unit of `max_blocks_per_stream`).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn apply_batch(
        &mut self,
        batch: &Batch,
        ctx: &mut Ctx<'_>,
        sink: &mut impl Sink,
    ) -> Result<ApplyStats, IndexError> {
        let mut stats = ApplyStats::default();
        for event in &batch.events {
            match event {
                Event::Stored(s) => self.stored(batch, s, ctx, sink, &mut stats)?,
                Event::Removed { hashes, tier } => {
                    for h in batch.hashes(*hashes) {
                        self.remove(*h, *tier, sink, &mut stats);
                    }
                }
                Event::Cleared { tier } => self.clear(*tier, sink),
            }
        }
        Ok(stats)
    }

    fn stored(
        &mut self,
        batch: &Batch,
        s: &Stored,
        ctx: &mut Ctx<'_>,
        sink: &mut impl Sink,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        let b = ctx.hasher.block_size();
        if s.block_size as usize != b {
            return Err(IndexError::BlockSize { expected: b as u32, got: s.block_size });
        }
        let hashes = batch.hashes(s.hashes);
        let tokens = batch.tokens(s.tokens);
        if tokens.is_empty() {
            return self.tokenless(hashes, s.tier, ctx.mode, sink, stats);
        }
        if tokens.len() != hashes.len() * b {
            let (blocks, expected) = (hashes.len(), hashes.len() * b);
            let block_size = b as u32;
            return Err(IndexError::TokenCount {
                tokens: tokens.len(),
                blocks,
                expected,
                block_size,
            });
        }
        let mut prev = match s.parent {
            None => None,
            Some(p) => match self.blocks.get(&HashKey::from(p)) {
                Some(block) => Some(block.key),
                None if ctx.mode == Mode::Snapshot => {
                    stats.orphans += hashes.len() as u64;
                    return Ok(());
                }
                None => return Err(IndexError::UnknownParent(p)),
            },
        };
        for (h, block) in hashes.iter().zip(tokens.chunks_exact(b)) {
            let key = ctx.hasher.chain(prev, block);
            self.store(*h, key, s.tier, ctx.max_blocks, sink, stats)?;
            prev = Some(key);
        }
        Ok(())
    }

    fn store(
        &mut self,
        h: EngineHash,
        key: ContentKey,
        tier: Tier,
        max_blocks: usize,
        sink: &mut impl Sink,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        let len = self.blocks.len();
        match self.blocks.entry(HashKey::from(h)) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                if e.get().key != key {
                    return Err(IndexError::HashConflict(h));
                }
                let block = e.get_mut();
                Self::add_tier_counts(&mut self.device, &mut self.host, block, tier, sink, stats);
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                if len >= max_blocks {
                    return Err(IndexError::LimitExceeded { limit: max_blocks });
                }
                let block = e.insert(Block { key, tiers: 0 });
                Self::add_tier_counts(&mut self.device, &mut self.host, block, tier, sink, stats);
            }
        }
        Ok(())
    }

    fn tokenless(
        &mut self,
        hashes: &[EngineHash],
        tier: Tier,
        mode: Mode,
        sink: &mut impl Sink,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        for h in hashes {
            match self.blocks.get_mut(&HashKey::from(*h)) {
                Some(block) => Self::add_tier_counts(
                    &mut self.device,
                    &mut self.host,
                    block,
                    tier,
                    sink,
                    stats,
                ),
                None if mode == Mode::Snapshot => stats.orphans += 1,
                None => return Err(IndexError::UnknownHash(*h)),
            }
        }
        Ok(())
    }

    fn add_tier_counts(
        device: &mut u64,
        host: &mut u64,
        block: &mut Block,
        tier: Tier,
        sink: &mut impl Sink,
        stats: &mut ApplyStats,
    ) {
        if block.tiers & bit(tier) != 0 {
            return;
        }
        block.tiers |= bit(tier);
        *match tier {
            Tier::Device => device,
            Tier::Host => host,
        } += 1;
        sink.op(ViewOp::Add(block.key, tier));
        stats.stored += 1;
    }

    fn remove(&mut self, h: EngineHash, tier: Tier, sink: &mut impl Sink, stats: &mut ApplyStats) {
        let hk = HashKey::from(h);
        let Some(block) = self.blocks.get_mut(&hk) else {
            stats.unknown_removals += 1;
            return;
        };
        if block.tiers & bit(tier) == 0 {
            return;
        }
        block.tiers &= !bit(tier);
        match tier {
            Tier::Device => self.device -= 1,
            Tier::Host => self.host -= 1,
        }
        sink.op(ViewOp::Remove(block.key, tier));
        stats.removed += 1;
        if block.tiers == 0 {
            self.blocks.remove(&hk);
        }
    }

    fn clear(&mut self, tier: Option<Tier>, sink: &mut impl Sink) {
        match tier {
            None => {
                self.blocks.clear();
                (self.device, self.host) = (0, 0);
                sink.op(ViewOp::ClearAll);
            }
            Some(t) => {
                self.blocks.retain(|_, b| {
                    b.tiers &= !bit(t);
                    b.tiers != 0
                });
                match t {
                    Tier::Device => self.device = 0,
                    Tier::Host => self.host = 0,
                }
                sink.op(ViewOp::ClearTier(t));
            }
        }
    }
}
