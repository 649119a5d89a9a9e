//! The Host tier on real sockets: offload, Device eviction with Host copies, explicit evictions
//! that leave a block on Host, and orphans.

use crate::common::{
    blocks, index_for, index_match, request_snapshot, start, Subscriber, DEADLINE,
};
use kvdir::wire::{Batch, EngineHash, Event, Tier};
use kvdir_sim::{block_hashes, EngineConfig, SimEngine};

const B: u32 = 4;

fn engine(device: usize, host: usize) -> SimEngine {
    start(EngineConfig {
        block_size: B,
        device_capacity_blocks: device,
        host_capacity_blocks: host,
        ..EngineConfig::default()
    })
}

fn hashes(tokens: &[i32]) -> Vec<EngineHash> {
    block_hashes(B, tokens).into_iter().map(|h| EngineHash(u128::from(h))).collect()
}

/// Each event as (kind, hashes, token count, tier) for compact assertions.
fn summary(batch: &Batch) -> Vec<(&'static str, Vec<EngineHash>, usize, Option<Tier>)> {
    batch
        .events
        .iter()
        .map(|e| match e {
            Event::Stored(s) => {
                let tokens = batch.tokens(s.tokens).len();
                ("stored", batch.hashes(s.hashes).to_vec(), tokens, Some(s.tier))
            }
            Event::Removed { hashes, tier, .. } => {
                ("removed", batch.hashes(*hashes).to_vec(), 0, Some(*tier))
            }
            Event::OutOfScope { hashes, tier } => {
                ("out of scope", batch.hashes(*hashes).to_vec(), 0, Some(*tier))
            }
            Event::Cleared { tier } => ("cleared", Vec::new(), 0, *tier),
        })
        .collect()
}

#[test]
fn offload_publishes_tokenless_cpu_stores() {
    let engine = engine(10, 10);
    let sub = Subscriber::connect(&engine, 0);
    let tokens = blocks(0, 3, B);
    engine.process(0, &tokens).unwrap();
    sub.recv_live();
    assert_eq!(engine.offload(0, &tokens[..8]).unwrap(), Some(1));
    let (_, batch) = sub.recv_live();
    assert_eq!(
        summary(&batch),
        vec![("stored", hashes(&tokens)[..2].to_vec(), 0, Some(Tier::Host))]
    );
    assert_eq!(engine.counts(0).unwrap(), (3, 2));
    assert_eq!(engine.offload(0, &tokens[..8]).unwrap(), None, "already on Host");
}

#[test]
fn capacity_eviction_copies_to_host_before_removing_from_device() {
    let engine = engine(2, 10);
    let sub = Subscriber::connect(&engine, 0);
    let a = blocks(0, 2, B);
    engine.process(0, &a).unwrap();
    sub.recv_live();
    let b = blocks(100, 1, B);
    engine.process(0, &b).unwrap();
    let (_, batch) = sub.recv_live();
    let leaf = vec![hashes(&a)[1]];
    assert_eq!(
        summary(&batch),
        vec![
            ("stored", hashes(&b), 4, Some(Tier::Device)),
            ("stored", leaf.clone(), 0, Some(Tier::Host)),
            ("removed", leaf, 0, Some(Tier::Device)),
        ]
    );
    assert_eq!(engine.resident(0, &a).unwrap(), (4, 4));
}

#[test]
fn device_eviction_of_a_block_also_on_host_leaves_it_on_host() {
    let engine = engine(10, 10);
    let sub = Subscriber::connect(&engine, 0);
    let tokens = blocks(0, 2, B);
    engine.process(0, &tokens).unwrap();
    engine.offload(0, &tokens).unwrap();
    assert_eq!(engine.evict(0, &tokens, Tier::Device).unwrap(), Some(2));
    let mut index = index_for(&engine);
    index.load_snapshot(&Batch::default(), 0).unwrap(); // an empty engine's snapshot
    let mut batch = Batch::default();
    for expected in 0..3 {
        let (seq, b) = sub.recv_live();
        assert_eq!(seq, expected);
        batch = b;
        index.apply(seq, &batch).unwrap();
    }
    assert_eq!(summary(&batch), vec![("removed", vec![hashes(&tokens)[1]], 0, Some(Tier::Device))]);
    assert_eq!(engine.resident(0, &tokens).unwrap(), (4, 4));
    index.publish();
    assert_eq!(index_match(&index, &tokens), (4, 4));
    let (watermark, snap) = request_snapshot(&engine, 0, 0, DEADLINE).decode();
    let mut fresh = index_for(&engine);
    fresh.load_snapshot(&snap, watermark).unwrap();
    fresh.publish();
    assert_eq!(index_match(&fresh, &tokens), (4, 4), "the snapshot shows the Host-only block");
}

#[test]
fn a_parent_evicted_from_both_tiers_leaves_an_orphan_the_snapshot_skips() {
    let engine = engine(10, 10);
    let tokens = blocks(0, 3, B);
    engine.process(0, &tokens).unwrap();
    engine.offload(0, &tokens).unwrap();
    engine.evict(0, &tokens[..8], Tier::Device).unwrap();
    engine.evict(0, &tokens[..8], Tier::Host).unwrap();
    assert_eq!(engine.resident(0, &tokens).unwrap(), (4, 0), "the walk stops at the gap");
    assert_eq!(engine.counts(0).unwrap(), (2, 2), "the child stays on both tiers");
    let (watermark, snap) = request_snapshot(&engine, 0, 0, DEADLINE).decode();
    let mut index = index_for(&engine);
    let stats = index.load_snapshot(&snap, watermark).unwrap();
    assert_eq!(stats.orphans, 2, "the orphan's Device store and its Host replica");
    index.publish();
    assert_eq!(index_match(&index, &tokens), (4, 0));
}
