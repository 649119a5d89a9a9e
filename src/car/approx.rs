//! [`ApproxCache`]: approximate credit for engines that publish no KV events. kvdir cannot see
//! what such an engine caches, so it assumes what the engine most likely did: a prompt that
//! kvdir routed to the engine left its blocks cached there.
//!
//! Rules:
//! - **What is credited.** When a request is routed to an approximate engine, every whole block
//!   of its prompt (content keys under the engine's block size, hash seed 1024 and the
//!   request's namespace) is recorded on it. A later prompt is credited the longest prefix of
//!   its keys recorded there (keys chain, so a recorded block implies its parents).
//! - **Expiry and capacity.** An entry lives `ttl_ms` from the latest request that used it, and
//!   an engine holds at most `blocks_per_engine` entries: recording past that drops the least
//!   recently used first, as the engine's own LRU would, and of one prompt its last blocks
//!   first (engines evict a prefix's tail before its head), so what survives is a prefix. The store of each engine is
//!   predict-on-route's ([`Predictions`]), whose TTL and bound are exactly these rules.
//! - **Never past the engine.** [`ApproxCache::set_engines`] names the approximate engines
//!   with their process identity: an engine that left, or whose process changed (a restart),
//!   loses every entry; another block size starts empty too (other keys).
//! - **Ranks.** An engine's DP scheduler picks the rank, so the credit covers every rank, as a
//!   prediction does.
//!
//! Time is passed in (monotonic milliseconds), so everything here is pure.

use std::collections::BTreeMap;

use super::{PredictCounters, Predictions};
use crate::index::ContentKey;
use crate::registry::Identity;

/// The settings of approximate credit (config `approximate_ttl_ms` and
/// `approximate_blocks_per_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApproxSettings {
    /// How long an entry lives after the latest request that used it, in ms (at least 1).
    pub ttl_ms: u64,
    /// Most blocks credited per engine (at least 1).
    pub blocks_per_engine: usize,
}

impl Default for ApproxSettings {
    fn default() -> Self {
        ApproxSettings { ttl_ms: 120_000, blocks_per_engine: 65_536 }
    }
}

/// One engine credited approximately.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApproxEngine {
    /// Instance name.
    pub name: String,
    /// The engine process the credit belongs to.
    pub process: Identity,
    /// Tokens per block.
    pub block_size: u32,
    /// DP ranks.
    pub dp_size: u32,
    /// The served model; empty answers queries for any model.
    pub model: String,
}

#[derive(Debug, Clone)]
struct Entry {
    engine: ApproxEngine,
    store: Predictions,
}

/// Approximate credit of every engine without KV events.
#[derive(Debug, Clone, Default)]
pub struct ApproxCache {
    settings: ApproxSettings,
    engines: BTreeMap<String, Entry>,
}

impl ApproxCache {
    /// An empty cache with `settings`.
    pub fn new(settings: ApproxSettings) -> Self {
        ApproxCache { settings, engines: BTreeMap::new() }
    }

    /// The settings.
    pub fn settings(&self) -> ApproxSettings {
        self.settings
    }

    /// Makes `engines` the approximate engines. A new engine starts empty; one that is not in
    /// `engines`, or whose process or block size changed, loses its entries. Returns the names
    /// of the engines whose entries were dropped (left, restarted, or another block size).
    pub fn set_engines(&mut self, engines: Vec<ApproxEngine>) -> Vec<String> {
        let mut dropped = Vec::new();
        let mut next = BTreeMap::new();
        for engine in engines {
            let store = match self.engines.remove(&engine.name) {
                Some(old) if same_credit(&old.engine, &engine) => old.store,
                Some(old) => {
                    if !old.store.is_empty() {
                        dropped.push(old.engine.name);
                    }
                    self.new_store()
                }
                None => self.new_store(),
            };
            next.insert(engine.name.clone(), Entry { engine, store });
        }
        dropped.extend(self.engines.values().filter(|e| !e.store.is_empty()).map(|e| {
            // Engines that left.
            e.engine.name.clone()
        }));
        self.engines = next;
        dropped
    }

    fn new_store(&self) -> Predictions {
        Predictions::new(self.settings.ttl_ms, self.settings.blocks_per_engine)
    }

