//! [`StreamIndex`]: the single writer of one stream's index and its synchronization state.
//!
//! States: *unsynchronized* (initially, and after any error or [`StreamIndex::invalidate`]) and
//! *synchronized* (after a snapshot is installed or a full-state batch is applied). While
//! unsynchronized, live batches other than full states are refused, so a stream that missed an
//! event never builds on a wrong base. Nothing becomes visible to readers until
//! [`StreamIndex::publish`], which makes every change since the last publish visible at once.

use std::sync::Arc;

use left_right::WriteHandle;

use super::apply::{Ctx, Mode, Table};
use super::namespace::Keys;
use super::view::{Change, IndexReader, PresenceMap, StreamStatus, ViewData, ViewOp};
use super::IndexError;
use crate::wire::Batch;

pub use super::apply::ApplyStats;

/// The per-stream settings the index needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// Tokens per block; must match the engine's `--block_size`.
    pub block_size: u32,
    /// Seed of the content keys (`hash_seed`, default 1024).
    pub hash_seed: u64,
    /// The stream's salt tag ([`super::Namespace::salt`]; 0 = none): every block it stores is
    /// keyed in that salt's namespace (protocol.md section 1.1).
    pub salt: u64,
    /// `max_blocks_per_stream`: engine blocks held, each with its content entry and hash mapping.
    pub max_blocks: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { block_size: 128, hash_seed: 1024, salt: 0, max_blocks: 262_144 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum SyncState {
    Synchronized,
    Unsynchronized(String),
}

/// The writer side of one stream's index.
pub struct StreamIndex {
    config: IndexConfig,
    hasher: Keys,
    table: Table,
    sync: SyncState,
    sequence: Option<u64>,
    partial: bool,
    writer: WriteHandle<ViewData, ViewOp>,
    reader: IndexReader,
}

impl std::fmt::Debug for StreamIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamIndex")
            .field("config", &self.config)
            .field("blocks", &self.table.len())
            .field("sync", &self.sync)
            .field("sequence", &self.sequence)
            .finish()
    }
}

impl Sink for WriteHandle<ViewData, ViewOp> {
    fn changes(&mut self, changes: &mut Vec<Change>) {
        if !changes.is_empty() {
            self.append(ViewOp::Changes(std::mem::take(changes)));
        }
    }

    fn op(&mut self, op: ViewOp) {
        self.append(op);
    }
}

use super::apply::Sink;

impl StreamIndex {
    /// An empty, unsynchronized index and the reader side of its view.
    pub fn new(config: IndexConfig) -> Self {
        let (writer, read) = left_right::new_from_empty(ViewData::new(config.max_blocks));
        let reader = IndexReader {
            factory: read.factory(),
            block_size: config.block_size,
            hash_seed: config.hash_seed,
        };
        let mut index = StreamIndex {
            config,
            hasher: Keys::new(config.block_size, config.hash_seed, config.salt),
            table: Table::with_capacity(0, config.max_blocks),
            sync: SyncState::Unsynchronized("waiting for the first snapshot".into()),
            sequence: None,
            partial: false,
            writer,
            reader,
        };
        index.publish();
        index
    }

    /// The stream's settings.
    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    /// A source of read handles for this stream's view.
    pub fn reader(&self) -> IndexReader {
        self.reader.clone()
    }

    /// Whether live batches are being applied.
    pub fn is_synchronized(&self) -> bool {
        self.sync == SyncState::Synchronized
    }

    /// Engine blocks held.
    pub fn block_count(&self) -> usize {
        self.table.len()
    }

    /// The status the next publish will show.
    pub fn status(&self) -> StreamStatus {
        StreamStatus {
            synchronized: self.is_synchronized(),
            sequence: self.sequence,
            device_blocks: self.table.device,
            host_blocks: self.table.host,
            error: match &self.sync {
                SyncState::Synchronized => None,
                SyncState::Unsynchronized(e) => Some(e.clone()),
            },
            partial: self.partial,
            approximate: false,
        }
    }

    /// Marks the stream partial or exact, as [`super::StreamWriter::set_partial`] does.
    pub fn set_partial(&mut self, partial: bool) {
        self.partial = partial;
    }

