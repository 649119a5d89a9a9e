//! Applying events to one stream's block table (engine hash -> content key and tiers).
//!
//! The same code serves live batches, replayed history and snapshots; [`Mode`] holds the
//! differences: a live batch that names an unknown parent or tokenless hash is an error (an
//! event was missed), a partial stream skips and counts such stores (it never saw their
//! parents), a snapshot skips such orphans and keeps every other prefix. Changes to the
//! content-key view are collected in order and handed to a [`Sink`]: the stream's pending
//! changes for the shared view, or nothing for a snapshot built aside.
//!
//! A block that leaves its last tier is kept in the table's [`Retired`] memory (see
//! `retired.rs`): a parent or tokenless hash that is not resident is looked up there before it
//! counts as unknown.
//!
//! Blocks outside the index's scope ([`Event::OutOfScope`]: multimodal context) are
//! remembered by engine hash with the `OUT_OF_SCOPE` flag (`blocks.rs`), on their tiers, and
//! never reach the view (`replica.rs`). A store whose parent is one of them, and a tokenless
//! replica of one, is out of scope too (vLLM marks only the blocks that carry the context; the
//! text blocks after them chain to them unmarked): remembered the same way and counted in
//! [`ApplyStats::out_of_scope`], where it used to be taken for a child of an unknown parent and
//! force a snapshot. They count against `max_blocks`, and removals and clears retire them like
//! any block, the mark kept. A parent
//! that is truly unknown is still an error in a live batch.
//!
//! The block table does not fit in cache, so while the code works on one engine hash it starts
//! loading the slot of the one [`AHEAD`] places on ([`Blocks::prefetch`]): the misses then
//! overlap with the work (the hashing of a block takes longer than a miss) instead of being
//! taken one after the other.

use super::blocks::{bit, Block, Blocks, Slot};
use super::groups::Groups;
use super::key::ContentKey;
use super::namespace::Keys;
use super::retired::Retired;
use super::IndexError;
use crate::wire::{Batch, EngineHash, Event, Stored, Tier};

mod hybrid;
mod removal;
mod replica;

/// How far ahead engine hashes are prefetched: enough to overlap the misses, few enough that the
/// lines are still in L1 when used.
const AHEAD: usize = 16;

/// Live deltas, deltas on a partial stream, or snapshot contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Live,
    /// Like `Live`, but a store whose parent is unknown, or a tokenless store of an unknown
    /// hash, is skipped and counted in [`ApplyStats::unknown_parents`]. An unlimited clear
    /// turns the rest of the batch to `Live` (the caller reads [`Ctx::mode`] back).
    Partial,
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
    /// follow, for instance, multimodal blocks whose stores were skipped, so they are only counted.
    pub unknown_removals: u64,
    /// Snapshot blocks skipped because their parent is absent from the snapshot.
    pub orphans: u64,
    /// `BlockStored` events skipped as out of scope by the index: children of out-of-scope
    /// blocks and tokenless replicas of them (the decoder counts the marked ones it sees).
    pub out_of_scope: u64,
    /// On a partial stream: blocks skipped because their parent, or for a tokenless store the
    /// block itself, was never seen (learned before the history the stream has).
    pub unknown_parents: u64,
    /// On a hybrid stream: block copies stored without content that no store has located
    /// (a sliding-window group's stores at vLLM's default retention, when no full-attention
    /// store of the same hash came first). They give no credit until one does.
    pub unlocated: u64,
}

impl ApplyStats {
    /// Adds another batch's figures.
    pub fn add(&mut self, o: &ApplyStats) {
        self.stored += o.stored;
        self.removed += o.removed;
        self.unknown_removals += o.unknown_removals;
        self.orphans += o.orphans;
        self.out_of_scope += o.out_of_scope;
        self.unknown_parents += o.unknown_parents;
        self.unlocated += o.unlocated;
    }
}

/// A resident engine block with content `key` entered (`add`) or left `tier`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Change {
    pub key: ContentKey,
    pub tier: Tier,
    pub add: bool,
}

