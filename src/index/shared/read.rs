//! The reader side of the shared index: one walk over a query's keys for every stream at once.
//!
//! The walk starts with the set of synchronized streams and narrows it block by block: a stream
//! stops at its first block absent from both of its tiers (protocol: "the matched prefix walks
//! the query's complete blocks from the first and stops at the first block absent from both
//! tiers of that stream"). Per-stream counts are kept as runs: while the sets of streams
//! matching a block on Device and Host-only stay the same from block to block (a prefix held
//! by every worker, a conversation held by one), the walk only extends the run, and each stream
//! is credited once per run, not once per block.
//!
//! A query's keys are hashed as the walk goes, a group of blocks at a time, under the same read
//! lock: once no stream can match a further block the rest of the prompt is not hashed, so a
//! long prompt whose cached prefix is short costs about the hashing of that prefix. Hashing is
//! most of a query's cost (about 40 ns per 128-token block, against a few for its probe). The
//! keys live in a [`PromptKeys`] that the walks of one query over several indexes share
//! ([`SharedHandle::walk_with`]): a walk reads the keys hashed so far and hashes only past them.

use std::sync::{Arc, RwLock};

use super::super::key::{ContentKey, TokenId};
use super::super::prompt::PromptKeys;
use super::super::StreamStatus;
use super::holders::{SharedData, StreamLabel, MAX_STREAMS};
use super::hybrid_read;
use super::log::read;
use crate::wire::Namespace;

/// Per-stream matched prefix lengths of one query, in blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedMatches {
    /// Streams synchronized when the query was read (the others report zero).
    pub synchronized: u128,
    /// Streams with at least one matched block.
    pub hit: u128,
    device: [u32; MAX_STREAMS],
    host_only: [u32; MAX_STREAMS],
    block_size: u32,
}

impl SharedMatches {
    fn empty(block_size: u32, synchronized: u128) -> Self {
        SharedMatches {
            synchronized,
            hit: 0,
            device: [0; MAX_STREAMS],
            host_only: [0; MAX_STREAMS],
            block_size,
        }
    }

    /// Matched blocks of stream `slot` on Device and only on Host.
    pub fn blocks(&self, slot: u8) -> (u32, u32) {
        let i = usize::from(slot) % MAX_STREAMS;
        (self.device[i], self.host_only[i])
    }

    /// `device_hit_tokens` and `host_only_hit_tokens` of stream `slot`.
    pub fn tokens(&self, slot: u8) -> (u64, u64) {
        let (d, h) = self.blocks(slot);
        let b = u64::from(self.block_size);
        (u64::from(d) * b, u64::from(h) * b)
    }

    /// The streams with a hit, in slot order, with their Device and Host-only blocks.
    pub fn iter(&self) -> impl Iterator<Item = (u8, u32, u32)> + '_ {
        Bits(self.hit).map(|s| (s, self.device[usize::from(s)], self.host_only[usize::from(s)]))
    }

    /// The index's block size.
    pub(super) fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Sets stream `slot`'s matched blocks (a hybrid stream's, by its own rule).
    pub(super) fn set(&mut self, slot: u8, device: u32, host_only: u32) {
        let i = usize::from(slot) % MAX_STREAMS;
        (self.device[i], self.host_only[i]) = (device, host_only);
        let bit = 1u128 << i;
        self.hit = if device + host_only > 0 { self.hit | bit } else { self.hit & !bit };
    }

    fn credit(&mut self, device: u128, host_only: u128, blocks: u32) {
        if blocks == 0 {
            return;
        }
        for s in Bits(device) {
            self.device[usize::from(s)] += blocks;
        }
        for s in Bits(host_only) {
            self.host_only[usize::from(s)] += blocks;
        }
        self.hit |= device | host_only;
    }
}

/// The set bits of a `u128`, lowest first.
pub(super) struct Bits(pub u128);

impl Iterator for Bits {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        if self.0 == 0 {
            return None;
        }
        let s = self.0.trailing_zeros() as u8;
        self.0 &= self.0 - 1;
        Some(s)
    }
}

/// Keys whose slots are prefetched together before they are probed (and blocks hashed per
/// group): the keys are known up front, so the misses of a long walk into a map much larger
/// than the cache overlap instead of coming one after the other.
const AHEAD: usize = 16;

/// The walk's state: the streams that may still match, the current run, the counts so far.
struct Walk {
    out: SharedMatches,
    candidates: u128,
    run_dev: u128,
    run_host: u128,
    run: u32,
}

impl Walk {
    fn new(data: &SharedData, block_size: u32) -> Self {
        let out = SharedMatches::empty(block_size, data.synced);
        Walk { out, candidates: data.synced, run_dev: 0, run_host: 0, run: 0 }
    }

