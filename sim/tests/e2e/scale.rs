//! The simulator at scale: many ranks share a few rank threads and every one of them still
//! answers its replay port, and connect mode (a rank's PUB connects to the subscriber's port
//! for the rank, as vLLM's publisher does with a non-wildcard endpoint).

use std::time::{Duration, Instant};

use crate::common::{blocks, request_snapshot, DEADLINE, MAX_BYTES};
use kvdir::wire::{decode_live, decode_snapshot_frame, Batch, SnapshotFrame};
use kvdir_sim::{EngineConfig, SimEngine};

const B: u32 = 4;

/// The process's thread count, from `/proc/self/status`.
fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("Threads:")).expect("a Threads line");
    line["Threads:".len()..].trim().parse().expect("a number")
}

/// Runs `test`, an ignored test of this module, alone in a child process of this test binary and
/// fails with its output unless it passed: for a test that counts the process's threads, which
/// the other tests of the binary, running beside it, would change.
fn in_own_process(test: &str) {
    let module = module_path!().split_once("::").map_or(module_path!(), |(_, m)| m);
    let name = format!("{module}::{test}");
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", &name, "--ignored", "--test-threads=1"])
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} in a process of its own:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn five_hundred_ranks_share_a_few_threads_and_every_rank_answers_its_replay_port() {
    in_own_process("ranks_in_a_process_of_their_own");
}

#[test]
#[ignore = "run in a process of its own by five_hundred_ranks_share_a_few_threads_..."]
fn ranks_in_a_process_of_their_own() {
    let before = threads();
    let engines: Vec<SimEngine> = (0..128)
        .map(|k| {
            let config = EngineConfig {
                name: format!("e{k}"),
                dp_size: 4,
                block_size: B,
                ..EngineConfig::default()
            };
            SimEngine::start(config).expect("the engine starts")
        })
        .collect();
    let grown = threads() - before;
    assert!(grown <= 16, "512 ranks added {grown} threads; they should share a few");
    for (k, engine) in engines.iter().enumerate() {
        for rank in 0..4 {
            engine.process(rank, &blocks(k as i32 * 100, 1 + rank as usize, B)).unwrap();
        }
    }
    // Every rank gets a request at once; each must answer with its own state.
    let ctx = zmq::Context::new();
    let mut dealers = Vec::new();
    for engine in &engines {
        for ep in engine.endpoints() {
            let dealer = ctx.socket(zmq::DEALER).expect("DEALER");
            dealer.set_linger(0).unwrap();
            dealer.connect(&ep.replay).unwrap();
            dealer.send_multipart([Vec::new(), 0u64.to_be_bytes().to_vec()], 0).unwrap();
            dealers.push(dealer);
        }
    }
    for (i, dealer) in dealers.iter().enumerate() {
        let (watermark, batch) = snapshot(dealer);
        assert_eq!(watermark, 1, "stream {i}: one batch published before the request");
        assert_eq!(batch.dp_rank, i as u32 % 4, "stream {i} answers for its own rank");
        assert!(!batch.events.is_empty(), "stream {i}: its blocks are in the snapshot");
    }
    drop(engines);
    assert!(threads() - before <= 16, "stopped engines leave no threads behind");
}

/// The snapshot reply and terminator on `dealer`, within the deadline.
fn snapshot(dealer: &zmq::Socket) -> (u64, Batch) {
    let mut result = None;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).as_millis() as i64;
        assert!(dealer.poll(zmq::POLLIN, left).unwrap() > 0, "no snapshot within {DEADLINE:?}");
        let msg = dealer.recv_multipart(0).unwrap();
        let mut batch = Batch::default();
        match decode_snapshot_frame(&msg, MAX_BYTES, &mut batch) {
            Ok(SnapshotFrame::Reply { watermark }) => result = Some((watermark, batch)),
            Ok(SnapshotFrame::End) => return result.expect("a reply before the end"),
            other => panic!("not a snapshot frame: {other:?}"),
        }
    }
}

