//! Decoded batch types. A [`Batch`] owns two flat arenas (engine hashes and token ids); events
//! refer to them by [`Span`], so decoding into a reused batch allocates nothing per event.

use std::fmt;

use super::group::Group;

/// An engine's block hash in canonical form (protocol.md section 2.2): an integer as itself
/// (negative values bit-cast to u64), a `bin` of up to 16 bytes as a big-endian number, a longer
/// `bin` reduced to 128 bits with XXH3-128. Only an identifier, never used for matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineHash(pub u128);

impl EngineHash {
    /// Canonical form of a `bin` hash of 1..=64 bytes (the caller checks the length).
    pub fn from_bin(bytes: &[u8]) -> Self {
        if bytes.len() <= 16 {
            EngineHash(bytes.iter().fold(0u128, |acc, b| (acc << 8) | u128::from(*b)))
        } else {
            EngineHash(xxhash_rust::xxh3::xxh3_128(bytes))
        }
    }
}

impl fmt::Display for EngineHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A residency tier of one engine's prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Accelerator memory (`gpu`, or no medium).
    Device,
    /// Host memory offload (`cpu`, `cpu_*`).
    Host,
}

impl Tier {
    /// Both tiers, Device first.
    pub const ALL: [Tier; 2] = [Tier::Device, Tier::Host];

    /// Maps a wire medium (case-insensitive) to a tier; `None` means out of scope (`disk`, ...).
    pub fn from_medium(medium: Option<&[u8]>) -> Option<Tier> {
        let Some(m) = medium else { return Some(Tier::Device) };
        if m.eq_ignore_ascii_case(b"gpu") {
            Some(Tier::Device)
        } else if m.eq_ignore_ascii_case(b"cpu")
            || (m.len() >= 4 && m[..4].eq_ignore_ascii_case(b"cpu_"))
        {
            Some(Tier::Host)
        } else {
            None
        }
    }

    /// The medium name the encoders write for this tier.
    pub fn medium(self) -> &'static str {
        match self {
            Tier::Device => "GPU",
            Tier::Host => "CPU",
        }
    }
}

/// A range of one of a batch's arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Span {
    /// First element.
    pub start: u32,
    /// Number of elements.
    pub len: u32,
}

impl Span {
    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// A decoded `BlockStored` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stored {
    /// The stored blocks' hashes, in prefix order.
    pub hashes: Span,
    /// The block before the first one; `None` starts a new prefix at token 0.
    pub parent: Option<EngineHash>,
    /// `block_size * hashes.len` token ids, or none for a tokenless replica event.
    pub tokens: Span,
    /// The engine's block size as sent.
    pub block_size: u32,
    /// Where the blocks now reside.
    pub tier: Tier,
    /// The LoRA adapter's namespace tag ([`super::Namespace::lora_name`] of `lora_name`,
    /// else `lora_id`); 0 for the base model (protocol.md section 1.1).
    pub lora: u64,
    /// The request salt's tag ([`super::Namespace::salt`] of the `cache_salt` that vLLM
    /// puts in the first block's `extra_keys`); 0 for none. Only a store with no parent has
    /// one: its first block is keyed in the salt's namespace, and the blocks chained to it
    /// follow by chaining.
    pub salt: u64,
    /// The KV cache group that stored the blocks, with its kind (see `group.rs`).
    pub group: Group,
}

/// One event the index acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// Blocks entered a tier.
    Stored(Stored),
    /// Blocks entered a tier with multimodal context (their `extra_keys` entry):
    /// outside the index's scope. Only their hashes are kept, so that
    /// the text blocks that chain to them (vLLM marks only the blocks that carry the context)
    /// are known to be out of scope too rather than taken for children of an unknown parent.
    OutOfScope {
        /// The blocks' hashes, in prefix order.
        hashes: Span,
        /// Where they now reside.
        tier: Tier,
    },
    /// Blocks left a tier.
    Removed {
        /// The removed blocks' hashes.
        hashes: Span,
        /// The tier they left.
        tier: Tier,
        /// The KV cache group they left (its kind is not sent with removals).
        group: Group,
    },
    /// Every block left one tier (`Some`) or both (`None`).
    Cleared {
        /// The tier cleared, or `None` for all.
        tier: Option<Tier>,
    },
}

/// Events dropped by the decoder, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SkipCounts {
    /// Event types this version does not know.
    pub unknown_type: u64,
    /// Media other than Device and Host (`storage`, `disk`, ...).
    pub out_of_scope_medium: u64,
    /// Events with multimodal or salt (extra key) context. LoRA events are indexed in their
    /// adapter's namespace and no longer counted here.
    pub lora_or_multimodal: u64,
}

