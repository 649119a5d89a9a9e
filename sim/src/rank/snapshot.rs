//! The replay endpoint of a rank: requests, and the xLLM snapshot reply (protocol.md
//! section 3, publisher side). The vLLM dialect's history reply is in `history`.
//!
//! The ROUTER receives `[identity, "", start_seq]` and answers `[identity, "", watermark,
//! payload]` then `[identity, "", u64::MAX, ""]`. The payload is a full state (every resident
//! block on both tiers, parent-first), not history, so `start_seq` is only logged. The watermark
//! is the next sequence number the rank will publish: the first live batch not contained in the
//! snapshot. A [`SnapshotMode`] fault changes what is sent.

use kvdir::wire::{encode_snapshot_end, encode_snapshot_reply};
use tracing::{debug, warn};

use super::RankState;
use crate::fault::{malformed_payload, SnapshotMode};
use crate::Dialect;

impl RankState {
    /// Answers every pending replay request without blocking, as a snapshot or (vLLM) from
    /// the history; whether there was any.
    pub(crate) fn serve_replays(&mut self) -> bool {
        let mut served = false;
        loop {
            let Some(sockets) = self.sockets.as_ref() else { return served };
            match sockets.router.recv_multipart(zmq::DONTWAIT) {
                Ok(request) => {
                    if let Some((identity, start_seq)) = self.parse_request(&request) {
                        match self.config.dialect {
                            Dialect::Vllm => self.answer_history(identity, start_seq),
                            _ => self.answer_snapshot(identity, start_seq),
                        }
                    }
                    served = true;
                }
                Err(zmq::Error::EAGAIN) => return served,
                Err(e) => {
                    warn!(engine = %self.config.name, rank = self.rank, error = %e, "replay receive failed");
                    return served;
                }
            }
        }
    }

    /// `(identity, start_seq)` of a well-formed request `[identity, "", start_seq as 8 bytes
    /// big-endian]`; any other shape is logged and gets no answer.
    fn parse_request<'r>(&self, request: &'r [Vec<u8>]) -> Option<(&'r [u8], u64)> {
        let rank = self.rank;
        let [identity, delimiter, start] = request else {
            warn!(rank, frames = request.len(), "replay request ignored: expected 3 frames");
            return None;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else {
            warn!(rank, len = start.len(), "replay request ignored: start_seq is not 8 bytes");
            return None;
        };
        if !delimiter.is_empty() {
            warn!(rank, "replay request ignored: no empty delimiter frame");
            return None;
        }
        Some((identity, u64::from_be_bytes(start)))
    }

    fn answer_snapshot(&self, identity: &[u8], start_seq: u64) {
        let watermark = self.next_seq;
        let mode = self.faults.snapshot;
        debug!(rank = self.rank, start_seq, watermark, ?mode, "snapshot request");
        for frames in self.replies(mode) {
            self.send_reply(identity, frames);
        }
    }

    /// The messages (after the identity) a snapshot request gets in `mode`.
    fn replies(&self, mode: SnapshotMode) -> Vec<[Vec<u8>; 3]> {
        let watermark = self.next_seq;
        let full_state = || self.encode(self.cache.full_state());
        match mode {
            SnapshotMode::Normal => {
                vec![encode_snapshot_reply(watermark, full_state()), encode_snapshot_end()]
            }
            SnapshotMode::Stall => Vec::new(),
            SnapshotMode::Truncate => vec![encode_snapshot_reply(watermark, full_state())],
            SnapshotMode::Refuse => vec![encode_snapshot_end()],
            SnapshotMode::Malformed => {
                vec![encode_snapshot_reply(watermark, malformed_payload()), encode_snapshot_end()]
            }
        }
    }

    /// Sends `frames` to the peer `identity` on the ROUTER.
    pub(super) fn send_reply<const N: usize>(&self, identity: &[u8], frames: [Vec<u8>; N]) {
        let Some(sockets) = self.sockets.as_ref() else { return };
        let message = std::iter::once(identity.to_vec()).chain(frames);
        if let Err(e) = sockets.router.send_multipart(message, 0) {
            warn!(rank = self.rank, error = %e, "replay reply failed");
        }
    }
}
