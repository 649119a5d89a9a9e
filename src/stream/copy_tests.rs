//! Unit tests of live copies: a live batch the stream already has (from a snapshot or a
//! history replay) is dropped as a duplicate, never taken for a restarted publisher, and a
//! restarted publisher is never taken for a copy.

use std::time::{Duration, Instant};

use super::tests::{batch, brought_live, cfg, live_at, machine, show, syncs};
use super::*;
use crate::config::ReplayKind;
use crate::index::IndexConfig;
use crate::wire::Batch;

/// A history-replay (vLLM) machine.
fn history_machine() -> Recovery {
    let cfg = RecoveryConfig { replay: ReplayKind::History, ..cfg() };
    Recovery::new(cfg, IndexConfig { block_size: 2, hash_seed: 1024, salt: 0, max_blocks: 100 })
}

/// A batch stamped `ts`, as vLLM stamps each batch with the wall clock.
fn stamped(ts: f64) -> Batch {
    let mut b = batch();
    b.timestamp = ts;
    b
}

/// A new stream whose history replay answered `0..n` (batch `s` stamped `s`) before any live
/// batch arrived: live at `n`.
fn replayed_before_live(n: u64, t0: Instant) -> (Recovery, Vec<Action>) {
    let mut m = history_machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    for seq in 0..n {
        m.on_history_batch(seq, stamped(seq as f64), t0, &mut out);
    }
    m.on_snapshot_end(t0, &mut out);
    assert_eq!((m.phase(), m.next_seq()), (StreamPhase::Live, Some(n)));
    out.clear();
    (m, out)
}