    /// Applies live batch `seq`. Sequence continuity is the caller's concern. While
    /// unsynchronized only a full-state batch is accepted, and applying one synchronizes. Any
    /// error leaves the stream unsynchronized with the error as its reason. While partial,
    /// see [`super::StreamWriter::set_partial`].
    pub fn apply(&mut self, seq: u64, batch: &Batch) -> Result<ApplyStats, IndexError> {
        if let SyncState::Unsynchronized(reason) = &self.sync {
            if !batch.is_full_state() {
                return Err(IndexError::NotSynchronized(reason.clone()));
            }
        }
        let mode = if self.partial { Mode::Partial } else { Mode::Live };
        let mut ctx = Ctx { hasher: &mut self.hasher, max_blocks: self.config.max_blocks, mode };
        let applied = self.table.apply_batch(batch, &mut ctx, &mut self.writer);
        self.partial = ctx.mode == Mode::Partial;
        match applied {
            Ok(stats) => {
                self.sync = SyncState::Synchronized;
                self.sequence = Some(seq);
                Ok(stats)
            }
            Err(e) => {
                self.invalidate(e.to_string());
                Err(e)
            }
        }
    }

    /// Marks the stream unsynchronized (a gap, a disconnect, a decode error ...). Readers see it,
    /// and zero hits, from the next publish.
    pub fn invalidate(&mut self, reason: impl Into<String>) {
        self.sync = SyncState::Unsynchronized(reason.into());
    }

    /// Starts building a snapshot aside; the live view is untouched until it is installed.
    pub fn snapshot_builder(&self) -> SnapshotBuilder {
        SnapshotBuilder::new(self.config)
    }

    /// Replaces the contents with a complete snapshot whose watermark (the first live sequence
    /// not contained in it) is `watermark`, and synchronizes. Publish to make it visible.
    pub fn install_snapshot(&mut self, snapshot: SnapshotBuilder, watermark: u64) -> ApplyStats {
        self.table = snapshot.table;
        self.writer.append(ViewOp::Replace(Box::new(snapshot.map)));
        self.sync = SyncState::Synchronized;
        self.partial = false;
        self.sequence = watermark.checked_sub(1);
        snapshot.stats
    }

    /// Builds and installs a one-message snapshot. On error the stream is left unsynchronized.
    pub fn load_snapshot(
        &mut self,
        batch: &Batch,
        watermark: u64,
    ) -> Result<ApplyStats, IndexError> {
        let mut builder = self.snapshot_builder();
        if let Err(e) = builder.add(batch) {
            self.invalidate(e.to_string());
            return Err(e);
        }
        Ok(self.install_snapshot(builder, watermark))
    }

    /// Makes every change since the last publish, and the current status, visible to readers
    /// in one step.
    pub fn publish(&mut self) {
        let status = Arc::new(self.status());
        self.writer.append(ViewOp::Status(status));
        self.writer.publish();
    }
}

/// A snapshot being built aside from the live view, one reply message at a time.
#[derive(Debug)]
pub struct SnapshotBuilder {
    hasher: Keys,
    max_blocks: usize,
    table: Table,
    map: PresenceMap,
    stats: ApplyStats,
}

impl SnapshotBuilder {
    /// An empty snapshot for a stream with these settings; it can be built on any thread.
    pub fn new(config: IndexConfig) -> Self {
        Self::with_capacity(config, 0)
    }

    /// Like [`Self::new`], with room for `blocks` blocks (capped at `max_blocks`) reserved up
    /// front, so that a snapshot of about that size is built without rehashing as it grows.
    /// A hint only: the snapshot may hold more or fewer blocks.
    pub fn with_capacity(config: IndexConfig, blocks: usize) -> Self {
        SnapshotBuilder {
            hasher: Keys::new(config.block_size, config.hash_seed, config.salt),
            max_blocks: config.max_blocks,
            table: Table::with_capacity(blocks, config.max_blocks),
            map: PresenceMap::with_capacity(blocks, config.max_blocks),
            stats: ApplyStats::default(),
        }
    }

    /// Adds one snapshot payload (parent-first). Blocks whose parent is absent are orphans:
    /// skipped and counted, with every other prefix kept.
    pub fn add(&mut self, batch: &Batch) -> Result<ApplyStats, IndexError> {
        let mut ctx =
            Ctx { hasher: &mut self.hasher, max_blocks: self.max_blocks, mode: Mode::Snapshot };
        let stats = self.table.apply_batch(batch, &mut ctx, &mut self.map)?;
        self.stats.add(&stats);
        Ok(stats)
    }

    /// Engine blocks in the snapshot so far.
    pub fn block_count(&self) -> usize {
        self.table.len()
    }
}
