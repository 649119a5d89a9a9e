//! One stream's tiered prefix index: content keys, the engine-hash map, and the read view.
//!
//! Layout (see the README's design notes for why):
//! - the writer ([`StreamIndex`]) owns `engine hash -> (content key, tiers)`; it is the truth for
//!   parents, removals and tokenless replica events, and counts resident blocks per tier;
//! - readers see `content key -> per-tier counts` through a `left-right` view ([`ViewHandle`]),
//!   published atomically after each batch or snapshot, so matching is one map probe per block
//!   with no lock and no message.
//!
//! Invariants: a content key is in the view exactly when some engine block with that key is
//! resident on some tier; an unsynchronized stream matches nothing; after any error the index
//! accepts no live batch until a snapshot or a full-state batch replaces its contents.

mod apply;
mod blocks;
mod flat;
mod key;
mod stream;
mod view;

pub use key::{ContentKey, KeyHasher};
pub use stream::{ApplyStats, IndexConfig, SnapshotBuilder, StreamIndex};
pub use view::{IndexReader, PrefixMatch, StreamStatus, ViewHandle};

use std::hash::{BuildHasherDefault, Hasher};

use thiserror::Error;

use crate::wire::EngineHash;

/// Why a batch or snapshot could not be applied. Every variant leaves the stream unsynchronized.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IndexError {
    /// A `BlockStored` block size differs from the stream's.
    #[error(
        "BlockStored block_size {got} does not match the stream's block_size {expected}; \
         configure block_size to the engine's --block_size"
    )]
    BlockSize {
        /// The stream's block size.
        expected: u32,
        /// The event's block size.
        got: u32,
    },
    /// A `BlockStored` token list does not cover its blocks exactly.
    #[error(
        "BlockStored has {tokens} token ids for {blocks} block hashes; expected 0 (tokenless) \
         or {expected} ({blocks} x block_size {block_size})"
    )]
    TokenCount {
        /// Token ids sent.
        tokens: usize,
        /// Block hashes sent.
        blocks: usize,
        /// `blocks * block_size`.
        expected: usize,
        /// The stream's block size.
        block_size: u32,
    },
    /// A live `BlockStored` names a parent this stream does not hold.
    #[error("unknown parent block hash {0}: an earlier event was missed; recovering by snapshot")]
    UnknownParent(EngineHash),
    /// A tokenless live `BlockStored` names a block this stream does not hold.
    #[error("tokenless BlockStored names unknown block hash {0}: its content was never seen")]
    UnknownHash(EngineHash),
    /// A block hash was stored again with different content.
    #[error("block hash {0} was stored again with different tokens or parent")]
    HashConflict(EngineHash),
    /// `max_blocks_per_stream` would be exceeded.
    #[error(
        "stream reached max_blocks_per_stream = {limit} blocks; raise max_blocks_per_stream or \
         lower the engine's cache size"
    )]
    LimitExceeded {
        /// The configured limit.
        limit: usize,
    },
    /// A live batch arrived while the stream waits for a snapshot or a full-state batch.
    #[error("stream is not synchronized ({0}); waiting for a snapshot or a full-state batch")]
    NotSynchronized(String),
}

/// A fast hasher for keys that are already hashes (content keys, engine hashes): it folds the
/// bytes and finishes with the murmur3 mixer, so every output bit depends on every input bit
/// even for small sequential engine hashes. For `std` maps of such keys; the index's own tables
/// are flat tables that hash their keys themselves.
#[derive(Debug, Default, Clone, Copy)]
pub struct MixHasher(u64);

impl Hasher for MixHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            self.0 = self.0.rotate_left(31);
        }
    }

    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// `BuildHasher` for [`MixHasher`].
pub type BuildMix = BuildHasherDefault<MixHasher>;

#[cfg(test)]
mod tests;
