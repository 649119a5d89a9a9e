//! The naive model of one stream: the spec the oracle tests hold the index to.

use std::collections::BTreeMap;

use kvdir::index::IndexError;
use kvdir::wire::Tier;

use super::{eh, Ev, B, MAX_BLOCKS, SEED};

/// The naive content key: a fresh buffer per block, no reuse.
pub fn naive_key(prev: Option<u128>, block: &[i32]) -> u128 {
    let mut bytes = Vec::new();
    if let Some(p) = prev {
        bytes.extend_from_slice(&p.to_le_bytes());
    }
    for t in block {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_128_with_seed(&bytes, SEED)
}

#[derive(Debug, Clone, Default)]
pub struct ModelBlock {
    pub key: u128,
    pub device: bool,
    pub host: bool,
    /// The full token prefix ending with this block, to generate hitting queries.
    pub prefix: Vec<i32>,
}

#[derive(Debug, Clone, Default)]
pub struct Model {
    pub blocks: BTreeMap<u8, ModelBlock>,
    /// Blocks that left their last tier, by hash, until `AllBlocksCleared`.
    pub retired: BTreeMap<u8, ModelBlock>,
    pub synced: bool,
    pub sequence: Option<u64>,
    pub partial: bool,
    /// Of the last `apply`: blocks skipped while partial, and retired blocks used (as a parent
    /// or brought back by a tokenless store).
    pub unknown_parents: u64,
    pub retired_used: u64,
}

pub fn set(b: &mut ModelBlock, t: Tier, on: bool) {
    match t {
        Tier::Device => b.device = on,
        Tier::Host => b.host = on,
    }
}

impl Model {
    pub fn apply(&mut self, events: &[Ev], snapshot: bool) -> Result<(), IndexError> {
        (self.unknown_parents, self.retired_used) = (0, 0);
        for e in events {
            match e {
                Ev::Store { parent, hashes, tokens, tier } => {
                    self.store(*parent, hashes, tokens, *tier, snapshot)?
                }
                Ev::Tokenless { hashes, tier } => self.tokenless(hashes, *tier, snapshot)?,
                Ev::Remove { hashes, tier } => {
                    for h in hashes {
                        if let Some(b) = self.blocks.get_mut(h) {
                            set(b, *tier, false);
                            if !b.device && !b.host {
                                let b = self.blocks.remove(h).unwrap();
                                self.retired.insert(*h, b);
                            }
                        }
                    }
                }
                Ev::Clear(None) => {
                    self.blocks.clear();
                    self.retired.clear();
                    self.partial = false;
                }
                Ev::Clear(Some(t)) => {
                    for b in self.blocks.values_mut() {
                        set(b, *t, false);
                    }
                    let (kept, gone) = std::mem::take(&mut self.blocks)
                        .into_iter()
                        .partition(|(_, b)| b.device || b.host);
                    self.blocks = kept;
                    self.retired.extend(gone);
                }
            }
        }
        Ok(())
    }

    fn tokenless(&mut self, hashes: &[u8], tier: Tier, snapshot: bool) -> Result<(), IndexError> {
        for h in hashes {
            if let Some(b) = self.blocks.get_mut(h) {
                set(b, tier, true);
            } else if let Some(r) = self.retired.get(h) {
                if self.blocks.len() >= MAX_BLOCKS {
                    return Err(IndexError::LimitExceeded { limit: MAX_BLOCKS });
                }
                let mut b = ModelBlock { device: false, host: false, ..r.clone() };
                set(&mut b, tier, true);
                self.blocks.insert(*h, b);
                self.retired.remove(h);
                self.retired_used += 1;
            } else if self.partial && !snapshot {
                self.unknown_parents += 1;
            } else if !snapshot {
                return Err(IndexError::UnknownHash(eh(*h)));
            }
        }
        Ok(())
    }

    fn store(
        &mut self,
        parent: Option<u8>,
        hashes: &[u8],
        tokens: &[i32],
        tier: Tier,
        snapshot: bool,
    ) -> Result<(), IndexError> {
        let (mut prev, mut prefix) = match parent {
            None => (None, Vec::new()),
            Some(p) => match (self.blocks.get(&p), self.retired.get(&p)) {
                (Some(b), _) => (Some(b.key), b.prefix.clone()),
                (None, Some(b)) => {
                    self.retired_used += 1;
                    (Some(b.key), b.prefix.clone())
                }
                (None, None) if snapshot => return Ok(()),
                (None, None) if self.partial => {
                    self.unknown_parents += hashes.len() as u64;
                    return Ok(());
                }
                (None, None) => return Err(IndexError::UnknownParent(eh(p))),
            },
        };
        for (h, block) in hashes.iter().zip(tokens.chunks(B as usize)) {
            let key = naive_key(prev, block);
            prefix.extend_from_slice(block);
            let len = self.blocks.len();
            match self.blocks.get_mut(h) {
                Some(b) if b.key != key => return Err(IndexError::HashConflict(eh(*h))),
                Some(b) => set(b, tier, true),
                None if len >= MAX_BLOCKS => {
                    return Err(IndexError::LimitExceeded { limit: MAX_BLOCKS })
                }
                None => {
                    let mut b = ModelBlock { key, prefix: prefix.clone(), ..Default::default() };
                    set(&mut b, tier, true);
                    self.blocks.insert(*h, b);
                    self.retired.remove(h);
                }
            }
            prev = Some(key);
        }
        Ok(())
    }

    pub fn hits(&self, tokens: &[i32]) -> (u64, u64) {
        let (mut dev, mut host, mut prev) = (0, 0, None);
        if !self.synced {
            return (0, 0);
        }
        for block in tokens.chunks_exact(B as usize) {
            let key = naive_key(prev, block);
            let on =
                |f: fn(&ModelBlock) -> bool| self.blocks.values().any(|b| b.key == key && f(b));
            if on(|b| b.device) {
                dev += u64::from(B);
            } else if on(|b| b.host) {
                host += u64::from(B);
            } else {
                break;
            }
            prev = Some(key);
        }
        (dev, host)
    }
}
