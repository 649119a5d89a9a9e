//! The shared view's write side: one copy of the view behind a reader/writer lock, and the log
//! of committed, not yet published operations.
//!
//! Why one copy and a lock rather than `left-right`'s two copies: every change was applied to
//! both copies (the peer bench's profile: about a third of kvdir's ingest CPU) and every key
//! was stored twice (about 27 of the 96 bytes per membership). Here a publish takes the write
//! lock once and applies the log in order; readers hold the read lock for one walk. What keeps
//! readers from waiting long:
//! - a live batch's changes are few, and applying them is a few probes each;
//! - a snapshot install sends only the difference between the stream's old and new contents
//!   (see `StreamWriter::install_snapshot`), which a periodic resync keeps small;
//! - the content-key map grows (a rehash of every key) before the write lock is taken, into a
//!   copy built while readers go on reading the old map; the lock only swaps it in;
//! - changes of a stream that readers do not see (unsynchronized in the view: a first snapshot,
//!   a recovery, a removal after its status went) are applied in chunks of [`CHUNK`], releasing
//!   the lock between them. Nothing of them is visible until the status that synchronizes the
//!   stream, which comes after them in the log.
//!
//! Everything of one publish that a reader can see is applied under one write lock, so a batch,
//! an install (old contents out, new in, status) and a removal are each visible all at once.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::super::apply::Change;
use super::super::flat::FlatTable;
use super::super::key::ContentKey;
use super::super::StreamStatus;
use super::holders::{Holders, SharedData, StreamLabel};

/// Changes applied per write lock when readers cannot see them.
const CHUNK: usize = 4096;

/// One committed operation.
#[derive(Debug)]
enum Op {
    /// One stream's changes, in order: a range of [`Log::changes`].
    Changes { slot: u8, range: Range<usize> },
    /// A stream's status; `None` when the stream is removed (its label goes with it).
    Status { slot: u8, status: Option<Arc<StreamStatus>> },
    /// Who holds a slot, set when a stream joins.
    Label { slot: u8, label: Arc<StreamLabel> },
}

/// Operations committed since the last publish. Changes of every commit share one buffer, so
/// a commit allocates nothing once the buffer has grown.
#[derive(Debug, Default)]
pub(crate) struct Log {
    ops: Vec<Op>,
    changes: Vec<Change>,
}

impl Log {
    /// Appends one stream's changes (and leaves `changes` empty).
    pub fn changes(&mut self, slot: u8, changes: &mut Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        let start = self.changes.len();
        self.changes.append(changes);
        self.ops.push(Op::Changes { slot, range: start..self.changes.len() });
    }

    pub fn status(&mut self, slot: u8, status: Option<Arc<StreamStatus>>) {
        self.ops.push(Op::Status { slot, status });
    }

    pub fn label(&mut self, slot: u8, label: Arc<StreamLabel>) {
        self.ops.push(Op::Label { slot, label });
    }

    /// Applies the log to the view in order and empties it (see the module documentation).
    pub fn publish(&mut self, view: &RwLock<SharedData>) {
        let mut ops = std::mem::take(&mut self.ops);
        // Only a publish changes the view, and publishes are serialized (the index's writer
        // mutex), so a larger map built under the read lock is still current when swapped in.
        let grown = self.grown_map(&read(view));
        let mut data = write(view);
        let old = grown.map(|map| std::mem::replace(&mut data.map, map));
        for op in ops.drain(..) {
            match op {
                Op::Changes { slot, range } => {
                    let changes = &self.changes[range];
                    if changes.len() <= CHUNK || data.synced & (1u128 << slot) != 0 {
                        data.apply_changes(slot, changes);
                        continue;
                    }
                    for chunk in changes.chunks(CHUNK) {
                        data.apply_changes(slot, chunk);
                        drop(data);
                        data = write(view);
                    }
                }
                Op::Status { slot, status } => data.set_status(slot, status),
                Op::Label { slot, label } => data.set_label(slot, label),
            }
        }
        drop(data);
        drop(old); // freed outside the lock
        self.ops = ops;
        self.changes.clear();
    }
}

impl Log {
    /// The view's map grown for this log's new keys, when it needs to grow. Additions are
    /// counted first (cheap); only when they could overflow the map are the keys that are new
    /// counted, so that the map grows exactly when inserting one by one would have grown it.
    fn grown_map(&self, data: &SharedData) -> Option<FlatTable<ContentKey, Holders>> {
        let adds = self.changes.iter().filter(|c| c.add);
        if data.map.has_room(adds.clone().count()) {
            return None;
        }
        let new: HashSet<_> =
            adds.filter(|c| data.map.get(&c.key).is_none()).map(|c| c.key).collect();
        data.map.grown_for(new.len())
    }
}

/// The view for writing. A panic while applying leaves the entries it did not reach
/// unapplied, never a broken table (each change is whole), so a poisoned lock is still used.
pub(crate) fn write(view: &RwLock<SharedData>) -> RwLockWriteGuard<'_, SharedData> {
    view.write().unwrap_or_else(PoisonError::into_inner)
}

/// The view for reading (see [`write`] on poisoning).
pub(crate) fn read(view: &RwLock<SharedData>) -> RwLockReadGuard<'_, SharedData> {
    view.read().unwrap_or_else(PoisonError::into_inner)
}
