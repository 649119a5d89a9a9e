//! Message envelopes: live messages (`topic | seq | payload`), snapshot replies
//! (`"" | watermark | payload`, ended by `"" | u64::MAX | ""`), protocol.md sections 2 and 3,
//! and history replies (vLLM, SGLang: `"" | topic | seq | payload` per buffered batch, ended by
//! `"" | "" | u64::MAX | ""`).

use super::decode::decode_batch;
use super::types::Batch;
use super::WireError;

/// The watermark value that marks the end of a snapshot reply.
pub const SNAPSHOT_END_WATERMARK: u64 = u64::MAX;

fn read_u64(frame: &[u8], field: &'static str) -> Result<u64, WireError> {
    let bytes: [u8; 8] =
        frame.try_into().map_err(|_| WireError::SequenceLength { field, len: frame.len() })?;
    Ok(u64::from_be_bytes(bytes))
}

fn check_size(payload: &[u8], max_message_bytes: usize) -> Result<(), WireError> {
    if payload.len() > max_message_bytes {
        return Err(WireError::MessageTooLarge { size: payload.len(), limit: max_message_bytes });
    }
    Ok(())
}

/// Decodes a live message into `batch` and returns its sequence number.
///
/// ZeroMQ subscriptions match topic prefixes, so the topic frame is compared exactly here.
pub fn decode_live<F: AsRef<[u8]>>(
    frames: &[F],
    topic: &[u8],
    max_message_bytes: usize,
    batch: &mut Batch,
) -> Result<u64, WireError> {
    let [t, seq, payload] = frames else { return Err(WireError::FrameCount(frames.len())) };
    let (t, payload) = (t.as_ref(), payload.as_ref());
    if t != topic {
        return Err(WireError::TopicMismatch {
            expected: String::from_utf8_lossy(topic).into_owned(),
            got: String::from_utf8_lossy(t).into_owned(),
        });
    }
    let seq = read_u64(seq.as_ref(), "sequence")?;
    check_size(payload, max_message_bytes)?;
    decode_batch(payload, batch)?;
    Ok(seq)
}

/// One snapshot reply message as the DEALER sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotFrame {
    /// A full-state payload, now decoded into the batch; `watermark` is the resume point.
    Reply {
        /// Sequence number of the first live batch not contained in the snapshot.
        watermark: u64,
    },
    /// The terminator: the snapshot is complete.
    End,
}

/// Decodes one snapshot reply message; a `Reply` leaves its payload decoded in `batch`.
pub fn decode_snapshot_frame<F: AsRef<[u8]>>(
    frames: &[F],
    max_message_bytes: usize,
    batch: &mut Batch,
) -> Result<SnapshotFrame, WireError> {
    let [delim, mark, payload] = frames else {
        return Err(WireError::SnapshotFrameCount(frames.len()));
    };
    if !delim.as_ref().is_empty() {
        return Err(WireError::SnapshotDelimiter(delim.as_ref().len()));
    }
    let watermark = read_u64(mark.as_ref(), "watermark")?;
    let payload = payload.as_ref();
    if watermark == SNAPSHOT_END_WATERMARK && payload.is_empty() {
        return Ok(SnapshotFrame::End);
    }
    if payload.is_empty() {
        return Err(WireError::EmptySnapshotPayload(watermark));
    }
    check_size(payload, max_message_bytes)?;
    decode_batch(payload, batch)?;
    Ok(SnapshotFrame::Reply { watermark })
}

/// One history reply message as the DEALER sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryFrame {
    /// A buffered batch, now decoded into the batch.
    Batch {
        /// Its sequence number.
        seq: u64,
    },
    /// The end marker: every buffered batch from the asked sequence on was sent.
    End,
}

/// Decodes one history reply message; a `Batch` leaves its payload decoded in `batch`. The
/// topic must be the stream's, as on the live socket.
pub fn decode_history_frame<F: AsRef<[u8]>>(
    frames: &[F],
    topic: &[u8],
    max_message_bytes: usize,
    batch: &mut Batch,
) -> Result<HistoryFrame, WireError> {
    let [delim, t, seq, payload] = frames else {
        return Err(WireError::HistoryFrameCount(frames.len()));
    };
    if !delim.as_ref().is_empty() {
        return Err(WireError::SnapshotDelimiter(delim.as_ref().len()));
    }
    let seq = read_u64(seq.as_ref(), "sequence")?;
    let (t, payload) = (t.as_ref(), payload.as_ref());
    if seq == SNAPSHOT_END_WATERMARK && t.is_empty() && payload.is_empty() {
        return Ok(HistoryFrame::End);
    }
    if t != topic {
        return Err(WireError::TopicMismatch {
            expected: String::from_utf8_lossy(topic).into_owned(),
            got: String::from_utf8_lossy(t).into_owned(),
        });
    }
    check_size(payload, max_message_bytes)?;
    decode_batch(payload, batch)?;
    Ok(HistoryFrame::Batch { seq })
}

