//! Unit tests of history replay (vLLM, SGLang) in the recovery machine: start, gap fill,
//! truncation, periodic resync and failures, with time passed in.

use std::time::{Duration, Instant};

use super::tests::{batch, cfg, show, syncs};
use super::*;
use crate::config::ReplayKind;
use crate::index::IndexConfig;
use crate::wire::Batch;

fn machine() -> Recovery {
    let cfg = RecoveryConfig { replay: ReplayKind::History, ..cfg() };
    Recovery::new(cfg, IndexConfig { block_size: 2, hash_seed: 1024, salt: 0, max_blocks: 100 })
}

fn cleared() -> Batch {
    let mut b = Batch::default();
    b.push_cleared(None);
    b
}

/// A machine that replayed `0..n` from a young engine and is live at `n`.
fn live_at(n: u64, t0: Instant) -> (Recovery, Vec<Action>) {
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    for seq in 0..n {
        m.on_history_batch(seq, batch(), t0, &mut out);
    }
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(m.phase(), StreamPhase::Live);
    out.clear();
    (m, out)
}

#[test]
fn start_replays_from_zero_then_continues_with_the_live_batches_buffered() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    assert_eq!(show(&mut out), ["reset", "request 0"]);
    assert_eq!(m.phase(), StreamPhase::Syncing);
    m.on_history_batch(0, batch(), t0, &mut out);
    m.on_history_batch(1, batch(), t0, &mut out);
    m.on_live(1, batch(), 10, t0, &mut out);
    m.on_live(2, batch(), 10, t0, &mut out);
    m.on_history_batch(2, batch(), t0, &mut out);
    assert_eq!(show(&mut out), ["recover 0", "recover 1", "recover 2"]);
    m.on_live(3, batch(), 10, t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["recover 3", "resume", "close"], "1 and 2 came replayed");
    assert_eq!((m.phase(), m.next_seq()), (StreamPhase::Live, Some(4)));
    m.on_live(4, batch(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 4"]);
    assert_eq!(m.stats().replayed_batches, 3);
    assert_eq!(syncs(&m), (1, 0, 0), "a first replay is no recovery");
}

#[test]
fn a_young_engine_with_nothing_published_is_exact_at_once() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["reset", "request 0", "resume", "close"]);
    assert_eq!(m.phase(), StreamPhase::Live);
    m.on_live(0, batch(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 0"]);
}

#[test]
fn a_history_that_starts_late_makes_the_stream_partial_until_a_full_clear() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    out.clear();
    m.on_history_batch(7, batch(), t0, &mut out);
    m.on_history_batch(8, batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    let expect = ["reset partial", "recover 7", "recover 8", "resume", "close"];
    assert_eq!(show(&mut out), expect);
    assert_eq!(m.phase(), StreamPhase::Partial);
    assert!(m.phase().is_synchronized(), "partial streams give credit");
    assert_eq!(m.stats().truncated_histories, 1);
    m.on_live(9, batch(), 10, t0, &mut out);
    assert_eq!((show(&mut out), m.phase()), (vec!["apply 9".to_string()], StreamPhase::Partial));
    m.on_live(10, cleared(), 10, t0, &mut out);
    assert_eq!((show(&mut out), m.phase()), (vec!["apply 10".to_string()], StreamPhase::Live));
}

#[test]
fn an_empty_history_before_later_live_batches_is_truncated_too() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    out.clear();
    m.on_live(40, batch(), 10, t0, &mut out);
    m.on_live(41, batch(), 10, t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["reset partial", "recover 40", "recover 41", "resume", "close"]);
    assert_eq!((m.phase(), m.next_seq()), (StreamPhase::Partial, Some(42)));
}

#[test]
fn a_gap_is_filled_from_the_history_without_dropping_the_blocks() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(10, t0);
    m.on_live(12, batch(), 10, t0, &mut out);
    assert_eq!(
        show(&mut out),
        ["invalidate: sequence gap: expected 10, got 12", "request 10"],
        "no reset: the blocks are right up to 9"
    );
    m.on_history_batch(10, batch(), t0, &mut out);
    m.on_history_batch(11, batch(), t0, &mut out);
    m.on_history_batch(12, batch(), t0, &mut out);
    m.on_live(13, batch(), 10, t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    let expect = ["recover 10", "recover 11", "recover 12", "recover 13", "resume", "close"];
    assert_eq!(show(&mut out), expect);
    assert_eq!((m.phase(), m.next_seq(), m.stats().gaps), (StreamPhase::Live, Some(14), 1));
}

