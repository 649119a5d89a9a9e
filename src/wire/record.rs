//! Owned, loosely typed batch records for the encoders.
//!
//! The simulator and the tests build these to publish events. They are deliberately looser than
//! the decoded [`super::Batch`]: a medium is any string, hashes keep their wire shape, and
//! LoRA/multimodal context and unknown event types can be expressed, so encoders can produce
//! every input the decoder must accept or skip.

use super::types::{EngineHash, Tier};

/// A block hash as it appears on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireHash {
    /// A MessagePack unsigned integer.
    Uint(u64),
    /// A MessagePack signed integer (negative values are bit-cast by the decoder).
    Int(i64),
    /// A MessagePack `bin` (vLLM's SHA-256 digests are 32 bytes).
    Bin(Vec<u8>),
}

impl WireHash {
    /// The canonical form the decoder produces for this hash.
    pub fn canonical(&self) -> EngineHash {
        match self {
            WireHash::Uint(v) => EngineHash(u128::from(*v)),
            WireHash::Int(v) => EngineHash(u128::from(*v as u64)),
            WireHash::Bin(b) => EngineHash::from_bin(b),
        }
    }
}

impl From<EngineHash> for WireHash {
    /// A hash that fits 64 bits goes out as an integer, a wider one as a 16-byte `bin`; both
    /// decode back to the same canonical value.
    fn from(h: EngineHash) -> Self {
        match u64::try_from(h.0) {
            Ok(v) => WireHash::Uint(v),
            Err(_) => WireHash::Bin(h.0.to_be_bytes().to_vec()),
        }
    }
}

impl From<u64> for WireHash {
    fn from(v: u64) -> Self {
        WireHash::Uint(v)
    }
}

/// A KV cache group as vLLM's hybrid allocator names it on an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    /// `group_idx`.
    pub idx: u32,
    /// `kv_cache_spec_kind` (stores only; `None` writes nil).
    pub kind: Option<String>,
    /// `kv_cache_spec_sliding_window` (stores only; `None` writes nil).
    pub window: Option<u32>,
}

/// A `BlockStored` event.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRecord {
    /// Block hashes, in prefix order.
    pub hashes: Vec<WireHash>,
    /// The parent block, or `None` for a prefix starting at token 0.
    pub parent: Option<WireHash>,
    /// Token ids (`block_size * hashes.len()`), or empty for a tokenless replica event.
    pub tokens: Vec<i32>,
    /// Tokens per block.
    pub block_size: u32,
    /// The medium string (`GPU`, `CPU`, ...), or `None` for nil.
    pub medium: Option<String>,
    /// LoRA adapter id; set means out of scope.
    pub lora_id: Option<i64>,
    /// LoRA adapter name; non-empty means out of scope.
    pub lora_name: Option<String>,
    /// vLLM's per-block `extra_keys`: one entry per block, a tuple of [`ExtraKey`]s or nil; an
    /// empty list is not written. A multimodal or embeddings entry puts that block and the ones
    /// after it out of scope; a lone string on a prefix's first block is its `cache_salt`.
    pub extra_keys: Vec<Option<Vec<ExtraKey>>>,
    /// The KV cache group fields (`group_idx`, `kv_cache_spec_kind`,
    /// `kv_cache_spec_sliding_window`), written after `extra_keys`; `None` writes none.
    pub group: Option<GroupRecord>,
}

/// One element of a block's `extra_keys` entry, in the shapes vLLM 0.32 publishes.
#[derive(Debug, Clone, PartialEq)]
pub enum ExtraKey {
    /// A string: the LoRA name or the request's `cache_salt`.
    Text(String),
    /// A multimodal item: `(mm_identifier, offset of the item in the block)`.
    Multimodal(String, i64),
    /// A prompt-embeddings digest.
    Bytes(Vec<u8>),
}

impl ExtraKey {
    /// The entry of a block that holds multimodal item `id` from its first token.
    pub fn image(id: &str) -> Option<Vec<ExtraKey>> {
        Some(vec![ExtraKey::Multimodal(id.to_string(), 0)])
    }

    /// The entry of a request's first block salted with `salt`.
    pub fn salt(salt: &str) -> Option<Vec<ExtraKey>> {
        Some(vec![ExtraKey::Text(salt.to_string())])
    }
}

impl StoredRecord {
    /// A plain in-scope store on `tier`.
    pub fn new(
        hashes: Vec<WireHash>,
        parent: Option<WireHash>,
        tokens: Vec<i32>,
        block_size: u32,
        tier: Tier,
    ) -> Self {
        StoredRecord {
            hashes,
            parent,
            tokens,
            block_size,
            medium: Some(tier.medium().to_string()),
            lora_id: None,
            lora_name: None,
            extra_keys: Vec::new(),
            group: None,
        }
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq)]
pub enum EventRecord {
    /// `BlockStored`.
    Stored(StoredRecord),
    /// `BlockRemoved`.
    Removed {
        /// Removed block hashes.
        hashes: Vec<WireHash>,
        /// The medium string, or `None` for nil.
        medium: Option<String>,
        /// `group_idx`, written after `medium` when set.
        group_idx: Option<u32>,
    },
    /// `AllBlocksCleared`, optionally limited to one medium.
    Cleared {
        /// The medium string, or `None` for every tier.
        medium: Option<String>,
    },
    /// An event type the decoder does not know; it must be skipped.
    Unknown {
        /// The `type` value.
        type_name: String,
    },
}

impl EventRecord {
    /// A `BlockRemoved` on `tier`.
    pub fn removed(hashes: Vec<WireHash>, tier: Tier) -> Self {
        EventRecord::Removed { hashes, medium: Some(tier.medium().to_string()), group_idx: None }
    }

    /// An `AllBlocksCleared`, limited to `tier` when given.
    pub fn cleared(tier: Option<Tier>) -> Self {
        EventRecord::Cleared { medium: tier.map(|t| t.medium().to_string()) }
    }
}

/// One batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRecord {
    /// Publisher timestamp, seconds.
    pub timestamp: f64,
    /// The events, in order.
    pub events: Vec<EventRecord>,
    /// DP rank; `None` leaves it out (decoders read 0).
    pub dp_rank: Option<u32>,
}

/// How a batch is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchForm {
    /// `[ts, events, dp_rank]` (xLLM); a `None` dp_rank writes nil.
    Array,
    /// `[ts, events]`: dp_rank omitted.
    ShortArray,
    /// `{ts, events, data_parallel_rank}` (vLLM); a `None` dp_rank omits the key.
    Map,
}

/// How each event is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventForm {
    /// A map tagged by `type`.
    Map,
    /// `[type, fields...]` in protocol order (vLLM and SGLang array-like encoding).
    Positional,
}
