//! Unit tests of hybrid streams (`groups.rs`, `apply/hybrid.rs`, `shared/hybrid_read.rs`):
//! events shaped as vLLM 0.32 publishes them for a model with a sliding-window group 0
//! (window 4 tokens: 2 blocks of 2 tokens must be cached in a row) and a full-attention
//! group 1, read back by vLLM's rule.

use super::tests::{index, View, B};
use super::*;
use crate::wire::{AttentionKind, Batch, EngineHash, Group, Tier, Unmodelled};

const SW: AttentionKind = AttentionKind::SlidingWindow { window: 4 };

fn group(idx: u32, kind: AttentionKind) -> Group {
    Group { idx, kind: Some(kind) }
}

fn hs(v: &[u128]) -> Vec<EngineHash> {
    v.iter().map(|v| EngineHash(*v)).collect()
}

/// A prompt of `blocks` blocks whose block `i` has tokens `[base + i, base + i]` and hash
/// `base + i`.
fn prompt(base: u128, blocks: usize) -> (Vec<u128>, Vec<i32>) {
    let hashes: Vec<u128> = (0..blocks as u128).map(|i| base + i).collect();
    let tokens = hashes.iter().flat_map(|h| [*h as i32, *h as i32]).collect();
    (hashes, tokens)
}

/// vLLM's stores for a request's new blocks `from..` of a prompt: the window group lists only
/// its last `kept` blocks (with the whole range's tokens), the full group all of them.
fn request(b: &mut Batch, p: &(Vec<u128>, Vec<i32>), from: usize, kept: usize) {
    let (hashes, tokens) = p;
    let parent = from.checked_sub(1).map(|i| EngineHash(hashes[i]));
    let range = &tokens[from * B as usize..];
    let sw_hashes = &hashes[hashes.len() - kept.min(hashes.len() - from)..];
    b.push_stored_by(&hs(sw_hashes), parent, range, B, Tier::Device, group(0, SW));
    let full = group(1, AttentionKind::Full);
    b.push_stored_by(&hs(&hashes[from..]), parent, range, B, Tier::Device, full);
}

fn removed(b: &mut Batch, hashes: &[u128], idx: u32) {
    b.push_removed_from(&hs(hashes), Tier::Device, Group { idx, kind: None });
}

fn apply(idx: &mut StreamWriter, seq: u64, batch: &Batch) {
    idx.apply(seq, batch).unwrap();
    idx.publish();
}

/// Device and Host-only hit tokens of a prompt (its last token is never credited).
fn hit(view: &mut View, tokens: &[i32]) -> (u64, u64) {
    view.query(tokens)
}

#[test]
fn a_window_store_listing_only_its_last_blocks_is_located_by_the_full_store() {
    let (mut idx, mut view) = index(100);
    let a = prompt(10, 8);
    let mut b = Batch::default();
    request(&mut b, &a, 0, 2);
    apply(&mut idx, 0, &b);
    let s = view.status();
    assert!(s.synchronized, "{:?}", s.error);
    assert_eq!(s.attention.len(), 2, "full attention and the window");
    assert_eq!(s.unlocated_blocks, 0, "the full store located the window's blocks");
    // The whole prompt again, one more token: all 8 blocks within n - 1.
    let mut more = a.1.clone();
    more.push(99);
    assert_eq!(hit(&mut view, &more), (16, 0));
    // Exactly the prompt: at most 7 blocks; the window then needs blocks 5 and 6, which it
    // no longer holds (it kept 6 and 7), and no run starts at block 0.
    assert_eq!(hit(&mut view, &a.1), (0, 0));
}

#[test]
fn a_shared_prefix_without_the_window_gives_nothing_where_full_attention_alone_would_credit() {
    let (mut idx, mut view) = index(100);
    let a = prompt(10, 8);
    let mut b = Batch::default();
    request(&mut b, &a, 0, 2);
    apply(&mut idx, 0, &b);
    // Another conversation branching after block 4: full attention holds blocks 0..4, the
    // window none of them; vLLM reuses nothing.
    let mut branch = a.1[..8].to_vec();
    branch.extend([500, 500, 501, 501, 502]);
    assert_eq!(hit(&mut view, &branch), (0, 0));
}

#[test]
fn the_rightmost_window_run_within_the_full_prefix_sets_the_hit() {
    let (mut idx, mut view) = index(100);
    let a = prompt(10, 8);
    let mut b = Batch::default();
    request(&mut b, &a, 0, 8); // dense retention: the window keeps every block
    apply(&mut idx, 0, &b);
    let mut more = a.1.clone();
    more.push(99);
    assert_eq!(hit(&mut view, &more), (16, 0));
    // The window loses block 6: the rightmost run of two ends at block 6 (blocks 4 and 5).
    let mut r = Batch::default();
    removed(&mut r, &[16], 0);
    apply(&mut idx, 1, &r);
    assert_eq!(hit(&mut view, &more), (12, 0));
    // Full attention loses block 3: the hit is cut to 3 blocks, and the window's run 1..3
    // ends there.
    let mut r = Batch::default();
    removed(&mut r, &[13], 1);
    apply(&mut idx, 2, &r);
    assert_eq!(hit(&mut view, &more), (6, 0));
    // The window loses block 1: no run of two within 3 blocks ends anywhere, and the run
    // from block 0 is one block long.
    let mut r = Batch::default();
    removed(&mut r, &[11], 0);
    apply(&mut idx, 3, &r);
    assert_eq!(hit(&mut view, &more), (2, 0));
}

