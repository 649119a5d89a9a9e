//! Unit tests of the recovery state machine: time is passed in, nothing sleeps.

use std::time::{Duration, Instant};

use super::*;
use crate::index::IndexConfig;
use crate::wire::{Batch, EngineHash, Tier};

pub(super) fn cfg() -> RecoveryConfig {
    RecoveryConfig {
        dp_rank: 0,
        replay: crate::config::ReplayKind::Snapshot,
        replay_timeout: Duration::from_millis(200),
        resync_interval: Duration::from_secs(10),
        resync_offset: Duration::ZERO,
        max_buffered_bytes: 1 << 20,
        backoff_min: Duration::from_millis(100),
        backoff_max: Duration::from_millis(400),
        ordered_losses: false,
    }
}

pub(super) fn machine() -> Recovery {
    Recovery::new(cfg(), IndexConfig { block_size: 2, hash_seed: 1024, salt: 0, max_blocks: 100 })
}

pub(super) fn batch() -> Batch {
    let mut b = Batch::default();
    b.push_stored(&[EngineHash(1)], None, &[1, 2], 2, Tier::Device);
    b
}

pub(super) fn full_state() -> Batch {
    let mut b = Batch::default();
    b.push_cleared(None);
    b.push_stored(&[EngineHash(1)], None, &[1, 2], 2, Tier::Device);
    b
}

/// A compact rendering of actions for assertions.
pub(super) fn show(out: &mut Vec<Action>) -> Vec<String> {
    out.drain(..)
        .map(|a| match a {
            Action::Apply { seq, .. } => format!("apply {seq}"),
            Action::Invalidate { fault } => format!("invalidate: {fault}"),
            Action::RequestSnapshot { start_seq } => format!("request {start_seq}"),
            Action::CloseSnapshot => "close".into(),
            Action::Reset { partial } => format!("reset{}", if partial { " partial" } else { "" }),
            Action::Recover { seq, .. } => format!("recover {seq}"),
            Action::Resume => "resume".into(),
            Action::Install { watermark, deltas, .. } => {
                let seqs: Vec<String> = deltas.iter().map(|(s, _)| s.to_string()).collect();
                format!("install {watermark} [{}]", seqs.join(","))
            }
        })
        .collect()
}

/// (initial syncs, periodic resyncs, recoveries) completed.
pub(super) fn syncs(m: &Recovery) -> (u64, u64, u64) {
    let s = m.stats();
    (s.initial_syncs, s.resyncs, s.recoveries)
}

/// Brings a machine to Live with next sequence `watermark`.
pub(super) fn live_at(watermark: u64, t0: Instant) -> (Recovery, Vec<Action>) {
    brought_live(machine(), watermark, t0)
}

