//! [`StreamFault`]: why a stream lost (or could not get) its credit, typed. Its text is what
//! operators read in `last_fault`, the streams report and the logs; its [`StreamFault::label`]
//! is one of a fixed set ([`FAULT_LABELS`]), the `reason` label of the fault counter in
//! `/metrics`, so the number of series stays bounded whatever the publisher sends.

use std::fmt;

/// The `reason` labels of stream faults, in [`StreamFault::label_index`] order.
pub const FAULT_LABELS: [&str; 9] = [
    "disconnected",
    "sequence",
    "decode",
    "dp_rank",
    "index",
    "buffer",
    "snapshot",
    "snapshot_timeout",
    "worker",
];

/// A fault of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamFault {
    /// The SUB socket lost its publisher (closed, or silent past the heartbeat timeout).
    Disconnected,
    /// The sequence went back: the publisher restarted.
    SequenceRegressed {
        /// The last sequence applied.
        last: u64,
        /// The one that arrived.
        got: u64,
    },
    /// A sequence was skipped.
    SequenceGap {
        /// The sequence expected.
        expected: u64,
        /// The one that arrived.
        got: u64,
    },
    /// A live sequence arrived before any was known.
    UnexpectedSequence(u64),
    /// A live message that does not decode (the decoder's message).
    LiveRejected(String),
    /// A live batch of another DP rank (a publisher wired to the wrong port).
    WrongDpRank {
        /// The batch's rank.
        got: u32,
        /// The stream's rank.
        want: u32,
    },
    /// A live batch the index refused (an unknown parent, a limit).
    IndexRejected {
        /// Its sequence.
        seq: u64,
        /// The index's message.
        error: String,
    },
    /// Live deltas buffered during a recovery outgrew `max_buffered_bytes`.
    BufferOverflow {
        /// The limit.
        max_bytes: usize,
    },
    /// A snapshot reply of another DP rank.
    SnapshotWrongDpRank {
        /// The reply's rank.
        got: u32,
        /// The stream's rank.
        want: u32,
    },
    /// Two replies of one snapshot name different watermarks.
    SnapshotWatermarks(u64),
    /// A snapshot reply that does not decode or does not build (the message).
    SnapshotRejected(String),
    /// The snapshot ended without a reply.
    SnapshotRefused,
    /// The buffered live deltas do not continue the snapshot.
    SnapshotGap {
        /// The sequence expected after the watermark.
        expected: u64,
        /// The one buffered.
        got: u64,
    },
    /// A history replay (or the live batches buffered during it) skipped a sequence.
    HistoryGap {
        /// The sequence expected.
        expected: u64,
        /// The one that came.
        got: u64,
    },
    /// The snapshot did not complete within `replay_timeout_ms`.
    SnapshotTimeout {
        /// The limit, in ms.
        timeout_ms: u128,
    },
    /// A history replay did not end within `replay_timeout_ms`.
    HistoryTimeout {
        /// The limit, in ms.
        timeout_ms: u128,
        /// Whether any of it arrived (none: most likely no replay endpoint there).
        replied: bool,
    },
    /// Several periodic resyncs failed in a row; the last one's fault.
    ResyncsFailed {
        /// How many.
        count: u32,
        /// The last fault.
        last: Box<StreamFault>,
    },
    /// The stream's thread failed (a socket it could not open, a panic).
    WorkerFailed(String),
}

impl StreamFault {
    /// The bounded `reason` label (one of [`FAULT_LABELS`]). Repeated resync failures carry
    /// the label of the last one.
    pub fn label(&self) -> &'static str {
        FAULT_LABELS[self.label_index()]
    }

    /// The position of [`StreamFault::label`] in [`FAULT_LABELS`].
    pub fn label_index(&self) -> usize {
        match self {
            StreamFault::Disconnected => 0,
            StreamFault::SequenceRegressed { .. }
            | StreamFault::SequenceGap { .. }
            | StreamFault::UnexpectedSequence(_) => 1,
            StreamFault::LiveRejected(_) => 2,
            StreamFault::WrongDpRank { .. } => 3,
            StreamFault::IndexRejected { .. } => 4,
            StreamFault::BufferOverflow { .. } => 5,
            StreamFault::SnapshotWrongDpRank { .. }
            | StreamFault::SnapshotWatermarks(_)
            | StreamFault::SnapshotRejected(_)
            | StreamFault::SnapshotRefused
            | StreamFault::SnapshotGap { .. }
            | StreamFault::HistoryGap { .. } => 6,
            StreamFault::SnapshotTimeout { .. } | StreamFault::HistoryTimeout { .. } => 7,
            StreamFault::ResyncsFailed { last, .. } => last.label_index(),
            StreamFault::WorkerFailed(_) => 8,
        }
    }
}

