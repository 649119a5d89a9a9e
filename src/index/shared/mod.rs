//! One query index shared by every stream of the same `(block_size, hash_seed)`.
//!
//! Layout:
//! - the shared view (`content key -> (Device streams, Host streams)`, plus every stream's
//!   status and the mask of synchronized streams) is one copy behind a reader/writer lock
//!   (`log.rs` says why and how readers are kept from waiting): readers ([`SharedHandle`])
//!   walk a query once for all streams under the read lock, hashing it as they go and only as
//!   far as any stream matches;
//! - each stream keeps its own writer state in a [`StreamWriter`]: engine hash -> content key
//!   and tiers, sync state, sequence, `max_blocks`. Applying a batch or building a snapshot
//!   (the hashing) touches only that state, so streams do it in parallel; the resulting
//!   changes are appended to a log under one mutex and published in one step.
//!
//! Invariants:
//! - a stream's bit for a key on a tier is set exactly while one of its resident engine blocks
//!   with that content is on that tier (counts beyond one are kept, see `holders.rs`);
//! - every publish carries whole batches: a batch, a snapshot install (its removals of the old
//!   contents, its new contents and its status together) or a removal is visible all at once,
//!   never half. A periodic resync leaves the old contents visible until the install;
//! - an unsynchronized stream, and a free slot, match nothing (the synchronized mask);
//! - dropping a [`StreamWriter`] removes all of its bits and frees its slot in one publish.

mod diff;
mod holders;
mod hybrid_read;
mod log;
mod read;
mod replay;
mod slots;

pub use holders::{StreamLabel, MAX_STREAMS};
pub use read::{SharedHandle, SharedMatches, SharedReader, SlotRead, ViewRead};

use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use thiserror::Error;

use super::apply::{ApplyStats, Change, Ctx, Mode, Sink, Table};
use super::namespace::Keys;
use super::{IndexConfig, IndexError, StreamStatus};
use crate::wire::Batch;
use holders::SharedData;
use log::Log;
use slots::Slots;

/// Why a stream could not join a shared index.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SharedError {
    /// Every slot is taken.
    #[error("the shared index holds {max} streams already; raise max_streams (at most 128)")]
    Full {
        /// The index's stream limit.
        max: usize,
    },
    /// The stream's block size or seed differs from the index's.
    #[error(
        "stream has block_size {got_block_size} and hash_seed {got_seed}, the shared index \
         {block_size} and {seed}; streams share an index only with equal settings"
    )]
    Settings {
        /// The index's block size.
        block_size: u32,
        /// The index's seed.
        seed: u64,
        /// The stream's block size.
        got_block_size: u32,
        /// The stream's seed.
        got_seed: u64,
    },
}

struct Writer {
    log: Log,
    slots: Slots,
}

impl Writer {
    fn publish(&mut self, reader: &SharedReader) {
        self.log.publish(&reader.view);
    }
}

struct Inner {
    writer: Mutex<Writer>,
    reader: SharedReader,
}

/// The shared index: cheap to clone; every clone is the same index.
#[derive(Clone)]
pub struct SharedIndex {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SharedIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedIndex").field("block_size", &self.inner.reader.block_size).finish()
    }
}

impl SharedIndex {
    /// An empty index for streams of `block_size` and `hash_seed`, at most `max_streams` of
    /// them (capped at [`MAX_STREAMS`]).
    pub fn new(block_size: u32, hash_seed: u64, max_streams: usize) -> Self {
        let view = Arc::new(RwLock::new(SharedData::default()));
        let reader = SharedReader { view, block_size, hash_seed };
        let writer =
            Writer { log: Log::default(), slots: Slots::new(max_streams.min(MAX_STREAMS)) };
        SharedIndex { inner: Arc::new(Inner { writer: Mutex::new(writer), reader }) }
    }

    /// A source of reader handles.
    pub fn reader(&self) -> SharedReader {
        self.inner.reader.clone()
    }

    /// A new, unsynchronized stream in a free slot. Its status is visible (unsynchronized)
    /// from the next publish.
    pub fn add_stream(&self, config: IndexConfig) -> Result<StreamWriter, SharedError> {
        self.add_labeled_stream(config, StreamLabel::default())
    }

    /// [`Self::add_stream`] with the stream's label, published with its first status (see
    /// [`SharedHandle::query_streams`]).
    pub fn add_labeled_stream(
        &self,
        config: IndexConfig,
        label: StreamLabel,
    ) -> Result<StreamWriter, SharedError> {
        let (block_size, seed) = (self.inner.reader.block_size, self.inner.reader.hash_seed);
        if (config.block_size, config.hash_seed) != (block_size, seed) {
            return Err(SharedError::Settings {
                block_size,
                seed,
                got_block_size: config.block_size,
                got_seed: config.hash_seed,
            });
        }
        let mut w = self.lock();
        let slot = w.slots.take().ok_or(SharedError::Full { max: w.slots.max() })?;
        let stream = StreamWriter {
            index: self.clone(),
            slot,
            config,
            hasher: Keys::new(config.block_size, config.hash_seed, config.salt),
            table: Table::with_capacity(0, config.max_blocks),
            sync: SyncState::Unsynchronized { reason: "waiting for the first snapshot".into() },
            sequence: None,
            partial: false,
            pending: Vec::new(),
        };
        w.log.label(slot, Arc::new(label));
        w.log.status(slot, Some(Arc::new(stream.status())));
        Ok(stream)
    }

