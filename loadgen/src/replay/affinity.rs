//! Capacity references of the replay, computed from the trace alone (pure, no I/O):
//! - [`pooled_lru`]: one LRU cache with the whole fleet's blocks;
//! - [`per_engine_lru`]: the capacity bound of issue #14, one LRU per engine with the same
//!   per-engine capacity as the replay and a router with perfect affinity.
//!
//! Cache model ([`Lru`]), as the simulated engine's: a request hits its complete blocks up to
//! the first one its cache lacks; then every complete block of the request becomes most recent
//! and the least recently used blocks are evicted down to the capacity. The blocks of a request
//! are touched leaf first, so a prefix is always more recent than its extensions and the LRU
//! victim is always a leaf, which is the engine's leaf-first LRU rule.
//!
//! Perfect affinity, precisely: request `n` (0-based) may go to an engine that has had fewer
//! than `cap(n) = max(1, ceil((1 + slack) * (n + 1) / engines))` requests (every engine when
//! `slack` is `None`); among those, it goes to the engine whose cache holds the longest prefix
//! of it *at that moment* (exact and instant knowledge, no queue term); ties go by rendezvous
//! hashing of the first block past the tied prefix (of the request index when there is none),
//! so a new conversation is spread and its next turns follow it. Without the cap, a block
//! every request shares (the conversation trace starts every prompt with the same block) draws
//! every request to the first engine that cached it, and the reference degenerates into one
//! engine's cache; the cap (`slack` 0.1: no engine above 1.1x the mean request count) keeps the
//! fleet busy, as any router that is judged by TTFT must.
//!
//! Neither figure is a proof bound: LRU is not the optimal replacement, and a router that
//! breaks affinity now and then can beat a greedy rule. They are what an exact, load-blind
//! directory could reach with these caches.

use std::collections::{BTreeMap, HashMap};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::trace::{Trace, TRACE_BLOCK};

/// The default slack of the per-engine bound: at most 1.1x the mean requests per engine.
pub const AFFINITY_SLACK: f64 = 0.1;

/// An LRU set of block ids with a capacity in blocks.
#[derive(Debug, Clone, Default)]
pub struct Lru {
    capacity: usize,
    clock: u64,
    last_use: HashMap<u64, u64>,
    by_age: BTreeMap<u64, u64>,
}

impl Lru {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Lru {
        Lru { capacity, ..Lru::default() }
    }

    /// How many of `blocks` hit, from the first, up to the first one not held.
    pub fn prefix_hits(&self, blocks: &[u64]) -> usize {
        blocks.iter().take_while(|id| self.last_use.contains_key(*id)).count()
    }

    /// Whether block `id` is held.
    pub fn contains(&self, id: u64) -> bool {
        self.last_use.contains_key(&id)
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }

    /// Makes `blocks` the most recent, leaf first, then evicts down to the capacity.
    pub fn touch(&mut self, blocks: &[u64]) {
        self.touch_evicting(blocks, &mut Vec::new());
    }

    /// [`Self::touch`], appending the evicted blocks to `evicted`, least recent first.
    pub fn touch_evicting(&mut self, blocks: &[u64], evicted: &mut Vec<u64>) {
        for &id in blocks.iter().rev() {
            self.clock += 1;
            if let Some(old) = self.last_use.insert(id, self.clock) {
                self.by_age.remove(&old);
            }
            self.by_age.insert(self.clock, id);
        }
        while self.last_use.len() > self.capacity {
            let Some((_, id)) = self.by_age.pop_first() else { break };
            self.last_use.remove(&id);
            evicted.push(id);
        }
    }
}

/// What a capacity reference measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// Hit tokens over input tokens.
    pub token_share: f64,
    /// Requests per engine (one entry for the pooled cache).
    pub per_engine: Vec<u64>,
}

impl Reference {
    /// Most requests on one engine over the mean.
    pub fn imbalance(&self) -> f64 {
        let total: u64 = self.per_engine.iter().sum();
        let max = self.per_engine.iter().copied().max().unwrap_or(0) as f64;
        max / (total as f64 / self.per_engine.len().max(1) as f64).max(1e-9)
    }
}

/// One LRU of `capacity` blocks for every request.
pub fn pooled_lru(trace: &Trace, capacity: usize) -> Reference {
    let mut lru = Lru::new(capacity);
    let mut hit_blocks = 0;
    for r in &trace.requests {
        hit_blocks += lru.prefix_hits(r.full_blocks());
        lru.touch(r.full_blocks());
    }
    let requests = trace.requests.len() as u64;
    Reference { token_share: share(trace, hit_blocks), per_engine: vec![requests] }
}

