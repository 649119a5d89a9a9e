//! Unit tests of the shared index: per-stream prefixes from one walk, the synchronized mask,
//! publishing, snapshot installs, stream removal and slot reuse, and a concurrent reader that
//! must never see half a batch.

use super::*;
use crate::index::KeyHasher;
use crate::wire::{EngineHash, Tier};

pub(super) const B: u32 = 2;

pub(super) fn config(max_blocks: usize) -> IndexConfig {
    IndexConfig { block_size: B, hash_seed: 1024, salt: 0, max_blocks }
}

/// A synchronized, empty stream.
pub(super) fn stream(index: &SharedIndex) -> StreamWriter {
    let mut s = index.add_stream(config(100)).unwrap();
    s.load_snapshot(&Batch::default(), 0).unwrap();
    s.publish();
    s
}

pub(super) fn stored(hashes: &[u128], parent: Option<u128>, tokens: &[i32], tier: Tier) -> Batch {
    let mut b = Batch::default();
    let hs: Vec<_> = hashes.iter().map(|v| EngineHash(*v)).collect();
    b.push_stored(&hs, parent.map(EngineHash), tokens, B, tier);
    b
}

pub(super) fn removed(hashes: &[u128], tier: Tier) -> Batch {
    let mut b = Batch::default();
    let hs: Vec<_> = hashes.iter().map(|v| EngineHash(*v)).collect();
    b.push_removed(&hs, tier);
    b
}

pub(super) fn apply(s: &mut StreamWriter, b: &Batch) {
    s.apply(0, b).unwrap();
    s.publish();
}

/// (device_hit_tokens, host_only_hit_tokens) of one stream.
pub(super) fn hits(r: &mut SharedHandle, s: &StreamWriter, tokens: &[i32]) -> (u64, u64) {
    r.query(tokens).tokens(s.slot())
}

