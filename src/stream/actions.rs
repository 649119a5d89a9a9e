//! The recovery machine's settings and what it gives back: the [`Action`]s the stream actor
//! carries out, the [`StreamPhase`] operators see and the [`RecoveryStats`] counters.

use std::time::Duration;

use crate::config::{Limits, StreamSpec};
use crate::index::SharedSnapshot;
use crate::wire::Batch;

use super::StreamFault;

/// The stream and the limits and timings its recovery obeys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// The stream's DP rank: every snapshot reply batch must carry it.
    pub dp_rank: u32,
    /// Time allowed for a complete snapshot.
    pub replay_timeout: Duration,
    /// Period of snapshot reconciliation while synchronized.
    pub resync_interval: Duration,
    /// Budget for live batches buffered while a snapshot is pending.
    pub max_buffered_bytes: usize,
    /// First retry delay after a failed snapshot; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
}

impl RecoveryConfig {
    /// Recovery settings of `spec`'s stream under the configured limits.
    pub fn for_stream(spec: &StreamSpec, l: &Limits) -> Self {
        RecoveryConfig {
            dp_rank: spec.dp_rank,
            replay_timeout: l.replay_timeout,
            resync_interval: l.resync_interval,
            max_buffered_bytes: l.max_buffered_bytes,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }
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
    /// Open a fresh DEALER (dropping any old one) and request a snapshot from `start_seq`.
    RequestSnapshot {
        /// Last applied sequence + 1, or 0 when cold.
        start_seq: u64,
    },
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

/// Counters for status and metrics (reported by name in the streams report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryStats {
    /// Sequence gaps and regressions seen on a synchronized stream.
    pub gaps: u64,
    /// Snapshots installed.
    pub recoveries: u64,
    /// Snapshots that failed (timeout, malformed, budget, hole).
    pub snapshot_failures: u64,
    /// Live batches dropped because the stream waited for a retry.
    pub dropped_batches: u64,
    /// Live batches restored synchronization as full states.
    pub full_state_restores: u64,
    /// Time the last successful recovery took.
    #[serde(skip)]
    pub last_recovery: Option<Duration>,
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
        }
    }

    /// Whether a snapshot is being received.
    pub fn is_syncing(self) -> bool {
        matches!(self, StreamPhase::Syncing | StreamPhase::Resyncing)
    }
}
