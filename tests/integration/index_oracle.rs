//! Property test: random event sequences (stores, tokenless replicas, removals per tier, clears,
//! full-state batches, snapshots with orphans, limit hits, invalidations, the partial mode,
//! children of retired blocks) drive one stream alone in the index the service runs (a
//! `SharedIndex`) and a small naive model side by side; every apply result, every query answer
//! and every count must agree. `shared_oracle.rs` interleaves several streams.

use crate::oracle::*;
use kvdir::index::{ContentKey, IndexConfig, KeyHasher, SharedHandle, SharedIndex};
use kvdir::wire::Batch;
use proptest::prelude::*;

/// Device and Host-only hit tokens of stream `slot`, with the query's keys hashed apart from
/// the index's own hashing walk.
fn query(view: &SharedHandle, slot: u8, tokens: &[i32]) -> (u64, u64) {
    let mut keys: Vec<ContentKey> = Vec::new();
    KeyHasher::new(B, SEED).prefix_keys(tokens, &mut keys);
    view.match_keys(&keys).tokens(slot)
}

/// One case: every op applied to the index and the model, then a query and the status.
fn run(ops: &[Op], cov: &mut Coverage) -> Result<(), TestCaseError> {
    let config = IndexConfig { block_size: B, hash_seed: SEED, salt: 0, max_blocks: MAX_BLOCKS };
    let shared = SharedIndex::new(B, SEED, 1);
    let mut idx = shared.add_stream(config).unwrap();
    let (mut view, slot) = (shared.reader().handle(), idx.slot());
    idx.load_snapshot(&Batch::default(), 0).unwrap();
    let mut model = Model { synced: true, ..Model::default() };
    for (i, op) in ops.iter().enumerate() {
        let seq = i as u64 + 1;
        apply_op(&mut idx, &mut model, op, seq)?.count(cov);
        idx.publish();
        let tokens = query_tokens(&model, op);
        let got = query(&view, slot, &tokens);
        prop_assert_eq!(got, model.hits(&tokens), "query {:?} after {:?}", tokens, op);
        let walked = view.query(&tokens).tokens(slot);
        prop_assert_eq!(walked, got, "the hashing walk of {:?} after {:?}", tokens, op);
        cov.device_hits += u64::from(got.0 > 0);
        cov.host_only_hits += u64::from(got.1 > 0);
        let status = view.status(slot).expect("the stream is in the index");
        prop_assert_eq!(status.synchronized, model.synced);
        prop_assert_eq!(status.partial, model.partial);
        if model.synced {
            cov.synced_checks += 1;
            let dev = model.blocks.values().filter(|b| b.device).count() as u64;
            let host = model.blocks.values().filter(|b| b.host).count() as u64;
            prop_assert_eq!((status.device_blocks, status.host_blocks), (dev, host));
            prop_assert_eq!(status.sequence, model.sequence);
            prop_assert_eq!(idx.block_count(), model.blocks.len());
            let distinct: std::collections::BTreeSet<u128> =
                model.blocks.values().map(|b| b.key).collect();
            prop_assert_eq!(view.content_entries(), distinct.len());
        }
    }
    Ok(())
}

#[test]
fn index_agrees_with_the_naive_model() {
    use proptest::test_runner::{Config, TestRunner};
    let cov = std::cell::RefCell::new(Coverage::default());
    let mut runner = TestRunner::new(Config { cases: 512, ..Config::default() });
    let result =
        runner.run(&prop::collection::vec(op(), 1..80), |ops| run(&ops, &mut cov.borrow_mut()));
    if let Err(e) = result {
        panic!("{e}");
    }
    let cov = cov.into_inner();
    println!("coverage: {cov:?}");
    // The generator must keep reaching the interesting states, or this test proves little.
    assert!(cov.device_hits > 500 && cov.host_only_hits > 300, "{cov:?}");
    for kind in ["unknown parent", "unknown hash", "conflict", "limit", "not synchronized"] {
        assert!(cov.errors.get(kind).copied().unwrap_or(0) > 20, "too few {kind} errors: {cov:?}");
    }
    assert!(cov.synced_checks > 5_000, "{cov:?}");
    // 64 to 94 skipped while partial and 187 to 301 retired blocks used in 512 cases.
    assert!(cov.partial_skips > 20 && cov.retired_used > 60, "{cov:?}");
}
