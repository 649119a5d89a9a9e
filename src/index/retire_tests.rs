//! Unit tests of retired blocks (`retired.rs`): blocks that left their last tier, whose keys
//! the index keeps so that later children still resolve, fed through the wire decoder as vLLM
//! publishes them.

use super::scope_tests::{apply, batch, hits, replica, store};
use super::tests::index;
use super::*;
use crate::wire::record::EventRecord;
use crate::wire::{EngineHash, Tier};

/// A vLLM `BlockStored` of text blocks (no `extra_keys`) on Device.
fn text(hashes: &[u64], parent: Option<u64>) -> EventRecord {
    store(hashes, parent, &[], Tier::Device)
}

fn gone(hashes: &[u64], tier: Tier) -> EventRecord {
    EventRecord::removed(hashes.iter().map(|h| (*h).into()).collect(), tier)
}

#[test]
fn vllms_duplicate_store_sequence_keeps_the_stream_synchronized_and_the_child_keyed() {
    let (mut idx, view) = index(100);
    // A prompt of two blocks, A = 1 and B = 2.
    apply(&mut idx, 0, &batch(vec![text(&[1, 2], None)])).unwrap();
    // Sent again: vLLM recomputes the last block into a new physical copy and stores B again.
    let again = apply(&mut idx, 1, &batch(vec![text(&[2], Some(1))])).unwrap();
    assert_eq!(again.stored, 0, "already resident");
    // The older copy is evicted: BlockRemoved for B, although the newer copy stays.
    assert_eq!(apply(&mut idx, 2, &batch(vec![gone(&[2], Tier::Device)])).unwrap().removed, 1);
    // The next turn extends the prompt: C = 3 names B as its parent.
    let child = apply(&mut idx, 3, &batch(vec![text(&[3], Some(2))])).unwrap();
    assert_eq!(child.stored, 1, "C is keyed from B's content and credited");
    let s = view.status();
    assert!(s.synchronized, "{:?}", s.error);
    assert_eq!((s.sequence, s.device_blocks), (Some(3), 2), "A and C; B is not credited");
    assert_eq!(hits(&view, &[1, 2, 3]), (2, 0), "under-credit: the walk stops at B");
    // When B is stored again, the chain is whole: C was keyed right.
    apply(&mut idx, 4, &batch(vec![text(&[2], Some(1))])).unwrap();
    assert_eq!(hits(&view, &[1, 2, 3]), (6, 0));
}

#[test]
fn stores_republished_for_reused_blocks_never_outlive_a_removal() {
    // kv_cache_report_mode "full" re-publishes BlockStored for reused blocks without a new
    // copy: one removal must still take the block out, however many stores came before.
    let (mut idx, view) = index(100);
    apply(&mut idx, 0, &batch(vec![text(&[1, 2], None)])).unwrap();
    apply(&mut idx, 1, &batch(vec![text(&[1, 2], None), text(&[1, 2], None)])).unwrap();
    apply(&mut idx, 2, &batch(vec![gone(&[2], Tier::Device)])).unwrap();
    assert_eq!(hits(&view, &[1, 2]), (2, 0));
    assert_eq!(view.status().device_blocks, 1);
}

#[test]
fn a_cleared_tier_retires_its_blocks_and_all_blocks_cleared_forgets_them() {
    let (mut idx, view) = index(100);
    apply(&mut idx, 0, &batch(vec![text(&[1, 2], None)])).unwrap();
    apply(&mut idx, 1, &batch(vec![EventRecord::cleared(Some(Tier::Device))])).unwrap();
    assert_eq!(idx.block_count(), 0);
    apply(&mut idx, 2, &batch(vec![text(&[3], Some(2))])).unwrap();
    // A tokenless copy of retired blocks puts them back, on that tier.
    let back = apply(&mut idx, 3, &batch(vec![replica(&[1, 2], Tier::Host)])).unwrap();
    assert_eq!(back.stored, 2);
    assert_eq!(hits(&view, &[1, 2, 3]), (2, 4), "1, 2 on Host, then 3 on Device");
    apply(&mut idx, 4, &batch(vec![EventRecord::cleared(None)])).unwrap();
    let err = apply(&mut idx, 5, &batch(vec![text(&[4], Some(3))])).unwrap_err();
    assert_eq!(err, IndexError::UnknownParent(EngineHash(3)), "a new epoch forgets them");
    let err =
        apply(&mut idx, 0, &batch(vec![EventRecord::cleared(None), replica(&[1], Tier::Host)]));
    assert_eq!(err.unwrap_err(), IndexError::UnknownHash(EngineHash(1)));
}

#[test]
fn a_retired_hash_stored_again_with_other_content_takes_the_new_content() {
    // Engine hashes that name content never do this; an engine that reuses hashes after a
    // removal must not be refused, and the new content is what its children chain to.
    let (mut idx, view) = index(100);
    apply(&mut idx, 0, &batch(vec![text(&[1], None)])).unwrap();
    apply(&mut idx, 1, &batch(vec![gone(&[1], Tier::Device)])).unwrap();
    apply(&mut idx, 2, &batch(vec![text(&[5], None)])).unwrap();
    let mut other = batch(vec![text(&[1], Some(5))]);
    apply(&mut idx, 3, &other).unwrap();
    apply(&mut idx, 4, &batch(vec![gone(&[1], Tier::Device)])).unwrap();
    other = batch(vec![text(&[7], Some(1))]);
    apply(&mut idx, 5, &other).unwrap();
    apply(&mut idx, 6, &batch(vec![replica(&[1], Tier::Device)])).unwrap();
    assert_eq!(hits(&view, &[5, 1, 7]), (6, 0), "1 retired again with its second content");
    assert_eq!(hits(&view, &[1, 7]), (0, 0));
}
