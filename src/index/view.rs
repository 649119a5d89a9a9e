//! The published read view of one stream, and prefix matching against it.
//!
//! The view is a `left-right` pair: readers take a [`ViewHandle`] and read one copy without locks
//! or messages, while the single writer ([`super::StreamIndex`]) appends operations and publishes
//! them all at once. A reader therefore sees either everything of a publish or nothing of it; a
//! half-applied batch or snapshot is never visible. The view holds what matching needs: content
//! key -> per-tier reference counts, plus the stream's status (sync flag, sequence, counts).

use std::sync::Arc;

use left_right::{Absorb, ReadHandle, ReadHandleFactory};

use super::flat::{FlatKey, FlatTable, Vacancy};
use super::key::ContentKey;
use crate::wire::Tier;

/// How many resident engine blocks carry a content key, per tier. Counts rather than flags keep
/// the view exact when two engine hashes ever name the same content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Presence {
    pub device: u32,
    pub host: u32,
}

impl Presence {
    fn count(&mut self, tier: Tier) -> &mut u32 {
        match tier {
            Tier::Device => &mut self.device,
            Tier::Host => &mut self.host,
        }
    }
}

/// A content key with no resident block is not in the map, so all-zero counts mark a vacant slot.
impl Vacancy for Presence {
    fn is_vacant(&self) -> bool {
        self.device == 0 && self.host == 0
    }
}

impl FlatKey for ContentKey {
    const FILLER: Self = ContentKey([0; 16]);

    /// Content keys are XXH3 digests, uniform in every bit: the low 64 bits need no mixing.
    fn hash64(&self) -> u64 {
        let [a, b, c, d, e, f, g, h, ..] = self.0;
        u64::from_le_bytes([a, b, c, d, e, f, g, h])
    }
}

pub(crate) type PresenceMap = FlatTable<ContentKey, Presence>;

/// What a stream reports about itself with every published view.
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
}

/// The data behind one copy of the view.
#[derive(Debug, Clone)]
pub(crate) struct ViewData {
    map: PresenceMap,
    status: Arc<StreamStatus>,
}

impl ViewData {
    /// An empty view of a stream of at most `max_blocks` blocks.
    pub(crate) fn new(max_blocks: usize) -> Self {
        ViewData { map: PresenceMap::with_limit(max_blocks), status: Arc::default() }
    }
}

/// A resident engine block with content `key` entered (`add`) or left `tier`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Change {
    pub key: ContentKey,
    pub tier: Tier,
    pub add: bool,
}

/// One change to the view.
#[derive(Debug)]
pub(crate) enum ViewOp {
    /// A batch's block changes, in order: one operation per batch rather than per block, so
    /// that applying them can load a group of slots ahead ([`apply_changes`]).
    Changes(Vec<Change>),
    ClearTier(Tier),
    ClearAll,
    Replace(Box<PresenceMap>),
    Status(Arc<StreamStatus>),
}

/// How far ahead of the change being applied its map slot is prefetched: the map does not fit
/// in cache, and misses started early overlap with the work on the changes before them.
const AHEAD: usize = 16;

/// Applies changes in order.
pub(crate) fn apply_changes(map: &mut PresenceMap, changes: &[Change]) {
    for (i, c) in changes.iter().enumerate() {
        prefetch_ahead(map, changes, i);
        apply_change(map, c);
    }
}

/// Before `changes[i]` is applied to `map` (this view's or the shared one): prefetches the
/// slot of the change [`AHEAD`] places on, and before the first change, those of the first
/// [`AHEAD`].
pub(crate) fn prefetch_ahead<V: Vacancy>(
    map: &FlatTable<ContentKey, V>,
    changes: &[Change],
    i: usize,
) {
    if i == 0 {
        changes.iter().take(AHEAD).for_each(|c| map.prefetch(&c.key));
    }
    if let Some(ahead) = changes.get(i + AHEAD) {
        map.prefetch(&ahead.key);
    }
}

fn apply_change(map: &mut PresenceMap, c: &Change) {
    match map.find(&c.key) {
        Ok(slot) => {
            let p = map.at_mut(slot);
            let n = p.count(c.tier);
            *n = if c.add { *n + 1 } else { n.saturating_sub(1) };
            if p.is_vacant() {
                map.remove_at(slot);
            }
        }
        Err(at) if c.add => {
            let mut p = Presence::default();
            *p.count(c.tier) = 1;
            map.insert_at(at, c.key, p);
        }
        Err(_) => {}
    }
}