#[test]
fn one_walk_gives_every_stream_its_own_prefix_and_tiers() {
    let index = SharedIndex::new(B, 1024, 128);
    let mut r = index.reader().handle();
    let (mut a, mut b, c) = (stream(&index), stream(&index), stream(&index));
    apply(&mut a, &stored(&[1, 2, 3], None, &[1, 2, 3, 4, 5, 6], Tier::Device));
    apply(&mut b, &stored(&[7], None, &[1, 2], Tier::Device));
    apply(&mut b, &stored(&[8, 9], Some(7), &[3, 4, 5, 6], Tier::Host));
    apply(&mut b, &stored(&[8], Some(7), &[3, 4], Tier::Device));
    let m = r.query(&[1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(m.tokens(a.slot()), (6, 0));
    assert_eq!(m.tokens(b.slot()), (4, 2), "a block on both tiers counts once, as Device");
    assert_eq!(m.tokens(c.slot()), (0, 0));
    assert_eq!(m.iter().collect::<Vec<_>>(), [(a.slot(), 3, 0), (b.slot(), 2, 1)]);
    apply(&mut a, &removed(&[2], Tier::Device));
    assert_eq!(hits(&mut r, &a, &[1, 2, 3, 4, 5, 6]), (2, 0), "stops at its first absent block");
    assert_eq!(hits(&mut r, &b, &[1, 2, 3, 4, 5, 6]), (4, 2), "other streams walk on");
    assert_eq!(hits(&mut r, &b, &[3, 4]), (0, 0), "a block only matches after its prefix");
}

#[test]
fn unsynchronized_streams_match_nothing_and_changes_wait_for_a_publish() {
    let index = SharedIndex::new(B, 1024, 128);
    let mut r = index.reader().handle();
    let mut a = stream(&index);
    a.apply(1, &stored(&[1], None, &[1, 2], Tier::Device)).unwrap();
    assert_eq!(hits(&mut r, &a, &[1, 2]), (0, 0), "not yet published");
    a.commit();
    assert_eq!(hits(&mut r, &a, &[1, 2]), (0, 0), "committed, not yet published");
    index.publish();
    assert_eq!(hits(&mut r, &a, &[1, 2]), (2, 0));
    a.invalidate("gap");
    a.publish();
    assert_eq!(hits(&mut r, &a, &[1, 2]), (0, 0));
    let status = r.status(a.slot()).unwrap();
    assert_eq!((status.synchronized, status.error.as_deref()), (false, Some("gap")));
    let err = a.apply(2, &stored(&[2], Some(1), &[3, 4], Tier::Device)).unwrap_err();
    assert!(matches!(err, IndexError::NotSynchronized(_)));
    let fresh = index.add_stream(config(10)).unwrap();
    index.publish();
    assert!(!r.status(fresh.slot()).unwrap().synchronized, "a new stream waits for a snapshot");
}

#[test]
fn a_periodic_resync_keeps_the_old_contents_visible_until_the_install_is_published() {
    let index = SharedIndex::new(B, 1024, 128);
    let mut r = index.reader().handle();
    let mut a = stream(&index);
    apply(&mut a, &stored(&[1, 2], None, &[1, 2, 3, 4], Tier::Device));
    let mut snap = a.snapshot_builder();
    snap.add(&stored(&[1], None, &[1, 2], Tier::Host)).unwrap();
    snap.add(&stored(&[5], None, &[9, 9], Tier::Device)).unwrap();
    assert_eq!(hits(&mut r, &a, &[1, 2, 3, 4]), (4, 0), "building aside changes nothing");
    a.install_snapshot(snap, 10);
    assert_eq!(hits(&mut r, &a, &[1, 2, 3, 4]), (4, 0), "installed, not yet published");
    a.publish();
    assert_eq!(hits(&mut r, &a, &[1, 2, 3, 4]), (0, 2));
    assert_eq!(hits(&mut r, &a, &[9, 9]), (2, 0));
    let status = r.status(a.slot()).unwrap();
    assert_eq!((status.sequence, status.device_blocks, status.host_blocks), (Some(9), 1, 1));
    assert_eq!(r.content_entries(), 2, "the old contents' keys are gone");
}

#[test]
fn a_failed_snapshot_unsynchronizes_and_keeps_the_old_contents_masked() {
    let index = SharedIndex::new(B, 1024, 128);
    let mut r = index.reader().handle();
    let mut a = stream(&index);
    apply(&mut a, &stored(&[1], None, &[1, 2], Tier::Device));
    let mut bad = stored(&[1], None, &[1, 2], Tier::Device);
    bad.push_stored(&[EngineHash(1)], None, &[3, 4], B, Tier::Device);
    assert!(matches!(a.load_snapshot(&bad, 5), Err(IndexError::HashConflict(_))));
    a.publish();
    assert_eq!(hits(&mut r, &a, &[1, 2]), (0, 0));
    assert_eq!(r.content_entries(), 1);
}

#[test]
fn clears_remove_per_block_and_a_tier_clear_keeps_the_other_tier() {
    let index = SharedIndex::new(B, 1024, 128);
    let mut r = index.reader().handle();
    let (mut a, mut b) = (stream(&index), stream(&index));
    for s in [&mut a, &mut b] {
        apply(s, &stored(&[1, 2], None, &[1, 2, 3, 4], Tier::Device));
        apply(s, &stored(&[1], None, &[], Tier::Host));
    }
    let mut clear = Batch::default();
    clear.push_cleared(Some(Tier::Device));
    apply(&mut a, &clear);
    assert_eq!(hits(&mut r, &a, &[1, 2, 3, 4]), (0, 2));
    assert_eq!(hits(&mut r, &b, &[1, 2, 3, 4]), (4, 0));
    let mut all = Batch::default();
    all.push_cleared(None);
    apply(&mut a, &all);
    assert_eq!(hits(&mut r, &a, &[1, 2, 3, 4]), (0, 0));
    assert_eq!(r.shared_entries(), 0, "b alone holds every key again");
    assert_eq!(r.content_entries(), 2);
}

#[test]
fn dropping_a_stream_removes_its_bits_and_frees_its_slot_for_a_clean_stream() {
    let index = SharedIndex::new(B, 1024, 2);
    let mut r = index.reader().handle();
    let mut a = stream(&index);
    let b = stream(&index);
    assert_eq!(index.add_stream(config(10)).unwrap_err(), SharedError::Full { max: 2 });
    apply(&mut a, &stored(&[1, 2], None, &[1, 2, 3, 4], Tier::Device));
    let slot = a.slot();
    drop(a);
    assert_eq!(r.content_entries(), 0);
    assert!(r.status(slot).is_none());
    let c = stream(&index);
    assert_eq!(c.slot(), slot);
    assert_eq!(hits(&mut r, &c, &[1, 2, 3, 4]), (0, 0));
    drop(b);
}

#[test]
fn streams_of_other_settings_are_refused() {
    let index = SharedIndex::new(B, 1024, 4);
    let err = index.add_stream(IndexConfig { block_size: 4, ..config(10) }).unwrap_err();
    assert!(err.to_string().contains("block_size 4"), "{err}");
    assert!(index.add_stream(IndexConfig { hash_seed: 1, ..config(10) }).is_err());
}

#[test]
fn a_reader_on_another_thread_never_sees_half_a_batch() {
    // The stream alternates between holding a 6-block chain and its first 3 blocks: one batch
    // removes blocks 6, 5, 4 (tail first), the next stores them again. Any part of a batch
    // would show as a prefix of 4 or 5 blocks; a reader must only ever see 3 or 6.
    let index = SharedIndex::new(B, 1024, 4);
    let mut a = stream(&index);
    let tokens: Vec<i32> = (1..=12).collect();
    apply(&mut a, &stored(&[1, 2, 3, 4, 5, 6], None, &tokens, Tier::Device));
    let slot = a.slot();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (reader, done, tokens) = (index.reader(), &done, &tokens);
        let seen = scope.spawn(move || {
            let mut r = reader.handle();
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) || reads < 100 {
                let (device, _) = r.query(tokens).blocks(slot);
                assert!(device == 3 || device == 6, "half a batch: {device} blocks");
                reads += 1;
            }
        });
        for i in 0..2_000 {
            let batch = if i % 2 == 0 {
                removed(&[6, 5, 4], Tier::Device)
            } else {
                stored(&[4, 5, 6], Some(3), &tokens[6..], Tier::Device)
            };
            apply(&mut a, &batch);
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        seen.join().unwrap();
    });
}

