//! Unit tests of the periodic resync's per-stream offset: each stream resyncs at a fixed,
//! deterministic point of the interval's last quarter, so a fleet that synchronized together
//! does not take its snapshots together.

use std::time::{Duration, Instant};

use super::actions::resync_offset;
use super::tests::{batch, cfg, show};
use super::*;
use crate::config::{Limits, ReplayKind, StreamSpec};
use crate::index::IndexConfig;

/// A machine with `offset`, live since `t0` with next sequence 5.
fn live_with_offset(offset: Duration, t0: Instant) -> Recovery {
    let cfg = RecoveryConfig { resync_offset: offset, ..cfg() };
    let index = IndexConfig { block_size: 2, hash_seed: 1024, salt: 0, max_blocks: 100 };
    let mut m = Recovery::new(cfg, index);
    let mut out = Vec::new();
    m.on_connected(t0, &mut out);
    m.on_snapshot_reply(5, &batch(), t0, &mut out);
    m.on_snapshot_end(t0, &mut out);
    assert_eq!(m.phase(), StreamPhase::Live);
    m
}

#[test]
fn two_streams_with_different_offsets_resync_apart_and_never_later_than_the_interval() {
    let t0 = Instant::now();
    let interval = cfg().resync_interval;
    let (oa, ob) = (resync_offset("engine-a", 0, interval), resync_offset("engine-b", 0, interval));
    assert_ne!(oa, ob, "different streams, different offsets");
    for o in [oa, ob] {
        assert!(o < interval / 4, "offset {o:?} below a quarter of {interval:?}");
    }
    let mut a = live_with_offset(oa, t0);
    let mut b = live_with_offset(ob, t0);
    let (da, db) = (a.next_deadline().unwrap(), b.next_deadline().unwrap());
    assert_ne!(da, db, "synchronized together, they resync apart");
    assert_eq!((da, db), (t0 + interval - oa, t0 + interval - ob));
    let mut out = Vec::new();
    for (m, at) in [(&mut a, da), (&mut b, db)] {
        assert!(at <= t0 + interval && at > t0 + interval * 3 / 4, "{at:?}");
        m.on_tick(at - Duration::from_millis(1), &mut out);
        assert_eq!(show(&mut out), Vec::<String>::new(), "not before its deadline");
        m.on_tick(at, &mut out);
        assert_eq!(show(&mut out), ["request 5"], "the periodic resync at its deadline");
        assert_eq!(m.phase(), StreamPhase::Resyncing);
    }
}

#[test]
fn offsets_are_deterministic_and_spread_a_fleet_over_a_quarter_interval() {
    let interval = Duration::from_secs(30);
    let quarter = interval / 4;
    assert_eq!(resync_offset("e-7", 3, interval), resync_offset("e-7", 3, interval));
    assert_ne!(resync_offset("e-7", 3, interval), resync_offset("e-7", 2, interval));
    let offsets: Vec<Duration> = (0..1024)
        .flat_map(|e| (0..4).map(move |r| resync_offset(&format!("engine-{e}"), r, interval)))
        .collect();
    let (lo, hi) = (offsets.iter().min().unwrap(), offsets.iter().max().unwrap());
    assert!(*hi < quarter, "{hi:?}");
    assert!(*hi - *lo > quarter * 9 / 10, "4,096 streams spread over {lo:?}..{hi:?}");
    let first_half = offsets.iter().filter(|o| **o < quarter / 2).count();
    assert!((1700..2400).contains(&first_half), "{first_half} of 4,096 in the first half");
    assert_eq!(resync_offset("e", 0, Duration::ZERO), Duration::ZERO, "no interval, no offset");
}

#[test]
fn the_stream_config_carries_its_offset() {
    let limits = Limits::default();
    let spec = |name: &str| StreamSpec {
        instance_name: name.into(),
        dp_rank: 1,
        block_size: 16,
        endpoint: "tcp://127.0.0.1:5557".into(),
        replay_endpoint: "tcp://127.0.0.1:5558".into(),
        topic: String::new(),
        hash_seed: 0,
        model: String::new(),
        salt: String::new(),
        replay: ReplayKind::Snapshot,
    };
    let (a, b) = (
        RecoveryConfig::for_stream(&spec("a"), &limits),
        RecoveryConfig::for_stream(&spec("b"), &limits),
    );
    assert_eq!(a.resync_offset, resync_offset("a", 1, limits.resync_interval));
    assert_ne!(a.resync_period(), b.resync_period());
    assert!(
        a.resync_period() <= limits.resync_interval
            && a.resync_period() > limits.resync_interval * 3 / 4
    );
}
