//! [`CacheEvent`], the engine-side description of one published change, and [`EventLog`], which
//! collects a batch's events and merges a store that continues the previous one's chain into
//! it (one `BlockStored` for a run of new blocks, as engines do).

use kvdir::wire::Tier;

/// One change to a rank's cache, in engine terms (64-bit engine hashes). The rank thread turns
/// these into wire records in the configured dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// `BlockStored`: blocks entered `tier`. Empty `tokens` is a tokenless replica event (a
    /// Host copy of a block that is already known).
    Stored {
        /// Block hashes in prefix order; each block's parent is the one before it.
        hashes: Vec<u64>,
        /// The parent of the first block, `None` for a prefix starting at token 0.
        parent: Option<u64>,
        /// `block_size * hashes.len()` token ids, or none.
        tokens: Vec<i32>,
        /// Where the blocks now reside.
        tier: Tier,
        /// The request's `cache_salt` when the first block is a salted root (vLLM puts it in
        /// that block's `extra_keys`); `None` otherwise.
        salt: Option<String>,
    },
    /// `BlockRemoved`: blocks left `tier`.
    Removed {
        /// The removed blocks.
        hashes: Vec<u64>,
        /// The tier they left.
        tier: Tier,
    },
    /// `AllBlocksCleared` with no medium: the whole cache is empty.
    Cleared,
}

/// The events of one batch, in order.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    pub(crate) events: Vec<CacheEvent>,
}

impl EventLog {
    /// Records that block `hash` (child of `parent`) entered `tier`. Extends the previous event
    /// when it is a store on the same tier, of the same kind (with or without tokens), whose
    /// last block is `parent`.
    pub(crate) fn store(&mut self, hash: u64, parent: Option<u64>, tokens: &[i32], tier: Tier) {
        self.store_salted(hash, parent, tokens, tier, None);
    }

    /// [`EventLog::store`] of a block that may be a salted root (a root never continues the
    /// previous event, so its salt always opens a new one).
    pub(crate) fn store_salted(
        &mut self,
        hash: u64,
        parent: Option<u64>,
        tokens: &[i32],
        tier: Tier,
        salt: Option<&str>,
    ) {
        if let Some(CacheEvent::Stored { hashes, tokens: prev_tokens, tier: prev_tier, .. }) =
            self.events.last_mut()
        {
            let continues = parent.is_some() && hashes.last().copied() == parent;
            if continues && *prev_tier == tier && prev_tokens.is_empty() == tokens.is_empty() {
                hashes.push(hash);
                prev_tokens.extend_from_slice(tokens);
                return;
            }
        }
        self.events.push(CacheEvent::Stored {
            hashes: vec![hash],
            parent,
            tokens: tokens.to_vec(),
            tier,
            salt: salt.filter(|_| parent.is_none()).map(str::to_string),
        });
    }

    /// Records that `hashes` left `tier`, as one event (nothing when `hashes` is empty).
    pub(crate) fn removed(&mut self, hashes: Vec<u64>, tier: Tier) {
        if !hashes.is_empty() {
            self.events.push(CacheEvent::Removed { hashes, tier });
        }
    }

    /// Appends every event of `other`.
    pub(crate) fn append(&mut self, other: EventLog) {
        self.events.extend(other.events);
    }
}