#[test]
fn out_of_scope_blocks_never_reach_the_shared_view_and_leave_it_cleanly() {
    // A LoRA block (out of scope), a text block chained to it, and a plain block: only the
    // plain one is in the view, and clearing, a snapshot install and removal emit no change for
    // the others (a removal of a key no stream holds would trip the view's debug assertion).
    let index = SharedIndex::new(B, 1024, 4);
    let mut r = index.reader().handle();
    let mut a = stream(&index);
    let mut b = Batch::default();
    b.push_out_of_scope(&[EngineHash(1)], Tier::Device);
    b.push_stored(&[EngineHash(2)], Some(EngineHash(1)), &[3, 4], B, Tier::Device);
    b.push_stored(&[EngineHash(3)], None, &[5, 6], B, Tier::Device);
    b.push_stored(&[EngineHash(1)], None, &[], B, Tier::Host);
    apply(&mut a, &b);
    assert_eq!(a.block_count(), 3);
    assert_eq!((r.content_entries(), hits(&mut r, &a, &[5, 6])), (1, (2, 0)));
    let mut host = Batch::default();
    host.push_cleared(Some(Tier::Host));
    apply(&mut a, &host);
    a.load_snapshot(&b, 9).unwrap();
    a.publish();
    assert_eq!((r.content_entries(), hits(&mut r, &a, &[5, 6])), (1, (2, 0)));
    let mut all = Batch::default();
    all.push_cleared(None);
    apply(&mut a, &all);
    assert_eq!(r.content_entries(), 0);
    apply(&mut a, &b);
    drop(a);
    assert_eq!(r.content_entries(), 0);
}

fn label(name: &str, dp_rank: u32) -> StreamLabel {
    StreamLabel { instance_name: name.into(), dp_rank, identity: None, ..StreamLabel::default() }
}

/// What `query_streams` lists: (instance, rank, synchronized, device and Host-only tokens).
fn listed(r: &mut SharedHandle, tokens: &[i32]) -> Vec<(String, u32, bool, (u64, u64))> {
    let mut slots = Vec::new();
    let m = r.query_streams(tokens, &mut slots);
    slots
        .iter()
        .map(|s| {
            let name = s.label.instance_name.clone();
            (name, s.label.dp_rank, s.status.synchronized, m.tokens(s.slot))
        })
        .collect()
}

#[test]
fn labels_are_published_with_the_status_and_a_reused_slot_never_shows_the_old_stream() {
    let index = SharedIndex::new(B, 1024, 2);
    let mut r = index.reader().handle();
    let mut a = index.add_labeled_stream(config(100), label("a", 0)).unwrap();
    assert!(listed(&mut r, &[1, 2]).is_empty(), "nothing before the first publish");
    a.load_snapshot(&stored(&[1], None, &[1, 2], Tier::Device), 1).unwrap();
    a.publish();
    let mut b = index.add_labeled_stream(config(100), label("b", 3)).unwrap();
    b.publish();
    assert_eq!(
        listed(&mut r, &[1, 2]),
        [("a".into(), 0, true, (2, 0)), ("b".into(), 3, false, (0, 0))]
    );
    let slot = a.slot();
    drop(a);
    assert_eq!(listed(&mut r, &[1, 2]), [("b".into(), 3, false, (0, 0))]);
    let mut c = index.add_labeled_stream(config(100), label("c", 1)).unwrap();
    assert_eq!(c.slot(), slot, "the freed slot is reused");
    c.publish();
    assert_eq!(
        listed(&mut r, &[1, 2]),
        [("b".into(), 3, false, (0, 0)), ("c".into(), 1, false, (0, 0))],
        "the new stream has none of the old one's bits and its own label, in name order"
    );
    c.load_snapshot(&Batch::default(), 0).unwrap();
    c.publish();
    assert_eq!(listed(&mut r, &[1, 2])[1], ("c".into(), 1, true, (0, 0)));
}

