//! History replay (vLLM, SGLang): the replay endpoint answers the buffered batches from the
//! asked sequence on, not a state. The stream asks from the first sequence it lacks and
//! applies what comes back as it arrives, so a failed attempt keeps its progress and the next
//! one asks from where it stopped.
//!
//! - **Start** (cold, after a disconnect or a fault): drop every block, ask from 0.
//! - **Gap fill** (a live gap): ask from the first missing sequence; the blocks stay, unused
//!   for credit until the missed batches are applied.
//! - **Periodic resync** (live): ask from the next sequence; replayed batches not yet seen
//!   live are applied ahead of the live stream, and their live copies are dropped later.
//! - **Truncated history**: the first batch replayed (or, with none, the first buffered live
//!   batch) is later than asked. The stream cannot be exact: it drops its blocks (their
//!   removals may be in the lost batches) and goes on as partial until the next full clear.

use std::time::Instant;

use crate::wire::Batch;

use super::actions::{Action, SyncReason};
use super::recovery::{Phase, Recovery};
use super::StreamFault;

/// A history replay in progress.
pub(super) struct Replay {
    pub(super) started: Instant,
    /// The sequence asked for: the first one the stream lacks.
    asked: u64,
    /// Whether a replayed batch arrived.
    replayed_any: bool,
    /// Why it runs; a periodic resync that finds a gap or a truncated history becomes a
    /// recovery.
    pub(super) reason: SyncReason,
    /// Live batches received meanwhile (not during a periodic resync).
    buffer: Vec<(u64, Batch)>,
    buffered_bytes: usize,
}

impl Replay {
    /// Whether a replayed batch arrived.
    pub(super) fn replied_any(&self) -> bool {
        self.replayed_any
    }
}

impl Recovery {
    /// Starts a history replay: from 0 with the blocks dropped when the stream has no known
    /// position, else from its next sequence.
    pub(super) fn begin_history(
        &mut self,
        now: Instant,
        reason: SyncReason,
        out: &mut Vec<Action>,
    ) {
        let asked = match self.next_seq {
            Some(n) => n,
            None => {
                self.partial = false;
                self.replayed.clear();
                out.push(Action::Reset { partial: false });
                self.next_seq = Some(0);
                0
            }
        };
        let replay = Replay {
            started: now,
            asked,
            replayed_any: false,
            reason,
            buffer: Vec::new(),
            buffered_bytes: 0,
        };
        self.phase = Phase::Replaying(Box::new(replay));
        out.push(Action::RequestSnapshot { start_seq: asked });
    }

    /// One replayed batch (`seq` with its payload decoded). A batch of another DP rank, or a
    /// hole inside the reply, fails the attempt.
    pub fn on_history_batch(
        &mut self,
        seq: u64,
        batch: Batch,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        if !matches!(self.phase, Phase::Replaying(_)) || self.other_rank(&batch, now, out) {
            return;
        }
        let Phase::Replaying(r) = &mut self.phase else { return };
        let next = self.next_seq.unwrap_or(0);
        let first = !std::mem::replace(&mut r.replayed_any, true);
        if seq > next {
            if !first {
                return self.fail(StreamFault::HistoryGap { expected: next, got: seq }, now, out);
            }
            self.truncated(seq, out);
        } else if seq < next {
            return; // applied live during a periodic resync
        }
        self.stats.replayed_batches += 1;
        if self.last_live.is_none_or(|l| seq > l) {
            self.replayed.remember(seq, &batch); // its live copy may still come
        }
        self.next_seq = Some(seq + 1);
        self.note_clears(&batch);
        if matches!(&self.phase, Phase::Replaying(r) if r.reason.keeps_live()) {
            out.push(Action::Apply { seq, batch });
        } else {
            out.push(Action::Recover { seq, batch });
        }
    }

    /// The history does not reach back to the asked sequence; `first` is the oldest there is.
    /// A live stream's periodic resync becomes a recovery: its blocks may be stale.
    fn truncated(&mut self, first: u64, out: &mut Vec<Action>) {
        self.stats.truncated_histories += 1;
        if let Phase::Replaying(r) = &mut self.phase {
            if r.reason.keeps_live() {
                r.reason = SyncReason::Recovery;
                let expected = self.next_seq.unwrap_or(0);
                self.stats.gaps += 1;
                out.push(Action::Invalidate {
                    fault: StreamFault::SequenceGap { expected, got: first },
                });
            }
        }
        self.partial = true;
        self.next_seq = Some(first);
        out.push(Action::Reset { partial: true });
    }