/// Receives content-key changes.
pub(crate) trait Sink {
    /// Takes the changes collected so far, in order, leaving `changes` empty.
    fn changes(&mut self, changes: &mut Vec<Change>);
    /// Whether a clear must arrive as one removal [`Change`] per block it clears (the shared
    /// view does; a snapshot built aside, which has no view, does not).
    fn clears_per_block(&self) -> bool;
}

/// The writer's truth for one stream.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    blocks: Blocks,
    retired: Retired,
    /// A hybrid stream's groups (`None` for a dense stream: one group, full attention).
    groups: Option<Box<Groups>>,
    pub device: u64,
    pub host: u64,
}

/// The fixed inputs of applying: the stream's block size, hashers (one per namespace: a LoRA
/// store is keyed in its adapter's, protocol.md section 1.1) and limit.
pub(crate) struct Ctx<'a> {
    pub hasher: &'a mut Keys,
    pub max_blocks: usize,
    pub mode: Mode,
}

impl Table {
    /// An empty table for a stream of at most `max_blocks` blocks, with room for `blocks`.
    pub fn with_capacity(blocks: usize, max_blocks: usize) -> Self {
        let retired = Retired::new(max_blocks);
        let blocks = Blocks::with_capacity(blocks, max_blocks);
        Table { blocks, retired, groups: None, device: 0, host: 0 }
    }

    /// A hybrid stream's groups, none for a dense stream.
    pub fn groups(&self) -> Option<&Groups> {
        self.groups.as_deref()
    }

    /// Engine blocks held (the unit of `max_blocks_per_stream`).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Applies every event; the view changes of the events applied before an error still reach
    /// the sink, as each one did when it was its own operation.
    pub fn apply_batch(
        &mut self,
        batch: &Batch,
        ctx: &mut Ctx<'_>,
        sink: &mut impl Sink,
    ) -> Result<ApplyStats, IndexError> {
        let mut stats = ApplyStats::default();
        let mut changes = Vec::with_capacity(batch.block_count());
        let applied = self.apply_events(batch, ctx, sink, &mut changes, &mut stats);
        sink.changes(&mut changes);
        applied.map(|()| stats)
    }

    fn apply_events(
        &mut self,
        batch: &Batch,
        ctx: &mut Ctx<'_>,
        sink: &mut impl Sink,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        for event in &batch.events {
            match event {
                Event::Stored(s) if self.hybrid_for(&s.group) => {
                    self.hybrid_stored(batch, s, ctx, out, stats)?
                }
                Event::Stored(s) => self.stored(batch, s, ctx, out, stats)?,
                Event::OutOfScope { hashes, tier } => {
                    self.out_of_scope(batch.hashes(*hashes), *tier, ctx.max_blocks)?
                }
                Event::Removed { hashes, tier, group } if self.hybrid_for(group) => {
                    self.hybrid_removed(batch.hashes(*hashes), *tier, group, out, stats)
                }
                Event::Removed { hashes, tier, .. } => {
                    self.removed(batch.hashes(*hashes), *tier, out, stats)
                }
                Event::Cleared { tier } => {
                    sink.changes(out);
                    self.clear(*tier, sink);
                    if tier.is_none() && ctx.mode == Mode::Partial {
                        ctx.mode = Mode::Live; // a new epoch: everything after it is seen
                    }
                }
            }
        }
        Ok(())
    }

    /// Starts loading the slots of `hashes` (see the module documentation).
    fn prefetch(&self, hashes: &[EngineHash]) {
        hashes.iter().for_each(|h| self.blocks.prefetch(*h));
    }

    /// While working on `hashes[i]`: starts loading the slot of the one [`AHEAD`] places on.
    fn prefetch_ahead(&self, hashes: &[EngineHash], i: usize) {
        if let Some(h) = hashes.get(i + AHEAD) {
            self.blocks.prefetch(*h);
        }
    }

