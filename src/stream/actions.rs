//! The recovery machine's settings and what it gives back: the [`Action`]s the stream actor
//! carries out, the [`StreamPhase`] operators see and the [`RecoveryStats`] counters, which
//! count each completed synchronization under its [`SyncReason`].

use std::time::Duration;

use crate::config::{Limits, ReplayKind, StreamSpec};
use crate::index::SharedSnapshot;
use crate::wire::Batch;

use super::StreamFault;

/// The stream and the limits and timings its recovery obeys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// The stream's DP rank: every snapshot reply batch must carry it.
    pub dp_rank: u32,
    /// What the replay endpoint answers: a snapshot (xLLM) or the history (vLLM, SGLang).
    pub replay: ReplayKind,
    /// Time allowed for a complete snapshot.
    pub replay_timeout: Duration,
    /// The configured period of snapshot reconciliation while synchronized.
    pub resync_interval: Duration,
    /// This stream's fixed offset, below a quarter of `resync_interval`: it resyncs every
    /// `resync_interval - resync_offset` ([`RecoveryConfig::resync_period`]), so a fleet that
    /// synchronized together spreads its snapshots over a quarter interval.
    pub resync_offset: Duration,
    /// Budget for live batches buffered while a snapshot is pending.
    pub max_buffered_bytes: usize,
    /// First retry delay after a failed snapshot; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// The live connection's losses reach the machine in order with its batches (kvdir's own
    /// ZMTP reader: one TCP connection, read in the stream's turn). A restarted publisher can
    /// then only send on a new connection, reported by [`super::Recovery::on_disconnected`]
    /// first, so a low sequence on the connection the sync began on is a late copy
    /// ([`super::Recovery::is_copy`]). `false` for libzmq's SUB and the bind endpoint, whose
    /// connection events come apart from the data.
    pub ordered_losses: bool,
}

impl RecoveryConfig {
    /// Recovery settings of `spec`'s stream under the configured limits.
    pub fn for_stream(spec: &StreamSpec, l: &Limits) -> Self {
        RecoveryConfig {
            dp_rank: spec.dp_rank,
            replay: spec.replay,
            replay_timeout: l.replay_timeout,
            resync_interval: l.resync_interval,
            resync_offset: resync_offset(&spec.instance_name, spec.dp_rank, l.resync_interval),
            max_buffered_bytes: l.max_buffered_bytes,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            ordered_losses: false,
        }
    }

    /// Time from one snapshot to the next periodic resync: never longer than configured.
    pub fn resync_period(&self) -> Duration {
        self.resync_interval.saturating_sub(self.resync_offset)
    }
}

/// A stream's deterministic resync offset in `[0, interval / 4)`: xxh3 of its instance name
/// seeded with its DP rank, stable across runs and builds (no RNG, no clock).
pub(super) fn resync_offset(instance_name: &str, dp_rank: u32, interval: Duration) -> Duration {
    let quarter = u64::try_from(interval.as_nanos() / 4).unwrap_or(u64::MAX);
    if quarter == 0 {
        return Duration::ZERO;
    }
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(instance_name.as_bytes(), u64::from(dp_rank));
    Duration::from_nanos(h % quarter)
}

/// What the stream actor must do.
#[derive(Debug)]
pub enum Action {
    /// Apply live batch `seq` to the index and publish.
    Apply {
        /// Its sequence number.
        seq: u64,
        /// The batch.
        batch: Batch,
    },
    /// Mark the index unsynchronized and publish.
    Invalidate {
        /// Why, for the status, the logs and the fault counter.
        fault: StreamFault,
    },
    /// Open a fresh DEALER (dropping any old one) and request a snapshot, or the history,
    /// from `start_seq` (the request is the same frames for both).
    RequestSnapshot {
        /// Last applied sequence + 1, or 0 when cold.
        start_seq: u64,
    },
    /// History replay: drop every block and stay unsynchronized; with `partial`, the stream
    /// from now on knows only the blocks it learns from the batches it sees.
    Reset {
        /// Whether the history that follows is truncated.
        partial: bool,
    },
    /// History replay: apply a replayed or buffered batch while unsynchronized.
    Recover {
        /// Its sequence number.
        seq: u64,
        /// The batch.
        batch: Batch,
    },
    /// History replay: the stream is synchronized again with its contents.
    Resume,
    /// Drop the snapshot DEALER.
    CloseSnapshot,
    /// Install the snapshot, apply the deltas in order, then publish once.
    Install {
        /// The snapshot, built aside.
        snapshot: Box<SharedSnapshot>,
        /// The first live sequence not contained in it.
        watermark: u64,
        /// Buffered live batches from `watermark` on, consecutive.
        deltas: Vec<(u64, Batch)>,
    },
}