/// One LRU of `capacity` blocks per engine, requests placed by perfect affinity (module doc).
pub fn per_engine_lru(
    trace: &Trace,
    engines: usize,
    capacity: usize,
    slack: Option<f64>,
) -> Reference {
    let engines = engines.max(1);
    let mut caches = vec![Lru::new(capacity); engines];
    let mut per_engine = vec![0u64; engines];
    let mut hit_blocks = 0;
    for (n, r) in trace.requests.iter().enumerate() {
        let blocks = r.full_blocks();
        let cap = slack.map_or(u64::MAX, |s| {
            (((1.0 + s) * (n + 1) as f64 / engines as f64).ceil() as u64).max(1)
        });
        let open = (0..engines).filter(|e| per_engine[*e] < cap);
        let hits: Vec<(usize, usize)> = open.map(|e| (e, caches[e].prefix_hits(blocks))).collect();
        let best = hits.iter().map(|(_, h)| *h).max().unwrap_or(0);
        let key = blocks.get(best).copied().unwrap_or(r.index as u64 ^ u64::MAX);
        let tied = hits.iter().filter(|(_, h)| *h == best).map(|(e, _)| *e);
        let engine = tied.max_by_key(|e| xxh3_64_with_seed(&key.to_le_bytes(), *e as u64));
        let engine = engine.unwrap_or(0);
        hit_blocks += best;
        caches[engine].touch(blocks);
        per_engine[engine] += 1;
    }
    Reference { token_share: share(trace, hit_blocks), per_engine }
}

fn share(trace: &Trace, hit_blocks: usize) -> f64 {
    (hit_blocks * TRACE_BLOCK) as f64 / trace.input_tokens().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::super::trace::TraceRequest;
    use super::*;

    fn trace(requests: &[&[u64]]) -> Trace {
        let request = |(index, ids): (usize, &&[u64])| TraceRequest {
            index,
            timestamp_ms: index as u64,
            input_length: ids.len() * TRACE_BLOCK,
            hash_ids: ids.to_vec(),
        };
        Trace { requests: requests.iter().enumerate().map(request).collect() }
    }

    #[test]
    fn the_lru_evicts_leaves_first_and_keeps_what_was_touched_last() {
        let mut lru = Lru::new(3);
        lru.touch(&[1, 2, 3]);
        lru.touch(&[1, 4]);
        assert_eq!(lru.prefix_hits(&[1, 2, 3]), 2, "3, the oldest leaf, made room for 4");
        assert_eq!(lru.prefix_hits(&[1, 4]), 2);
        let mut evicted = Vec::new();
        lru.touch_evicting(&[5], &mut evicted);
        assert_eq!((lru.prefix_hits(&[1, 2]), lru.prefix_hits(&[1, 4])), (1, 2), "then 2");
        assert_eq!(
            (evicted, lru.len(), lru.contains(2), lru.contains(5)),
            (vec![2], 3, false, true)
        );
    }

    /// Two conversations a (10, 11, 12) and b (20, 21) alternate, each turn extending its
    /// previous one, every prompt starting with the shared block 0: 14 blocks in all.
    const TURNS: [&[u64]; 5] = [&[0, 10], &[0, 20], &[0, 10, 11], &[0, 20, 21], &[0, 10, 11, 12]];

    #[test]
    fn perfect_affinity_on_two_small_engines_by_hand() {
        let t = trace(&TURNS);
        let of_blocks = |hits: f64| hits / 14.0;
        // One infinite cache: 0 | 0 | 0 10 | 0 20 | 0 10 11.
        assert_eq!(t.bound().token_share, of_blocks(1.0 + 2.0 + 2.0 + 3.0));
        // 2 engines of 3 blocks, slack 0.1, cap(n) = ceil(0.55 (n + 1)) = 1, 2, 2, 3, 3:
        // r0 -> X by hash (0 hits); r1 -> X, which holds 0 (1); r2: X is at its cap 2 -> Y
        // (0); r3 -> X, 0 20 (2), evicting 10, X's oldest leaf; r4: X at cap 3 -> Y,
        // 0 10 11 (3).
        let r = per_engine_lru(&t, 2, 3, Some(0.1));
        assert_eq!(r.token_share, of_blocks(0.0 + 1.0 + 0.0 + 2.0 + 3.0), "{r:?}");
        let mut counts = r.per_engine.clone();
        counts.sort();
        assert_eq!(counts, [2, 3]);
        assert!((r.imbalance() - 1.2).abs() < 1e-12, "3 over a mean of 2.5");
        // Without a cap everything follows the shared block 0 onto X: one 3-block cache.
        // r2 hits 0 10 and evicts 20; r3 hits 0 and evicts 11, 10; r4 hits 0.
        let uncapped = per_engine_lru(&t, 2, 3, None);
        assert_eq!(uncapped.token_share, of_blocks(0.0 + 1.0 + 2.0 + 1.0 + 1.0));
        assert!(uncapped.per_engine.contains(&5), "{uncapped:?}");
        assert_eq!(pooled_lru(&t, 3).token_share, uncapped.token_share);
        assert_eq!(pooled_lru(&t, 100).token_share, t.bound().token_share, "nothing evicted");
    }
}