impl SkipCounts {
    /// Adds another count into this one.
    pub fn add(&mut self, other: &SkipCounts) {
        self.unknown_type += other.unknown_type;
        self.out_of_scope_medium += other.out_of_scope_medium;
        self.lora_or_multimodal += other.lora_or_multimodal;
    }

    /// All skipped events.
    pub fn total(&self) -> u64 {
        self.unknown_type + self.out_of_scope_medium + self.lora_or_multimodal
    }
}

/// One decoded batch: `[timestamp, events, dp_rank]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// The publisher's timestamp, seconds.
    pub timestamp: f64,
    /// The publisher's data-parallel rank (0 when absent).
    pub dp_rank: u32,
    /// The in-scope events, in order.
    pub events: Vec<Event>,
    /// Events the decoder dropped.
    pub skipped: SkipCounts,
    hashes: Vec<EngineHash>,
    tokens: Vec<i32>,
}

impl Batch {
    /// Empties the batch, keeping its allocations.
    pub fn clear(&mut self) {
        self.timestamp = 0.0;
        self.dp_rank = 0;
        self.events.clear();
        self.skipped = SkipCounts::default();
        self.hashes.clear();
        self.tokens.clear();
    }

    /// The hashes a span refers to.
    pub fn hashes(&self, span: Span) -> &[EngineHash] {
        &self.hashes[span.range()]
    }

    /// The token ids a span refers to.
    pub fn tokens(&self, span: Span) -> &[i32] {
        &self.tokens[span.range()]
    }

    /// Number of blocks named by in-scope events (stored and removed).
    pub fn block_count(&self) -> usize {
        self.events
            .iter()
            .map(|e| match e {
                Event::Stored(s) => s.hashes.len as usize,
                Event::OutOfScope { hashes, .. } | Event::Removed { hashes, .. } => {
                    hashes.len as usize
                }
                Event::Cleared { .. } => 0,
            })
            .sum()
    }

    /// Approximate heap bytes held, for buffering budgets.
    pub fn heap_bytes(&self) -> usize {
        self.events.capacity() * std::mem::size_of::<Event>()
            + self.hashes.capacity() * std::mem::size_of::<EngineHash>()
            + self.tokens.capacity() * std::mem::size_of::<i32>()
    }

    /// Whether this batch is a full state: an unlimited `AllBlocksCleared` followed only by
    /// `BlockStored` events (in or out of scope). Applying it restores synchronization
    /// (protocol.md section 2.2).
    pub fn is_full_state(&self) -> bool {
        matches!(self.events.first(), Some(Event::Cleared { tier: None }))
            && self.events[1..]
                .iter()
                .all(|e| matches!(e, Event::Stored(_) | Event::OutOfScope { .. }))
    }

    /// Whether an `AllBlocksCleared` (every tier) is among the events: what follows it is
    /// known from the batch alone.
    pub fn clears_all(&self) -> bool {
        self.events.iter().any(|e| matches!(e, Event::Cleared { tier: None }))
    }

    /// Appends a `BlockStored` event.
    pub fn push_stored(
        &mut self,
        hashes: &[EngineHash],
        parent: Option<EngineHash>,
        tokens: &[i32],
        block_size: u32,
        tier: Tier,
    ) {
        self.push_stored_in(hashes, parent, tokens, block_size, tier, 0);
    }

    /// [`Self::push_stored`] in LoRA namespace `lora` (a `Namespace::lora_name` tag).
    pub fn push_stored_in(
        &mut self,
        hashes: &[EngineHash],
        parent: Option<EngineHash>,
        tokens: &[i32],
        block_size: u32,
        tier: Tier,
        lora: u64,
    ) {
        let hashes = self.push_hashes(hashes);
        let tokens = self.push_tokens(tokens);
        let group = Group::default();
        let stored = Stored { hashes, parent, tokens, block_size, tier, lora, salt: 0, group };
        self.events.push(Event::Stored(stored));
    }

    /// [`Self::push_stored`] by KV cache group `group` (a hybrid model's group, with its kind).
    pub fn push_stored_by(
        &mut self,
        hashes: &[EngineHash],
        parent: Option<EngineHash>,
        tokens: &[i32],
        block_size: u32,
        tier: Tier,
        group: Group,
    ) {
        self.push_stored(hashes, parent, tokens, block_size, tier);
        if let Some(Event::Stored(s)) = self.events.last_mut() {
            s.group = group;
        }
    }

    /// [`Self::push_stored`] with the token ids written by `fill` into `tokens` zeroed slots,
    /// for a caller that converts ids on the way in: they are then written once, not copied
    /// again from the caller's buffer.
    pub fn push_stored_with(
        &mut self,
        hashes: &[EngineHash],
        parent: Option<EngineHash>,
        tokens: usize,
        block_size: u32,
        tier: Tier,
        fill: impl FnOnce(&mut [i32]),
    ) {
        let hashes = self.push_hashes(hashes);
        let start = self.tokens.len() as u32;
        fill(self.token_slots(tokens));
        let tokens = Span { start, len: tokens as u32 };
        let group = Group::default();
        let stored = Stored { hashes, parent, tokens, block_size, tier, lora: 0, salt: 0, group };
        self.events.push(Event::Stored(stored));
    }

