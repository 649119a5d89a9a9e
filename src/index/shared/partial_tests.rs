//! Unit tests of a stream's history-replay states: [`StreamWriter::reset`],
//! [`StreamWriter::apply_unsynchronized`], [`StreamWriter::resume`] and the partial mode.

use super::tests::{config, hits, removed, stored, stream, B};
use super::*;
use crate::wire::{EngineHash, Tier};

/// `a` then `b` in one batch.
fn both(mut a: Batch, b: &Batch) -> Batch {
    for e in &b.events {
        match e {
            crate::wire::Event::Stored(s) => {
                let hs = b.hashes(s.hashes).to_vec();
                a.push_stored(&hs, s.parent, b.tokens(s.tokens), B, s.tier);
            }
            crate::wire::Event::Removed { hashes, tier, .. } => {
                a.push_removed(b.hashes(*hashes), *tier)
            }
            crate::wire::Event::Cleared { tier } => a.push_cleared(*tier),
            other => panic!("unexpected {other:?}"),
        }
    }
    a
}

fn cleared() -> Batch {
    let mut b = Batch::default();
    b.push_cleared(None);
    b
}

#[test]
fn a_partial_replay_skips_stores_it_cannot_key_and_credits_what_it_saw_once_resumed() {
    let index = SharedIndex::new(B, 1024, 128);
    let mut r = index.reader().handle();
    let mut s = stream(&index);
    s.reset();
    s.set_partial(true);
    // History starting after the engine's start: a child of a block stored before it, a
    // tokenless copy of such a block, a removal of one, and a prefix stored in full.
    let history =
        both(stored(&[10], Some(99), &[7, 7], Tier::Device), &stored(&[77], None, &[], Tier::Host));
    let history = both(
        both(history, &removed(&[88], Tier::Device)),
        &stored(&[1, 2], None, &[1, 2, 3, 4], Tier::Device),
    );
    let stats = s.apply_unsynchronized(5, &history).unwrap();
    assert_eq!((stats.unknown_parents, stats.unknown_removals, stats.stored), (2, 1, 2));
    s.publish();
    let st = s.status();
    assert_eq!((st.synchronized, st.partial, st.sequence), (false, true, Some(5)));
    assert_eq!(hits(&mut r, &s, &[1, 2, 3, 4]), (0, 0), "nothing before it resumes");

    s.resume();
    s.publish();
    assert_eq!(hits(&mut r, &s, &[1, 2, 3, 4]), (4, 0));
    assert!(index.reader().handle().status(s.slot()).unwrap().partial, "the status says so");
    // Live, still partial: an unseen parent is skipped, not a fault.
    let live = s.apply(6, &stored(&[11], Some(98), &[5, 5], Tier::Device)).unwrap();
    assert_eq!(live.unknown_parents, 1);
    assert!(s.is_synchronized());
    // An AllBlocksCleared makes the rest of its batch, and the stream, exact.
    let epoch = both(
        both(stored(&[3], Some(97), &[1, 1], Tier::Device), &cleared()),
        &stored(&[4], Some(96), &[2, 2], Tier::Device),
    );
    assert_eq!(s.apply(7, &epoch).unwrap_err(), IndexError::UnknownParent(EngineHash(96)));
    assert!(!s.is_partial() && !s.is_synchronized());
}

#[test]
fn a_full_state_or_a_snapshot_ends_the_partial_state() {
    let index = SharedIndex::new(B, 1024, 128);
    let mut s = stream(&index);
    s.set_partial(true);
    s.invalidate("gap");
    let full = both(cleared(), &stored(&[1], None, &[1, 2], Tier::Device));
    assert_eq!(s.apply(3, &full).unwrap().stored, 1);
    assert!(s.is_synchronized() && !s.is_partial());
    s.set_partial(true);
    s.load_snapshot(&stored(&[1], None, &[1, 2], Tier::Device), 9).unwrap();
    assert!(!s.status().partial);
}

#[test]
fn reset_drops_every_block_and_the_retired_memory_and_waits_for_a_resume() {
    let index = SharedIndex::new(B, 1024, 128);
    let mut r = index.reader().handle();
    let mut s = stream(&index);
    s.apply(0, &stored(&[1, 2], None, &[1, 2, 3, 4], Tier::Device)).unwrap();
    s.apply(1, &removed(&[2], Tier::Device)).unwrap();
    s.publish();
    assert_eq!(hits(&mut r, &s, &[1, 2]), (2, 0));
    s.reset();
    s.publish();
    let st = s.status();
    assert_eq!((st.synchronized, st.sequence, st.device_blocks), (false, None, 0));
    assert_eq!(st.error.as_deref(), Some("reset for history replay"));
    assert_eq!(s.block_count(), 0);
    assert_eq!(r.content_entries(), 0, "readers lost the blocks at the publish");
    s.resume();
    s.publish();
    assert_eq!(hits(&mut r, &s, &[1, 2]), (0, 0));
    // The retired block 2 is forgotten too: its child is an unknown parent again.
    let child = stored(&[3], Some(2), &[5, 6], Tier::Device);
    assert_eq!(s.apply(2, &child).unwrap_err(), IndexError::UnknownParent(EngineHash(2)));
}

#[test]
fn an_error_in_replayed_history_leaves_the_stream_unsynchronized() {
    let index = SharedIndex::new(B, 1024, 128);
    let mut s = index.add_stream(config(100)).unwrap();
    s.reset();
    let err = s.apply_unsynchronized(0, &stored(&[3], Some(2), &[5, 6], Tier::Device));
    assert_eq!(err.unwrap_err(), IndexError::UnknownParent(EngineHash(2)));
    let st = s.status();
    assert!(!st.synchronized && st.error.unwrap().contains("unknown parent block hash 0x2"));
    assert_eq!(st.sequence, None, "the failed batch is not applied");
    // Exact history from the engine's start applies, and the stream resumes exact.
    s.reset();
    s.apply_unsynchronized(0, &stored(&[1], None, &[1, 2], Tier::Device)).unwrap();
    s.resume();
    assert!(s.is_synchronized() && !s.is_partial());
    assert_eq!(s.status().sequence, Some(0));
}
