//! End-to-end supervision: faults that no input provokes on demand are injected at named points
//! (`kvdir_service::faults`); the engine, sockets, actors, supervisor and HTTP stay real. Each
//! test asserts what an operator sees in the streams report and the query response.

use crate::common::*;
use kvdir_service::faults::{self, Fault, FaultPoint};
use kvdir_sim::Fault as SimFault;
use serde_json::{json, Value};

/// The streams-report entry of `instance`/`rank`.
fn stream(svc: &kvdir_service::Service, instance: &str, rank: u32) -> Value {
    let r = report(svc);
    let found =
        r["streams"].as_array().into_iter().flatten().find(|s| {
            s["instance_name"] == instance && s["dp_rank"].as_u64() == Some(u64::from(rank))
        });
    found.cloned().unwrap_or_else(|| panic!("no stream {instance}/{rank} in {r}"))
}

#[test]
fn a_stream_thread_that_fails_to_open_is_restarted_with_doubling_backoff() {
    let eng = engine("broken-open", 1, 0);
    let a = prompt(1, 3);
    eng.process(0, &a).unwrap();
    faults::arm(FaultPoint::WorkerOpen, "broken-open", 0, 3, Fault::Panic);
    let svc = service(streams_of(&eng), json!({}));
    let mut backoffs = Vec::new();
    eventually("three failed starts, then a synchronized stream", || {
        // The query comes first: credit seen before the report means credit at that time.
        let m = query(&svc, &a);
        let s = stream(&svc, "broken-open", 0);
        if entry(&m, "broken-open", 0).synchronized {
            assert_eq!(s["restarts"], 3, "credit only once a worker opened: {m:?} {s}");
        }
        if s["phase"] == "backoff" {
            let seen = (s["restarts"].as_u64(), s["restart_backoff_ms"].as_u64());
            if backoffs.last() != Some(&seen) {
                backoffs.push(seen);
            }
            let fault = s["last_fault"].as_str().unwrap_or_default();
            assert!(fault.contains("stream thread panicked"), "readable fault: {s}");
        }
        match (s["restarts"].as_u64(), s["phase"].as_str()) {
            (Some(3), Some("live")) => Ok(()),
            _ => Err(s.to_string()),
        }
    });
    let expected = [(0, 200), (1, 400), (2, 800)].map(|(r, b)| (Some(r), Some(b)));
    assert_eq!(backoffs, expected, "each failure waits twice as long as the one before");
    assert_eq!(agrees(&svc, &eng, 0, &a), (48, 0), "the restarted stream is exact");
}

/// A `/metrics` sample without labels.
fn gauge(svc: &kvdir_service::Service, name: &str) -> Option<f64> {
    let body = http(svc.http_addr(), "GET", "/metrics", &[], b"").body;
    let line = body.lines().find(|l| l.split(' ').next() == Some(name))?;
    line.split(' ').nth(1)?.parse().ok()
}

#[test]
fn a_stream_short_of_file_descriptors_waits_and_is_not_restarted() {
    let eng = engine("no-fds", 1, 0);
    let a = prompt(1, 3);
    eng.process(0, &a).unwrap();
    faults::arm(FaultPoint::WorkerOpen, "no-fds", 0, 3, Fault::OutOfFiles);
    let svc = service(streams_of(&eng), json!({}));
    let mut saw_wait = false;
    eventually("three waits for descriptors, then a synchronized stream", || {
        let s = stream(&svc, "no-fds", 0);
        if s["phase"] == "backoff" {
            saw_wait = true;
            let fault = s["last_fault"].as_str().unwrap_or_default();
            assert!(fault.contains("Too many open files") && fault.contains("ulimit"), "{s}");
        }
        match (gauge(&svc, "kvdir_fd_waits_total"), s["phase"].as_str()) {
            (Some(3.0), Some("live")) => Ok(()),
            seen => Err(format!("{seen:?} {s}")),
        }
    });
    assert!(saw_wait, "the wait shows in the report");
    assert_eq!(stream(&svc, "no-fds", 0)["restarts"], 0, "a wait is no restart");
    assert_eq!(gauge(&svc, "kvdir_streams_waiting_for_fds"), Some(0.0));
    assert_eq!(agrees(&svc, &eng, 0, &a), (48, 0), "the stream is exact");
    // A replay whose DEALER finds no descriptor waits too, and the gap is recovered from.
    faults::arm(FaultPoint::SnapshotRequest, "no-fds", 0, 2, Fault::OutOfFiles);
    eng.faults(0, SimFault::DropNext(1)).unwrap();
    let (lost, next) = (prompt(100, 2), prompt(200, 2));
    eng.process(0, &lost).unwrap();
    eng.process(0, &next).unwrap();
    eventually("the gap recovered after two waits", || {
        let s = stream(&svc, "no-fds", 0);
        match (gauge(&svc, "kvdir_fd_waits_total"), s["recoveries"].as_u64()) {
            (Some(5.0), Some(1)) if s["phase"] == "live" => Ok(()),
            seen => Err(format!("{seen:?} {s}")),
        }
    });
    assert_eq!(stream(&svc, "no-fds", 0)["restarts"], 0);
    assert_eq!(agrees(&svc, &eng, 0, &lost), (32, 0), "the replay brought the lost batch");
    assert_eq!(agrees(&svc, &eng, 0, &next), (32, 0));
}

