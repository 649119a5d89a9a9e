//! Unit tests of live copies (snapshot replay): a live batch the stream already has is dropped
//! as a duplicate, never taken for a restarted publisher.

use std::time::{Duration, Instant};

use super::tests::{batch, live_at, machine, show, syncs};
use super::*;

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
