//! What a stream reports about itself with every publish ([`StreamStatus`]), and the settings
//! a stream's writer is made with ([`IndexConfig`]).

/// The per-stream settings the index needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// Tokens per block; must match the engine's `--block_size`.
    pub block_size: u32,
    /// Seed of the content keys (`hash_seed`, default 1024).
    pub hash_seed: u64,
    /// The stream's salt tag ([`super::Namespace::salt`]; 0 = none): every block it stores is
    /// keyed in that salt's namespace (protocol.md section 1.1).
    pub salt: u64,
    /// `max_blocks_per_stream`: engine blocks held, each with its content entry and hash mapping.
    pub max_blocks: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { block_size: 128, hash_seed: 1024, salt: 0, max_blocks: 262_144 }
    }
}

/// What a stream reports about itself with every publish.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamStatus {
    /// A valid snapshot plus continuous deltas; when false every hit is zero.
    pub synchronized: bool,
    /// The last applied sequence number, if any.
    pub sequence: Option<u64>,
    /// Resident engine blocks on Device.
    pub device_blocks: u64,
    /// Resident engine blocks on Host (replicas of Device blocks included).
    pub host_blocks: u64,
    /// Why the stream is unsynchronized.
    pub error: Option<String>,
    /// The stream's history did not reach back to its engine's start: it credits only blocks
    /// learned from events seen, and skips stores whose parents it never saw, until the next
    /// `AllBlocksCleared` (or snapshot) makes it exact.
    pub partial: bool,
    /// Not a stream: an engine without KV events, credited from kvdir's own routing
    /// (`kvdir::car::ApproxCache`); its hits are assumptions.
    pub approximate: bool,
    /// A hybrid stream's attention classes (its KV cache groups by kind), full attention
    /// first; empty for a dense stream (one group, full attention).
    pub attention: Vec<super::AttentionClass>,
    /// Hashes stored by a group without content that no store has located yet: they give no
    /// credit (a sliding-window model with no full-attention group, at vLLM's default
    /// retention, has only these).
    pub unlocated_blocks: u64,
}