#[test]
fn a_gap_whose_history_is_gone_drops_the_blocks_and_goes_partial() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(10, t0);
    m.on_live(30, batch(), 10, t0, &mut out);
    out.clear();
    m.on_history_batch(25, batch(), t0, &mut out);
    assert_eq!(show(&mut out), ["reset partial", "recover 25"], "removals 10..24 are lost");
    for seq in 26..=30 {
        m.on_history_batch(seq, batch(), t0, &mut out);
    }
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out).last().map(String::as_str), Some("close"));
    assert_eq!((m.phase(), m.next_seq()), (StreamPhase::Partial, Some(31)));
}

#[test]
fn a_periodic_resync_applies_batches_ahead_of_live_and_drops_their_copies() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(5, t0);
    let t1 = t0 + Duration::from_secs(11);
    m.on_tick(t1, &mut out);
    assert_eq!((show(&mut out), m.phase()), (vec!["request 5".into()], StreamPhase::Resyncing));
    m.on_live(5, batch(), 10, t1, &mut out);
    m.on_history_batch(5, batch(), t1, &mut out);
    m.on_history_batch(6, batch(), t1, &mut out);
    m.on_snapshot_end(t1, &mut out);
    assert_eq!(show(&mut out), ["apply 5", "apply 6", "close"], "5 came live first");
    assert_eq!(m.phase(), StreamPhase::Live);
    m.on_live(6, batch(), 10, t1, &mut out);
    m.on_live(7, batch(), 10, t1, &mut out);
    assert_eq!(show(&mut out), ["apply 7"], "6 was a copy");
    assert_eq!((m.stats().duplicate_batches, m.stats().gaps), (1, 0));
    assert_eq!(syncs(&m), (1, 1, 0), "a routine resync is no recovery");
}

#[test]
fn a_resync_that_finds_the_tail_gone_recovers_as_partial() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(5, t0);
    let t1 = t0 + Duration::from_secs(11);
    m.on_tick(t1, &mut out);
    out.clear();
    m.on_history_batch(9, batch(), t1, &mut out);
    let expect = ["invalidate: sequence gap: expected 5, got 9", "reset partial", "recover 9"];
    assert_eq!(show(&mut out), expect);
    m.on_snapshot_end(t1, &mut out);
    assert_eq!(show(&mut out), ["resume", "close"]);
    assert_eq!(m.phase(), StreamPhase::Partial);
    assert_eq!(syncs(&m), (1, 0, 1), "the resync became a recovery");
}

#[test]
fn a_fault_replays_from_the_start_and_a_timeout_keeps_the_progress() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(5, t0);
    m.on_fault(StreamFault::LiveRejected("bad".into()), t0, &mut out);
    assert_eq!(show(&mut out), ["invalidate: live message rejected: bad", "reset", "request 0"]);
    m.on_history_batch(0, batch(), t0, &mut out);
    m.on_history_batch(1, batch(), t0, &mut out);
    out.clear();
    let t1 = t0 + Duration::from_millis(250);
    m.on_tick(t1, &mut out);
    assert_eq!(m.phase(), StreamPhase::Backoff);
    let expect = "invalidate: history replay incomplete after replay_timeout_ms = 200";
    assert!(show(&mut out).iter().any(|a| a == expect));
    m.on_tick(t1 + Duration::from_millis(150), &mut out);
    assert_eq!(show(&mut out), ["request 2"], "0 and 1 are applied already");
}

#[test]
fn an_endpoint_that_never_answers_names_the_engine_setting() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    out.clear();
    m.on_tick(t0 + Duration::from_millis(250), &mut out);
    let shown = show(&mut out).join("\n");
    assert!(shown.contains("sets replay_endpoint"), "{shown}");
    assert_eq!(m.phase(), StreamPhase::Backoff);
}

#[test]
fn a_hole_inside_the_history_or_another_rank_fails_the_attempt() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_history_batch(0, batch(), t0, &mut out);
    out.clear();
    m.on_history_batch(2, batch(), t0, &mut out);
    assert_eq!(m.phase(), StreamPhase::Backoff);
    assert!(show(&mut out)
        .iter()
        .any(|a| a.contains("history replay skipped from sequence 1 to 2")));

    let mut m = machine();
    m.on_connected(t0, &mut out);
    let mut other = batch();
    other.dp_rank = 3;
    m.on_history_batch(0, other, t0, &mut out);
    assert_eq!(m.phase(), StreamPhase::Backoff);
}

