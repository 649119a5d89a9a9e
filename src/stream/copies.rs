//! Telling the late live copy of a replayed batch from a restarted publisher's batch, for
//! certain: a history replay (vLLM, SGLang) answers the very batches the publisher sent live,
//! so the live copy of a replayed batch decodes to the same batch, timestamp included. A
//! restarted publisher numbers from 0 again, but its batches carry new timestamps (vLLM and
//! SGLang stamp each batch with the wall clock), so its batch 0 differs from the one replayed.
//!
//! [`ReplayedTail`] keeps a fingerprint of the last replayed batches that may still arrive
//! live; a live batch with a remembered sequence is a copy exactly when its fingerprint is the
//! same. A snapshot (xLLM) carries state, not batches: there is nothing to compare, and the
//! sequence rules of `is_copy` decide alone.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

use crate::wire::{Batch, Event};

/// Replayed batches remembered at most: the newest ones, which the live path may not have
/// delivered yet. A live copy older than these falls back to the sequence rules.
pub(super) const MAX_REMEMBERED: usize = 64;

/// Fingerprints of the newest replayed batches whose live copies may still arrive, by
/// sequence, ascending.
#[derive(Debug, Default)]
pub(super) struct ReplayedTail {
    batches: VecDeque<(u64, u64)>,
}

impl ReplayedTail {
    /// Remembers replayed batch `seq`; a remembered sequence at or after it (an older replay's)
    /// is forgotten first.
    pub(super) fn remember(&mut self, seq: u64, batch: &Batch) {
        while self.batches.back().is_some_and(|&(s, _)| s >= seq) {
            self.batches.pop_back();
        }
        if self.batches.len() == MAX_REMEMBERED {
            self.batches.pop_front();
        }
        self.batches.push_back((seq, fingerprint(batch)));
    }

    /// Live batch `seq` arrived: the copies of earlier batches can no longer come (a publisher
    /// sends in order on one connection), so they are forgotten.
    pub(super) fn passed(&mut self, seq: u64) {
        while self.batches.front().is_some_and(|&(s, _)| s < seq) {
            self.batches.pop_front();
        }
        if self.batches.is_empty() && self.batches.capacity() > 0 {
            self.batches = VecDeque::new(); // an idle stream holds nothing
        }
    }

    /// Whether live batch `seq` is the replayed one: `None` when `seq` is not remembered.
    pub(super) fn same(&self, seq: u64, batch: &Batch) -> Option<bool> {
        let &(_, f) = self.batches.iter().find(|&&(s, _)| s == seq)?;
        Some(f == fingerprint(batch))
    }

    /// Forgets everything: the stream's numbering starts over.
    pub(super) fn clear(&mut self) {
        self.batches = VecDeque::new();
    }
}

/// A 64-bit digest of everything a decoded batch says: its timestamp, rank, events (with the
/// hashes and token ids they name) and skipped-event counts.
pub(super) fn fingerprint(batch: &Batch) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3Default::new();
    batch.timestamp.to_bits().hash(&mut h);
    batch.dp_rank.hash(&mut h);
    batch.skipped.hash(&mut h);
    batch.events.len().hash(&mut h);
    for e in &batch.events {
        e.hash(&mut h);
        match e {
            Event::Stored(s) => {
                batch.hashes(s.hashes).hash(&mut h);
                batch.tokens(s.tokens).hash(&mut h);
            }
            Event::OutOfScope { hashes, .. } | Event::Removed { hashes, .. } => {
                batch.hashes(*hashes).hash(&mut h);
            }
            Event::Cleared { .. } => {}
        }
    }
    h.finish()
}
