//! kvdir's adapter for the peer bench (`vs-peers.sh` copies this file over the bench's own
//! `src/adapters/kvdir.rs`, so it compiles inside that bench, against its `harness` module).
//! It measures the shared index through the core's public API: one [`SharedIndex`] for all
//! workers, one [`StreamWriter`] per worker (kvdir keeps one writer per instance/DP stream),
//! and one query walk for all of them.
//!
//! Two variants, as before:
//! - `kvdir`: publishes after every event, as if each event were its own engine batch (the
//!   conservative reading: kvdir publishes once per live batch);
//! - `kvdir-sliced`: commits each event and publishes once per harness slice (`flush()`).
//!
//! `tests/integration/peer_adapter.rs` compiles this file against a copy of the harness trait and checks
//! its answers, so it cannot go stale unnoticed.

use std::cell::RefCell;

use kvdir::index::{ContentKey, IndexConfig, KeyHasher, SharedHandle, SharedIndex, StreamWriter};
use kvdir::wire::{Batch, EngineHash, Tier};
use serde_json::{json, Value};

use crate::harness::{PrefixIndexUnderTest, Setup};

pub struct Kvdir {
    name: &'static str,
    publish_each: bool,
    block_size: u32,
    index: SharedIndex,
    streams: Vec<StreamWriter>,
    batch: Batch,
    hashes: Vec<EngineHash>,
    seq: Vec<u64>,
    rejected: u64,
    // query scratch (query takes &self): the reader handle, and a hasher and key buffer for
    // hash_only (the handle hashes with its own, built the same way). Both hash the harness's
    // u32 ids as they are (`kvdir::index::TokenId`): no conversion pass over the query.
    q: RefCell<(SharedHandle, KeyHasher, Vec<ContentKey>)>,
}

impl Kvdir {
    pub fn new(s: &Setup, publish_each: bool) -> Self {
        let block_size = s.block_tokens as u32;
        let config = IndexConfig { block_size, hash_seed: 1024, salt: 0, max_blocks: 1 << 22 };
        let index = SharedIndex::new(block_size, 1024, s.workers as usize);
        // A stream starts unsynchronized; an empty full-state batch synchronizes it.
        let streams = (0..s.workers)
            .map(|_| {
                let mut st = index.add_stream(config).expect("at most 128 workers");
                let mut b = Batch::default();
                b.push_cleared(None);
                st.apply(0, &b).expect("empty full-state batch");
                st.publish();
                st
            })
            .collect();
        let handle = index.reader().handle();
        Kvdir {
            name: if publish_each { "kvdir" } else { "kvdir-sliced" },
            publish_each,
            block_size,
            index,
            streams,
            batch: Batch::default(),
            hashes: Vec::new(),
            seq: vec![0; s.workers as usize],
            rejected: 0,
            q: RefCell::new((handle, KeyHasher::new(block_size, 1024), Vec::new())),
        }
    }

    fn apply(&mut self, worker: u32) {
        let w = worker as usize;
        self.seq[w] += 1;
        if self.streams[w].apply(self.seq[w], &self.batch).is_err() {
            self.rejected += 1;
        }
        if self.publish_each {
            self.streams[w].publish();
        } else {
            self.streams[w].commit();
        }
    }
}

/// Writes the harness's u32 ids into `out` (of the same length) as i32. The ids are below
/// 2^31, so the mask changes nothing; it keeps the loop from being compiled into a `memcpy`,
/// which glibc runs as `rep movsb`, and which took 40-50 µs per 128 KiB on this machine's AMD
/// EPYC when source and destination were both page-aligned allocations.
fn convert(tokens: &[u32], out: &mut [i32]) {
    for (d, s) in out.iter_mut().zip(tokens) {
        *d = (*s & 0x7fff_ffff) as i32;
    }
}

impl PrefixIndexUnderTest for Kvdir {
    fn name(&self) -> &str {
        self.name
    }
    fn store(&mut self, worker: u32, parent: Option<u64>, blocks: &[(u64, &[u32])]) {
        self.hashes.clear();
        self.hashes.extend(blocks.iter().map(|&(h, _)| EngineHash(h as u128)));
        let tokens = blocks.iter().map(|(_, t)| t.len()).sum();
        self.batch.clear();
        // The ids are converted straight into the batch (one write, no second copy).
        self.batch.push_stored_with(
            &self.hashes,
            parent.map(|p| EngineHash(p as u128)),
            tokens,
            self.block_size,
            Tier::Device,
            |out| {
                let mut at = 0;
                for (_, toks) in blocks {
                    convert(toks, &mut out[at..at + toks.len()]);
                    at += toks.len();
                }
            },
        );
        self.apply(worker);
    }
    fn remove(&mut self, worker: u32, hashes: &[u64]) {
        self.hashes.clear();
        self.hashes.extend(hashes.iter().map(|&h| EngineHash(h as u128)));
        self.batch.clear();
        self.batch.push_removed(&self.hashes, Tier::Device);
        self.apply(worker);
    }
    fn flush(&mut self) {
        if !self.publish_each {
            self.index.publish();
        }
    }
    fn query(&self, tokens: &[u32]) -> Vec<(u32, usize)> {
        let mut q = self.q.borrow_mut();
        let (handle, _, _) = &mut *q;
        let m = handle.query(tokens);
        // Slots are taken in order, so worker w is slot w.
        m.iter().filter(|&(_, d, _)| d > 0).map(|(s, d, _)| (u32::from(s), d as usize)).collect()
    }
    /// The hashing the query just did on these tokens (the harness calls this right after
    /// `query` with the same tokens): kvdir's query hashes only as far as a worker can still
    /// match (`SharedHandle::keys` is what it hashed), so this hashes that many blocks.
    fn hash_only(&self, tokens: &[u32]) -> Option<usize> {
        let mut q = self.q.borrow_mut();
        let (handle, hasher, keys) = &mut *q;
        let hashed = handle.keys().len() * self.block_size as usize;
        keys.clear();
        hasher.prefix_keys(&tokens[..hashed.min(tokens.len())], keys);
        Some(keys.len())
    }
    fn rejected(&self) -> u64 {
        self.rejected
    }
    fn describe(&self) -> Value {
        json!({
            "crate": "kvdir", "version": "path (project checkout)",
            "type": "one SharedIndex (one view behind a reader/writer lock: content key -> Device/Host stream sets) for all workers, one StreamWriter per worker",
            "publish": if self.publish_each { "after every event" } else { "once per harness slice (flush)" },
            "api": ["SharedIndex::add_stream", "Batch::push_stored_with", "StreamWriter::apply(seq, &Batch)",
                    "StreamWriter::publish / commit + SharedIndex::publish",
                    "SharedHandle::query (one walk for all workers, hashing as far as any worker matches)"],
        })
    }
}