    /// Walks the query's next `keys`; false once no stream can match any further block.
    fn keys(&mut self, data: &SharedData, keys: &[ContentKey]) -> bool {
        for (i, k) in keys.iter().enumerate() {
            if self.candidates == 0 {
                return false;
            }
            if i % AHEAD == 0 {
                keys[i..keys.len().min(i + AHEAD)].iter().for_each(|k| data.map.prefetch(k));
            }
            let Some(h) = data.map.get(k) else {
                self.candidates = 0;
                return false;
            };
            let set = data.sets_of(*h);
            self.candidates &= set.device | set.host;
            let c = self.candidates;
            let (dev, host) = (set.device & c, set.host & !set.device & c);
            if (dev, host) != (self.run_dev, self.run_host) {
                self.out.credit(self.run_dev, self.run_host, self.run);
                (self.run_dev, self.run_host, self.run) = (dev, host, 0);
            }
            self.run += 1;
        }
        self.candidates != 0
    }

    fn finish(mut self) -> SharedMatches {
        self.out.credit(self.run_dev, self.run_host, self.run);
        self.out
    }
}

/// The walk over keys computed beforehand (see the module documentation).
pub(crate) fn walk(data: &SharedData, keys: &[ContentKey], block_size: u32) -> SharedMatches {
    let mut w = Walk::new(data, block_size);
    w.keys(data, keys);
    let mut out = w.finish();
    if data.hybrid & data.synced != 0 {
        hybrid_read::rehit(data, keys, keys.len(), &mut out);
    }
    out
}

/// The walk, hashing `tokens` a group of [`AHEAD`] blocks at a time and stopping at the group
/// after which no stream matches: a prompt whose cached prefix is short costs the hashing of
/// that prefix, not of the whole prompt. The keys already in `keys` (another index's walk of
/// the same query) are walked first and hashed no more; `keys` ends with the keys hashed, a
/// prefix of the query's keys ([`PromptKeys::complete`] completes it).
fn walk_hashing<T: TokenId>(
    data: &SharedData,
    keys: &mut PromptKeys,
    tokens: &[T],
    block_size: u32,
) -> SharedMatches {
    let mut w = Walk::new(data, block_size);
    let mut at = 0;
    loop {
        if at == keys.keys().len() && keys.extend(tokens, AHEAD) == 0 {
            break;
        }
        let more = w.keys(data, &keys.keys()[at..]);
        at = keys.keys().len();
        if !more {
            break;
        }
    }
    let mut out = w.finish();
    if data.hybrid & data.synced != 0 {
        if hybrid_read::needs_all_keys(data) {
            keys.complete(tokens);
        }
        // The last token is always computed: whole blocks within the first n - 1 tokens.
        let max = tokens.len().saturating_sub(1) / block_size.max(1) as usize;
        hybrid_read::rehit(data, keys.keys(), max, &mut out);
    }
    out
}

/// One present stream as a reader saw it: its slot, label and status.
#[derive(Debug, Clone)]
pub struct SlotRead {
    /// Its slot, the index into [`SharedMatches`].
    pub slot: u8,
    /// Who it is.
    pub label: Arc<StreamLabel>,
    /// Its published status.
    pub status: Arc<StreamStatus>,
}

/// A source of reader handles; cheap to clone and shareable between threads.
#[derive(Clone)]
pub struct SharedReader {
    pub(crate) view: Arc<RwLock<SharedData>>,
    pub(crate) block_size: u32,
    pub(crate) hash_seed: u64,
}

impl std::fmt::Debug for SharedReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReader").field("block_size", &self.block_size).finish()
    }
}

impl SharedReader {
    /// A handle for one reading thread, with its own key buffer.
    pub fn handle(&self) -> SharedHandle {
        SharedHandle {
            view: Arc::clone(&self.view),
            keys: PromptKeys::new(self.block_size, self.hash_seed),
            block_size: self.block_size,
        }
    }
}

/// One reader's handle on the shared view: one per reading thread (it keeps its own key
/// buffer for the queries that bring none, [`Self::query`] and [`Self::query_streams_in`]).
pub struct SharedHandle {
    view: Arc<RwLock<SharedData>>,
    keys: PromptKeys,
    block_size: u32,
}

impl std::fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedHandle").field("block_size", &self.block_size).finish()
    }
}

impl SharedHandle {
    /// Walks the shared view once for all streams, hashing `tokens` (complete blocks only) as
    /// far as any stream can match (see [`walk_hashing`]).
    pub fn query<T: TokenId>(&mut self, tokens: &[T]) -> SharedMatches {
        self.keys.start(Namespace::default());
        walk_hashing(&read(&self.view), &mut self.keys, tokens, self.block_size)
    }

