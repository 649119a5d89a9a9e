//! Unit tests of the index rules (protocol.md sections 1, 2.2, 3 and 6), on small blocks.

use super::*;
use crate::wire::{Batch, EngineHash, Tier};

pub(super) const B: u32 = 2;

fn h(v: u128) -> EngineHash {
    EngineHash(v)
}

/// One stream's view in a shared index, as the tests read it.
pub(super) struct View {
    handle: SharedHandle,
    slot: u8,
}

impl View {
    /// The stream's published status; `None` once it is removed.
    pub fn status(&self) -> std::sync::Arc<StreamStatus> {
        self.handle.status(self.slot).expect("the stream is in the index")
    }

    /// Device and Host-only hit tokens of a prompt, hashed by the query.
    pub fn query(&mut self, tokens: &[i32]) -> (u64, u64) {
        self.handle.query(tokens).tokens(self.slot)
    }

    /// Distinct keys in the view.
    pub fn content_entries(&self) -> usize {
        self.handle.content_entries()
    }

    /// Device and Host-only hit tokens of keys computed beforehand.
    pub fn match_keys(&self, keys: &[ContentKey]) -> (u64, u64) {
        self.handle.match_keys(keys).tokens(self.slot)
    }
}

/// A synchronized, empty stream of [`B`]-token blocks, alone in a shared index, and a reader
/// of it.
pub(super) fn index(max_blocks: usize) -> (StreamWriter, View) {
    let config = IndexConfig { block_size: B, hash_seed: 1024, salt: 0, max_blocks };
    let shared = SharedIndex::new(B, 1024, 1);
    let mut idx = shared.add_stream(config).unwrap();
    idx.load_snapshot(&Batch::default(), 0).unwrap();
    idx.publish();
    let view = View { handle: shared.reader().handle(), slot: idx.slot() };
    (idx, view)
}

fn keys(tokens: &[i32]) -> Vec<ContentKey> {
    let mut out = Vec::new();
    KeyHasher::new(B, 1024).prefix_keys(tokens, &mut out);
    out
}

/// (device_hit_tokens, host_only_hit_tokens) for a query.
fn hits(view: &View, tokens: &[i32]) -> (u64, u64) {
    view.match_keys(&keys(tokens))
}

fn stored(hashes: &[u128], parent: Option<u128>, tokens: &[i32], tier: Tier) -> Batch {
    let mut b = Batch::default();
    let hs: Vec<_> = hashes.iter().map(|v| h(*v)).collect();
    b.push_stored(&hs, parent.map(h), tokens, B, tier);
    b
}

fn removed(hashes: &[u128], tier: Tier) -> Batch {
    let mut b = Batch::default();
    let hs: Vec<_> = hashes.iter().map(|v| h(*v)).collect();
    b.push_removed(&hs, tier);
    b
}

fn apply(idx: &mut StreamWriter, seq: u64, b: &Batch) -> Result<ApplyStats, IndexError> {
    let r = idx.apply(seq, b);
    idx.publish();
    r
}

/// Blocks 1,2 = tokens [1,2],[3,4] on Device; block 3 = [5,6] child of 2 on Device.
fn populated() -> (StreamWriter, View) {
    let (mut idx, view) = index(100);
    apply(&mut idx, 0, &stored(&[1, 2], None, &[1, 2, 3, 4], Tier::Device)).unwrap();
    apply(&mut idx, 1, &stored(&[3], Some(2), &[5, 6], Tier::Device)).unwrap();
    (idx, view)
}

#[test]
fn stored_blocks_match_as_a_prefix_and_a_partial_tail_is_ignored() {
    let (_idx, view) = populated();
    assert_eq!(hits(&view, &[1, 2, 3, 4, 5, 6, 7]), (6, 0));
    assert_eq!(hits(&view, &[1, 2, 3, 4, 9, 9]), (4, 0), "stops at the first absent block");
    assert_eq!(hits(&view, &[3, 4, 5, 6]), (0, 0), "a block only matches after its own prefix");
    assert_eq!(hits(&view, &[]), (0, 0));
    let s = view.status();
    assert!(s.synchronized);
    assert_eq!((s.sequence, s.device_blocks, s.host_blocks), (Some(1), 3, 0));
}

#[test]
fn changes_are_invisible_until_published() {
    let (mut idx, view) = index(100);
    idx.apply(0, &stored(&[1], None, &[1, 2], Tier::Device)).unwrap();
    assert_eq!(hits(&view, &[1, 2]), (0, 0));
    idx.publish();
    assert_eq!(hits(&view, &[1, 2]), (2, 0));
}

#[test]
fn tokenless_host_copies_and_device_removal_leave_host_credit() {
    let (mut idx, view) = populated();
    let mut copy = stored(&[1, 2], None, &[], Tier::Host);
    copy.push_removed(&[h(1), h(2)], Tier::Device);
    apply(&mut idx, 2, &copy).unwrap();
    assert_eq!(hits(&view, &[1, 2, 3, 4, 5, 6]), (2, 4), "1,2 host-only, then 3 on Device");
    let s = view.status();
    assert_eq!((s.device_blocks, s.host_blocks), (1, 2));
}