/// The four frames of a history reply message, as the ROUTER sends them after the peer
/// identity.
pub fn encode_history_reply(topic: &[u8], seq: u64, payload: Vec<u8>) -> [Vec<u8>; 4] {
    [Vec::new(), topic.to_vec(), seq.to_be_bytes().to_vec(), payload]
}

/// The history end marker frames.
pub fn encode_history_end() -> [Vec<u8>; 4] {
    [Vec::new(), Vec::new(), SNAPSHOT_END_WATERMARK.to_be_bytes().to_vec(), Vec::new()]
}

/// The three frames of a live message.
pub fn encode_live(topic: &[u8], seq: u64, payload: Vec<u8>) -> [Vec<u8>; 3] {
    [topic.to_vec(), seq.to_be_bytes().to_vec(), payload]
}

/// The three frames of a snapshot reply, as the ROUTER sends them after the peer identity.
pub fn encode_snapshot_reply(watermark: u64, payload: Vec<u8>) -> [Vec<u8>; 3] {
    [Vec::new(), watermark.to_be_bytes().to_vec(), payload]
}

/// The snapshot terminator frames.
pub fn encode_snapshot_end() -> [Vec<u8>; 3] {
    [Vec::new(), SNAPSHOT_END_WATERMARK.to_be_bytes().to_vec(), Vec::new()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord};
    use crate::wire::{encode_batch, Tier};

    fn payload() -> Vec<u8> {
        let rec = BatchRecord {
            timestamp: 1.0,
            events: vec![EventRecord::cleared(Some(Tier::Host))],
            dp_rank: Some(0),
        };
        encode_batch(&rec, BatchForm::Array, EventForm::Map)
    }

    #[test]
    fn live_message_checks_frames_topic_sequence_and_size() {
        let mut b = Batch::default();
        let frames = encode_live(b"kv", 42, payload());
        assert_eq!(decode_live(&frames, b"kv", 1 << 20, &mut b), Ok(42));
        assert_eq!(b.events.len(), 1);

        let err = decode_live(&frames, b"k", 1 << 20, &mut b).unwrap_err();
        assert_eq!(err.to_string(), "topic \"kv\" does not match the configured topic \"k\"");
        let err = decode_live(&frames[..2], b"kv", 1 << 20, &mut b).unwrap_err();
        assert_eq!(err, WireError::FrameCount(2));
        let short = [b"kv".to_vec(), vec![0; 4], payload()];
        let err = decode_live(&short, b"kv", 1 << 20, &mut b).unwrap_err();
        assert_eq!(err, WireError::SequenceLength { field: "sequence", len: 4 });
        let err = decode_live(&frames, b"kv", 3, &mut b).unwrap_err();
        assert!(matches!(err, WireError::MessageTooLarge { limit: 3, .. }), "{err}");
    }

    #[test]
    fn history_reply_then_end_marker_and_a_snapshot_shape_named() {
        let mut b = Batch::default();
        let reply = encode_history_reply(b"kv", 7, payload());
        assert_eq!(
            decode_history_frame(&reply, b"kv", 1 << 20, &mut b),
            Ok(HistoryFrame::Batch { seq: 7 })
        );
        assert_eq!(b.events.len(), 1);
        let end = encode_history_end();
        assert_eq!(decode_history_frame(&end, b"kv", 1 << 20, &mut b), Ok(HistoryFrame::End));
        let err = decode_history_frame(&reply, b"other", 1 << 20, &mut b).unwrap_err();
        assert!(matches!(err, WireError::TopicMismatch { .. }), "{err}");
        let snapshot = encode_snapshot_reply(7, payload());
        let err = decode_history_frame(&snapshot, b"kv", 1 << 20, &mut b).unwrap_err();
        assert!(err.to_string().ends_with("set \"replay\": \"snapshot\" for this stream"), "{err}");
        let err = decode_snapshot_frame(&reply, 1 << 20, &mut b).unwrap_err();
        assert!(err.to_string().contains("4 frames are a history replay"), "{err}");
    }

    #[test]
    fn snapshot_reply_then_terminator() {
        let mut b = Batch::default();
        let reply = encode_snapshot_reply(7, payload());
        assert_eq!(
            decode_snapshot_frame(&reply, 1 << 20, &mut b),
            Ok(SnapshotFrame::Reply { watermark: 7 })
        );
        assert_eq!(
            decode_snapshot_frame(&encode_snapshot_end(), 1 << 20, &mut b),
            Ok(SnapshotFrame::End)
        );
        let bad = [vec![1], 7u64.to_be_bytes().to_vec(), payload()];
        assert_eq!(
            decode_snapshot_frame(&bad, 1 << 20, &mut b),
            Err(WireError::SnapshotDelimiter(1))
        );
        let empty = encode_snapshot_reply(7, Vec::new());
        assert_eq!(
            decode_snapshot_frame(&empty, 1 << 20, &mut b),
            Err(WireError::EmptySnapshotPayload(7))
        );
    }
}
