//! [`Recovery`]: sequence tracking, snapshot recovery, buffering and back-off for one stream.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::config::ReplayKind;
use crate::index::{IndexConfig, SharedSnapshot};
use crate::wire::Batch;

use super::actions::{Action, RecoveryConfig, RecoveryStats, StreamPhase, SyncReason};
use super::copies::ReplayedTail;
use super::history::Replay;
use super::snapshot::Pending;
use super::StreamFault;

/// Consecutive failed periodic resyncs after which a live stream loses its credit: a
/// publisher that keeps sending live events but no longer answers snapshots could otherwise
/// keep credit forever on an index that silently lost events. With the default 30 s resync
/// interval that bounds unverified credit to about 90 s.
pub const MAX_FAILED_RESYNCS: u32 = 3;

/// The first wait after the index refuses a batch; it doubles with each refusal up to
/// [`INDEX_BACKOFF_MAX`]. A refusal is rarely cured by asking again at once (a batch the index
/// cannot apply comes back in the replay), so a persistent one costs the engine about one
/// replay a minute instead of ten a second.
pub const INDEX_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait after a refusal.
pub const INDEX_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A refusal this long after the last back-off ended starts again from the shortest wait.
const INDEX_QUIET: Duration = Duration::from_secs(300);

pub(super) enum Phase {
    Disconnected,
    Live {
        since_snapshot: Instant,
    },
    Syncing(Box<Pending>),
    /// A history replay (vLLM, SGLang) in progress.
    Replaying(Box<Replay>),
    Backoff {
        until: Instant,
    },
}

/// The recovery state machine of one stream.
pub struct Recovery {
    pub(super) cfg: RecoveryConfig,
    index: IndexConfig,
    pub(super) phase: Phase,
    pub(super) next_seq: Option<u64>,
    pub(super) backoff: Backoff,
    /// Periodic resyncs that failed since the last installed snapshot.
    pub(super) failed_resyncs: u32,
    pub(super) stats: RecoveryStats,
    /// History replay: the stream knows only the blocks learned since a truncated history.
    pub(super) partial: bool,
    /// The last live sequence received (`None` before the first, and after a disconnect: a
    /// publisher may come back with its numbering restarted).
    pub(super) last_live: Option<u64>,
    /// The live sequence received before the last one.
    pub(super) live_before: Option<u64>,
    /// History replay: the newest replayed batches whose live copies may still arrive.
    pub(super) replayed: ReplayedTail,
    /// The wait after the index refuses a batch ([`INDEX_BACKOFF_MIN`]).
    index_backoff: Backoff,
    /// When the last index back-off ended.
    index_backoff_end: Option<Instant>,
}