#[test]
fn a_block_on_both_tiers_counts_once_as_device() {
    let (mut idx, view) = populated();
    apply(&mut idx, 2, &stored(&[1], None, &[], Tier::Host)).unwrap();
    assert_eq!(hits(&view, &[1, 2, 3, 4]), (4, 0));
    let s = view.status();
    assert_eq!((s.device_blocks, s.host_blocks), (3, 1), "replicas overlap in the counts");
}

#[test]
fn a_block_leaving_both_tiers_is_retired_and_a_replica_brings_it_back() {
    let (mut idx, view) = populated();
    apply(&mut idx, 2, &stored(&[1], None, &[], Tier::Host)).unwrap();
    apply(&mut idx, 3, &removed(&[1], Tier::Device)).unwrap();
    apply(&mut idx, 4, &removed(&[1], Tier::Host)).unwrap();
    assert_eq!(hits(&view, &[1, 2]), (0, 0));
    assert_eq!(idx.block_count(), 2, "a retired block is not held");
    // The engine says it holds the block again, on Host: its content is known.
    let back = apply(&mut idx, 5, &stored(&[1], None, &[], Tier::Host)).unwrap();
    assert_eq!(back.stored, 1);
    assert_eq!(hits(&view, &[1, 2]), (0, 2), "back on Host only");
    assert_eq!((view.status().device_blocks, view.status().host_blocks), (2, 1));
    let err = apply(&mut idx, 6, &stored(&[9], None, &[], Tier::Host)).unwrap_err();
    assert_eq!(err, IndexError::UnknownHash(h(9)), "a hash never seen is still unknown");
}

#[test]
fn storing_again_on_the_same_tier_is_idempotent() {
    let (mut idx, view) = populated();
    let stats = apply(&mut idx, 2, &stored(&[1, 2], None, &[1, 2, 3, 4], Tier::Device)).unwrap();
    assert_eq!(stats.stored, 0);
    apply(&mut idx, 3, &removed(&[1], Tier::Device)).unwrap();
    assert_eq!(hits(&view, &[1, 2]), (0, 0), "one removal undoes any number of stores");
}

#[test]
fn clearing_one_tier_keeps_the_other() {
    let (mut idx, view) = populated();
    apply(&mut idx, 2, &stored(&[1, 2], None, &[], Tier::Host)).unwrap();
    let mut clear = Batch::default();
    clear.push_cleared(Some(Tier::Device));
    apply(&mut idx, 3, &clear).unwrap();
    assert_eq!(hits(&view, &[1, 2, 3, 4, 5, 6]), (0, 4));
    assert_eq!(idx.block_count(), 2, "the device-only block 3 is gone with its mapping");
    let mut all = Batch::default();
    all.push_cleared(None);
    apply(&mut idx, 4, &all).unwrap();
    assert_eq!(hits(&view, &[1, 2, 3, 4]), (0, 0));
    assert_eq!(idx.block_count(), 0);
    let s = view.status();
    assert_eq!((s.device_blocks, s.host_blocks, s.synchronized), (0, 0, true));
}

#[test]
fn an_unknown_parent_unsynchronizes_until_a_full_state_arrives() {
    let (mut idx, view) = populated();
    let err = apply(&mut idx, 2, &stored(&[9], Some(77), &[7, 8], Tier::Device)).unwrap_err();
    assert_eq!(err, IndexError::UnknownParent(h(77)));
    let s = view.status();
    assert!(!s.synchronized);
    assert_eq!(s.error.as_deref(), Some(err.to_string().as_str()));
    assert_eq!(hits(&view, &[1, 2]), (0, 0), "an unsynchronized stream gives no credit");

    let refused = apply(&mut idx, 3, &stored(&[4], None, &[9, 9], Tier::Device)).unwrap_err();
    assert!(matches!(refused, IndexError::NotSynchronized(_)), "{refused}");

    let mut full = Batch::default();
    full.push_cleared(None);
    full.push_stored(&[h(5)], None, &[1, 2], B, Tier::Host);
    apply(&mut idx, 4, &full).unwrap();
    assert_eq!(hits(&view, &[1, 2, 3, 4]), (0, 2), "only the full state's contents remain");
    assert_eq!(view.status().sequence, Some(4));
}

#[test]
fn block_size_and_token_count_mismatches_are_errors() {
    let (mut idx, _view) = populated();
    let mut b = Batch::default();
    b.push_stored(&[h(8)], None, &[1, 2, 3, 4], 4, Tier::Device);
    let err = apply(&mut idx, 2, &b).unwrap_err();
    assert_eq!(err, IndexError::BlockSize { expected: 2, got: 4 });
    assert!(err.to_string().contains("configure block_size"), "{err}");

    let (mut idx, _view) = populated();
    let err = apply(&mut idx, 2, &stored(&[8, 9], None, &[1, 2, 3], Tier::Device)).unwrap_err();
    assert_eq!(err, IndexError::TokenCount { tokens: 3, blocks: 2, expected: 4, block_size: 2 });
}