#[test]
fn a_disconnect_forgets_the_position_and_a_reconnect_starts_over() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(5, t0);
    m.on_disconnected(&mut out);
    assert_eq!((m.phase(), m.next_seq()), (StreamPhase::Disconnected, None));
    out.clear();
    m.on_connected(t0, &mut out);
    assert_eq!(show(&mut out), ["reset", "request 0"], "a restarted engine counts from 0 again");
}

/// The index refuses live batch `seq` of a live machine.
fn refused(m: &mut Recovery, seq: u64, now: Instant, out: &mut Vec<Action>) {
    let fault = StreamFault::IndexRejected { seq, error: "BlockStored has 4 token ids".into() };
    m.on_fault(fault, now, out);
}

#[test]
fn a_batch_the_index_refuses_backs_off_doubling_to_a_minute_before_the_engine_is_asked_again() {
    // Regression: a hybrid model's stores were refused on every replay, and the stream asked
    // the engine for its whole history about ten times a second.
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(3, t0);
    let mut now = t0;
    let mut waits = Vec::new();
    for seq in 3..12 {
        refused(&mut m, seq, now, &mut out);
        assert_eq!(m.phase(), StreamPhase::Backoff);
        let shown = show(&mut out);
        assert!(shown[0].starts_with("invalidate"), "{shown:?}");
        assert!(!shown.iter().any(|a| a.starts_with("request")), "no replay at once: {shown:?}");
        let until = m.next_deadline().expect("a back-off ends");
        waits.push(until.duration_since(now).as_secs());
        // Nothing is asked before the wait ends; then the history is replayed.
        m.on_tick(until - Duration::from_millis(1), &mut out);
        assert!(out.is_empty());
        now = until;
        m.on_tick(now, &mut out);
        assert_eq!(show(&mut out), ["reset", "request 0"]);
        m.on_history_batch(0, batch(), now, &mut out);
        m.on_snapshot_end(now, &mut out);
        out.clear();
    }
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert_eq!(m.stats().index_backoffs, 9);
    // Five quiet minutes later, a refusal waits the shortest time again.
    now += Duration::from_secs(301);
    refused(&mut m, 12, now, &mut out);
    assert_eq!(m.next_deadline().unwrap().duration_since(now), Duration::from_secs(1));
}

#[test]
fn a_refusal_during_a_replay_closes_it_and_backs_off() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_history_batch(0, batch(), t0, &mut out);
    out.clear();
    refused(&mut m, 0, t0, &mut out);
    let shown = show(&mut out);
    assert!(shown.contains(&"close".to_string()), "{shown:?}");
    assert_eq!(m.phase(), StreamPhase::Backoff);
    // Other faults still recover at once.
    let (mut m, mut out) = live_at(2, t0);
    m.on_fault(StreamFault::LiveRejected("bad msgpack".into()), t0, &mut out);
    assert!(show(&mut out).contains(&"request 0".to_string()));
}

#[test]
fn a_live_copy_of_a_batch_the_resync_applied_first_is_a_duplicate_not_a_restart() {
    // Regression (4,096 bound streams): during a periodic resync the history got ahead of the
    // live socket, and the live copy that came next was taken for a restarted publisher
    // ("sequence went back from 8 to 7"), costing a recovery and its sockets.
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(5, t0);
    m.on_live(5, batch(), 10, t0, &mut out);
    m.on_live(6, batch(), 10, t0, &mut out);
    let t1 = t0 + Duration::from_secs(11);
    m.on_tick(t1, &mut out);
    out.clear();
    m.on_history_batch(7, batch(), t1, &mut out);
    m.on_history_batch(8, batch(), t1, &mut out);
    m.on_live(7, batch(), 10, t1, &mut out);
    m.on_live(8, batch(), 10, t1, &mut out);
    m.on_live(8, batch(), 10, t1, &mut out);
    assert_eq!(show(&mut out), ["apply 7", "apply 8"], "the live copies are dropped");
    m.on_snapshot_end(t1, &mut out);
    m.on_live(9, batch(), 10, t1, &mut out);
    assert_eq!(show(&mut out), ["close", "apply 9"]);
    assert_eq!((m.stats().duplicate_batches, m.stats().gaps), (3, 0));
    assert_eq!(syncs(&m), (1, 1, 0), "no recovery");
    // A publisher that really restarts goes back below what it sent live.
    m.on_live(2, batch(), 10, t1, &mut out);
    assert!(show(&mut out)[0].contains("went back from 9 to 2"));
}