#[test]
fn a_panicking_stream_thread_invalidates_the_stream_and_is_restarted() {
    let eng = engine("panicky", 1, 0);
    let svc = service(streams_of(&eng), json!({}));
    let a = prompt(1, 2);
    eng.process(0, &a).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &a), (32, 0));
    // The next snapshot request (after a gap) panics inside the stream thread.
    faults::arm(FaultPoint::SnapshotRequest, "panicky", 0, 1, Fault::Panic);
    eng.faults(0, SimFault::DropNext(1)).unwrap();
    let lost = prompt(100, 2);
    let next = prompt(200, 2);
    eng.process(0, &lost).unwrap();
    eng.process(0, &next).unwrap();
    let mut saw_no_credit = false;
    eventually("the panic to be reported and the stream restarted", || {
        let m = query(&svc, &a);
        let e = entry(&m, "panicky", 0);
        let error = e.error.as_deref().unwrap_or_default();
        if !e.synchronized && error.contains("stream thread panicked") {
            saw_no_credit = true;
        }
        let s = stream(&svc, "panicky", 0);
        match (s["restarts"].as_u64(), s["phase"].as_str()) {
            (Some(1), Some("live")) if saw_no_credit => Ok(()),
            _ => Err(format!("{s}; query {e:?}")),
        }
    });
    assert_eq!(agrees(&svc, &eng, 0, &lost), (32, 0), "the snapshot brings the lost batch");
    assert_eq!(agrees(&svc, &eng, 0, &next), (32, 0));
}

#[test]
fn a_stalled_stream_thread_holds_up_neither_queries_nor_other_streams() {
    let (slow, fast) = (engine("stalled", 1, 0), engine("unaffected", 1, 0));
    let mut streams = streams_of(&slow);
    streams.extend(streams_of(&fast));
    let svc = service(streams, json!({}));
    let a = prompt(1, 2);
    slow.process(0, &a).unwrap();
    assert_eq!(agrees(&svc, &slow, 0, &a), (32, 0));
    let hold = faults::hold_stream("stalled", 0);
    let b = prompt(5000, 3);
    slow.process(0, &b).unwrap();
    fast.process(0, &b).unwrap();
    // The other stream applies its events and queries answer while "stalled" cannot write.
    assert_eq!(agrees(&svc, &fast, 0, &b), (48, 0));
    let m = entry(&query(&svc, &a), "stalled", 0).clone();
    assert!(m.synchronized && m.device_hit_tokens == 32, "the last published state: {m:?}");
    drop(hold);
    assert_eq!(agrees(&svc, &slow, 0, &b), (48, 0), "it catches up once released");
    let s = stream(&svc, "stalled", 0);
    let syncs = (&s["initial_syncs"], &s["recoveries"]);
    assert_eq!(syncs, (&json!(1), &json!(0)), "applied live, no resnapshot: {s}");
}

#[test]
fn a_live_batch_larger_than_the_buffer_budget_still_applies() {
    let eng = engine("one-big-batch", 1, 0);
    let svc = service(streams_of(&eng), json!({"max_buffered_bytes": 1}));
    agrees(&svc, &eng, 0, &[]);
    for first in [1, 5000, 9000] {
        let p = prompt(first, 4);
        eng.process(0, &p).unwrap();
        assert_eq!(agrees(&svc, &eng, 0, &p), (64, 0));
    }
    let s = stream(&svc, "one-big-batch", 0);
    let syncs = (&s["initial_syncs"], &s["recoveries"]);
    assert_eq!(syncs, (&json!(1), &json!(0)), "applied live, no resnapshot: {s}");
}

/// Threads of this process called `name` (Linux keeps 15 bytes of a name).
fn threads_called(name: &str) -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").expect("Linux /proc");
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

#[test]
fn stopping_the_service_ends_every_stream_thread() {
    let eng = engine("st", 2, 0);
    let svc = service(streams_of(&eng), json!({}));
    agrees(&svc, &eng, 0, &[]);
    agrees(&svc, &eng, 1, &[]);
    // The I/O threads that serve the streams, as the streams report names them, and libzmq's
    // threads, which take the name of the thread that made the context's first socket.
    let r = report(&svc);
    let pool = r["io_threads"].as_array().cloned().unwrap_or_default();
    let names: Vec<String> =
        pool.iter().filter_map(|t| t["name"].as_str()).map(Into::into).collect();
    let served: u64 = pool.iter().filter_map(|t| t["streams"].as_u64()).sum();
    assert_eq!(served, 2, "both DP streams are served: {r}");
    let running = || names.iter().map(|n| threads_called(n)).sum::<usize>();
    assert!(!names.is_empty() && running() >= names.len(), "the pool runs: {names:?}");
    svc.stop();
    assert_eq!(running(), 0, "stop returns after the I/O threads end");
}