#[test]
fn a_second_copy_in_a_group_outlives_the_removal_of_the_first() {
    let (mut idx, mut view) = index(100);
    let a = prompt(10, 3);
    let mut b = Batch::default();
    request(&mut b, &a, 0, 3);
    // The window missed, so the request recomputed block 2 in both groups: second copies.
    request(&mut b, &a, 2, 1);
    apply(&mut idx, 0, &b);
    let mut more = a.1.clone();
    more.push(99);
    assert_eq!(hit(&mut view, &more), (6, 0));
    let mut r = Batch::default();
    removed(&mut r, &[12], 0);
    removed(&mut r, &[12], 1);
    apply(&mut idx, 1, &r);
    assert_eq!(hit(&mut view, &more), (6, 0), "the newer copies stay");
    let mut r = Batch::default();
    removed(&mut r, &[12], 1);
    apply(&mut idx, 2, &r);
    assert_eq!(hit(&mut view, &more), (4, 0), "full attention holds blocks 0 and 1 only");
    assert_eq!(idx.block_count(), 3, "block 2 is still in the window's group");
}

#[test]
fn window_copies_stored_before_their_full_store_wait_and_are_then_credited() {
    let (mut idx, mut view) = index(100);
    let a = prompt(10, 4);
    let mut b = Batch::default();
    let sw = group(0, SW);
    b.push_stored_by(&hs(&a.0[2..]), None, &a.1, B, Tier::Device, sw);
    apply(&mut idx, 0, &b);
    assert_eq!(view.status().unlocated_blocks, 2);
    let mut more = a.1.clone();
    more.push(99);
    assert_eq!(hit(&mut view, &more), (0, 0), "unlocated copies give nothing");
    let mut b = Batch::default();
    let full = group(1, AttentionKind::Full);
    b.push_stored_by(&hs(&a.0), None, &a.1, B, Tier::Device, full);
    apply(&mut idx, 1, &b);
    assert_eq!(view.status().unlocated_blocks, 0);
    assert_eq!(hit(&mut view, &more), (8, 0));
}

#[test]
fn a_model_of_windows_alone_credits_only_what_its_stores_locate() {
    let (mut idx, mut view) = index(100);
    let a = prompt(10, 4);
    let mut more = a.1.clone();
    more.push(99);
    // Dense retention: the store covers its blocks exactly and locates them itself.
    let mut b = Batch::default();
    b.push_stored_by(&hs(&a.0), None, &a.1, B, Tier::Device, group(0, SW));
    apply(&mut idx, 0, &b);
    assert_eq!(hit(&mut view, &more), (8, 0));
    // Default retention: a store listing fewer blocks than its tokens locates nothing.
    let c = prompt(40, 4);
    let mut b = Batch::default();
    b.push_stored_by(&hs(&c.0[2..]), None, &c.1, B, Tier::Device, group(0, SW));
    apply(&mut idx, 1, &b);
    let mut more = c.1.clone();
    more.push(99);
    assert_eq!(hit(&mut view, &more), (0, 0), "never an over-credit");
}

#[test]
fn a_kind_without_a_rule_credits_nothing_and_is_reported() {
    let (mut idx, mut view) = index(100);
    let a = prompt(10, 3);
    let mut b = Batch::default();
    let mamba = AttentionKind::Unmodelled(Unmodelled::Mamba);
    b.push_stored_by(&hs(&a.0), None, &a.1, B, Tier::Device, group(0, AttentionKind::Full));
    b.push_stored_by(&hs(&a.0), None, &a.1, B, Tier::Device, group(1, mamba));
    apply(&mut idx, 0, &b);
    let mut more = a.1.clone();
    more.push(99);
    assert_eq!(hit(&mut view, &more), (0, 0));
    assert!(view.status().attention.iter().any(|c| c.kind == mamba));
}

#[test]
fn a_dense_stream_that_meets_a_second_group_keeps_what_it_held() {
    let (mut idx, mut view) = index(100);
    let a = prompt(10, 3);
    let mut b = Batch::default();
    b.push_stored_by(&hs(&a.0), None, &a.1, B, Tier::Device, group(0, AttentionKind::Full));
    apply(&mut idx, 0, &b);
    assert!(view.status().attention.is_empty(), "one full-attention group is dense");
    let mut more = a.1.clone();
    more.push(99);
    assert_eq!(hit(&mut view, &more), (6, 0));
    let mut b = Batch::default();
    b.push_stored_by(&hs(&a.0), None, &a.1, B, Tier::Device, group(1, SW));
    apply(&mut idx, 1, &b);
    assert_eq!(view.status().attention.len(), 2);
    assert_eq!(hit(&mut view, &more), (6, 0));
    let mut r = Batch::default();
    removed(&mut r, &[12], 0);
    apply(&mut idx, 2, &r);
    assert_eq!(hit(&mut view, &more), (4, 0), "group 0's removal cuts full attention");
}

#[test]
fn clears_and_stream_removal_take_every_class_entry_out() {
    let (mut idx, view) = index(100);
    let a = prompt(10, 4);
    let mut b = Batch::default();
    request(&mut b, &a, 0, 4);
    apply(&mut idx, 0, &b);
    assert!(view.content_entries() >= 8, "a key per block and class");
    let mut c = Batch::default();
    c.push_cleared(None);
    apply(&mut idx, 1, &c);
    assert_eq!(view.content_entries(), 0);
    let mut b = Batch::default();
    request(&mut b, &a, 0, 4);
    apply(&mut idx, 2, &b);
    drop(idx);
    assert_eq!(view.content_entries(), 0, "the stream's removal leaves nothing behind");
}
