//! Log levels as an operator reads them, captured from the service's real tracing output while
//! a simulated engine keeps failing: a stream that loses synchronization is reported once at
//! WARN, its further failed retries only at DEBUG, and the next loss after it was live again is
//! a WARN again; an unreachable etcd is one WARN, its retries DEBUG. (Its own test binary: the
//! log subscriber is process-wide.)

mod common;

use common::*;
use kvdir_sim::{Fault, SnapshotMode};
use serde_json::json;

/// Log lines about stream `name` that contain `what` at `level`.
fn lines(level: &str, name: &str, what: &str) -> usize {
    let log = captured_log();
    let stream = format!("stream={name} ");
    log.lines().filter(|l| l.contains(level) && l.contains(&stream) && l.contains(what)).count()
}

#[test]
fn a_failing_stream_warns_once_per_loss_of_synchronization() {
    capture_logs(tracing_subscriber::filter::LevelFilter::DEBUG);
    let eng = engine("refuser", 1, 0);
    let a = prompt(1, 2);
    eng.process(0, &a).unwrap();
    eng.faults(0, Fault::Snapshot(SnapshotMode::Refuse)).unwrap();
    let svc = service(streams_of(&eng), json!({}));
    eventually("several refused snapshots", || {
        match lines("DEBUG", "refuser", "stream still unsynchronized") {
            n if n >= 3 => Ok(()),
            n => Err(format!("{n} DEBUG retries so far")),
        }
    });
    assert_eq!(lines("WARN", "refuser", "stream unsynchronized"), 1, "one WARN for the loss");

    eng.faults(0, Fault::Snapshot(SnapshotMode::Normal)).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &a), (32, 0));
    eng.faults(0, Fault::DropNext(1)).unwrap();
    eng.process(0, &prompt(100, 1)).unwrap();
    let b = prompt(200, 1);
    eng.process(0, &b).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &b), (16, 0));
    assert_eq!(lines("WARN", "refuser", "stream unsynchronized"), 2, "a new loss warns again");

    // The registry's etcd (nowhere, in this test) is retried with back-off: one WARN for the
    // outage, the retries at DEBUG.
    let count = |level: &str, what: &str| {
        let log = captured_log();
        log.lines().filter(|l| l.contains(level) && l.contains(what)).count()
    };
    eventually("several etcd retries", || match count("DEBUG", "etcd still unavailable") {
        n if n >= 2 => Ok(()),
        n => Err(format!("{n} DEBUG retries so far")),
    });
    assert_eq!(count("WARN", "etcd unavailable; serving what is known"), 1, "one WARN per outage");
}
