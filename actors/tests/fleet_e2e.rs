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

/// Threads of this process called one of `names` (`/proc/self/task/*/comm`).
fn threads_called(names: &[&str]) -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").expect("Linux /proc");
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| names.contains(&comm.trim_end()))
        .count()
}

/// The streams report's entries, by name.
fn stream_reports(svc: &kvdir_actors::Service) -> (Value, Vec<Value>) {
    let r = report(svc);
    let streams = r["streams"].as_array().cloned().unwrap_or_default();
    (r, streams)
}

/// Waits until all of `fleet`'s streams are live in `svc`.
fn all_live(svc: &kvdir_actors::Service, streams: usize) {
    eventually_within(Duration::from_secs(60), "every stream to be live", || {
        let (_, reports) = stream_reports(svc);
        let live = reports.iter().filter(|s| s["phase"] == "live").count();
        if reports.len() == streams && live == streams {
            Ok(())
        } else {
            Err(format!("{live} of {} streams live", reports.len()))
        }
    });
}

/// Publishes [`BATCHES`] per stream and checks that every one is applied live, in order.
fn every_batch_applied(svc: &kvdir_actors::Service, fleet: &Fleet, streams: usize) {
    fleet.publish(BATCHES);
    eventually_within(Duration::from_secs(60), "every batch to be applied", || {
        let m = query(svc, &[]);
        let behind: Vec<_> = m
            .matches
            .iter()
            .filter(|e| !e.synchronized || e.device_blocks != BATCHES)
            .map(|e| format!("{}: {} blocks", e.instance_name, e.device_blocks))
            .collect();
        match (m.matches.len(), behind.first()) {
            (n, None) if n == streams => Ok(()),
            (n, first) => Err(format!("{n} streams, {} behind, e.g. {first:?}", behind.len())),
        }
    });
    let (_, reports) = stream_reports(svc);
    for s in &reports {
        assert_eq!((s["messages"].as_u64(), s["gaps"].as_u64()), (Some(BATCHES), Some(0)), "{s}");
    }
    // A stream's last block answers a query for it, through the shared index.
    let last = streams - 1;
    let tokens = block_tokens(last, BATCHES - 1);
    assert_eq!(hits(svc, &format!("fleet-{last}"), 0, &tokens), Ok((u64::from(BLOCK), 0)));
}

#[test]
fn a_thousand_streams_synchronize_and_apply_every_batch_on_a_fixed_pool_of_threads() {
    enough_fds(STREAMS);
    let fleet = Fleet::start(STREAMS, 4);
    let svc = service(fleet.streams(), json!({"max_streams": STREAMS}));
    all_live(&svc, STREAMS);
    let (r, _) = stream_reports(&svc);
    let pool = r["io_threads"].as_array().cloned().unwrap_or_default();
    let served: u64 = pool.iter().filter_map(|t| t["streams"].as_u64()).sum();
    assert_eq!(served, STREAMS as u64, "every stream is served by the pool: {pool:?}");
    assert!(pool.len() <= 64, "a bounded pool: {} threads", pool.len());
    // The pool's threads, plus libzmq's I/O thread and reaper, which take the name of the
    // thread that made the first socket: a thread per stream would show a thousand more.
    let names: Vec<&str> = pool.iter().filter_map(|t| t["name"].as_str()).collect();
    let running = threads_called(&names);
    assert!(
        running <= names.len() + 2,
        "{running} threads serve {STREAMS} streams, named {names:?}"
    );
    every_batch_applied(&svc, &fleet, STREAMS);
    let (_, reports) = stream_reports(&svc);
    for s in &reports {
        assert_eq!(s["recoveries"], 1, "synchronized once, then applied live: {s}");
    }
    svc.stop();
}

#[test]
fn streams_queue_for_the_few_replay_slots_and_all_synchronize() {
    let streams = 96;
    enough_fds(streams);
    let fleet = Fleet::start(streams, 2);
    let config = json!({"max_streams": streams, "max_concurrent_replays": 2, "io_threads": 1});
    let svc = service(fleet.streams(), config);
    all_live(&svc, streams);
    let (r, _) = stream_reports(&svc);
    assert_eq!(r["replays_waiting"], 0, "nobody waits once all are live: {}", r["io_threads"]);
    assert_eq!(r["io_threads"].as_array().map(Vec::len), Some(1), "io_threads = 1");
    every_batch_applied(&svc, &fleet, streams);
}