    /// The approximate engines in name order.
    pub fn engines(&self) -> impl Iterator<Item = &ApproxEngine> {
        self.engines.values().map(|e| &e.engine)
    }

    /// Whether `name` is credited approximately.
    pub fn contains(&self, name: &str) -> bool {
        self.engines.contains_key(name)
    }

    /// Records `keys` (a prompt's whole blocks) as cached on `name` from `now_ms`; nothing when
    /// `name` is not an approximate engine.
    pub fn record(&mut self, now_ms: u64, name: &str, keys: &[ContentKey]) {
        if let Some(e) = self.engines.get_mut(name) {
            // Last block first: a prompt's tail is the least recently used of its blocks, so
            // eviction takes tails before prefixes, as engines evict (vLLM frees a request's
            // blocks tail first; SGLang's radix tree evicts leaves).
            let tail_first: Vec<ContentKey> = keys.iter().rev().copied().collect();
            e.store.record(now_ms, name, &tail_first);
        }
    }

    /// The longest prefix of `keys`, in blocks, credited on `name` at `now_ms`.
    pub fn cached_blocks(&self, now_ms: u64, name: &str, keys: &[ContentKey]) -> usize {
        self.engines.get(name).map_or(0, |e| e.store.predicted_blocks(now_ms, name, keys))
    }

    /// Blocks held for `name` now (expired ones included until the next recording purges
    /// them), and its counters: `recorded`, `expired` and `evicted` (LRU) blocks.
    pub fn blocks(&self, name: &str) -> Option<(usize, PredictCounters)> {
        self.engines.get(name).map(|e| (e.store.len(), e.store.counters()))
    }
}