    /// Appends a `BlockStored` event of out-of-scope blocks (see [`Event::OutOfScope`]).
    pub fn push_out_of_scope(&mut self, hashes: &[EngineHash], tier: Tier) {
        let hashes = self.push_hashes(hashes);
        self.events.push(Event::OutOfScope { hashes, tier });
    }

    /// Appends a `BlockRemoved` event.
    pub fn push_removed(&mut self, hashes: &[EngineHash], tier: Tier) {
        self.push_removed_from(hashes, tier, Group::default());
    }

    /// [`Self::push_removed`] from KV cache group `group`.
    pub fn push_removed_from(&mut self, hashes: &[EngineHash], tier: Tier, group: Group) {
        let hashes = self.push_hashes(hashes);
        self.events.push(Event::Removed { hashes, tier, group });
    }

    /// Appends an `AllBlocksCleared` event.
    pub fn push_cleared(&mut self, tier: Option<Tier>) {
        self.events.push(Event::Cleared { tier });
    }

    fn push_hashes(&mut self, hashes: &[EngineHash]) -> Span {
        let start = self.hashes.len() as u32;
        self.hashes.extend_from_slice(hashes);
        Span { start, len: hashes.len() as u32 }
    }

    fn push_tokens(&mut self, tokens: &[i32]) -> Span {
        let start = self.tokens.len() as u32;
        self.tokens.extend_from_slice(tokens);
        Span { start, len: tokens.len() as u32 }
    }

    /// Arena access for the decoder: appends one hash.
    pub(super) fn arena_hash(&mut self, h: EngineHash) {
        self.hashes.push(h);
    }

    /// Arena access for the decoder: appends `n` zeroed token slots and returns them, so the
    /// decoder's fast path fills ids by index instead of pushing one at a time.
    pub(super) fn token_slots(&mut self, n: usize) -> &mut [i32] {
        let start = self.tokens.len();
        self.tokens.resize(start + n, 0);
        &mut self.tokens[start..]
    }

    /// Arena lengths, to open spans and roll back a dropped event.
    pub(super) fn arena_marks(&self) -> (u32, u32) {
        (self.hashes.len() as u32, self.tokens.len() as u32)
    }

    /// Drops arena entries written after `marks`.
    pub(super) fn arena_truncate(&mut self, marks: (u32, u32)) {
        self.hashes.truncate(marks.0 as usize);
        self.tokens.truncate(marks.1 as usize);
    }

    /// Drops token ids written after `mark`, keeping the hashes: an event whose tokens are not
    /// needed is the last one written, so its tokens end the arena.
    pub(super) fn tokens_truncate(&mut self, mark: u32) {
        self.tokens.truncate(mark as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bin_hashes_up_to_16_bytes_are_big_endian_numbers() {
        assert_eq!(EngineHash::from_bin(&[0x01, 0x02]), EngineHash(0x0102));
        let sixteen: Vec<u8> = (1..=16).collect();
        assert_eq!(EngineHash::from_bin(&sixteen).0.to_be_bytes().to_vec(), sixteen);
        let long = [7u8; 32];
        assert_eq!(EngineHash::from_bin(&long), EngineHash(xxhash_rust::xxh3::xxh3_128(&long)));
    }

    #[test]
    fn medium_mapping_is_case_insensitive_and_scoped() {
        assert_eq!(Tier::from_medium(None), Some(Tier::Device));
        assert_eq!(Tier::from_medium(Some(b"GPU")), Some(Tier::Device));
        assert_eq!(Tier::from_medium(Some(b"cpu")), Some(Tier::Host));
        assert_eq!(Tier::from_medium(Some(b"CPU_pinned")), Some(Tier::Host));
        assert_eq!(Tier::from_medium(Some(b"cpu_")), Some(Tier::Host));
        assert_eq!(Tier::from_medium(Some(b"cpux")), None);
        assert_eq!(Tier::from_medium(Some(b"disk")), None);
        assert_eq!(Tier::from_medium(Some(b"storage")), None);
    }

    #[test]
    fn full_state_is_an_unlimited_clear_then_only_stores() {
        let mut b = Batch::default();
        b.push_cleared(None);
        b.push_stored(&[EngineHash(1)], None, &[1, 2], 2, Tier::Device);
        assert!(b.is_full_state());
        b.push_removed(&[EngineHash(1)], Tier::Device);
        assert!(!b.is_full_state());
        let mut limited = Batch::default();
        limited.push_cleared(Some(Tier::Host));
        assert!(!limited.is_full_state());
    }
}