/// Two SUB sockets bound on consecutive loopback ports `P`, `P + 1`, subscribed to `topic`.
fn bound_subs(topic: &[u8]) -> (u16, Vec<zmq::Socket>) {
    let ctx = zmq::Context::new();
    for _ in 0..50 {
        let first = ctx.socket(zmq::SUB).unwrap();
        first.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = first.get_last_endpoint().unwrap().unwrap();
        let port: u16 = endpoint.rsplit_once(':').unwrap().1.parse().unwrap();
        let second = ctx.socket(zmq::SUB).unwrap();
        if port < u16::MAX && second.bind(&format!("tcp://127.0.0.1:{}", port + 1)).is_ok() {
            for sub in [&first, &second] {
                sub.set_subscribe(topic).unwrap();
            }
            return (port, vec![first, second]);
        }
    }
    panic!("no two consecutive free ports found");
}

/// Probes `rank` (`send_raw`, no sequence consumed) until `sub` receives a probe.
fn wait_subscribed(engine: &SimEngine, rank: u32, sub: &zmq::Socket) {
    let topic = engine.config().topic.as_bytes().to_vec();
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        engine.send_raw(rank, vec![topic.clone(), b"probe".to_vec()]).unwrap();
        if sub.poll(zmq::POLLIN, 20).unwrap() > 0 {
            while sub.poll(zmq::POLLIN, 0).unwrap() > 0 {
                assert_eq!(sub.recv_multipart(0).unwrap()[1], b"probe", "only probes so far");
            }
            return;
        }
    }
    panic!("rank {rank}'s PUB did not reach its SUB within {DEADLINE:?}");
}

/// The next live message on `sub` (probes skipped): topic frame, sequence and batch.
fn recv_live(sub: &zmq::Socket, topic: &[u8]) -> (Vec<u8>, u64, Batch) {
    loop {
        assert!(sub.poll(zmq::POLLIN, DEADLINE.as_millis() as i64).unwrap() > 0, "no message");
        let frames = sub.recv_multipart(0).unwrap();
        if frames.get(1).is_some_and(|f| f == b"probe") {
            continue;
        }
        let mut batch = Batch::default();
        let seq = decode_live(&frames, topic, MAX_BYTES, &mut batch).expect("a live message");
        return (frames[0].clone(), seq, batch);
    }
}

#[test]
fn in_connect_mode_rank_r_publishes_to_port_p_plus_r_with_the_engine_topic() {
    let topic = "kv@127.0.0.1:8000@m".to_string();
    let (port, subs) = bound_subs(topic.as_bytes());
    let config = EngineConfig {
        events_connect: Some(format!("tcp://127.0.0.1:{port}")),
        dp_size: 2,
        block_size: B,
        topic: topic.clone(),
        ..EngineConfig::default()
    };
    let engine = SimEngine::start(config).expect("the engine starts");
    let endpoints = engine.endpoints();
    assert_eq!(endpoints[1].event, format!("tcp://127.0.0.1:{}", port + 1));
    for rank in 0..2 {
        wait_subscribed(&engine, rank, &subs[rank as usize]);
        engine.process(rank, &blocks(1, 2, B)).unwrap();
        let (frame, seq, batch) = recv_live(&subs[rank as usize], topic.as_bytes());
        assert_eq!((frame, seq, batch.dp_rank), (topic.clone().into_bytes(), 0, rank));
    }
    // A restart connects again, and the replay port still answers.
    engine.restart(1).unwrap();
    wait_subscribed(&engine, 1, &subs[1]);
    engine.process(1, &blocks(9, 1, B)).unwrap();
    assert_eq!(recv_live(&subs[1], topic.as_bytes()).1, 0, "a restarted rank starts at 0");
    let reply = request_snapshot(&engine, 1, 0, DEADLINE);
    assert_eq!(reply.decode().0, 1);
    let quiet = subs[0].poll(zmq::POLLIN, Duration::from_millis(50).as_millis() as i64);
    assert_eq!(quiet.unwrap(), 0, "rank 1's batches never reach rank 0's port");
}
