//! [`CacheModel`]: one rank's prefix cache, and the events an engine publishes as it changes.
//!
//! Blocks of `block_size` tokens form prefix chains. A block's engine hash is
//! `xxh3_64(parent_hash.to_le_bytes() ++ le_i32(tokens))` (the parent part is absent for the
//! first block), so equal content at an equal position gets an equal hash, as in a real engine.
//! Each block is resident on the Device tier, the Host tier, or both; each tier has its own LRU.
//!
//! Eviction prefers leaves: the victim on a tier is the least recently used block with no child
//! resident on that same tier. With this rule, and because a request makes its whole prefix
//! Device-resident, every resident block's parent stays resident (the chains stay consistent)
//! unless a test removes a parent on purpose with [`CacheModel::evict`].
//!
//! Event order inside one batch: Device stores (with tokens), then tokenless Host copies of
//! Device victims, then Device removals, then Host removals. Every tokenless store therefore
//! names a block that is still known when it is applied.

mod log;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kvdir::wire::Tier;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use log::CacheEvent;
use log::EventLog;

/// Seed of the engine block hashes. Deliberately unrelated to the directory's content keys,
/// which must never rely on engine hashes.
const ENGINE_HASH_SEED: u64 = 0x5eed_0fe9_9e00_0001;

/// The engine hash of one block after `parent`.
pub fn block_hash(parent: Option<u64>, block: &[i32]) -> u64 {
    let mut buf = Vec::with_capacity(8 + 4 * block.len());
    if let Some(p) = parent {
        buf.extend_from_slice(&p.to_le_bytes());
    }
    for t in block {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(&buf, ENGINE_HASH_SEED)
}

/// The engine hash of a block with a `cache_salt`: only a root (the first block) takes the
/// salt, so every block after it differs from the unsalted chain through its parent.
fn salted_hash(parent: Option<u64>, block: &[i32], salt: Option<&str>) -> u64 {
    match (parent, salt) {
        (None, Some(salt)) => {
            let mut buf = format!("cache_salt:{salt}\0").into_bytes();
            for t in block {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            xxh3_64_with_seed(&buf, ENGINE_HASH_SEED)
        }
        _ => block_hash(parent, block),
    }
}

/// The engine hashes of every complete block of `tokens`; a partial tail has none.
pub fn block_hashes(block_size: u32, tokens: &[i32]) -> Vec<u64> {
    salted_block_hashes(block_size, tokens, None)
}

/// [`block_hashes`] of a request with `cache_salt` `salt` (vLLM keys its blocks apart).
pub fn salted_block_hashes(block_size: u32, tokens: &[i32], salt: Option<&str>) -> Vec<u64> {
    let mut parent = None;
    chunks(block_size, tokens)
        .map(|block| {
            let h = salted_hash(parent, block, salt);
            parent = Some(h);
            h
        })
        .collect()
}

fn chunks(block_size: u32, tokens: &[i32]) -> std::slice::ChunksExact<'_, i32> {
    tokens.chunks_exact(block_size.max(1) as usize)
}

fn slot(tier: Tier) -> usize {
    match tier {
        Tier::Device => 0,
        Tier::Host => 1,
    }
}

/// Sizes of one rank's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per block.
    pub block_size: u32,
    /// Device tier capacity in blocks.
    pub device_capacity_blocks: usize,
    /// Host tier capacity in blocks; 0 disables the Host tier.
    pub host_capacity_blocks: usize,
}

#[derive(Debug)]
struct Block {
    parent: Option<u64>,
    tokens: Box<[i32]>,
    /// LRU tick per tier (Device, Host); `Some` means resident there.
    tick: [Option<u64>; 2],
    /// Children resident per tier, for the leaf-first eviction rule.
    kids: [u32; 2],
    /// The `cache_salt` of a salted root block.
    salt: Option<Box<str>>,
}

impl Block {
    fn on(&self, tier: Tier) -> bool {
        self.tick[slot(tier)].is_some()
    }
}