    /// Makes everything committed so far visible to readers in one step.
    pub fn publish(&self) {
        self.lock().publish(&self.inner.reader);
    }

    fn lock(&self) -> MutexGuard<'_, Writer> {
        // Appending and publishing leave the log and the view consistent at every step a panic
        // could interrupt, so a poisoned lock is still usable.
        self.inner.writer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Collects a stream's changes for the shared view; clears arrive as per-block removals.
struct Pending<'a>(&'a mut Vec<Change>);

impl Sink for Pending<'_> {
    fn changes(&mut self, changes: &mut Vec<Change>) {
        self.0.append(changes);
    }

    fn clears_per_block(&self) -> bool {
        true
    }
}

/// Discards changes: a snapshot being built aside has no view of its own.
struct Discard;

impl Sink for Discard {
    fn changes(&mut self, changes: &mut Vec<Change>) {
        changes.clear();
    }

    fn clears_per_block(&self) -> bool {
        false
    }
}

/// Whether a stream's live batches are applied; if not, why not (its status's `error`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum SyncState {
    /// Live batches apply; the stream matches from the next publish.
    Synchronized,
    /// Only a full-state batch, a snapshot or a finished history replay synchronizes it.
    Unsynchronized {
        /// What unsynchronized it, for operators.
        reason: String,
    },
}

/// One stream's writer state in a shared index (see the module documentation). Changes are
/// kept pending until [`Self::commit`] or [`Self::publish`].
pub struct StreamWriter {
    index: SharedIndex,
    slot: u8,
    config: IndexConfig,
    hasher: Keys,
    table: Table,
    sync: SyncState,
    sequence: Option<u64>,
    /// See [`StreamWriter::set_partial`].
    partial: bool,
    pending: Vec<Change>,
}

impl std::fmt::Debug for StreamWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamWriter")
            .field("slot", &self.slot)
            .field("blocks", &self.table.len())
            .field("sync", &self.sync)
            .field("sequence", &self.sequence)
            .field("partial", &self.partial)
            .finish()
    }
}

impl StreamWriter {
    /// The stream's slot: its bit in the shared sets and its index in [`SharedMatches`].
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// Whether live batches are being applied.
    pub fn is_synchronized(&self) -> bool {
        self.sync == SyncState::Synchronized
    }

    /// Engine blocks held.
    pub fn block_count(&self) -> usize {
        self.table.len()
    }

    /// A hybrid stream's attention classes and its unlocated hashes; `None` for a dense
    /// stream.
    pub fn hybrid(&self) -> Option<(&[super::AttentionClass], u64)> {
        let g = self.table.groups()?;
        Some((&g.classes, g.unlocated.copies.len() as u64))
    }

    /// The status the next commit will show.
    pub fn status(&self) -> StreamStatus {
        let error = match &self.sync {
            SyncState::Synchronized => None,
            SyncState::Unsynchronized { reason } => Some(reason.clone()),
        };
        StreamStatus {
            synchronized: error.is_none(),
            sequence: self.sequence,
            device_blocks: self.table.device,
            host_blocks: self.table.host,
            error,
            partial: self.partial,
            approximate: false,
            attention: self.table.groups().map(|g| g.classes.clone()).unwrap_or_default(),
            unlocated_blocks: self.table.groups().map_or(0, |g| g.unlocated.copies.len() as u64),
        }
    }

    /// Applies live batch `seq` to this stream's state (no lock taken). Sequence continuity is
    /// the caller's concern. While unsynchronized only a full-state batch is accepted, and
    /// applying one synchronizes; an error unsynchronizes, with the error as its reason, and the
    /// changes made before it stay pending (they are real). While partial, see
    /// [`Self::set_partial`].
    pub fn apply(&mut self, seq: u64, batch: &Batch) -> Result<ApplyStats, IndexError> {
        if let SyncState::Unsynchronized { reason } = &self.sync {
            if !batch.is_full_state() {
                return Err(IndexError::NotSynchronized(reason.clone()));
            }
        }
        let stats = self.apply_table(batch)?;
        self.sync = SyncState::Synchronized;
        self.sequence = Some(seq);
        Ok(stats)
    }

