//! [`StreamCounters`]: the counters of one stream that `/metrics` exposes, kept by the stream's
//! thread (applied events) and its worker (recoveries).

use std::sync::atomic::{AtomicU64, Ordering};

use kvdir::metrics::Histogram;
use kvdir::stream::{StreamFault, FAULT_LABELS};
use kvdir::wire::{Batch, Event, Tier};

/// Counters of one stream, shared by its index actor (applied events) and worker (recoveries).
#[derive(Debug, Default)]
pub struct StreamCounters {
    /// Live batches applied to the index.
    pub batches_applied: AtomicU64,
    /// Blocks stored, by tier (Device, Host).
    pub blocks_stored: [AtomicU64; 2],
    /// Blocks removed, by tier.
    pub blocks_removed: [AtomicU64; 2],
    /// `AllBlocksCleared` events applied.
    pub cleared: AtomicU64,
    /// How long each successful snapshot recovery took.
    pub recovery: Histogram,
    /// Losses of credit, by [`StreamFault::label_index`].
    pub faults: [AtomicU64; FAULT_LABELS.len()],
}

fn tier_index(t: Tier) -> usize {
    match t {
        Tier::Device => 0,
        Tier::Host => 1,
    }
}

impl StreamCounters {
    /// Counts the events of a batch the index applied.
    pub fn count_batch(&self, batch: &Batch) {
        self.batches_applied.fetch_add(1, Ordering::Relaxed);
        for ev in &batch.events {
            let (slot, n) = match ev {
                Event::Stored(s) => (&self.blocks_stored[tier_index(s.tier)], s.hashes.len),
                Event::Removed { hashes, tier, .. } => {
                    (&self.blocks_removed[tier_index(*tier)], hashes.len)
                }
                Event::Cleared { .. } => (&self.cleared, 1),
                // Not indexed; counted as skipped by the decoder.
                Event::OutOfScope { .. } => continue,
            };
            slot.fetch_add(u64::from(n), Ordering::Relaxed);
        }
    }

    /// Counts a loss of credit by its bounded reason.
    pub fn count_fault(&self, fault: &StreamFault) {
        self.faults[fault.label_index()].fetch_add(1, Ordering::Relaxed);
    }
}
