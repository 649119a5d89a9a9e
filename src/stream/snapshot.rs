//! Snapshot recovery (xLLM) in the recovery machine: live batches buffered while a snapshot is
//! awaited, its replies built aside, and its install with the buffered deltas that continue it
//! (protocol.md section 3). History replay (vLLM, SGLang) is in `history.rs`.

use std::time::Instant;

use crate::index::SharedSnapshot;
use crate::wire::Batch;

use super::actions::{Action, SyncReason};
use super::recovery::{Phase, Recovery};
use super::StreamFault;

/// A snapshot being awaited: its replies built aside, and the live batches buffered meanwhile.
pub(super) struct Pending {
    pub(super) started: Instant,
    pub(super) builder: Box<SharedSnapshot>,
    pub(super) watermark: Option<u64>,
    pub(super) buffer: Vec<(u64, Batch)>,
    pub(super) buffered_bytes: usize,
    /// Why it runs; a periodic resync that meets a gap becomes a recovery.
    pub(super) reason: SyncReason,
}

impl Recovery {
    pub(super) fn buffer(
        &mut self,
        seq: u64,
        batch: Batch,
        wire_bytes: usize,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let Phase::Syncing(p) = &mut self.phase else { return };
        p.buffered_bytes += wire_bytes + batch.heap_bytes();
        p.buffer.push((seq, batch));
        if p.buffered_bytes > self.cfg.max_buffered_bytes {
            let fault = StreamFault::BufferOverflow { max_bytes: self.cfg.max_buffered_bytes };
            self.fail(fault, now, out);
        }
    }

    /// One snapshot reply message, already decoded. A reply of another DP rank's state (a
    /// publisher wired to the wrong replay port) fails the snapshot like a malformed one.
    pub fn on_snapshot_reply(
        &mut self,
        watermark: u64,
        batch: &Batch,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        if !matches!(self.phase, Phase::Syncing(_)) || self.other_rank(batch, now, out) {
            return;
        }
        let Phase::Syncing(p) = &mut self.phase else { return };
        if p.watermark.is_some_and(|w| w != watermark) {
            return self.fail(StreamFault::SnapshotWatermarks(watermark), now, out);
        }
        p.watermark = Some(watermark);
        if let Err(e) = p.builder.add(batch) {
            self.fail(StreamFault::SnapshotRejected(e.to_string()), now, out);
        }
    }

    /// Fails the attempt when a reply's batch is of another DP rank (a publisher wired to the
    /// wrong replay port); says whether it did.
    pub(super) fn other_rank(
        &mut self,
        batch: &Batch,
        now: Instant,
        out: &mut Vec<Action>,
    ) -> bool {
        if batch.dp_rank == self.cfg.dp_rank {
            return false;
        }
        let fault = StreamFault::SnapshotWrongDpRank { got: batch.dp_rank, want: self.cfg.dp_rank };
        self.fail(fault, now, out);
        true
    }

    /// A snapshot reply could not be read (malformed, oversized...).
    pub fn on_snapshot_error(&mut self, fault: StreamFault, now: Instant, out: &mut Vec<Action>) {
        if self.awaits_reply() {
            self.fail(fault, now, out);
        }
    }

    /// The snapshot terminator: install it with the buffered deltas that continue it.
    pub fn on_snapshot_end(&mut self, now: Instant, out: &mut Vec<Action>) {
        if matches!(self.phase, Phase::Replaying(_)) {
            return self.end_history(now, out);
        }
        // A terminator after the attempt already failed (its reply was rejected) is ignored:
        // the phase it failed into (back-off, or live for a resync) stands.
        if !matches!(self.phase, Phase::Syncing(_)) {
            return;
        }
        let Phase::Syncing(p) = std::mem::replace(&mut self.phase, Phase::Disconnected) else {
            return;
        };
        let Some(watermark) = p.watermark else {
            return self.fail_attempt(StreamFault::SnapshotRefused, p.reason, now, out);
        };
        let deltas: Vec<(u64, Batch)> =
            p.buffer.into_iter().filter(|(s, _)| *s >= watermark).collect();
        if let Some(hole) =
            deltas.iter().enumerate().find(|(i, (s, _))| *s != watermark + *i as u64)
        {
            let fault =
                StreamFault::SnapshotGap { expected: watermark + hole.0 as u64, got: (hole.1).0 };
            return self.fail_attempt(fault, p.reason, now, out);
        }
        self.next_seq = Some(watermark + deltas.len() as u64);
        self.stats.count_sync(p.reason, now.saturating_duration_since(p.started));
        self.backoff.reset();
        self.phase = Phase::Live { since_snapshot: now };
        self.failed_resyncs = 0;
        out.push(Action::CloseSnapshot);
        out.push(Action::Install { snapshot: p.builder, watermark, deltas });
    }
}