    /// The end marker: the live batches buffered meanwhile continue the replay, and the stream
    /// is synchronized (exact, or partial after a truncation).
    pub(super) fn end_history(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Phase::Replaying(r) = std::mem::replace(&mut self.phase, Phase::Disconnected) else {
            return;
        };
        let mut r = *r;
        let mut next = self.next_seq.unwrap_or(r.asked);
        let mut deltas = std::mem::take(&mut r.buffer);
        deltas.retain(|(s, _)| *s >= next);
        if let Some(&(first, _)) = deltas.first() {
            if first > next && !r.replayed_any {
                self.truncated(first, out);
                next = first;
            }
        }
        for (seq, batch) in deltas {
            if seq != next {
                self.next_seq = Some(next);
                self.phase = Phase::Replaying(Box::new(r));
                return self.fail(StreamFault::HistoryGap { expected: next, got: seq }, now, out);
            }
            self.note_clears(&batch);
            out.push(Action::Recover { seq, batch });
            next += 1;
        }
        self.finish_history(r, next, now, out);
    }

    fn finish_history(&mut self, r: Replay, next: u64, now: Instant, out: &mut Vec<Action>) {
        // Replayed batches the live stream has not delivered yet arrive later as copies
        // (`is_copy`).
        self.next_seq = Some(next);
        self.stats.count_sync(r.reason, now.saturating_duration_since(r.started));
        if !r.reason.keeps_live() {
            out.push(Action::Resume);
        }
        self.backoff.reset();
        self.failed_resyncs = 0;
        self.phase = Phase::Live { since_snapshot: now };
        out.push(Action::CloseSnapshot);
    }

    /// A live batch during a history replay: applied at once during a periodic resync (a gap
    /// turns it into a gap fill), buffered otherwise.
    pub(super) fn live_while_replaying(
        &mut self,
        seq: u64,
        batch: Batch,
        wire_bytes: usize,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let Phase::Replaying(r) = &mut self.phase else { return };
        let batch = if r.reason.keeps_live() {
            let Some(batch) = self.take_in_order(seq, batch, out) else { return };
            self.gap(seq, out);
            self.begin_history(now, self.regain_reason(), out);
            batch
        } else {
            batch
        };
        let Phase::Replaying(r) = &mut self.phase else { return };
        r.buffered_bytes += wire_bytes + batch.heap_bytes();
        r.buffer.push((seq, batch));
        if r.buffered_bytes > self.cfg.max_buffered_bytes {
            let fault = StreamFault::BufferOverflow { max_bytes: self.cfg.max_buffered_bytes };
            self.fail(fault, now, out);
        }
    }

    /// A live batch of a synchronized stream: applied when it is the next one, dropped when it
    /// is the live copy of a batch a history replay applied; otherwise handed back (a gap).
    pub(super) fn take_in_order(
        &mut self,
        seq: u64,
        batch: Batch,
        out: &mut Vec<Action>,
    ) -> Option<Batch> {
        if self.next_seq == Some(seq) {
            self.note_clears(&batch);
            self.apply(seq, batch, out);
            return None;
        }
        if self.is_copy(seq, &batch) {
            self.stats.duplicate_batches += 1;
            return None;
        }
        Some(batch)
    }

    /// Whether live batch `seq` is a copy of one the stream has already. A replay travels
    /// beside the live path (on the bind endpoint, behind the fan-out) and can get ahead of it,
    /// by seconds when kvdir is loaded, so the live copy of a replayed batch can come after it.
    ///
    /// - A batch a history replay answered (the newest [`super::copies::MAX_REMEMBERED`]) is a
    ///   copy exactly when it is the same batch (`copies.rs`): a restarted publisher's batch 0
    ///   carries a new timestamp, so it is told apart for certain, even before any live batch.
    /// - Otherwise (a snapshot, xLLM: state without its batches) the sequence decides: the live
    ///   batch just before it again (a repeated delivery), or one below the next expected
    ///   sequence but later than the live batch before it. A publisher sends its sequence in
    ///   order on one connection; a restarted one goes back to or below what it sent live,
    ///   which no copy does. Before any live batch (a new stream, or after a disconnect) a batch
    ///   below the next expected one is a copy unless it is 0, where a restarted publisher
    ///   starts: a snapshot's stream cannot tell a late copy of 0 from a restart, and pays one
    ///   recovery rather than credit a cache that may be gone. On a connection whose losses
    ///   arrive in order ([`super::RecoveryConfig::ordered_losses`]) it can: a restarted publisher
    ///   would have come on a new connection, after a disconnect, so 0 is a copy there too.
    pub(super) fn is_copy(&self, seq: u64, batch: &Batch) -> bool {
        if let Some(same) = self.replayed.same(seq, batch) {
            return same;
        }
        let repeated = self.live_before == Some(seq) && seq > 0;
        let below_next = self.next_seq.is_some_and(|n| seq < n);
        let first_on_connection = seq > 0 || self.cfg.ordered_losses;
        let after_live = self.live_before.map_or(first_on_connection, |l| seq > l);
        repeated || (below_next && after_live)
    }

    /// A batch that clears every tier makes a partial stream exact from then on: everything
    /// after it is learned from events.
    pub(super) fn note_clears(&mut self, batch: &Batch) {
        if self.partial && batch.clears_all() {
            self.partial = false;
        }
    }
}