impl std::fmt::Debug for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovery")
            .field("phase", &self.phase())
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl Recovery {
    /// A disconnected stream; nothing happens until [`Recovery::on_connected`] or a live batch.
    pub fn new(cfg: RecoveryConfig, index: IndexConfig) -> Self {
        let backoff = Backoff::new(cfg.backoff_min, cfg.backoff_max);
        Recovery {
            cfg,
            index,
            phase: Phase::Disconnected,
            next_seq: None,
            backoff,
            failed_resyncs: 0,
            stats: RecoveryStats::default(),
            partial: false,
            last_live: None,
            live_before: None,
            replayed: ReplayedTail::default(),
            index_backoff: Backoff::new(INDEX_BACKOFF_MIN, INDEX_BACKOFF_MAX),
            index_backoff_end: None,
        }
    }

    /// Continues where a previous machine of the same stream left off (a restarted worker):
    /// the counters keep counting from `stats`.
    pub fn continuing(mut self, stats: RecoveryStats) -> Self {
        self.stats = stats;
        self
    }

    /// Counters.
    pub fn stats(&self) -> RecoveryStats {
        self.stats
    }

    /// The phase, as operators see it.
    pub fn phase(&self) -> StreamPhase {
        match &self.phase {
            Phase::Disconnected => StreamPhase::Disconnected,
            Phase::Live { .. } | Phase::Replaying(_) if self.partial && self.is_synchronized() => {
                StreamPhase::Partial
            }
            Phase::Live { .. } => StreamPhase::Live,
            Phase::Syncing(p) if p.reason.keeps_live() => StreamPhase::Resyncing,
            Phase::Replaying(r) if r.reason.keeps_live() => StreamPhase::Resyncing,
            Phase::Syncing(_) | Phase::Replaying(_) => StreamPhase::Syncing,
            Phase::Backoff { .. } => StreamPhase::Backoff,
        }
    }

    /// Whether the stream gives credit: live, or replaying for a periodic resync.
    fn is_synchronized(&self) -> bool {
        match &self.phase {
            Phase::Live { .. } => true,
            Phase::Syncing(p) => p.reason.keeps_live(),
            Phase::Replaying(r) => r.reason.keeps_live(),
            Phase::Disconnected | Phase::Backoff { .. } => false,
        }
    }

    /// Whether a snapshot or history reply is awaited on the replay socket.
    pub fn awaits_reply(&self) -> bool {
        matches!(self.phase, Phase::Syncing(_) | Phase::Replaying(_))
    }

    /// Whether the stream knows only what it learned since a truncated history.
    pub fn is_partial(&self) -> bool {
        self.partial
    }

    /// The next live sequence expected, once known.
    pub fn next_seq(&self) -> Option<u64> {
        self.next_seq
    }

    /// The publisher is reachable: take a snapshot.
    pub fn on_connected(&mut self, now: Instant, out: &mut Vec<Action>) {
        if matches!(self.phase, Phase::Disconnected) {
            self.begin_sync(now, self.regain_reason(), out);
        }
    }

    /// Why a sync that (re)gains synchronization runs: the first one, or a recovery once the
    /// stream has been synchronized (a continued machine counts its predecessor's syncs).
    pub(super) fn regain_reason(&self) -> SyncReason {
        match self.stats.syncs() + self.stats.full_state_restores {
            0 => SyncReason::Initial,
            _ => SyncReason::Recovery,
        }
    }

    /// The publisher went away: no credit until a snapshot after the reconnect.
    pub fn on_disconnected(&mut self, out: &mut Vec<Action>) {
        if !matches!(self.phase, Phase::Disconnected) {
            self.invalidate(StreamFault::Disconnected, out);
            out.push(Action::CloseSnapshot);
            self.phase = Phase::Disconnected;
            self.next_seq = None;
            (self.last_live, self.live_before) = (None, None);
            self.replayed.clear();
        }
    }

    /// A problem on the live side (decode error, index error, full mailbox): resynchronize.
    ///
    /// A batch the index refused backs off first ([`INDEX_BACKOFF_MIN`]): the engine would
    /// send the same batch again in the replay.
    pub fn on_fault(&mut self, fault: StreamFault, now: Instant, out: &mut Vec<Action>) {
        let refused = matches!(fault, StreamFault::IndexRejected { .. });
        self.invalidate(fault, out);
        if self.cfg.replay == ReplayKind::History {
            // The blocks may not match the engine's any more: replay from the start.
            self.next_seq = None;
        }
        if matches!(self.phase, Phase::Disconnected | Phase::Backoff { .. }) {
            return;
        }
        if refused {
            return self.back_off_index(now, out);
        }
        self.begin_sync(now, self.regain_reason(), out);
    }

    /// Waits before asking again after the index refused a batch.
    fn back_off_index(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self
            .index_backoff_end
            .is_some_and(|end| now.saturating_duration_since(end) > INDEX_QUIET)
        {
            self.index_backoff.reset();
        }
        if self.awaits_reply() {
            out.push(Action::CloseSnapshot);
        }
        let until = now + self.index_backoff.next_delay();
        self.index_backoff_end = Some(until);
        self.stats.index_backoffs += 1;
        self.phase = Phase::Backoff { until };
    }

    /// A decoded live batch; `wire_bytes` counts against the buffering budget.
    pub fn on_live(
        &mut self,
        seq: u64,
        batch: Batch,
        wire_bytes: usize,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        if matches!(self.phase, Phase::Disconnected) {
            self.begin_sync(now, self.regain_reason(), out);
        }
        self.live_before = self.last_live.replace(seq);
        self.replayed.passed(seq);
        let in_order = self.next_seq == Some(seq);
        let live = matches!(self.phase, Phase::Live { .. });
        if batch.is_full_state() && !(in_order && live) {
            return self.restore_full_state(seq, batch, now, out);
        }
        if live {
            let Some(batch) = self.take_in_order(seq, batch, out) else { return };
            self.gap(seq, out);
            self.begin_sync(now, self.regain_reason(), out);
            if matches!(self.phase, Phase::Replaying(_)) {
                return self.live_while_replaying(seq, batch, wire_bytes, now, out);
            }
            return self.buffer(seq, batch, wire_bytes, now, out);
        }
        if matches!(self.phase, Phase::Replaying(_)) {
            return self.live_while_replaying(seq, batch, wire_bytes, now, out);
        }
        if !in_order && self.is_copy(seq, &batch) {
            self.stats.duplicate_batches += 1;
            return;
        }
        let Phase::Syncing(p) = &mut self.phase else {
            self.stats.dropped_batches += 1;
            return;
        };
        if p.reason.keeps_live() && in_order {
            self.apply(seq, batch.clone(), out);
        } else if p.reason.keeps_live() {
            p.reason = SyncReason::Recovery;
            self.gap(seq, out);
        }
        self.buffer(seq, batch, wire_bytes, now, out);
    }

    /// A live batch out of order that is no copy. A restarted publisher (the sequence went
    /// back) has a new history: a history replay starts over from 0 with the blocks dropped,
    /// since asking it from the old position would skip its first batches and keep the old
    /// publisher's blocks.
    pub(super) fn gap(&mut self, seq: u64, out: &mut Vec<Action>) {
        self.stats.gaps += 1;
        let fault = self.gap_fault(seq);
        if matches!(fault, StreamFault::SequenceRegressed { .. })
            && self.cfg.replay == ReplayKind::History
        {
            self.next_seq = None;
        }
        self.invalidate(fault, out);
    }

    fn gap_fault(&self, seq: u64) -> StreamFault {
        match self.next_seq {
            Some(n) if seq < n => StreamFault::SequenceRegressed { last: n - 1, got: seq },
            Some(n) => StreamFault::SequenceGap { expected: n, got: seq },
            None => StreamFault::UnexpectedSequence(seq),
        }
    }

    pub(super) fn apply(&mut self, seq: u64, batch: Batch, out: &mut Vec<Action>) {
        self.next_seq = Some(seq + 1);
        out.push(Action::Apply { seq, batch });
    }

    fn restore_full_state(&mut self, seq: u64, batch: Batch, now: Instant, out: &mut Vec<Action>) {
        if self.awaits_reply() {
            out.push(Action::CloseSnapshot);
        }
        self.partial = false;
        self.stats.full_state_restores += 1;
        self.apply(seq, batch, out);
        self.phase = Phase::Live { since_snapshot: now };
        self.backoff.reset();
    }

    /// When [`Recovery::on_tick`] next has something to do (a snapshot timeout, the end of a
    /// back-off, the periodic resync), so a caller can sleep until then; `None` while
    /// disconnected, when only an event can move the machine.
    pub fn next_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Syncing(p) => Some(p.started + self.cfg.replay_timeout),
            Phase::Replaying(r) => Some(r.started + self.cfg.replay_timeout),
            Phase::Backoff { until } => Some(*until),
            Phase::Live { since_snapshot } => Some(*since_snapshot + self.cfg.resync_period()),
            Phase::Disconnected => None,
        }
    }

    /// Timeouts, retries and the periodic resync.
    pub fn on_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        match &self.phase {
            Phase::Syncing(_) | Phase::Replaying(_)
                if self.next_deadline().is_some_and(|at| now > at) =>
            {
                let timeout_ms = self.cfg.replay_timeout.as_millis();
                let fault = match &self.phase {
                    Phase::Replaying(r) => {
                        StreamFault::HistoryTimeout { timeout_ms, replied: r.replied_any() }
                    }
                    _ => StreamFault::SnapshotTimeout { timeout_ms },
                };
                self.fail(fault, now, out);
            }
            Phase::Backoff { until } if now >= *until => {
                self.begin_sync(now, self.regain_reason(), out)
            }
            Phase::Live { since_snapshot }
                if now.saturating_duration_since(*since_snapshot) >= self.cfg.resync_period() =>
            {
                self.begin_sync(now, SyncReason::Periodic, out)
            }
            _ => {}
        }
    }

    fn begin_sync(&mut self, now: Instant, reason: SyncReason, out: &mut Vec<Action>) {
        if self.cfg.replay == ReplayKind::History {
            return self.begin_history(now, reason, out);
        }
        let pending = Pending {
            started: now,
            builder: Box::new(SharedSnapshot::new(self.index)),
            watermark: None,
            buffer: Vec::new(),
            buffered_bytes: 0,
            reason,
        };
        self.phase = Phase::Syncing(Box::new(pending));
        out.push(Action::RequestSnapshot { start_seq: self.next_seq.unwrap_or(0) });
    }

    fn invalidate(&mut self, fault: StreamFault, out: &mut Vec<Action>) {
        out.push(Action::Invalidate { fault });
    }

    /// A snapshot or history attempt failed while pending.
    pub(super) fn fail(&mut self, fault: StreamFault, now: Instant, out: &mut Vec<Action>) {
        let reason = match &self.phase {
            Phase::Syncing(p) => p.reason,
            Phase::Replaying(r) => r.reason,
            _ => self.regain_reason(),
        };
        self.fail_attempt(fault, reason, now, out);
    }

    /// A periodic resync of a live stream stays live and retries at the next interval, up to
    /// [`MAX_FAILED_RESYNCS`] in a row; otherwise the stream becomes unsynchronized and retries
    /// with back-off.
    pub(super) fn fail_attempt(
        &mut self,
        fault: StreamFault,
        reason: SyncReason,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        self.stats.snapshot_failures += 1;
        out.push(Action::CloseSnapshot);
        let mut fault = fault;
        if reason.keeps_live() {
            self.failed_resyncs += 1;
            if self.failed_resyncs < MAX_FAILED_RESYNCS {
                self.phase = Phase::Live { since_snapshot: now };
                return;
            }
            fault =
                StreamFault::ResyncsFailed { count: self.failed_resyncs, last: Box::new(fault) };
            self.failed_resyncs = 0;
        }
        self.invalidate(fault, out);
        self.phase = Phase::Backoff { until: now + self.backoff.next_delay() };
    }
}
