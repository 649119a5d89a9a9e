//! The vLLM dialect's replay: a rank keeps its latest `buffer_steps` batches and answers a
//! replay request from them, as vLLM 0.32's `ZmqEventPublisher` does.
//!
//! The ROUTER receives `[identity, "", start_seq]` (8 bytes big-endian) and answers
//! `[identity, "", topic, seq, payload]` for every buffered batch with `seq >= start_seq`,
//! oldest first, then `[identity, "", "", 8 bytes of 0xFF, ""]`. It is history, not state:
//! when `start_seq` is older than the oldest buffered batch the reply starts later, and a
//! `start_seq` past the last batch gets only the end marker. A [`SnapshotMode`] fault changes
//! what is sent, as for snapshots: `Stall` sends nothing, `Truncate` no end marker, `Refuse`
//! only the end marker, `Malformed` every batch with a payload that is not MessagePack.

use tracing::debug;

use super::RankState;
use crate::fault::{malformed_payload, SnapshotMode};

/// The sequence frame of the end marker (vLLM's `(-1).to_bytes(8, "big", signed=True)`).
const HISTORY_END_SEQ: [u8; 8] = [0xFF; 8];

impl RankState {
    /// Keeps `(seq, payload)` in the history, dropping the oldest batch beyond `buffer_steps`.
    pub(super) fn remember(&mut self, seq: u64, payload: &[u8]) {
        self.history.push_back((seq, payload.to_vec()));
        while self.history.len() > self.config.buffer_steps {
            self.history.pop_front();
        }
    }

    /// Answers one well-formed replay request from the history.
    pub(super) fn answer_history(&self, identity: &[u8], start_seq: u64) {
        let mode = self.faults.snapshot;
        let oldest = self.history.front().map(|(seq, _)| *seq);
        debug!(rank = self.rank, start_seq, ?oldest, ?mode, "history replay request");
        if mode == SnapshotMode::Stall {
            return;
        }
        if mode != SnapshotMode::Refuse {
            let topic = self.config.topic.as_bytes();
            for (seq, payload) in self.history.iter().filter(|(seq, _)| *seq >= start_seq) {
                let payload = if mode == SnapshotMode::Malformed {
                    malformed_payload()
                } else {
                    payload.clone()
                };
                let frames = [Vec::new(), topic.to_vec(), seq.to_be_bytes().to_vec(), payload];
                self.send_reply(identity, frames);
            }
        }
        if mode != SnapshotMode::Truncate {
            let end = [Vec::new(), Vec::new(), HISTORY_END_SEQ.to_vec(), Vec::new()];
            self.send_reply(identity, end);
        }
    }
}
