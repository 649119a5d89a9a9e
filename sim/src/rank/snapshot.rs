//! The snapshot (replay) endpoint of a rank, protocol.md section 3, publisher side.
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

impl RankState {
    /// Answers every pending snapshot request without blocking; whether there was any.
    pub(super) fn serve_snapshots(&mut self) -> bool {
        let mut served = false;
        loop {
            let Some(sockets) = self.sockets.as_ref() else { return served };
            match sockets.router.recv_multipart(zmq::DONTWAIT) {
                Ok(request) => {
                    self.answer(request);
                    served = true;
                }
                Err(zmq::Error::EAGAIN) => return served,
                Err(e) => {
                    warn!(engine = %self.config.name, rank = self.rank, error = %e, "snapshot receive failed");
                    return served;
                }
            }
        }
    }

    fn answer(&self, request: Vec<Vec<u8>>) {
        let rank = self.rank;
        let [identity, delimiter, start] = request.as_slice() else {
            warn!(rank, frames = request.len(), "snapshot request ignored: expected 3 frames");
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else {
            warn!(rank, len = start.len(), "snapshot request ignored: start_seq is not 8 bytes");
            return;
        };
        if !delimiter.is_empty() {
            warn!(rank, "snapshot request ignored: no empty delimiter frame");
            return;
        }
        let watermark = self.next_seq;
        let mode = self.faults.snapshot;
        debug!(rank, start_seq = u64::from_be_bytes(start), watermark, ?mode, "snapshot request");
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

    fn send_reply(&self, identity: &[u8], frames: [Vec<u8>; 3]) {
        let Some(sockets) = self.sockets.as_ref() else { return };
        let message = std::iter::once(identity.to_vec()).chain(frames);
        if let Err(e) = sockets.router.send_multipart(message, 0) {
            warn!(rank = self.rank, error = %e, "snapshot reply failed");
        }
    }
}