/// One rank's prefix cache.
#[derive(Debug)]
pub struct CacheModel {
    config: CacheConfig,
    /// Blocks resident on at least one tier.
    blocks: HashMap<u64, Block>,
    /// Parent hash -> resident children, kept even while the parent is absent.
    children: HashMap<u64, BTreeSet<u64>>,
    /// Per tier: tick -> block, oldest first.
    lru: [BTreeMap<u64, u64>; 2],
    clock: u64,
}

impl CacheModel {
    /// An empty cache.
    pub fn new(config: CacheConfig) -> Self {
        CacheModel {
            config,
            blocks: HashMap::new(),
            children: HashMap::new(),
            lru: [BTreeMap::new(), BTreeMap::new()],
            clock: 0,
        }
    }

    /// The cache's sizes.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// Whether the Host tier exists.
    pub fn host_enabled(&self) -> bool {
        self.config.host_capacity_blocks > 0
    }

    /// A request's prefill: every complete block of `tokens` becomes Device-resident (new and
    /// Host-only blocks are stored with tokens, resident ones are touched), then capacity is
    /// enforced. Returns the batch's events, empty when nothing changed.
    pub fn process(&mut self, tokens: &[i32]) -> Vec<CacheEvent> {
        self.process_salted(tokens, None)
    }

    /// [`CacheModel::process`] of a request with a `cache_salt`: its blocks are keyed apart
    /// ([`salted_block_hashes`]) and the salted root's store carries the salt.
    pub fn process_salted(&mut self, tokens: &[i32], salt: Option<&str>) -> Vec<CacheEvent> {
        let mut log = EventLog::default();
        let mut parent = None;
        for block in chunks(self.config.block_size, tokens) {
            let h = salted_hash(parent, block, salt);
            match self.blocks.get(&h) {
                Some(b) if b.on(Tier::Device) => {}
                Some(_) => {
                    log.store_salted(h, parent, block, Tier::Device, salt);
                    self.place(h, Tier::Host);
                }
                None => {
                    self.insert_block(h, parent, block);
                    if let (None, Some(b)) = (parent, self.blocks.get_mut(&h)) {
                        b.salt = salt.map(Box::from);
                    }
                    log.store_salted(h, parent, block, Tier::Device, salt);
                }
            }
            self.place(h, Tier::Device);
            parent = Some(h);
        }
        self.enforce_capacity(&mut log);
        log.events
    }

    /// Copies the Device-resident blocks of `tokens`' prefix to Host (tokenless Host stores),
    /// touching blocks already there, up to the first block absent from both tiers; then
    /// enforces the Host capacity. Does nothing when the Host tier is disabled.
    pub fn offload(&mut self, tokens: &[i32]) -> Vec<CacheEvent> {
        let mut log = EventLog::default();
        if !self.host_enabled() {
            return log.events;
        }
        for h in block_hashes(self.config.block_size, tokens) {
            let Some(b) = self.blocks.get(&h) else { break };
            if b.on(Tier::Device) && !b.on(Tier::Host) {
                log.store(h, b.parent, &[], Tier::Host);
            }
            self.place(h, Tier::Host);
        }
        self.enforce_capacity(&mut log);
        log.events
    }

    /// Removes only the last complete block of `tokens` from `tier`, with no Host copy and no
    /// regard for its children (tests use it to make orphans).
    pub fn evict(&mut self, tokens: &[i32], tier: Tier) -> Vec<CacheEvent> {
        let mut log = EventLog::default();
        if let Some(&last) = block_hashes(self.config.block_size, tokens).last() {
            if self.unplace(last, tier) {
                log.removed(vec![last], tier);
            }
        }
        log.events
    }

