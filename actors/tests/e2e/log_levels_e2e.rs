//! Log levels as an operator reads them, captured from the service's real tracing output while
//! a simulated engine keeps failing: a stream that loses synchronization is reported once at
//! WARN, its further failed retries only at DEBUG, and the next loss after it was live again is
//! a WARN again; an unreachable etcd is one WARN, its retries DEBUG. The log is the whole test
//! binary's, so the test counts only lines naming its own stream and its own etcd endpoint.

use kvdir::config::Flags;
use kvdir_sim::{Fault, SnapshotMode};
use serde_json::json;

use crate::common::*;

/// The stream of this test (no other test names a stream so).
const STREAM: &str = "log-levels-refuser";
/// This test's etcd endpoint, where nothing listens (port 2, like [`NO_ETCD`]'s port 1, needs
/// root to bind and nothing uses it); no other test uses it.
const DEAD_ETCD: &str = "127.0.0.1:2";

/// Log lines about stream `name` that contain `what` at `level`.
fn lines(level: &str, name: &str, what: &str) -> usize {
    let log = captured_log();
    let stream = format!("stream={name} ");
    log.lines().filter(|l| l.contains(level) && l.contains(&stream) && l.contains(what)).count()
}

#[test]
fn a_failing_stream_warns_once_per_loss_of_synchronization() {
    let _log = capture_logs(tracing_subscriber::filter::LevelFilter::DEBUG);
    let eng = engine(STREAM, 1, 0);
    let a = prompt(1, 2);
    eng.process(0, &a).unwrap();
    eng.faults(0, Fault::Snapshot(SnapshotMode::Refuse)).unwrap();
    let flags = Flags {
        etcd_addr: DEAD_ETCD.into(),
        etcd_namespace: "log-levels".into(),
        ..Flags::default()
    };
    let svc = service_with(streams_of(&eng), json!({}), flags);
    eventually("several refused snapshots", || {
        match lines("DEBUG", STREAM, "stream still unsynchronized") {
            n if n >= 3 => Ok(()),
            n => Err(format!("{n} DEBUG retries so far")),
        }
    });
    assert_eq!(lines("WARN", STREAM, "stream unsynchronized"), 1, "one WARN for the loss");

    eng.faults(0, Fault::Snapshot(SnapshotMode::Normal)).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &a), (32, 0));
    eng.faults(0, Fault::DropNext(1)).unwrap();
    eng.process(0, &prompt(100, 1)).unwrap();
    let b = prompt(200, 1);
    eng.process(0, &b).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &b), (16, 0));
    assert_eq!(lines("WARN", STREAM, "stream unsynchronized"), 2, "a new loss warns again");

    // The registry's etcd (nowhere, in this test) is retried with back-off: one WARN for the
    // outage, the retries at DEBUG.
    let endpoint = format!("{DEAD_ETCD}:");
    let count = |level: &str, what: &str| {
        let log = captured_log();
        let ours = |l: &&str| l.contains(level) && l.contains(what) && l.contains(&endpoint);
        log.lines().filter(ours).count()
    };
    eventually("several etcd retries", || match count("DEBUG", "etcd still unavailable") {
        n if n >= 2 => Ok(()),
        n => Err(format!("{n} DEBUG retries so far")),
    });
    assert_eq!(count("WARN", "etcd unavailable; serving what is known"), 1, "one WARN per outage");
}
