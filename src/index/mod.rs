//! The prefix index: content keys, every stream's engine blocks, and the one shared view that
//! queries walk.
//!
//! Layout (see `docs/design.md` for why):
//! - one [`SharedIndex`] per `(block_size, hash_seed)` and 128 streams holds the view queries read:
//!   `content key -> (Device streams, Host streams)`, with each stream's status and label
//!   (`shared/`). A query walks it once for all streams ([`SharedHandle`]), hashing the prompt
//!   into content keys ([`KeyHasher`], `key.rs`, in the query's [`Namespace`]) as it goes;
//!   a fleet of more than [`MAX_STREAMS`] streams has several indexes, whose walks of one query
//!   share its keys ([`PromptKeys`], `prompt.rs`), so that each block is hashed once;
//! - each stream's [`StreamWriter`] owns `engine hash -> (content key, tiers)` (`apply/`,
//!   `blocks.rs`, `retired.rs`): the truth for parents, removals and tokenless replica events,
//!   counting resident blocks per tier. It applies batches and builds snapshots
//!   ([`SharedSnapshot`]) on its own thread, and commits the resulting changes to the view,
//!   where a publish makes them visible at once.
//!
//! Invariants: a stream's bit for a content key is set exactly when some in-scope engine block
//! of that stream with that key is resident on that tier (out-of-scope blocks are held by hash
//! only, never in the view, and retired blocks, which left their last tier, by hash and key in
//! a bounded memory for their children); an unsynchronized stream matches nothing; after any
//! error a stream accepts no live batch until a snapshot, a full-state batch or a history
//! replay (`shared/replay.rs`) replaces its contents.

mod apply;
mod blocks;
mod flat;
mod groups;
mod key;
mod namespace;
mod prompt;
mod retired;
mod shared;
mod status;

/// The wire's namespace, re-exported beside the keys it seeds.
pub use crate::wire::Namespace;
pub use apply::ApplyStats;
pub use groups::{class_key, AttentionClass};
pub use key::{ContentKey, KeyHasher, TokenId};
pub use namespace::Keys;
pub use prompt::PromptKeys;
pub use shared::{
    SharedError, SharedHandle, SharedIndex, SharedMatches, SharedReader, SharedSnapshot, SlotRead,
    StreamLabel, StreamWriter, ViewRead, MAX_STREAMS,
};
pub use status::{IndexConfig, StreamStatus};

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

#[cfg(test)]
mod hybrid_tests;
#[cfg(test)]
mod retire_tests;
#[cfg(test)]
mod scope_tests;
#[cfg(test)]
mod tests;