/// Brings `m` (disconnected) to Live with next sequence `watermark` from a snapshot.
pub(super) fn brought_live(
    mut m: Recovery,
    watermark: u64,
    t0: Instant,
) -> (Recovery, Vec<Action>) {
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_snapshot_reply(watermark, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    out.clear();
    (m, out)
}

#[test]
fn cold_start_snapshots_then_applies_in_order() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    assert_eq!(m.phase(), StreamPhase::Disconnected);
    m.on_connected(t0, &mut out);
    assert_eq!(show(&mut out), ["request 0"]);
    m.on_live(3, batch(), 10, t0, &mut out);
    m.on_live(4, batch(), 10, t0, &mut out);
    m.on_live(5, batch(), 10, t0, &mut out);
    m.on_snapshot_reply(4, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["close", "install 4 [4,5]"], "seq 3 is in the snapshot");
    assert_eq!(m.next_seq(), Some(6));
    m.on_live(6, batch(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 6"]);
    assert_eq!(syncs(&m), (1, 0, 0), "a first sync is no recovery");
}

#[test]
fn a_gap_invalidates_and_resyncs_from_the_last_applied_sequence() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(5, t0);
    m.on_live(5, batch(), 10, t0, &mut out);
    m.on_live(7, batch(), 10, t0, &mut out);
    assert_eq!(
        show(&mut out),
        ["apply 5", "invalidate: sequence gap: expected 6, got 7", "request 6"]
    );
    assert_eq!(m.stats().gaps, 1);
    m.on_snapshot_reply(7, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["close", "install 7 [7]"]);
    assert_eq!(syncs(&m), (1, 0, 1), "the gap is recovered from");
}

#[test]
fn a_continued_machine_keeps_counting_from_the_old_stats() {
    let t0 = Instant::now();
    let (old, _) = live_at(5, t0);
    let mut m = machine().continuing(old.stats());
    assert_eq!(m.stats(), old.stats());
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_snapshot_reply(9, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(syncs(&m), (1, 0, 1), "a restarted worker's first sync is a recovery");
}

#[test]
fn a_sequence_regression_means_the_publisher_restarted() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(10, t0);
    m.on_live(0, batch(), 10, t0, &mut out);
    assert_eq!(
        show(&mut out),
        ["invalidate: sequence went back from 9 to 0: publisher restarted", "request 10"]
    );
    m.on_snapshot_reply(0, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(
        show(&mut out),
        ["close", "install 0 [0]"],
        "the restarted publisher's batch 0 continues its snapshot"
    );
}

#[test]
fn deltas_that_do_not_continue_the_watermark_fail_and_back_off() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_live(8, batch(), 10, t0, &mut out);
    m.on_snapshot_reply(5, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(
        show(&mut out),
        [
            "request 0",
            "close",
            "invalidate: live deltas do not continue the snapshot: expected sequence 5, got 8"
        ]
    );
    assert_eq!(m.phase(), StreamPhase::Backoff);
    m.on_live(9, batch(), 10, t0, &mut out);
    assert!(out.is_empty(), "batches are dropped while backing off");
    m.on_tick(t0 + Duration::from_millis(99), &mut out);
    assert!(out.is_empty());
    m.on_tick(t0 + Duration::from_millis(100), &mut out);
    assert_eq!(show(&mut out), ["request 0"]);
}

#[test]
fn an_incomplete_snapshot_times_out_with_doubling_backoff() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_snapshot_reply(1, &batch(), t0, &mut out); // truncated: no terminator follows
    m.on_tick(t0 + Duration::from_millis(200), &mut out);
    assert_eq!(show(&mut out), ["request 0"], "not yet past the timeout");
    let t1 = t0 + Duration::from_millis(201);
    m.on_tick(t1, &mut out);
    assert_eq!(
        show(&mut out),
        ["close", "invalidate: snapshot incomplete after replay_timeout_ms = 200"]
    );
    m.on_tick(t1 + Duration::from_millis(100), &mut out);
    assert_eq!(show(&mut out), ["request 0"]);
    let t2 = t1 + Duration::from_millis(301);
    m.on_tick(t2, &mut out);
    out.clear();
    m.on_tick(t2 + Duration::from_millis(199), &mut out);
    assert!(out.is_empty(), "second back-off is 200 ms");
    m.on_tick(t2 + Duration::from_millis(200), &mut out);
    assert_eq!(show(&mut out), ["request 0"]);
    assert_eq!(m.stats().snapshot_failures, 2);
}

#[test]
fn a_refused_or_rejected_snapshot_fails() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(
        show(&mut out),
        ["request 0", "close", "invalidate: snapshot ended without a reply (publisher refused)"]
    );
    m.on_tick(t0 + Duration::from_millis(100), &mut out);
    let mut wrong = Batch::default();
    wrong.push_stored(&[EngineHash(1)], None, &[1, 2, 3, 4], 4, Tier::Device);
    m.on_snapshot_reply(0, &wrong, t0, &mut out);
    let shown = show(&mut out);
    assert_eq!(shown[..2], ["request 0", "close"]);
    assert!(
        shown[2].starts_with("invalidate: snapshot rejected: BlockStored block_size 4"),
        "{shown:?}"
    );
}