/// Applies a change to a map; `Status` is not a map change and is ignored.
pub(crate) fn apply_to_map(map: &mut PresenceMap, op: &ViewOp) {
    match op {
        ViewOp::Changes(changes) => apply_changes(map, changes),
        ViewOp::ClearTier(t) => map.retain(|_, p| {
            *p.count(*t) = 0;
            p.device > 0 || p.host > 0
        }),
        ViewOp::ClearAll => map.clear(),
        ViewOp::Replace(m) => map.clone_from(m),
        ViewOp::Status(_) => {}
    }
}

impl ViewData {
    fn apply(&mut self, op: &ViewOp) {
        match op {
            ViewOp::Status(s) => self.status = Arc::clone(s),
            op => apply_to_map(&mut self.map, op),
        }
    }
}

impl Absorb<ViewOp> for ViewData {
    fn absorb_first(&mut self, op: &mut ViewOp, _other: &Self) {
        self.apply(op);
    }

    fn absorb_second(&mut self, op: ViewOp, _other: &Self) {
        match op {
            // The second copy takes the snapshot map by move instead of cloning it again.
            ViewOp::Replace(m) => self.map = *m,
            op => self.apply(&op),
        }
    }

    fn drop_first(self: Box<Self>) {}

    fn sync_with(&mut self, first: &Self) {
        self.clone_from(first);
    }
}

/// A source of read handles; cheap to clone and shareable between threads.
#[derive(Clone)]
pub struct IndexReader {
    pub(crate) factory: ReadHandleFactory<ViewData>,
    pub(crate) block_size: u32,
    pub(crate) hash_seed: u64,
}

impl std::fmt::Debug for IndexReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexReader").field("block_size", &self.block_size).finish()
    }
}

impl IndexReader {
    /// A handle for one reading thread.
    pub fn handle(&self) -> ViewHandle {
        ViewHandle {
            handle: self.factory.handle(),
            block_size: self.block_size,
            hash_seed: self.hash_seed,
        }
    }
}

/// How much of a query's prefix one stream holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixMatch {
    /// The stream's status when the match was taken.
    pub status: Arc<StreamStatus>,
    /// Tokens of the matched prefix whose blocks are on Device.
    pub device_hit_tokens: u64,
    /// Tokens of the matched prefix whose blocks are only on Host.
    pub host_only_hit_tokens: u64,
}

impl PrefixMatch {
    /// Device plus Host-only tokens; a block on both tiers counts once, as Device.
    pub fn reusable_prefix_tokens(&self) -> u64 {
        self.device_hit_tokens + self.host_only_hit_tokens
    }
}

/// One reader's handle on a stream's view. `Send`, not `Sync`: one per reading thread.
pub struct ViewHandle {
    handle: ReadHandle<ViewData>,
    block_size: u32,
    hash_seed: u64,
}

impl std::fmt::Debug for ViewHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewHandle").field("block_size", &self.block_size).finish()
    }
}

fn stopped() -> Arc<StreamStatus> {
    Arc::new(StreamStatus { error: Some("stream stopped".into()), ..StreamStatus::default() })
}

impl ViewHandle {
    /// Tokens per block of this stream; query keys must be computed with it.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The content-key seed of this stream; query keys must be computed with it.
    pub fn hash_seed(&self) -> u64 {
        self.hash_seed
    }

    /// The latest published status.
    pub fn status(&self) -> Arc<StreamStatus> {
        match self.handle.enter() {
            Some(g) => Arc::clone(&g.status),
            None => stopped(),
        }
    }

    /// Walks `keys` (the query's content keys under this stream's block size and seed) from the
    /// first and stops at the first block absent from both tiers. Unsynchronized: zero hits.
    pub fn match_prefix(&self, keys: &[ContentKey]) -> PrefixMatch {
        let Some(view) = self.handle.enter() else {
            return PrefixMatch {
                status: stopped(),
                device_hit_tokens: 0,
                host_only_hit_tokens: 0,
            };
        };
        let (mut device, mut host) = (0u64, 0u64);
        if view.status.synchronized {
            for k in keys {
                match view.map.get(k) {
                    Some(p) if p.device > 0 => device += 1,
                    Some(p) if p.host > 0 => host += 1,
                    _ => break,
                }
            }
        }
        let b = u64::from(self.block_size);
        PrefixMatch {
            status: Arc::clone(&view.status),
            device_hit_tokens: device * b,
            host_only_hit_tokens: host * b,
        }
    }

    /// Number of content keys in the view (for memory accounting and tests).
    pub fn content_entries(&self) -> usize {
        self.handle.enter().map(|g| g.map.len()).unwrap_or(0)
    }
}
