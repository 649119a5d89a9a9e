//! Log levels as an operator reads them, captured from the service's real tracing output while
//! a simulated engine keeps failing: a stream that loses synchronization is reported once at
//! WARN, its further failed retries only at DEBUG, and the next loss after it was live again is
//! a WARN again; an unreachable etcd is one WARN, its retries DEBUG. (Its own test binary: the
//! log subscriber is process-wide.)

mod common;

use std::io::Write;
use std::sync::Mutex;

use common::*;
use kvdir_sim::{Fault, SnapshotMode};
use serde_json::json;

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Log lines about stream `name` that contain `what` at `level`.
fn lines(level: &str, name: &str, what: &str) -> usize {
    let log = String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned();
    let stream = format!("stream={name} ");
    log.lines().filter(|l| l.contains(level) && l.contains(&stream) && l.contains(what)).count()
}

#[test]
fn a_failing_stream_warns_once_per_loss_of_synchronization() {
    tracing_subscriber::fmt()
        .with_writer(|| Capture)
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::DEBUG)
        .init();
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
        let log = String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned();
        log.lines().filter(|l| l.contains(level) && l.contains(what)).count()
    };
    eventually("several etcd retries", || match count("DEBUG", "etcd still unavailable") {
        n if n >= 2 => Ok(()),
        n => Err(format!("{n} DEBUG retries so far")),
    });
    assert_eq!(count("WARN", "etcd unavailable; serving what is known"), 1, "one WARN per outage");
}