    /// vLLM's second copy: sent again, a fully cached prompt whose length is a multiple of the
    /// block size has its last block recomputed into a new physical block, and vLLM publishes
    /// `BlockStored` for the same hash again. Publishes that store (with tokens, on Device) for
    /// the last complete block of `tokens` when it is Device-resident, and touches it. The
    /// model keeps one block per hash: the copy changes no residency.
    pub fn store_copy(&mut self, tokens: &[i32]) -> Vec<CacheEvent> {
        let mut log = EventLog::default();
        let Some(&last) = block_hashes(self.config.block_size, tokens).last() else {
            return log.events;
        };
        if let Some(b) = self.blocks.get(&last).filter(|b| b.on(Tier::Device)) {
            log.store(last, b.parent, &b.tokens, Tier::Device);
            self.place(last, Tier::Device);
        }
        log.events
    }

    /// vLLM evicting the older of two copies: `BlockRemoved` (Device) for the last complete
    /// block of `tokens` when it is Device-resident, although it stays cached (resident, with
    /// its children storable under it).
    pub fn remove_copy(&mut self, tokens: &[i32]) -> Vec<CacheEvent> {
        let mut log = EventLog::default();
        if let Some(&last) = block_hashes(self.config.block_size, tokens).last() {
            if self.blocks.get(&last).is_some_and(|b| b.on(Tier::Device)) {
                log.removed(vec![last], Tier::Device);
            }
        }
        log.events
    }

    /// Empties the cache: one unlimited `AllBlocksCleared`.
    pub fn clear(&mut self) -> Vec<CacheEvent> {
        *self = CacheModel::new(self.config);
        vec![CacheEvent::Cleared]
    }