#[test]
fn the_late_live_copy_of_a_replayed_batch_0_is_a_duplicate_not_a_restart() {
    // Regression (issue 36, run C: kvdir connected to 4,096 streams under load): a new
    // stream's replay covered batch 0, then the lagging live copy of batch 0 arrived and was
    // taken for a restarted publisher ("sequence went back from 0 to 0"), costing a recovery.
    let t0 = Instant::now();
    let (mut m, mut out) = replayed_before_live(2, t0);
    m.on_live(0, stamped(0.0), 10, t0, &mut out);
    m.on_live(1, stamped(1.0), 10, t0, &mut out);
    m.on_live(2, stamped(2.0), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 2"], "0 and 1 are the replayed batches again");
    assert_eq!((m.stats().duplicate_batches, m.stats().gaps), (2, 0));
    assert_eq!((m.phase(), syncs(&m)), (StreamPhase::Live, (1, 0, 0)));
}

#[test]
fn a_restarted_publishers_new_batch_0_is_a_restart_and_its_history_replays_from_0() {
    let t0 = Instant::now();
    let (mut m, mut out) = replayed_before_live(2, t0);
    m.on_live(0, stamped(50.0), 10, t0, &mut out);
    let expect = ["invalidate: sequence went back from 1 to 0: publisher restarted", "reset"];
    assert_eq!(show(&mut out), [expect[0], expect[1], "request 0"], "the old blocks go");
    m.on_history_batch(0, stamped(50.0), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    m.on_live(1, stamped(51.0), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["recover 0", "resume", "close", "apply 1"]);
    assert_eq!(syncs(&m), (1, 0, 1));
}

#[test]
fn a_remembered_sequence_with_another_batch_is_a_restart_even_where_the_numbers_fit_a_copy() {
    // 1 after no live batch, below the next expected: the sequence alone would call it a copy
    // (the restarted publisher's batch 0 was lost). Its batch is not the replayed 1.
    let t0 = Instant::now();
    let (mut m, mut out) = replayed_before_live(3, t0);
    m.on_live(1, stamped(61.0), 10, t0, &mut out);
    let shown = show(&mut out);
    assert_eq!(shown[0], "invalidate: sequence went back from 2 to 1: publisher restarted");
    assert_eq!(shown[1..], ["reset", "request 0"]);
    assert_eq!(m.stats().duplicate_batches, 0);
}

#[test]
fn a_restart_seen_on_a_live_history_stream_replays_from_0_not_from_the_old_position() {
    // Asked from the old position, the restarted publisher's history (0, 1, ...) was skipped
    // as already applied, the old blocks kept their credit and its 1 passed for a copy.
    let t0 = Instant::now();
    let (mut m, mut out) = replayed_before_live(5, t0);
    m.on_live(5, stamped(5.0), 10, t0, &mut out);
    m.on_live(0, stamped(90.0), 10, t0, &mut out);
    let restarted = "invalidate: sequence went back from 5 to 0: publisher restarted";
    assert_eq!(show(&mut out), ["apply 5", restarted, "reset", "request 0"]);
    m.on_history_batch(0, stamped(90.0), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    m.on_live(1, stamped(91.0), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["recover 0", "resume", "close", "apply 1"]);
}

#[test]
fn a_snapshot_stream_cannot_compare_batches_and_takes_a_late_0_for_a_restart() {
    // xLLM's snapshot is state, not batches: on libzmq's SUB, whose disconnects come apart
    // from the data, a live 0 after it may be a restarted publisher's, and crediting the
    // snapshot's blocks then would credit a cache that is gone.
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(1, t0);
    m.on_live(0, stamped(0.0), 10, t0, &mut out);
    let shown = show(&mut out);
    assert_eq!(shown[0], "invalidate: sequence went back from 0 to 0: publisher restarted");
}

/// A snapshot (xLLM) machine on kvdir's own reader, live at `watermark`: its connection's
/// losses come in order with the batches.
fn ordered_live_at(watermark: u64, t0: Instant) -> (Recovery, Vec<Action>) {
    let cfg = RecoveryConfig { ordered_losses: true, ..cfg() };
    let index = IndexConfig { block_size: 2, hash_seed: 1024, salt: 0, max_blocks: 100 };
    brought_live(Recovery::new(cfg, index), watermark, t0)
}

#[test]
fn on_an_ordered_connection_the_late_live_0_after_a_snapshot_is_a_copy() {
    // Regression (issue 36, run C, 3 runs of 5): xLLM's snapshot covered batch 0 (watermark 1),
    // then live 0 came late on the connection the sync began on and was taken for a restart
    // ("sequence went back from 0 to 0"), costing a recovery. A restarted publisher would
    // have come on a new connection, after a disconnect.
    let t0 = Instant::now();
    let (mut m, mut out) = ordered_live_at(1, t0);
    m.on_live(0, batch(), 10, t0, &mut out);
    m.on_live(1, batch(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 1"], "0 is in the snapshot");
    assert_eq!((m.stats().duplicate_batches, m.stats().gaps), (1, 0));
    assert_eq!((m.phase(), syncs(&m)), (StreamPhase::Live, (1, 0, 0)));
}

#[test]
fn on_an_ordered_connection_a_sequence_that_goes_back_after_a_live_batch_is_a_restart() {
    let t0 = Instant::now();
    let (mut m, mut out) = ordered_live_at(3, t0);
    m.on_live(3, batch(), 10, t0, &mut out);
    m.on_live(0, batch(), 10, t0, &mut out);
    let shown = show(&mut out);
    assert_eq!(
        shown[..2],
        ["apply 3", "invalidate: sequence went back from 3 to 0: publisher restarted"]
    );
    assert_eq!((m.stats().duplicate_batches, m.stats().gaps), (0, 1));
}

#[test]
fn on_an_ordered_connection_a_new_connections_sync_drops_its_own_late_0() {
    // The publisher restarted: its connection ended first, the sync after the new one asked
    // the new process, and its late live 0 is a copy of what that snapshot holds.
    let t0 = Instant::now();
    let (mut m, mut out) = ordered_live_at(5, t0);
    m.on_disconnected(&mut out);
    m.on_connected(t0, &mut out);
    m.on_snapshot_reply(1, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    out.clear();
    m.on_live(0, batch(), 10, t0, &mut out);
    m.on_live(1, batch(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 1"]);
    assert_eq!((m.phase(), m.stats().duplicate_batches, m.stats().gaps), (StreamPhase::Live, 1, 0));
}

#[test]
fn only_the_newest_replayed_batches_are_remembered_and_passed_ones_are_forgotten() {
    let mut tail = copies::ReplayedTail::default();
    let n = copies::MAX_REMEMBERED as u64 + 10;
    for seq in 0..n {
        tail.remember(seq, &stamped(seq as f64));
    }
    assert_eq!(tail.same(9, &stamped(9.0)), None, "older than the newest 64");
    assert_eq!(tail.same(10, &stamped(10.0)), Some(true));
    assert_eq!(tail.same(10, &stamped(10.5)), Some(false));
    tail.passed(n - 1);
    assert_eq!(tail.same(n - 2, &stamped((n - 2) as f64)), None, "its copy can no longer come");
    assert_eq!(tail.same(n - 1, &stamped((n - 1) as f64)), Some(true));
    tail.remember(3, &stamped(3.5));
    assert_eq!(tail.same(n - 1, &stamped((n - 1) as f64)), None, "a newer replay replaces it");
    assert_eq!(tail.same(3, &stamped(3.5)), Some(true));
}

#[test]
fn the_fingerprint_covers_the_timestamp_and_the_events() {
    let f = copies::fingerprint;
    assert_eq!(f(&stamped(1.0)), f(&stamped(1.0)));
    assert_ne!(f(&stamped(1.0)), f(&stamped(2.0)));
    let mut other = stamped(1.0);
    other.push_removed(&[crate::wire::EngineHash(7)], crate::wire::Tier::Device);
    assert_ne!(f(&stamped(1.0)), f(&other));
    let mut tokens = Batch::default();
    tokens.timestamp = 1.0;
    let hash = [crate::wire::EngineHash(1)];
    tokens.push_stored(&hash, None, &[1, 3], 2, crate::wire::Tier::Device);
    assert_ne!(f(&stamped(1.0)), f(&tokens), "token ids differ");
}

#[test]
fn live_copies_older_than_the_first_snapshot_are_duplicates_not_a_restart() {
    // Regression (issue 36, 4,096 bound streams under load): the snapshot reply overtook the
    // live path (behind the bind fan-out), so the first live batches after the install were
    // older than its watermark, and the first of them read as "sequence went back from 36 to
    // 36: publisher restarted", costing a recovery and its sockets.
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_snapshot_reply(37, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["request 0", "close", "install 37 []"]);
    for seq in [35, 36, 37, 37, 38] {
        m.on_live(seq, batch(), 10, t0, &mut out);
    }
    assert_eq!(show(&mut out), ["apply 37", "apply 38"], "35, 36 and the second 37 are copies");
    assert_eq!((m.stats().duplicate_batches, m.stats().gaps), (3, 0));
    assert_eq!((m.phase(), syncs(&m)), (StreamPhase::Live, (1, 0, 0)));
    // A publisher that really restarts goes back below what it sent live.
    m.on_live(3, batch(), 10, t0, &mut out);
    assert_eq!(
        show(&mut out),
        ["invalidate: sequence went back from 38 to 3: publisher restarted", "request 39"]
    );
}

#[test]
fn a_copy_during_a_periodic_resync_is_dropped_and_the_resync_stays_routine() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(5, t0);
    m.on_live(5, batch(), 10, t0, &mut out);
    m.on_live(6, batch(), 10, t0, &mut out);
    m.on_tick(t0 + Duration::from_secs(10), &mut out);
    m.on_live(6, batch(), 10, t0, &mut out);
    m.on_live(7, batch(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 5", "apply 6", "request 7", "apply 7"]);
    m.on_snapshot_reply(8, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["close", "install 8 []"]);
    assert_eq!((m.stats().duplicate_batches, m.stats().gaps), (1, 0));
    assert_eq!(syncs(&m), (1, 1, 0), "a routine resync, no recovery");
}

#[test]
fn after_a_disconnect_the_old_numbering_is_forgotten() {
    // A publisher restarted while disconnected numbers from 0 again; the copies of what its
    // new snapshot covered are below what the old one sent live, and still copies.
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(5, t0);
    for seq in 5..10 {
        m.on_live(seq, batch(), 10, t0, &mut out);
    }
    m.on_disconnected(&mut out);
    m.on_connected(t0, &mut out);
    m.on_snapshot_reply(3, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    out.clear();
    for seq in [2, 3] {
        m.on_live(seq, batch(), 10, t0, &mut out);
    }
    assert_eq!(show(&mut out), ["apply 3"], "2 is a copy of the new publisher's snapshot");
    assert_eq!((m.stats().duplicate_batches, m.stats().gaps), (1, 0));
}