    /// [`Self::query`], plus every present stream's label and status read from the same
    /// published copy (ordered by instance name, then DP rank), so matches, statuses and slot
    /// owners agree.
    pub fn query_streams(&mut self, tokens: &[i32], streams: &mut Vec<SlotRead>) -> SharedMatches {
        self.query_streams_in(Namespace::default(), tokens, streams)
    }

    /// [`Self::query_streams`] with the query's keys in namespace `ns` (a LoRA adapter, a
    /// salt: protocol.md section 1.1), so only blocks stored in that namespace match.
    pub fn query_streams_in<T: TokenId>(
        &mut self,
        ns: Namespace,
        tokens: &[T],
        streams: &mut Vec<SlotRead>,
    ) -> SharedMatches {
        self.keys.start(ns);
        let data = read(&self.view);
        let matches = walk_hashing(&data, &mut self.keys, tokens, self.block_size);
        ViewRead { data: &data }.slot_reads(streams);
        matches
    }

    /// Walks the view for `tokens` with the keys `keys` holds, hashing further blocks into it
    /// only as far as a stream of this index may still match: `keys` may be shared by every
    /// index of this block size and seed that one query walks, so that the query hashes each
    /// block once. Then `f` reads the matches' streams from the same published copy
    /// ([`ViewRead`]); the matches are returned.
    pub fn walk_with<T: TokenId>(
        &self,
        keys: &mut PromptKeys,
        tokens: &[T],
        f: impl FnOnce(&SharedMatches, ViewRead<'_>),
    ) -> SharedMatches {
        debug_assert_eq!(keys.settings().0, self.block_size, "keys of another block size");
        let data = read(&self.view);
        let matches = walk_hashing(&data, keys, tokens, self.block_size);
        f(&matches, ViewRead { data: &data });
        matches
    }

    /// `f` over the published streams, without a walk.
    pub fn view_with<R>(&self, f: impl FnOnce(ViewRead<'_>) -> R) -> R {
        f(ViewRead { data: &read(&self.view) })
    }

    /// The content keys the last query hashed, in its namespace: a prefix of its keys, as far
    /// as the walk went.
    pub fn keys(&self) -> &[ContentKey] {
        self.keys.keys()
    }

    /// Every content key of `tokens`, the last query's tokens, in its namespace: the walk's
    /// keys, completed.
    pub fn all_keys<T: TokenId>(&mut self, tokens: &[T]) -> &[ContentKey] {
        self.keys.complete(tokens)
    }

    /// Walks keys already computed under this index's block size and seed.
    pub fn match_keys(&self, keys: &[ContentKey]) -> SharedMatches {
        walk(&read(&self.view), keys, self.block_size)
    }

    /// The published status of stream `slot`; `None` for a free slot.
    pub fn status(&self, slot: u8) -> Option<Arc<StreamStatus>> {
        read(&self.view).status.get(usize::from(slot)).cloned().flatten()
    }

    /// Distinct content keys held by any stream (for memory accounting and tests).
    pub fn content_entries(&self) -> usize {
        read(&self.view).map.len()
    }

    /// Content keys held by two streams or more.
    pub fn shared_entries(&self) -> usize {
        read(&self.view).shared_keys()
    }
}

/// The streams of one published copy of the view, as a reader holding it sees them.
#[derive(Clone, Copy)]
pub struct ViewRead<'a> {
    data: &'a SharedData,
}

impl<'a> ViewRead<'a> {
    /// The present streams' slots, ordered by instance name, then DP rank.
    pub fn order(&self) -> &'a [u8] {
        &self.data.order
    }

    /// The label and status of the stream in `slot`; `None` for a free slot.
    pub fn stream(&self, slot: u8) -> Option<(&'a Arc<StreamLabel>, &'a Arc<StreamStatus>)> {
        let i = usize::from(slot);
        match (self.data.labels.get(i), self.data.status.get(i)) {
            (Some(Some(label)), Some(Some(status))) => Some((label, status)),
            _ => None,
        }
    }

    /// The present streams whose hits count: synchronized, one bit per slot.
    pub fn synchronized(&self) -> u128 {
        self.data.synced
    }

    /// Every present stream's [`SlotRead`], in [`Self::order`], into `out` (cleared first).
    pub fn slot_reads(&self, out: &mut Vec<SlotRead>) {
        out.clear();
        for &slot in self.order() {
            if let Some((label, status)) = self.stream(slot) {
                out.push(SlotRead { slot, label: Arc::clone(label), status: Arc::clone(status) });
            }
        }
    }
}