    /// `BlockStored` events for every resident block, parent-first (a depth-first walk from
    /// each root, and from each block whose parent is absent). Device blocks carry tokens; a
    /// Host replica of a Device block follows as a tokenless Host store after all the stores
    /// with tokens; a Host-only block carries tokens.
    pub fn full_state(&self) -> Vec<CacheEvent> {
        let mut log = EventLog::default();
        let mut replicas = EventLog::default();
        let mut starts: Vec<u64> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.parent.is_none_or(|p| !self.blocks.contains_key(&p)))
            .map(|(h, _)| *h)
            .collect();
        starts.sort_unstable_by(|a, b| b.cmp(a));
        let mut stack = starts;
        while let Some(h) = stack.pop() {
            let Some(b) = self.blocks.get(&h) else { continue };
            let (tier, salt) =
                (if b.on(Tier::Device) { Tier::Device } else { Tier::Host }, &b.salt);
            log.store_salted(h, b.parent, &b.tokens, tier, salt.as_deref());
            if tier == Tier::Device && b.on(Tier::Host) {
                replicas.store(h, b.parent, &[], Tier::Host);
            }
            if let Some(kids) = self.children.get(&h) {
                stack.extend(kids.iter().rev());
            }
        }
        log.append(replicas);
        log.events
    }

    /// Ground truth for a query: `(device_hit_tokens, host_only_hit_tokens)` over the prefix of
    /// complete blocks up to the first block absent from both tiers. A block on both tiers
    /// counts as Device.
    pub fn resident(&self, tokens: &[i32]) -> (u64, u64) {
        self.resident_salted(tokens, None)
    }

    /// [`CacheModel::resident`] of a request with a `cache_salt`.
    pub fn resident_salted(&self, tokens: &[i32], salt: Option<&str>) -> (u64, u64) {
        let b = u64::from(self.config.block_size);
        let (mut device, mut host) = (0, 0);
        for h in salted_block_hashes(self.config.block_size, tokens, salt) {
            match self.blocks.get(&h) {
                Some(block) if block.on(Tier::Device) => device += b,
                Some(_) => host += b,
                None => break,
            }
        }
        (device, host)
    }

    /// Resident blocks per tier: `(device_blocks, host_blocks)`; a block on both counts twice.
    pub fn counts(&self) -> (u64, u64) {
        (self.lru[0].len() as u64, self.lru[1].len() as u64)
    }

    /// Evicts Device blocks over capacity (copying each to Host first when the Host tier is
    /// enabled), then Host blocks over capacity.
    fn enforce_capacity(&mut self, log: &mut EventLog) {
        let mut off_device = Vec::new();
        while self.lru[slot(Tier::Device)].len() > self.config.device_capacity_blocks {
            let Some(victim) = self.victim(Tier::Device) else { break };
            if let Some(b) = self.blocks.get(&victim) {
                if self.host_enabled() && !b.on(Tier::Host) {
                    log.store(victim, b.parent, &[], Tier::Host);
                    self.place(victim, Tier::Host);
                }
            }
            self.unplace(victim, Tier::Device);
            off_device.push(victim);
        }
        log.removed(off_device, Tier::Device);
        let mut off_host = Vec::new();
        while self.lru[slot(Tier::Host)].len() > self.config.host_capacity_blocks {
            let Some(victim) = self.victim(Tier::Host) else { break };
            self.unplace(victim, Tier::Host);
            off_host.push(victim);
        }
        log.removed(off_host, Tier::Host);
    }

    /// The least recently used block on `tier` with no child on `tier`, or failing that (it
    /// cannot happen in a forest) the least recently used block.
    fn victim(&self, tier: Tier) -> Option<u64> {
        let lru = &self.lru[slot(tier)];
        let is_leaf = |h: &&u64| self.blocks.get(h).is_some_and(|b| b.kids[slot(tier)] == 0);
        lru.values().find(is_leaf).or_else(|| lru.values().next()).copied()
    }

    /// Adds a block that is on no tier yet; its per-tier child counts are rebuilt from the
    /// children that outlived an earlier copy of it.
    fn insert_block(&mut self, h: u64, parent: Option<u64>, tokens: &[i32]) {
        let mut kids = [0u32; 2];
        for c in self.children.get(&h).into_iter().flatten() {
            if let Some(child) = self.blocks.get(c) {
                for tier in Tier::ALL {
                    kids[slot(tier)] += u32::from(child.on(tier));
                }
            }
        }
        let block = Block { parent, tokens: tokens.into(), tick: [None, None], kids, salt: None };
        self.blocks.insert(h, block);
        if let Some(p) = parent {
            self.children.entry(p).or_default().insert(h);
        }
    }

    /// Makes `h` resident on `tier` (or touches it there) as the most recently used block.
    fn place(&mut self, h: u64, tier: Tier) {
        self.clock += 1;
        let now = self.clock;
        let Some(b) = self.blocks.get_mut(&h) else { return };
        let old = b.tick[slot(tier)].replace(now);
        let parent = b.parent;
        match old {
            Some(old) => {
                self.lru[slot(tier)].remove(&old);
            }
            None => self.adjust_parent(parent, tier, true),
        }
        self.lru[slot(tier)].insert(now, h);
    }

    /// Takes `h` off `tier`; a block left on no tier is forgotten. Returns whether it was there.
    fn unplace(&mut self, h: u64, tier: Tier) -> bool {
        let Some(b) = self.blocks.get_mut(&h) else { return false };
        let Some(old) = b.tick[slot(tier)].take() else { return false };
        let (parent, gone) = (b.parent, b.tick.iter().all(Option::is_none));
        self.lru[slot(tier)].remove(&old);
        self.adjust_parent(parent, tier, false);
        if gone {
            self.blocks.remove(&h);
            if let Some(p) = parent {
                if let Some(set) = self.children.get_mut(&p) {
                    set.remove(&h);
                    if set.is_empty() {
                        self.children.remove(&p);
                    }
                }
            }
        }
        true
    }

    fn adjust_parent(&mut self, parent: Option<u64>, tier: Tier, added: bool) {
        if let Some(p) = parent.and_then(|p| self.blocks.get_mut(&p)) {
            let n = &mut p.kids[slot(tier)];
            *n = if added { *n + 1 } else { n.saturating_sub(1) };
        }
    }
}