/// Why a stream synchronizes (a snapshot, or a history replay); each one that completes is
/// counted under its reason, so a healthy stream shows no recoveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncReason {
    /// The stream has never been synchronized: it just started, or every attempt so far failed.
    Initial,
    /// The periodic reconciliation of a live stream (`resync_interval`): live batches keep
    /// applying and the stream keeps its credit meanwhile.
    Periodic,
    /// The stream was synchronized and lost it to a fault: a gap, a restarted publisher, a
    /// disconnect, a failed worker, a bad live message, failed periodic resyncs.
    Recovery,
}

impl SyncReason {
    /// Whether live batches keep applying (and credit stays) while it runs.
    pub fn keeps_live(self) -> bool {
        self == SyncReason::Periodic
    }
}

/// Counters for status and metrics (reported by name in the streams report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryStats {
    /// Sequence gaps and regressions seen on a synchronized stream.
    pub gaps: u64,
    /// Synchronizations completed for [`SyncReason::Initial`]: 1 for a healthy stream.
    pub initial_syncs: u64,
    /// Periodic resyncs completed ([`SyncReason::Periodic`]).
    pub resyncs: u64,
    /// Synchronizations regained after a fault ([`SyncReason::Recovery`]): 0 for a healthy
    /// stream.
    pub recoveries: u64,
    /// Snapshots that failed (timeout, malformed, budget, hole).
    pub snapshot_failures: u64,
    /// Live batches dropped because the stream waited for a retry.
    pub dropped_batches: u64,
    /// Live batches restored synchronization as full states.
    pub full_state_restores: u64,
    /// History replays that found the engine's buffer no longer reaching back to the asked
    /// sequence: the stream went on as partial.
    pub truncated_histories: u64,
    /// Replayed batches applied (history replay).
    pub replayed_batches: u64,
    /// Live batches dropped as copies of replayed ones already applied.
    pub duplicate_batches: u64,
    /// Back-offs after the index refused a batch (`index` faults): the stream waits, from 1 s
    /// doubling to 60 s, before it asks the engine again, instead of replaying at once.
    pub index_backoffs: u64,
    /// Time the last completed synchronization (of any reason) took.
    #[serde(skip)]
    pub last_sync: Option<Duration>,
}

impl RecoveryStats {
    /// Synchronizations completed, of every reason.
    pub fn syncs(&self) -> u64 {
        self.initial_syncs + self.resyncs + self.recoveries
    }

    /// Counts a completed synchronization that took `took`.
    pub(super) fn count_sync(&mut self, reason: SyncReason, took: Duration) {
        let counter = match reason {
            SyncReason::Initial => &mut self.initial_syncs,
            SyncReason::Periodic => &mut self.resyncs,
            SyncReason::Recovery => &mut self.recoveries,
        };
        *counter += 1;
        self.last_sync = Some(took);
    }
}

/// A stream's phase as operators see it (the streams report's `phase`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamPhase {
    /// No connection to the publisher; no credit.
    #[default]
    Disconnected,
    /// Waiting for the first snapshot (or one after a fault); no credit.
    Syncing,
    /// Applying live batches; credit.
    Live,
    /// A periodic snapshot while live batches still apply; credit.
    Resyncing,
    /// Waiting to retry a failed snapshot; no credit.
    Backoff,
    /// Applying live batches after a truncated history: credit for the blocks learned from
    /// the batches seen since, never for one after its removal; exact again at the next
    /// full clear.
    Partial,
}

impl StreamPhase {
    /// The name in the streams report.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamPhase::Disconnected => "disconnected",
            StreamPhase::Syncing => "syncing",
            StreamPhase::Live => "live",
            StreamPhase::Resyncing => "resyncing",
            StreamPhase::Backoff => "backoff",
            StreamPhase::Partial => "partial",
        }
    }

    /// Whether the stream gives credit.
    pub fn is_synchronized(self) -> bool {
        matches!(self, StreamPhase::Live | StreamPhase::Resyncing | StreamPhase::Partial)
    }
}
