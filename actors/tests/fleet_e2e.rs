//! Fleet scale: a thousand streams in one kvdir on loopback, served by a fixed pool of I/O
//! threads. The publishers live in this process too (a few threads owning many PUB and ROUTER
//! sockets), so the process needs file descriptors for both sides.

mod common;
#[path = "fleet/publishers.rs"]
mod publishers;

use std::time::Duration;

use common::*;
use publishers::{block_tokens, Fleet, BLOCK};
use serde_json::{json, Value};

/// Streams of the test (the issue asks for at least 1,000).
const STREAMS: usize = 1024;
/// Live batches each stream publishes once synchronized.
const BATCHES: u64 = 5;
/// File descriptors per stream, both sides: kvdir's SUB (mailbox, TCP), monitor pair (2) and a
/// replay DEALER (mailbox, TCP); the publisher's PUB and ROUTER (mailbox, listener, accepted
/// connection each).
const FDS_PER_STREAM: u64 = 12;

/// Raises the soft open-file limit to the hard one, and fails with what to do if the hard
/// limit cannot hold the test.
fn enough_fds(streams: usize) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    let raised = Rlimit { current: lim.maximum, maximum: lim.maximum };
    setrlimit(Resource::Nofile, raised).expect("raising the soft open-file limit to the hard one");
    let need = streams as u64 * FDS_PER_STREAM + 1024;
    if let Some(hard) = lim.maximum {
        assert!(
            hard >= need,
            "this test needs about {need} file descriptors for {streams} streams (both sides \
             run here), but the hard open-file limit is {hard}: raise it (ulimit -Hn {need})"
        );
    }
}

/// Threads of this process (`/proc/self/status`).
fn threads() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let line = status.lines().find(|l| l.starts_with("Threads:")).expect("a Threads line");
    line["Threads:".len()..].trim().parse().expect("a thread count")
}

/// The streams report's entries, by name.
fn stream_reports(svc: &kvdir_actors::Service) -> (Value, Vec<Value>) {
    let r = report(svc);
    let streams = r["streams"].as_array().cloned().unwrap_or_default();
    (r, streams)
}

#[test]
fn a_thousand_streams_synchronize_and_apply_every_batch_on_a_fixed_pool_of_threads() {
    enough_fds(STREAMS);
    let fleet = Fleet::start(STREAMS, 4);
    let before = threads();
    let svc = service(fleet.streams(), json!({"max_streams": STREAMS}));
    let long = Duration::from_secs(60);
    eventually_within(long, "every stream to be live", || {
        let (_, streams) = stream_reports(&svc);
        let live = streams.iter().filter(|s| s["phase"] == "live").count();
        if streams.len() == STREAMS && live == STREAMS {
            Ok(())
        } else {
            Err(format!("{live} of {} streams live", streams.len()))
        }
    });
    let (r, _) = stream_reports(&svc);
    let pool = r["io_threads"].as_array().cloned().unwrap_or_default();
    let served: u64 = pool.iter().filter_map(|t| t["streams"].as_u64()).sum();
    assert_eq!(served, STREAMS as u64, "every stream is served by the pool: {pool:?}");
    assert!(pool.len() <= 64, "a bounded pool: {} threads", pool.len());
    let grown = threads() - before;
    assert!(
        grown < 128,
        "the service added {grown} threads for {STREAMS} streams; a thread per stream would add \
         {STREAMS}"
    );

    fleet.publish(BATCHES);
    eventually_within(long, "every batch to be applied", || {
        let m = query(&svc, &[]);
        let behind: Vec<_> = m
            .matches
            .iter()
            .filter(|e| !e.synchronized || e.device_blocks != BATCHES)
            .map(|e| format!("{}: {} blocks", e.instance_name, e.device_blocks))
            .collect();
        match (m.matches.len(), behind.first()) {
            (STREAMS, None) => Ok(()),
            (n, first) => Err(format!("{n} streams, {} behind, e.g. {first:?}", behind.len())),
        }
    });
    let (_, streams) = stream_reports(&svc);
    for s in &streams {
        assert_eq!((s["messages"].as_u64(), s["gaps"].as_u64()), (Some(BATCHES), Some(0)), "{s}");
        assert_eq!(s["recoveries"], 1, "synchronized once, then applied live: {s}");
    }
    // A stream's last block answers a query for it, through the shared index.
    let last = STREAMS - 1;
    let tokens = block_tokens(last, BATCHES - 1);
    assert_eq!(hits(&svc, &format!("fleet-{last}"), 0, &tokens), Ok((u64::from(BLOCK), 0)));
    svc.stop();
}
