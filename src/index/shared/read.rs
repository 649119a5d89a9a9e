//! The reader side of the shared index: one walk over a query's keys for every stream at once.
//!
//! The walk starts with the set of synchronized streams and narrows it block by block: a stream
//! stops at its first block absent from both of its tiers (protocol: "the matched prefix walks
//! the query's complete blocks from the first and stops at the first block absent from both
//! tiers of that stream"). Per-stream counts are kept as runs: while the sets of streams
//! matching a block on Device and Host-only stay the same from block to block (a prefix held
//! by every worker, a conversation held by one), the walk only extends the run, and each stream
//! is credited once per run, not once per block.

use std::hint::black_box;
use std::sync::{Arc, RwLock};

use super::super::key::{ContentKey, KeyHasher};
use super::super::namespace::Namespace;
use super::super::view::StreamStatus;
use super::holders::{SharedData, StreamLabel, MAX_STREAMS};
use super::log::read;

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
struct Bits(u128);

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

/// Keys whose slots are loaded in one pass before they are probed: the keys are known up
/// front, so the misses of a long walk into a map much larger than the cache overlap instead
/// of coming one after the other.
const AHEAD: usize = 16;

fn touch(data: &SharedData, keys: &[ContentKey]) {
    black_box(keys.iter().fold(false, |acc, k| acc ^ data.map.touch(k)));
}

/// The walk (see the module documentation).
pub(crate) fn walk(data: &SharedData, keys: &[ContentKey], block_size: u32) -> SharedMatches {
    let mut out = SharedMatches::empty(block_size, data.synced);
    let mut candidates = data.synced;
    let (mut run_dev, mut run_host, mut run) = (0u128, 0u128, 0u32);
    for (i, k) in keys.iter().enumerate() {
        if candidates == 0 {
            break;
        }
        if i % AHEAD == 0 {
            touch(data, &keys[i..keys.len().min(i + AHEAD)]);
        }
        let Some(h) = data.map.get(k) else { break };
        let set = data.sets_of(*h);
        candidates &= set.device | set.host;
        let (dev, host) = (set.device & candidates, set.host & !set.device & candidates);
        if (dev, host) != (run_dev, run_host) {
            out.credit(run_dev, run_host, run);
            (run_dev, run_host, run) = (dev, host, 0);
        }
        run += 1;
    }
    out.credit(run_dev, run_host, run);
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
    /// A handle for one reading thread, with its own hasher and key buffer.
    pub fn handle(&self) -> SharedHandle {
        SharedHandle {
            view: Arc::clone(&self.view),
            hasher: KeyHasher::new(self.block_size, self.hash_seed),
            namespaced: None,
            keys: Vec::new(),
            block_size: self.block_size,
            hash_seed: self.hash_seed,
        }
    }
}

/// One reader's handle on the shared view: one per reading thread (it keeps its own hasher
/// and key buffer).
pub struct SharedHandle {
    view: Arc<RwLock<SharedData>>,
    hasher: KeyHasher,
    /// The hasher of the last namespace other than the default one that was queried.
    namespaced: Option<(Namespace, KeyHasher)>,
    keys: Vec<ContentKey>,
    block_size: u32,
    hash_seed: u64,
}

impl std::fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedHandle").field("block_size", &self.block_size).finish()
    }
}

impl SharedHandle {
    /// Hashes `tokens` once (complete blocks only) and walks the shared view once.
    pub fn query(&mut self, tokens: &[i32]) -> SharedMatches {
        self.keys.clear();
        self.hasher.prefix_keys(tokens, &mut self.keys);
        walk(&read(&self.view), &self.keys, self.block_size)
    }

    /// [`Self::query`], plus every present stream's label and status read from the same
    /// published copy (in slot order), so matches, statuses and slot owners agree.
    pub fn query_streams(&mut self, tokens: &[i32], streams: &mut Vec<SlotRead>) -> SharedMatches {
        self.query_streams_in(Namespace::default(), tokens, streams)
    }

    /// [`Self::query_streams`] with the query's keys in namespace `ns` (a LoRA adapter, a
    /// salt: protocol.md section 1.1), so only blocks stored in that namespace match.
    pub fn query_streams_in(
        &mut self,
        ns: Namespace,
        tokens: &[i32],
        streams: &mut Vec<SlotRead>,
    ) -> SharedMatches {
        streams.clear();
        self.keys.clear();
        let hasher = if ns == Namespace::default() {
            &mut self.hasher
        } else {
            if self.namespaced.as_ref().is_none_or(|(n, _)| *n != ns) {
                let h = KeyHasher::new(self.block_size, ns.seed(self.hash_seed));
                self.namespaced = Some((ns, h));
            }
            &mut self.namespaced.as_mut().expect("set above").1
        };
        hasher.prefix_keys(tokens, &mut self.keys);
        let view = read(&self.view);
        for (i, label) in view.labels.iter().enumerate() {
            let status = view.status.get(i).cloned().flatten();
            if let (Some(label), Some(status)) = (label, status) {
                streams.push(SlotRead { slot: i as u8, label: Arc::clone(label), status });
            }
        }
        walk(&view, &self.keys, self.block_size)
    }

    /// The content keys of the last query, in its namespace (complete blocks only).
    pub fn keys(&self) -> &[ContentKey] {
        &self.keys
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