#[test]
fn a_snapshot_of_another_dp_rank_is_rejected() {
    let t0 = Instant::now();
    let index = IndexConfig { block_size: 2, hash_seed: 1024, salt: 0, max_blocks: 100 };
    let mut m = Recovery::new(RecoveryConfig { dp_rank: 1, ..cfg() }, index);
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    let rank0 = batch(); // dp_rank 0: rank 0's state served on rank 1's replay port
    m.on_snapshot_reply(3, &rank0, t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(
        show(&mut out),
        [
            "request 0",
            "close",
            "invalidate: snapshot rejected: batch dp_rank 0 does not match the stream's dp_rank 1"
        ]
    );
    assert_eq!((m.phase(), syncs(&m)), (StreamPhase::Backoff, (0, 0, 0)), "no credit from it");

    m.on_tick(t0 + Duration::from_millis(100), &mut out);
    let mut rank1 = batch();
    rank1.dp_rank = 1;
    m.on_snapshot_reply(3, &rank1, t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["request 0", "close", "install 3 []"]);
    assert_eq!(syncs(&m), (1, 0, 0), "a retried first sync is still the first");
}

#[test]
fn the_buffer_budget_is_enforced() {
    let t0 = Instant::now();
    let mut m = Recovery::new(
        RecoveryConfig { max_buffered_bytes: 1000, ..cfg() },
        IndexConfig { block_size: 2, hash_seed: 1024, salt: 0, max_blocks: 100 },
    );
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_live(0, batch(), 400, t0, &mut out);
    assert_eq!(show(&mut out), ["request 0"]);
    m.on_live(1, batch(), 700, t0, &mut out);
    assert_eq!(
        show(&mut out),
        [
            "close",
            "invalidate: live deltas buffered during recovery exceeded max_buffered_bytes = 1000"
        ]
    );
}

#[test]
fn periodic_resync_keeps_applying_and_installs_without_losing_credit() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(3, t0);
    m.on_tick(t0 + Duration::from_secs(10), &mut out);
    assert_eq!(show(&mut out), ["request 3"], "no invalidation for a routine resync");
    assert_eq!(m.phase(), StreamPhase::Resyncing);
    m.on_live(3, batch(), 10, t0, &mut out);
    m.on_live(4, batch(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 3", "apply 4"]);
    m.on_snapshot_reply(4, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["close", "install 4 [4]"]);
    assert_eq!(m.next_seq(), Some(5));
    assert_eq!(syncs(&m), (1, 1, 0), "a routine resync is no recovery");

    // A failed periodic resync leaves the stream live.
    let t1 = t0 + Duration::from_secs(20);
    m.on_tick(t1, &mut out);
    m.on_tick(t1 + Duration::from_millis(201), &mut out);
    assert_eq!(show(&mut out), ["request 5", "close"]);
    assert_eq!(m.phase(), StreamPhase::Live);
}

#[test]
fn a_gap_during_periodic_resync_invalidates() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(3, t0);
    m.on_tick(t0 + Duration::from_secs(10), &mut out);
    m.on_live(5, batch(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["request 3", "invalidate: sequence gap: expected 3, got 5"]);
    assert_eq!(m.phase(), StreamPhase::Syncing);
    m.on_snapshot_reply(5, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(show(&mut out), ["close", "install 5 [5]"]);
    assert_eq!(syncs(&m), (1, 0, 1), "the resync became a recovery");
}

#[test]
fn a_full_state_batch_restores_sync_from_any_phase() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_snapshot_end(t0, &mut out); // refused: back-off
    out.clear();
    m.on_live(40, full_state(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 40"]);
    assert_eq!(m.phase(), StreamPhase::Live);
    m.on_live(41, batch(), 10, t0, &mut out);
    assert_eq!(show(&mut out), ["apply 41"]);
    m.on_live(0, full_state(), 10, t0, &mut out);
    assert_eq!(
        show(&mut out),
        ["apply 0"],
        "a restarted publisher's full state is applied at once"
    );
    assert_eq!(m.stats().full_state_restores, 2);
}

#[test]
fn a_disconnect_invalidates_and_waits_for_the_reconnect() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(3, t0);
    m.on_disconnected(&mut out);
    assert_eq!(show(&mut out), ["invalidate: publisher disconnected", "close"]);
    m.on_tick(t0 + Duration::from_secs(60), &mut out);
    assert!(out.is_empty(), "nothing to do until the publisher is back");
    m.on_connected(t0, &mut out);
    assert_eq!(show(&mut out), ["request 0"], "a reconnect starts cold");
    m.on_snapshot_reply(0, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(syncs(&m), (1, 0, 1), "the reconnect is recovered from");
}

#[test]
fn a_fault_resyncs_at_once() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(3, t0);
    m.on_fault(
        StreamFault::LiveRejected("events[0]: block_hashes: truncated".into()),
        t0,
        &mut out,
    );
    assert_eq!(
        show(&mut out),
        ["invalidate: live message rejected: events[0]: block_hashes: truncated", "request 3"]
    );
}

#[test]
fn the_next_deadline_follows_the_phase() {
    let t0 = Instant::now();
    let mut m = machine();
    let mut out = Vec::new();
    assert_eq!(m.next_deadline(), None, "disconnected: only an event moves it");
    m.on_connected(t0, &mut out);
    assert_eq!(m.next_deadline(), Some(t0 + cfg().replay_timeout), "the snapshot timeout");
    let t1 = t0 + Duration::from_millis(300);
    m.on_tick(t1, &mut out);
    assert_eq!(m.phase(), StreamPhase::Backoff);
    assert_eq!(m.next_deadline(), Some(t1 + cfg().backoff_min), "the end of the back-off");
    let (live, _) = live_at(5, t0);
    assert_eq!(live.next_deadline(), Some(t0 + cfg().resync_period()), "the periodic resync");
}

#[test]
fn consecutive_failed_resyncs_end_the_credit_and_a_success_resets_the_count() {
    let t0 = Instant::now();
    let (mut m, mut out) = live_at(3, t0);
    let mut t = t0;
    let mut fail_one_resync = |m: &mut Recovery, out: &mut Vec<Action>| {
        t += Duration::from_secs(10);
        m.on_tick(t, out);
        m.on_snapshot_error(StreamFault::SnapshotRefused, t, out);
    };
    for _ in 1..MAX_FAILED_RESYNCS {
        fail_one_resync(&mut m, &mut out);
        assert_eq!(show(&mut out), ["request 3", "close"], "live events keep the credit");
        assert_eq!(m.phase(), StreamPhase::Live);
    }
    fail_one_resync(&mut m, &mut out);
    let shown = show(&mut out);
    assert_eq!(shown.len(), 3, "{shown:?}");
    assert!(
        shown[2]
            .starts_with("invalidate: 3 periodic resyncs failed in a row (last: snapshot ended"),
        "{shown:?}"
    );
    assert_eq!(m.phase(), StreamPhase::Backoff);

    // Once a snapshot succeeds, the count starts again.
    let (mut m, mut out) = live_at(3, t0);
    let mut t = t0;
    for round in 0..2 * MAX_FAILED_RESYNCS {
        t += Duration::from_secs(10);
        m.on_tick(t, &mut out);
        if round % 2 == 0 {
            m.on_snapshot_error(StreamFault::SnapshotRefused, t, &mut out);
        } else {
            m.on_snapshot_reply(3, &batch(), t, &mut out);
            m.on_snapshot_end(t, &mut out);
        }
        assert_eq!(m.phase().as_str(), "live", "round {round}: {:?}", show(&mut out));
    }
}