    /// Applies `batch` in the stream's mode, clearing the partial flag at an unlimited clear;
    /// an error unsynchronizes.
    fn apply_table(&mut self, batch: &Batch) -> Result<ApplyStats, IndexError> {
        let max_blocks = self.config.max_blocks;
        let mode = if self.partial { Mode::Partial } else { Mode::Live };
        let mut ctx = Ctx { hasher: &mut self.hasher, max_blocks, mode };
        let applied = self.table.apply_batch(batch, &mut ctx, &mut Pending(&mut self.pending));
        self.partial = ctx.mode == Mode::Partial;
        applied.inspect_err(|e| self.invalidate(e.to_string()))
    }

    /// Marks the stream unsynchronized: it matches nothing from the next publish.
    pub fn invalidate(&mut self, reason: impl Into<String>) {
        self.sync = SyncState::Unsynchronized { reason: reason.into() };
    }

    /// Starts building a snapshot aside; this stream's contents stay visible meanwhile.
    pub fn snapshot_builder(&self) -> SharedSnapshot {
        SharedSnapshot::new(self.config)
    }

    /// Replaces the contents with a complete snapshot (watermark: the first live sequence not
    /// in it) and synchronizes; the stream is exact (not partial) and its retired memory is the
    /// snapshot's (empty). The removal of the old contents and the new ones are one
    /// pending change set, so readers go from the old contents to the new in one publish; only
    /// the difference is sent (a periodic resync changes little, and the view is locked while
    /// it applies), see [`diff::changes_between`].
    pub fn install_snapshot(&mut self, snapshot: SharedSnapshot, watermark: u64) -> ApplyStats {
        let old = std::mem::replace(&mut self.table, snapshot.table);
        diff::changes_between(&old, &self.table, &mut self.pending);
        self.sync = SyncState::Synchronized;
        self.partial = false;
        self.sequence = watermark.checked_sub(1);
        snapshot.stats
    }

    /// Builds and installs a one-message snapshot. On error the stream is left unsynchronized
    /// with its old contents.
    pub fn load_snapshot(
        &mut self,
        batch: &Batch,
        watermark: u64,
    ) -> Result<ApplyStats, IndexError> {
        let mut snapshot = self.snapshot_builder();
        if let Err(e) = snapshot.add(batch) {
            self.invalidate(e.to_string());
            return Err(e);
        }
        Ok(self.install_snapshot(snapshot, watermark))
    }

    /// Appends the pending changes and the current status to the shared view, without
    /// publishing (several streams can then share one [`SharedIndex::publish`]).
    pub fn commit(&mut self) {
        let index = self.index.clone();
        let mut w = index.lock();
        self.append(&mut w);
    }

    /// Commits and publishes in one step: the changes become visible all at once.
    pub fn publish(&mut self) {
        let index = self.index.clone();
        let mut w = index.lock();
        self.append(&mut w);
        w.publish(&index.inner.reader);
    }

    fn append(&mut self, w: &mut Writer) {
        w.log.changes(self.slot, &mut self.pending);
        w.log.status(self.slot, Some(Arc::new(self.status())));
    }
}

/// Removes the stream: its status goes first (from then on it matches nothing), then every
/// one of its bits, in the same publish; then its slot is free for another stream.
impl Drop for StreamWriter {
    fn drop(&mut self) {
        // After the pending changes: they may add what the removal then takes out.
        self.table.changes_of_all(false, &mut self.pending);
        let index = self.index.clone();
        let mut w = index.lock();
        w.log.status(self.slot, None);
        w.log.changes(self.slot, &mut self.pending);
        w.publish(&index.inner.reader);
        w.slots.give_back(self.slot);
    }
}

/// A snapshot of one stream being built aside, one reply message at a time (any thread).
#[derive(Debug)]
pub struct SharedSnapshot {
    hasher: Keys,
    max_blocks: usize,
    table: Table,
    stats: ApplyStats,
}

impl SharedSnapshot {
    /// An empty snapshot for a stream with these settings.
    pub fn new(config: IndexConfig) -> Self {
        Self::with_capacity(config, 0)
    }

    /// Like [`Self::new`], with room for about `blocks` blocks (capped at `max_blocks`).
    pub fn with_capacity(config: IndexConfig, blocks: usize) -> Self {
        SharedSnapshot {
            hasher: Keys::new(config.block_size, config.hash_seed, config.salt),
            max_blocks: config.max_blocks,
            table: Table::with_capacity(blocks, config.max_blocks),
            stats: ApplyStats::default(),
        }
    }

    /// Adds one snapshot payload (parent-first); orphans are skipped and counted.
    pub fn add(&mut self, batch: &Batch) -> Result<ApplyStats, IndexError> {
        let mut ctx =
            Ctx { hasher: &mut self.hasher, max_blocks: self.max_blocks, mode: Mode::Snapshot };
        let stats = self.table.apply_batch(batch, &mut ctx, &mut Discard)?;
        self.stats.add(&stats);
        Ok(stats)
    }

    /// Engine blocks in the snapshot so far.
    pub fn block_count(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod partial_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod walk_tests;
