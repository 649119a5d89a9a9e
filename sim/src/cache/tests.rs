//! Unit tests of the cache model, including a replay check: applying the published events to a
//! naive consumer (with the live rules of protocol.md: known parents, known tokenless hashes)
//! must always reproduce the model's residency.

use std::collections::HashMap;

use super::*;
use crate::workload::{Workload, WorkloadConfig};

const B: u32 = 4;

fn model(device: usize, host: usize) -> CacheModel {
    CacheModel::new(CacheConfig {
        block_size: B,
        device_capacity_blocks: device,
        host_capacity_blocks: host,
    })
}

fn toks(range: std::ops::Range<i32>) -> Vec<i32> {
    range.collect()
}

/// A consumer that applies events with the live rules and panics on a violation.
#[derive(Default)]
struct Replica {
    tiers: HashMap<u64, [bool; 2]>,
}

impl Replica {
    fn apply(&mut self, events: &[CacheEvent]) {
        for e in events {
            match e {
                CacheEvent::Stored { hashes, parent, tokens, tier, .. } => {
                    if tokens.is_empty() {
                        assert!(hashes.iter().all(|h| self.tiers.contains_key(h)), "{e:?}");
                    } else {
                        assert_eq!(tokens.len(), hashes.len() * B as usize);
                        assert!(parent.is_none_or(|p| self.tiers.contains_key(&p)), "{e:?}");
                    }
                    for h in hashes {
                        self.tiers.entry(*h).or_default()[slot(*tier)] = true;
                    }
                }
                CacheEvent::Removed { hashes, tier } => {
                    for h in hashes {
                        let t = self.tiers.get_mut(h).expect("removal of an unknown block");
                        t[slot(*tier)] = false;
                        if t == &[false, false] {
                            self.tiers.remove(h);
                        }
                    }
                }
                CacheEvent::Cleared => self.tiers.clear(),
            }
        }
    }

    fn assert_matches(&self, m: &CacheModel) {
        assert_eq!(self.tiers.len(), m.blocks.len());
        for (h, b) in &m.blocks {
            assert_eq!(self.tiers.get(h), Some(&[b.on(Tier::Device), b.on(Tier::Host)]));
        }
    }
}