/// Whether credit recorded for `old` still holds for `new`: the same process, and the same
/// block size (the keys depend on it).
fn same_credit(old: &ApproxEngine, new: &ApproxEngine) -> bool {
    old.process.same_process(&new.process) && old.block_size == new.block_size
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(from: u128, n: u128) -> Vec<ContentKey> {
        (from..from + n).map(ContentKey::from_u128).collect()
    }

    fn engine(name: &str, process: &str) -> ApproxEngine {
        ApproxEngine {
            name: name.into(),
            process: Identity { incarnation_id: Some(process.into()), register_ts_ms: None },
            block_size: 16,
            dp_size: 1,
            model: String::new(),
        }
    }

    fn cache(ttl_ms: u64, blocks_per_engine: usize) -> ApproxCache {
        let mut c = ApproxCache::new(ApproxSettings { ttl_ms, blocks_per_engine });
        c.set_engines(vec![engine("a", "p1"), engine("b", "p1")]);
        c
    }

    #[test]
    fn a_served_prompt_is_credited_on_its_engine_until_its_ttl() {
        let mut c = cache(1_000, 100);
        let k = keys(1, 4);
        c.record(10, "a", &k);
        assert_eq!(c.cached_blocks(10, "a", &k), 4);
        assert_eq!(c.cached_blocks(10, "b", &k), 0, "only where it was served");
        assert_eq!(c.cached_blocks(10, "a", &keys(1, 6)), 4, "a longer prompt: its prefix");
        assert_eq!(c.cached_blocks(1_009, "a", &k), 4);
        assert_eq!(c.cached_blocks(1_010, "a", &k), 0, "expired at the TTL");
        // Each use refreshes the blocks it covers.
        c.record(1_500, "a", &k);
        c.record(2_400, "a", &k[..2]);
        assert_eq!(c.cached_blocks(2_600, "a", &k), 2, "the refreshed prefix outlives the rest");
        c.record(9_000, "a", &[]);
        assert_eq!(c.cached_blocks(9_000, "a", &k), 0);
        c.record(10, "unknown", &k);
        assert!(!c.contains("unknown") && c.blocks("unknown").is_none(), "engines are named");
    }

    #[test]
    fn past_its_capacity_an_engine_drops_the_least_recently_used_blocks() {
        let mut c = cache(1_000_000, 8);
        let (old, hot) = (keys(100, 4), keys(200, 4));
        c.record(1, "a", &old);
        c.record(2, "a", &hot);
        c.record(3, "a", &old); // old is now the more recently used
        c.record(4, "a", &keys(300, 4)); // 12 blocks for 8 places: hot goes
        assert_eq!(c.cached_blocks(5, "a", &old), 4, "used most recently but one: kept");
        assert_eq!(c.cached_blocks(5, "a", &hot), 0, "least recently used: evicted");
        assert_eq!(c.cached_blocks(5, "a", &keys(300, 4)), 4);
        let (held, counters) = c.blocks("a").unwrap();
        assert_eq!((held, counters.evicted, counters.recorded), (8, 4, 16));
        // The capacity is per engine: b has its own.
        c.record(6, "b", &keys(400, 8));
        assert_eq!(c.cached_blocks(6, "a", &old), 4);
        assert_eq!(c.cached_blocks(6, "b", &keys(400, 8)), 8);
        // Refreshing the same blocks over and over keeps the capacity in live blocks.
        for t in 10..1_000 {
            c.record(t, "b", &keys(400, 8));
        }
        assert_eq!((c.blocks("b").unwrap().0, c.cached_blocks(1_000, "b", &keys(400, 8))), (8, 8));
        assert_eq!(c.blocks("b").unwrap().1.evicted, 0, "refreshes evict nothing");
    }

    #[test]
    fn eviction_takes_a_prompts_tail_before_its_prefix() {
        let mut c = cache(1_000_000, 6);
        let (a, b) = (keys(100, 4), keys(200, 4));
        c.record(1, "a", &a);
        c.record(2, "a", &b); // 8 blocks for 6 places: a's last two go
        assert_eq!(c.cached_blocks(3, "a", &a), 2, "a's first two blocks remain, a prefix");
        assert_eq!(c.cached_blocks(3, "a", &b), 4);
    }

    #[test]
    fn a_restarted_or_departed_engine_loses_its_credit() {
        let mut c = cache(1_000_000, 100);
        let k = keys(1, 3);
        c.record(1, "a", &k);
        c.record(1, "b", &k);
        // The same process again (a refresh of the listing): the credit stays.
        assert!(c.set_engines(vec![engine("a", "p1"), engine("b", "p1")]).is_empty());
        assert_eq!(c.cached_blocks(2, "a", &k), 3);
        // a restarted (another process), b left.
        let dropped = c.set_engines(vec![engine("a", "p2")]);
        assert_eq!(dropped, ["a", "b"]);
        assert_eq!(c.cached_blocks(2, "a", &k), 0, "a new process starts cold");
        assert_eq!(c.cached_blocks(2, "b", &k), 0);
        assert!(!c.contains("b"));
        // b comes back: it starts empty, credit is never carried across.
        c.set_engines(vec![engine("a", "p2"), engine("b", "p1")]);
        assert_eq!(c.cached_blocks(2, "b", &k), 0);
        // Another block size means other keys: a starts empty too.
        c.record(3, "a", &k);
        let resized = ApproxEngine { block_size: 32, ..engine("a", "p2") };
        assert_eq!(c.set_engines(vec![resized]), ["a"]);
        assert_eq!(c.cached_blocks(3, "a", &k), 0);
        let names: Vec<&str> = c.engines().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a"]);
    }

    fn candidate(name: &str, hit: u64, approximate: bool) -> super::super::Candidate {
        let mut c = super::super::Candidate::test_idle(name, 1, hit);
        c.hits[0].approximate = approximate;
        c
    }

    #[test]
    fn car_takes_approximate_credit_as_the_engines_hit_ratio_and_says_so() {
        use super::super::{route, CacheState, Rotation, RouteParams};
        let cands = [candidate("exact", 40, false), candidate("approx", 80, true)];
        let r = route(&cands, 100, &RouteParams::default(), &mut Rotation::default()).unwrap();
        assert_eq!(r.prefill, "approx", "its credit is its hit ratio");
        let c = &r.candidates[1];
        assert_eq!((c.kv_hit_ratio, c.score), (Some(0.8), Some(0.5 * (1.0 - 0.8))));
        assert_eq!(c.cached_tokens(), (80, CacheState::Approximate));
        assert_eq!(r.candidates[0].cached_tokens(), (40, CacheState::Exact));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["candidates"][1]["dp_hits"][0]["approximate"], true);
        assert_eq!(json["candidates"][0]["dp_hits"][0]["approximate"], false);
        assert_eq!(CacheState::Approximate.as_str(), "approximate");
    }
}