/// A chain of `n` blocks (hashes 1..=n, token pairs `2i, 2i + 1`) on `tier`.
pub(super) fn chain(n: u32, tier: Tier) -> (Batch, Vec<i32>) {
    let tokens: Vec<i32> = (0..2 * n as i32).collect();
    let hashes: Vec<u128> = (1..=u128::from(n)).collect();
    (stored(&hashes, None, &tokens, tier), tokens)
}

#[test]
fn large_installs_and_a_removal_are_seen_whole_by_a_concurrent_reader() {
    // Large enough that the changes of an unsynchronized stream are applied in several
    // write-locked chunks (`log.rs`): a reader must still only ever see nothing, or all of the
    // old contents, or all of the new ones.
    const N: u32 = 10_000;
    let index = SharedIndex::new(B, 1024, 4);
    let mut a = index.add_stream(config(2 * N as usize)).unwrap();
    a.publish();
    let slot = a.slot();
    let (device, tokens) = chain(N, Tier::Device);
    let (host, _) = chain(N, Tier::Host);
    let mut half = device.clone();
    half.push_removed(
        &(N / 2 + 1..=N).map(|h| EngineHash(h.into())).collect::<Vec<_>>(),
        Tier::Device,
    );
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (reader, done, tokens) = (index.reader(), &done, &tokens);
        let seen = scope.spawn(move || {
            let mut r = reader.handle();
            let mut states = std::collections::BTreeSet::new();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let got = r.query(tokens).blocks(slot);
                assert!(
                    [(0, 0), (N, 0), (0, N), (N / 2, 0)].contains(&got),
                    "part of an install: {got:?}"
                );
                states.insert(got);
            }
            states
        });
        for _ in 0..8 {
            a.load_snapshot(&device, 1).unwrap(); // first sync: unsynchronized, chunked
            a.publish();
            a.load_snapshot(&host, 2).unwrap(); // periodic resync: one write lock
            a.publish();
            a.load_snapshot(&half, 3).unwrap();
            a.publish();
            a.invalidate("gap");
            a.publish();
        }
        drop(a); // the removal: status first, then the bits in chunks
        done.store(true, std::sync::atomic::Ordering::Release);
        seen.join().unwrap();
    });
    let mut r = index.reader().handle();
    assert_eq!((r.content_entries(), r.query(&tokens).hit), (0, 0));
}

#[test]
fn a_resync_sends_the_view_only_what_changed() {
    let index = SharedIndex::new(B, 1024, 4);
    let mut r = index.reader().handle();
    let mut a = stream(&index);
    let (device, tokens) = chain(99, Tier::Device);
    a.load_snapshot(&device, 1).unwrap();
    a.publish();
    let mut same = device.clone();
    same.push_stored(&[EngineHash(1000)], None, &[7, 7], B, Tier::Host);
    a.load_snapshot(&same, 2).unwrap();
    assert_eq!(a.pending.len(), 1, "one block added, nothing else");
    a.publish();
    assert_eq!((r.query(&tokens).blocks(a.slot()), r.content_entries()), ((99, 0), 100));
    a.load_snapshot(&Batch::default(), 3).unwrap();
    assert_eq!(a.pending.len(), 100);
    a.publish();
    assert_eq!(r.content_entries(), 0);
}

#[test]
fn a_query_hashes_as_far_as_a_stream_matches_and_answers_as_the_full_walk() {
    let index = SharedIndex::new(B, 1024, 8);
    let lens = [0u32, 5, 16, 17, 40];
    let streams: Vec<StreamWriter> = lens
        .iter()
        .map(|&n| {
            let mut s = stream(&index);
            if n > 0 {
                apply(&mut s, &chain(n, Tier::Device).0);
            }
            s
        })
        .collect();
    let tokens = chain(120, Tier::Device).1;
    let mut r = index.reader().handle();
    let m = r.query(&tokens);
    for (s, n) in streams.iter().zip(lens) {
        assert_eq!(m.blocks(s.slot()), (n, 0));
    }
    let hashed = r.keys().len();
    assert!((40..120).contains(&hashed), "hashed {hashed} of 120 blocks; the longest match is 40");
    let mut full = Vec::new();
    KeyHasher::new(B, 1024).prefix_keys(&tokens, &mut full);
    assert_eq!(r.all_keys(&tokens), &full[..], "completed from where the walk stopped");
    assert_eq!(r.match_keys(&full), m, "the same answer as a walk over every key");
}