#[test]
fn a_hash_stored_again_with_other_content_is_a_conflict() {
    let (mut idx, _view) = populated();
    let err = apply(&mut idx, 2, &stored(&[1], None, &[9, 9], Tier::Host)).unwrap_err();
    assert_eq!(err, IndexError::HashConflict(h(1)));
}

#[test]
fn removals_of_unknown_hashes_are_counted_not_errors() {
    let (mut idx, view) = populated();
    let stats = apply(&mut idx, 2, &removed(&[42, 1], Tier::Device)).unwrap();
    assert_eq!((stats.unknown_removals, stats.removed), (1, 1));
    assert!(view.status().synchronized);
}

#[test]
fn two_engine_hashes_with_the_same_content_are_counted_separately() {
    let (mut idx, view) = index(100);
    apply(&mut idx, 0, &stored(&[1], None, &[1, 2], Tier::Device)).unwrap();
    apply(&mut idx, 1, &stored(&[2], None, &[1, 2], Tier::Device)).unwrap();
    apply(&mut idx, 2, &removed(&[1], Tier::Device)).unwrap();
    assert_eq!(hits(&view, &[1, 2]), (2, 0), "block 2 still holds the content");
    apply(&mut idx, 3, &removed(&[2], Tier::Device)).unwrap();
    assert_eq!(hits(&view, &[1, 2]), (0, 0));
}

#[test]
fn max_blocks_per_stream_is_enforced() {
    let (mut idx, view) = index(3);
    apply(&mut idx, 0, &stored(&[1, 2, 3], None, &[1, 2, 3, 4, 5, 6], Tier::Device)).unwrap();
    apply(&mut idx, 1, &stored(&[1], None, &[], Tier::Host)).unwrap();
    let err = apply(&mut idx, 2, &stored(&[4], Some(3), &[7, 8], Tier::Device)).unwrap_err();
    assert_eq!(err, IndexError::LimitExceeded { limit: 3 });
    assert!(!view.status().synchronized);
    assert!(err.to_string().contains("max_blocks_per_stream = 3"), "{err}");
}

#[test]
fn snapshots_skip_orphans_and_keep_other_prefixes() {
    let (mut idx, view) = populated();
    let mut snap = stored(&[10, 11], None, &[1, 2, 3, 4], Tier::Device);
    snap.push_stored(&[h(12)], Some(h(99)), &[5, 6], B, Tier::Device); // parent gone: orphan
    snap.push_stored(&[h(13)], Some(h(12)), &[7, 8], B, Tier::Device); // descendant of an orphan
    snap.push_stored(&[h(14)], None, &[9, 9], B, Tier::Host);
    snap.push_stored(&[h(10), h(77)], None, &[], B, Tier::Host); // 77 unknown: tokenless orphan
    let stats = idx.load_snapshot(&snap, 20).unwrap();
    idx.publish();
    assert_eq!(stats.orphans, 3);
    assert_eq!(hits(&view, &[1, 2, 3, 4, 5, 6]), (4, 0));
    assert_eq!(hits(&view, &[9, 9]), (0, 2));
    let s = view.status();
    assert_eq!(
        (s.synchronized, s.sequence, s.device_blocks, s.host_blocks),
        (true, Some(19), 2, 2)
    );
    apply(&mut idx, 20, &stored(&[15], Some(11), &[5, 6], Tier::Device)).unwrap();
    assert_eq!(hits(&view, &[1, 2, 3, 4, 5, 6]), (6, 0), "live deltas continue the snapshot");
}

#[test]
fn a_snapshot_is_built_aside_and_a_failed_one_leaves_no_credit() {
    let (mut idx, view) = populated();
    let mut builder = idx.snapshot_builder();
    builder.add(&stored(&[20], None, &[5, 5], Tier::Device)).unwrap();
    assert_eq!(hits(&view, &[1, 2]), (2, 0), "the live view is untouched while building");
    idx.install_snapshot(builder, 0);
    idx.publish();
    assert_eq!(hits(&view, &[1, 2]), (0, 0));
    assert_eq!(hits(&view, &[5, 5]), (2, 0));
    assert_eq!(view.status().sequence, None, "watermark 0: nothing applied yet");

    let (mut idx, view) = index(1);
    let err =
        idx.load_snapshot(&stored(&[1, 2], None, &[1, 2, 3, 4], Tier::Device), 5).unwrap_err();
    idx.publish();
    assert_eq!(err, IndexError::LimitExceeded { limit: 1 });
    assert!(!view.status().synchronized);
}

#[test]
fn a_new_index_waits_for_its_first_snapshot() {
    let shared = SharedIndex::new(128, 1024, 1);
    let mut idx = shared.add_stream(IndexConfig::default()).unwrap();
    idx.publish();
    let view = View { handle: shared.reader().handle(), slot: idx.slot() };
    let s = view.status();
    assert!(!s.synchronized);
    assert_eq!(s.error.as_deref(), Some("waiting for the first snapshot"));
    drop(idx);
    assert_eq!(view.handle.status(view.slot), None, "a removed stream has no status");
}