impl fmt::Display for StreamFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamFault::Disconnected => write!(f, "publisher disconnected"),
            StreamFault::SequenceRegressed { last, got } => {
                write!(f, "sequence went back from {last} to {got}: publisher restarted")
            }
            StreamFault::SequenceGap { expected, got } => {
                write!(f, "sequence gap: expected {expected}, got {got}")
            }
            StreamFault::UnexpectedSequence(seq) => write!(f, "unexpected sequence {seq}"),
            StreamFault::LiveRejected(e) => write!(f, "live message rejected: {e}"),
            StreamFault::WrongDpRank { got, want } => {
                write!(f, "batch dp_rank {got} does not match the stream's dp_rank {want}")
            }
            StreamFault::IndexRejected { seq, error } => {
                write!(f, "batch {seq} rejected by the index: {error}")
            }
            StreamFault::BufferOverflow { max_bytes } => write!(
                f,
                "live deltas buffered during recovery exceeded max_buffered_bytes = {max_bytes}"
            ),
            StreamFault::SnapshotWrongDpRank { got, want } => write!(
                f,
                "snapshot rejected: batch dp_rank {got} does not match the stream's dp_rank {want}"
            ),
            StreamFault::SnapshotWatermarks(w) => {
                write!(f, "snapshot replies disagree on the watermark: {w}")
            }
            StreamFault::SnapshotRejected(e) => write!(f, "snapshot rejected: {e}"),
            StreamFault::SnapshotRefused => {
                write!(f, "snapshot ended without a reply (publisher refused)")
            }
            StreamFault::SnapshotGap { expected, got } => write!(
                f,
                "live deltas do not continue the snapshot: expected sequence {expected}, got {got}"
            ),
            StreamFault::HistoryGap { expected, got } => {
                write!(f, "history replay skipped from sequence {expected} to {got}; asking again")
            }
            StreamFault::SnapshotTimeout { timeout_ms } => {
                write!(f, "snapshot incomplete after replay_timeout_ms = {timeout_ms}")
            }
            StreamFault::HistoryTimeout { timeout_ms, replied: true } => {
                write!(f, "history replay incomplete after replay_timeout_ms = {timeout_ms}")
            }
            StreamFault::HistoryTimeout { timeout_ms, replied: false } => write!(
                f,
                "no history replay answer within replay_timeout_ms = {timeout_ms}: check that \
                 the engine's --kv-events-config sets replay_endpoint and that this stream's \
                 replay endpoint reaches it"
            ),
            StreamFault::ResyncsFailed { count, last } => write!(
                f,
                "{count} periodic resyncs failed in a row (last: {last}); no credit until a \
                 snapshot succeeds"
            ),
            StreamFault::WorkerFailed(e) => write!(f, "stream worker failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded_and_a_repeated_resync_failure_keeps_its_cause() {
        let timeout = StreamFault::SnapshotTimeout { timeout_ms: 5000 };
        let repeated = StreamFault::ResyncsFailed { count: 3, last: Box::new(timeout.clone()) };
        assert_eq!(timeout.label(), "snapshot_timeout");
        assert_eq!(repeated.label(), "snapshot_timeout");
        assert!(repeated.to_string().starts_with("3 periodic resyncs failed in a row (last: "));
        // Whatever text a publisher's bytes produce, the label is one of the fixed set.
        let decode = StreamFault::LiveRejected("anything \u{1f4a5} at all".into());
        assert_eq!(decode.label(), "decode");
        assert!(FAULT_LABELS.contains(&decode.label()));
    }
}
