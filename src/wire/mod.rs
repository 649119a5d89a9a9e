//! The engine-facing wire format: live messages, snapshot replies, batches and events.
//!
//! Decoding writes into a reusable [`Batch`] whose events point into two flat arenas (engine
//! hashes and token ids), so a batch of any size costs no allocation per event once the arenas
//! have grown. Every accepted dialect of protocol.md section 2 decodes into the same [`Batch`]:
//! 3-, 2-element and map batches; tagged-map and positional events; integer and `bin` hashes.
//! Events outside the index's scope are counted in [`SkipCounts`]: unknown types and
//! `storage`-like media are dropped; stores with multimodal or salt context keep only their
//! hashes ([`Event::OutOfScope`]), so the index can tell their unmarked children from children of
//! an unknown parent. LoRA stores are in scope, tagged with their adapter's namespace.
//!
//! [`record`] holds owned, loosely typed records for the encoders that the simulator and tests
//! use, so they can also produce the odd inputs the decoder must tolerate.

mod decode;
mod encode;
mod extra_keys;
mod frames;
mod group;
pub mod msgpack;
mod namespace;
pub mod record;
mod types;

pub use decode::decode_batch;
pub use encode::encode_batch;
pub use frames::{
    decode_history_frame, decode_live, decode_snapshot_frame, encode_history_end,
    encode_history_reply, encode_live, encode_snapshot_end, encode_snapshot_reply, HistoryFrame,
    SnapshotFrame, SNAPSHOT_END_WATERMARK,
};
pub use group::{AttentionKind, Group, Unmodelled, MAX_GROUPS};
pub use namespace::Namespace;
pub use types::{Batch, EngineHash, Event, SkipCounts, Span, Stored, Tier};

use thiserror::Error;

/// What a replay reply of `frames` frames is, when that is the other kind's shape (`other`).
fn shape_hint(frames: usize, other: usize) -> &'static str {
    match (frames == other, other) {
        (true, 4) => {
            "; 4 frames are a history replay (vLLM, SGLang): set \"replay\": \"history\" (or \
             the engine's dialect) for this stream"
        }
        (true, _) => {
            "; 3 frames are an xLLM snapshot: set \"replay\": \"snapshot\" for this stream"
        }
        _ => "",
    }
}

/// Everything that can be wrong with bytes received from an engine.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// A live message did not have exactly three frames.
    #[error("live message has {0} frames, expected 3 (topic, sequence, payload)")]
    FrameCount(usize),
    /// A snapshot reply did not have the `[empty, watermark, payload]` shape.
    #[error(
        "snapshot reply has {n} frames, expected 3 (empty delimiter, watermark, payload){hint}",
        n = .0,
        hint = shape_hint(*.0, 4)
    )]
    SnapshotFrameCount(usize),
    /// A history replay message did not have the `[empty, topic, seq, payload]` shape.
    #[error(
        "history reply has {n} frames, expected 4 (empty delimiter, topic, sequence, payload){hint}",
        n = .0,
        hint = shape_hint(*.0, 3)
    )]
    HistoryFrameCount(usize),
    /// The first frame of a snapshot reply was not the empty delimiter.
    #[error("snapshot reply delimiter frame is {0} bytes, expected an empty frame")]
    SnapshotDelimiter(usize),
    /// A sequence or watermark frame was not 8 bytes.
    #[error("{field} frame is {len} bytes, expected 8 (unsigned big-endian)")]
    SequenceLength {
        /// `sequence` or `watermark`.
        field: &'static str,
        /// The frame's length.
        len: usize,
    },
    /// ZeroMQ filters subscriptions by prefix; the topic must match exactly.
    #[error("topic {got:?} does not match the configured topic {expected:?}")]
    TopicMismatch {
        /// The configured topic.
        expected: String,
        /// The topic received (lossy UTF-8).
        got: String,
    },
    /// A payload exceeded `max_message_bytes`.
    #[error("payload of {size} bytes exceeds max_message_bytes = {limit}")]
    MessageTooLarge {
        /// The payload size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A non-terminator snapshot reply had an empty payload.
    #[error("snapshot reply with watermark {0} has an empty payload")]
    EmptySnapshotPayload(u64),
    /// The MessagePack document ended early.
    #[error("truncated MessagePack: {needed} more bytes needed at offset {offset}")]
    Truncated {
        /// Where the missing bytes start.
        offset: usize,
        /// How many bytes were missing.
        needed: usize,
    },
    /// A value had the wrong MessagePack type.
    #[error("{field}: expected {expected}, found {found} at offset {offset}")]
    Type {
        /// The field being decoded.
        field: &'static str,
        /// The accepted type.
        expected: &'static str,
        /// The type found.
        found: &'static str,
        /// Offset of the value.
        offset: usize,
    },
    /// A value had the right type but an unacceptable value.
    #[error("{field}: value {value} is out of range ({allowed})")]
    Range {
        /// The field being decoded.
        field: &'static str,
        /// The value received.
        value: String,
        /// What is accepted.
        allowed: &'static str,
    },
    /// A batch array had the wrong number of elements.
    #[error("batch array has {0} elements, expected 2 or 3 ([timestamp, events, dp_rank?])")]
    BatchArity(usize),
    /// A map batch or event lacked a required key.
    #[error("{context} lacks the required key {key:?}")]
    MissingKey {
        /// `batch` or the event type.
        context: &'static str,
        /// The missing key.
        key: &'static str,
    },
    /// An event failed to decode; `index` is its position in the batch.
    #[error("events[{index}]: {source}")]
    Event {
        /// Position of the event in the batch.
        index: usize,
        /// What went wrong.
        source: Box<WireError>,
    },
    /// Bytes followed the batch.
    #[error("{0} trailing bytes after the batch")]
    TrailingBytes(usize),
    /// Nesting went deeper than the skip limit.
    #[error("MessagePack nested deeper than {limit} levels at offset {offset}")]
    TooDeep {
        /// The depth limit.
        limit: usize,
        /// Where it was exceeded.
        offset: usize,
    },
}