fn stored(events: &[CacheEvent]) -> Vec<(Vec<u64>, Option<u64>, usize, Tier)> {
    events
        .iter()
        .filter_map(|e| match e {
            CacheEvent::Stored { hashes, parent, tokens, tier, .. } => {
                Some((hashes.clone(), *parent, tokens.len(), *tier))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn hashes_are_deterministic_and_depend_on_the_prefix() {
    let a = block_hashes(B, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(a.len(), 2, "the partial tail has no hash");
    assert_eq!(a, block_hashes(B, &[1, 2, 3, 4, 5, 6, 7, 8]));
    assert_eq!(a[1], block_hash(Some(a[0]), &[5, 6, 7, 8]));
    assert_ne!(a[1], block_hashes(B, &[0, 2, 3, 4, 5, 6, 7, 8])[1]);
}

#[test]
fn new_blocks_are_one_store_with_the_right_parent() {
    let mut m = model(100, 0);
    let h = block_hashes(B, &toks(0..16));
    assert_eq!(stored(&m.process(&toks(0..10))), vec![(h[..2].to_vec(), None, 8, Tier::Device)]);
    assert!(m.process(&toks(0..8)).is_empty(), "resident blocks are only touched");
    assert_eq!(
        stored(&m.process(&toks(0..16))),
        vec![(h[2..].to_vec(), Some(h[1]), 8, Tier::Device)]
    );
    assert_eq!(m.counts(), (4, 0));
    assert_eq!(m.resident(&toks(0..18)), (16, 0));
    assert_eq!(m.resident(&[9, 9, 9, 9]), (0, 0));
}

#[test]
fn device_eviction_without_host_prefers_old_leaves() {
    let mut m = model(3, 0);
    m.process(&toks(0..8)); // a0 a1
    m.process(&toks(100..104)); // b0
    let events = m.process(&toks(200..204)); // c0: over capacity by one
    let a = block_hashes(B, &toks(0..8));
    assert_eq!(
        events.last(),
        Some(&CacheEvent::Removed { hashes: vec![a[1]], tier: Tier::Device })
    );
    assert_eq!(m.resident(&toks(0..8)), (4, 0), "the root a0 survives its leaf");
    assert_eq!(m.counts(), (3, 0));
}

#[test]
fn device_eviction_copies_to_host_first() {
    let mut m = model(2, 10);
    m.process(&toks(0..8));
    let events = m.process(&toks(100..104));
    let a = block_hashes(B, &toks(0..8));
    assert_eq!(
        events[1..],
        [
            CacheEvent::Stored {
                hashes: vec![a[1]],
                parent: Some(a[0]),
                tokens: vec![],
                tier: Tier::Host,
                salt: None,
            },
            CacheEvent::Removed { hashes: vec![a[1]], tier: Tier::Device },
        ]
    );
    assert_eq!(m.resident(&toks(0..8)), (4, 4));
    assert_eq!(m.counts(), (2, 1));
}

#[test]
fn host_only_blocks_come_back_with_tokens_and_keep_their_host_copy() {
    let mut m = model(2, 10);
    m.process(&toks(0..8));
    m.process(&toks(100..104));
    let events = m.process(&toks(0..8));
    let a = block_hashes(B, &toks(0..8));
    assert_eq!(stored(&events)[0], (vec![a[1]], Some(a[0]), 4, Tier::Device));
    assert_eq!(m.resident(&toks(0..8)), (8, 0));
    assert_eq!(m.counts(), (2, 2), "b0 went to Host, a1 stays there too");
}

#[test]
fn host_capacity_evicts_from_host() {
    let mut m = model(1, 1);
    m.process(&toks(0..4));
    m.process(&toks(100..104)); // a0 -> host
    let events = m.process(&toks(200..204)); // b0 -> host, a0 leaves host
    let a0 = block_hashes(B, &toks(0..4))[0];
    assert_eq!(events.last(), Some(&CacheEvent::Removed { hashes: vec![a0], tier: Tier::Host }));
    assert_eq!(m.counts(), (1, 1));
    assert_eq!(m.resident(&toks(0..4)), (0, 0));
}

#[test]
fn offload_copies_resident_device_blocks_tokenless() {
    let mut m = model(10, 10);
    m.process(&toks(0..12));
    let h = block_hashes(B, &toks(0..12));
    let events = m.offload(&toks(0..8));
    assert_eq!(stored(&events), vec![(h[..2].to_vec(), None, 0, Tier::Host)]);
    assert!(m.offload(&toks(0..8)).is_empty(), "already on Host");
    assert_eq!(m.counts(), (3, 2));
    assert!(model(10, 0).offload(&toks(0..8)).is_empty());
}

#[test]
fn evict_removes_only_the_last_block_and_can_make_orphans() {
    let mut m = model(10, 10);
    m.process(&toks(0..12));
    m.offload(&toks(0..12));
    let h = block_hashes(B, &toks(0..12));
    assert_eq!(
        m.evict(&toks(0..8), Tier::Device),
        vec![CacheEvent::removed_for_test(h[1], Tier::Device)]
    );
    assert_eq!(m.resident(&toks(0..12)), (8, 4), "a1 is Host-only now");
    m.evict(&toks(0..8), Tier::Host);
    assert!(m.evict(&toks(0..8), Tier::Host).is_empty(), "nothing left to evict");
    assert_eq!(m.resident(&toks(0..12)), (4, 0), "the walk stops at the absent a1");
    assert_eq!(m.counts(), (2, 2), "a2 stays as an orphan");
    let state = stored(&m.full_state());
    assert!(state.contains(&(vec![h[2]], Some(h[1]), 4, Tier::Device)), "{state:?}");
}

#[test]
fn full_state_is_parent_first_with_replicas_last() {
    let mut m = model(3, 10);
    m.process(&toks(0..12));
    m.process(&toks(0..4).into_iter().chain(50..54).collect::<Vec<_>>());
    let mut replica = Replica::default();
    let mut events = vec![CacheEvent::Cleared];
    events.extend(m.full_state());
    replica.apply(&events);
    replica.assert_matches(&m);
    let kinds: Vec<bool> = stored(&events).iter().map(|s| s.2 == 0).collect();
    let first_tokenless = kinds.iter().position(|t| *t).unwrap_or(kinds.len());
    assert!(kinds[first_tokenless..].iter().all(|t| *t), "tokenless replicas come last");
}

#[test]
fn clear_empties_everything() {
    let mut m = model(10, 10);
    m.process(&toks(0..12));
    m.offload(&toks(0..12));
    assert_eq!(m.clear(), vec![CacheEvent::Cleared]);
    assert_eq!(m.counts(), (0, 0));
    assert!(m.full_state().is_empty());
}

/// Random requests, offloads and evictions from the workload generator: the events always
/// replay onto a naive consumer without violating the live rules, the full state rebuilds the
/// same residency, capacities hold, and no orphan appears without an explicit evict().
#[test]
fn published_events_replay_to_the_model_state() {
    let config = WorkloadConfig {
        system_prompts: 3,
        system_prompt_tokens: 12,
        sessions: 6,
        turn_tokens: 1..=9,
        max_turns: 5,
        vocab_size: 5,
        ..WorkloadConfig::default()
    };
    for (device, host) in [(6, 0), (8, 5), (20, 40), (3, 2)] {
        let mut w = Workload::new(config.clone());
        let mut m = model(device, host);
        let mut replica = Replica::default();
        for i in 0..400 {
            let r = w.next_request();
            let events = match i % 7 {
                3 => m.offload(&r.tokens),
                _ => m.process(&r.tokens),
            };
            replica.apply(&events);
            replica.assert_matches(&m);
            let (d, h) = m.counts();
            assert!(d as usize <= device && h as usize <= host);
            let mut snap = Replica::default();
            snap.apply(&[vec![CacheEvent::Cleared], m.full_state()].concat());
            snap.assert_matches(&m);
        }
    }
}

impl CacheEvent {
    fn removed_for_test(h: u64, tier: Tier) -> CacheEvent {
        CacheEvent::Removed { hashes: vec![h], tier }
    }
}

#[test]
fn a_salted_prompt_is_keyed_apart_and_its_root_store_carries_the_salt() {
    let mut m = model(10, 0);
    let prompt = toks(0..8);
    m.process(&prompt);
    let salted = salted_block_hashes(B, &prompt, Some("s"));
    assert_ne!(salted, block_hashes(B, &prompt), "the salt changes every block");
    assert_eq!(salted_block_hashes(B, &prompt, None), block_hashes(B, &prompt));
    let salt_of = |events: &[CacheEvent]| match events {
        [CacheEvent::Stored { hashes, salt, .. }] => (hashes.clone(), salt.clone()),
        other => panic!("{other:?}"),
    };
    let events = m.process_salted(&prompt, Some("s"));
    assert_eq!(salt_of(&events), (salted.clone(), Some("s".to_string())));
    assert_eq!(m.resident_salted(&prompt, Some("s")), (8, 0));
    assert_eq!(m.resident_salted(&prompt, Some("t")), (0, 0));
    let longer = m.process_salted(&toks(0..12), Some("s"));
    let (hashes, salt) = salt_of(&longer);
    assert_eq!((hashes.len(), salt), (1, None), "a block after the root carries no salt");
    let full = m.full_state();
    let roots: Vec<_> = full
        .iter()
        .filter_map(|e| match e {
            CacheEvent::Stored { parent: None, salt, .. } => Some(salt.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(roots.len(), 2);
    assert!(roots.contains(&Some("s".to_string())) && roots.contains(&None), "{roots:?}");
}