    fn stored(
        &mut self,
        batch: &Batch,
        s: &Stored,
        ctx: &mut Ctx<'_>,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        let b = ctx.hasher.block_size();
        if s.block_size as usize != b {
            return Err(IndexError::BlockSize { expected: b as u32, got: s.block_size });
        }
        let hashes = batch.hashes(s.hashes);
        let tokens = batch.tokens(s.tokens);
        if tokens.is_empty() {
            return self.tokenless(hashes, s.tier, ctx, out, stats);
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
        // Started before the parent's lookup, so that its miss and theirs overlap.
        self.prefetch(&hashes[..hashes.len().min(AHEAD)]);
        let mut prev = match s.parent {
            None => None,
            Some(p) => match self.parent(p) {
                Some(block) if block.is_out_of_scope() => {
                    stats.out_of_scope += 1;
                    return self.out_of_scope(hashes, s.tier, ctx.max_blocks);
                }
                Some(block) => Some(block.key),
                None => return unknown_parent(p, hashes.len(), ctx.mode, stats),
            },
        };
        for (i, (h, block)) in hashes.iter().zip(tokens.chunks_exact(b)).enumerate() {
            self.prefetch_ahead(hashes, i);
            let key = ctx.hasher.hasher(s.lora, s.salt).chain(prev, block);
            self.store(*h, key, s.tier, ctx.max_blocks, out, stats)?;
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
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        match self.blocks.find(h) {
            Ok(slot) => {
                let block = self.blocks.at_mut(slot);
                same_content(block, h, key)?;
                Self::add_tier_counts(&mut self.device, &mut self.host, block, tier, out, stats);
            }
            Err(at) => {
                let block = Block { key, tiers: bit(tier) };
                self.insert(at, h, block, max_blocks, out, stats)?;
            }
        }
        Ok(())
    }

    /// The resident or retired block `p` (see `retired.rs`).
    fn parent(&mut self, p: EngineHash) -> Option<Block> {
        match self.blocks.get(p) {
            Some(b) => Some(*b),
            None => self.retired.get(p).map(|e| e.block(0)),
        }
    }

    fn tier_count(&mut self, tier: Tier) -> &mut u64 {
        match tier {
            Tier::Device => &mut self.device,
            Tier::Host => &mut self.host,
        }
    }

    /// Inserts a block absent from the table (new, or retired and back) at `at` (the `Err` of
    /// [`Blocks::find`] for `h`). It enters on exactly one tier: the counts of
    /// `add_tier_counts`.
    fn insert(
        &mut self,
        at: Slot,
        h: EngineHash,
        block: Block,
        max_blocks: usize,
        out: &mut Vec<Change>,
        stats: &mut ApplyStats,
    ) -> Result<(), IndexError> {
        if self.blocks.len() >= max_blocks {
            return Err(IndexError::LimitExceeded { limit: max_blocks });
        }
        self.blocks.insert_at(at, h, block);
        if !block.is_out_of_scope() {
            let tier = if block.tiers & bit(Tier::Device) != 0 { Tier::Device } else { Tier::Host };
            *self.tier_count(tier) += 1;
            out.push(Change { key: block.key, tier, add: true });
            stats.stored += 1;
        }
        Ok(())
    }

    fn add_tier_counts(
        device: &mut u64,
        host: &mut u64,
        block: &mut Block,
        tier: Tier,
        out: &mut Vec<Change>,
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
        out.push(Change { key: block.key, tier, add: true });
        stats.stored += 1;
    }
}

/// A block stored again must hold the same content: an engine hash names its content (and
/// its context, so it cannot be in scope once and out of scope another time).
pub(super) fn same_content(
    block: &Block,
    h: EngineHash,
    key: ContentKey,
) -> Result<(), IndexError> {
    if block.is_out_of_scope() || block.key != key {
        return Err(IndexError::HashConflict(h));
    }
    Ok(())
}

/// A store whose parent is unknown: an error on a live stream (an event was missed), counted
/// otherwise (a snapshot's orphans, a partial stream's unseen parents).
pub(super) fn unknown_parent(
    p: EngineHash,
    blocks: usize,
    mode: Mode,
    stats: &mut ApplyStats,
) -> Result<(), IndexError> {
    match mode {
        Mode::Snapshot => stats.orphans += blocks as u64,
        Mode::Partial => stats.unknown_parents += blocks as u64,
        Mode::Live => return Err(IndexError::UnknownParent(p)),
    }
    Ok(())
}
