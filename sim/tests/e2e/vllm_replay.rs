//! The vLLM dialect's replay endpoint on real sockets, as vLLM 0.32's `ZmqEventPublisher`
//! answers it: the buffered batches from the asked sequence on, the same frames as live,
//! then the end marker. A kvdir index fed the history from 0 must agree with the simulator's
//! ground truth.

use std::time::Duration;

use crate::common::{blocks, index_for, index_match, start, Subscriber, DEADLINE};
use kvdir::wire::{decode_batch, Batch, EngineHash, Event};
use kvdir_sim::{Dialect, EngineConfig, Fault, SimEngine, SnapshotMode};

const B: u32 = 4;
const TOPIC: &str = "kv";
/// How long a negative check waits for a message that must not come.
const SILENCE: Duration = Duration::from_millis(300);
/// The end marker's sequence frame.
const END_SEQ: [u8; 8] = [0xFF; 8];

fn vllm(buffer_steps: usize, dp_size: u32) -> SimEngine {
    start(EngineConfig {
        block_size: B,
        topic: TOPIC.to_string(),
        dp_size,
        dialect: Dialect::Vllm,
        buffer_steps,
        ..EngineConfig::default()
    })
}

/// Publishes `n` batches on `rank`, each storing a new one-block prompt; returns their seqs.
fn publish(engine: &SimEngine, rank: u32, n: usize) -> Vec<u64> {
    let first = engine.next_sequence(rank).unwrap() as i32;
    (0..n as i32)
        .map(|i| engine.process(rank, &blocks(1000 * (first + i), 1, B)).unwrap().unwrap())
        .collect()
}

/// A DEALER connected to `rank`'s replay endpoint.
fn dealer(engine: &SimEngine, rank: u32) -> zmq::Socket {
    let dealer = zmq::Context::new().socket(zmq::DEALER).expect("DEALER socket");
    dealer.set_linger(0).expect("linger");
    dealer.connect(&engine.endpoints()[rank as usize].replay).expect("connect");
    dealer
}

/// What one replay request got back.
#[derive(Debug, Default)]
struct History {
    /// `(seq, payload)` of every batch message, in arrival order.
    batches: Vec<(u64, Vec<u8>)>,
    /// Whether the end marker arrived.
    ended: bool,
}

impl History {
    fn seqs(&self) -> Vec<u64> {
        self.batches.iter().map(|(seq, _)| *seq).collect()
    }
}

/// Sends `request` on `dealer` and collects messages until the end marker or `wait`.
fn ask(dealer: &zmq::Socket, request: Vec<Vec<u8>>, wait: Duration) -> History {
    dealer.send_multipart(request, 0).expect("request");
    let deadline = std::time::Instant::now() + wait;
    let mut history = History::default();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if dealer.poll(zmq::POLLIN, left.as_millis() as i64).expect("poll") == 0 {
            return history;
        }
        let msg = dealer.recv_multipart(0).expect("recv");
        match msg.as_slice() {
            [delim, topic, seq, payload] if delim.is_empty() && topic.is_empty() => {
                assert_eq!((seq.as_slice(), payload.len()), (&END_SEQ[..], 0), "end marker");
                history.ended = true;
                return history;
            }
            [delim, topic, seq, payload] if delim.is_empty() => {
                assert_eq!(topic, TOPIC.as_bytes(), "replayed batches carry the topic");
                let seq = u64::from_be_bytes(seq.as_slice().try_into().expect("8-byte seq"));
                history.batches.push((seq, payload.clone()));
            }
            other => panic!("not a vLLM replay message: {other:?}"),
        }
    }
}

/// A well-formed request from `start_seq`: `["", start_seq as 8 bytes big-endian]`.
fn request(start_seq: u64) -> Vec<Vec<u8>> {
    vec![Vec::new(), start_seq.to_be_bytes().to_vec()]
}

fn replay(engine: &SimEngine, rank: u32, start_seq: u64) -> History {
    ask(&dealer(engine, rank), request(start_seq), DEADLINE)
}

fn decode(payload: &[u8]) -> Batch {
    let mut batch = Batch::default();
    decode_batch(payload, &mut batch).expect("a replayed payload decodes");
    batch
}

#[test]
fn replay_from_zero_repeats_the_live_messages_and_feeds_an_exact_index() {
    let engine = vllm(100, 1);
    let sub = Subscriber::connect(&engine, 0);
    let prompt = blocks(1, 3, B);
    engine.process(0, &prompt).unwrap();
    engine.process(0, &blocks(50, 2, B)).unwrap();
    engine.evict(0, &prompt, kvdir::wire::Tier::Device).unwrap();
    let live: Vec<Vec<Vec<u8>>> = (0..3).map(|_| sub.recv(DEADLINE).expect("live")).collect();
    let history = replay(&engine, 0, 0);
    assert!(history.ended);
    assert_eq!(history.seqs(), [0, 1, 2]);
    for ((seq, payload), live) in history.batches.iter().zip(&live) {
        assert_eq!(live[1], seq.to_be_bytes(), "live and replay agree on the sequence");
        assert_eq!(&live[2], payload, "live and replay carry the same payload");
    }
    let first = decode(&history.batches[0].1);
    assert!(matches!(first.events[0], Event::Stored(_)), "a fresh vLLM does not start by clearing");
    let mut index = index_for(&engine);
    let empty = index.snapshot_builder();
    index.install_snapshot(empty, 0);
    for (seq, payload) in &history.batches {
        index.apply(*seq, &decode(payload)).expect("history applies in order");
    }
    index.publish();
    assert_eq!(index.status().device_blocks, engine.counts(0).unwrap().0);
    for tokens in [prompt, blocks(50, 2, B)] {
        assert_eq!(index_match(&index, &tokens), engine.resident(0, &tokens).unwrap());
    }
}

#[test]
fn replay_from_the_middle_sends_only_later_batches() {
    let engine = vllm(100, 1);
    publish(&engine, 0, 6);
    let history = replay(&engine, 0, 4);
    assert!(history.ended);
    assert_eq!(history.seqs(), [4, 5]);
}

#[test]
fn a_small_buffer_truncates_the_history_to_its_latest_batches() {
    let engine = vllm(3, 1);
    publish(&engine, 0, 7);
    assert_eq!(replay(&engine, 0, 0).seqs(), [4, 5, 6], "asked from 0, starts at the oldest kept");
    assert_eq!(replay(&engine, 0, 5).seqs(), [5, 6]);
}

#[test]
fn a_start_past_the_last_batch_gets_only_the_end_marker() {
    let engine = vllm(100, 1);
    publish(&engine, 0, 2);
    for start_seq in [2, 1000, u64::MAX] {
        let history = replay(&engine, 0, start_seq);
        assert!(history.ended && history.batches.is_empty(), "from {start_seq}: {history:?}");
    }
    let fresh = vllm(100, 1);
    let history = replay(&fresh, 0, 0);
    assert!(history.ended && history.batches.is_empty(), "an empty buffer: {history:?}");
}

#[test]
fn a_malformed_request_gets_no_answer_and_a_following_good_one_does() {
    let engine = vllm(100, 1);
    publish(&engine, 0, 3);
    let dealer = dealer(&engine, 0);
    let malformed = [
        vec![Vec::new(), vec![0, 0, 0, 1]],
        vec![0u64.to_be_bytes().to_vec()],
        vec![b"x".to_vec(), 0u64.to_be_bytes().to_vec()],
        vec![Vec::new(), 0u64.to_be_bytes().to_vec(), Vec::new()],
    ];
    for bad in malformed {
        let history = ask(&dealer, bad.clone(), SILENCE);
        assert!(!history.ended && history.batches.is_empty(), "{bad:?} was answered");
    }
    let history = ask(&dealer, request(1), DEADLINE);
    assert!(history.ended);
    assert_eq!(history.seqs(), [1, 2]);
}

#[test]
fn a_batch_lost_on_the_way_is_still_in_the_history() {
    let engine = vllm(100, 1);
    let sub = Subscriber::connect(&engine, 0);
    publish(&engine, 0, 1);
    engine.faults(0, Fault::DropNext(1)).unwrap();
    publish(&engine, 0, 2);
    assert_eq!(sub.recv_live().0, 0);
    assert_eq!(sub.recv_live().0, 2, "seq 1 was withheld: a gap");
    assert_eq!(replay(&engine, 0, 1).seqs(), [1, 2], "replay fills the gap");
}

#[test]
fn replay_faults_apply_to_the_history() {
    let engine = vllm(100, 1);
    publish(&engine, 0, 2);
    engine.faults(0, Fault::Snapshot(SnapshotMode::Truncate)).unwrap();
    let dealer = dealer(&engine, 0);
    let history = ask(&dealer, request(0), SILENCE);
    assert_eq!((history.seqs(), history.ended), (vec![0, 1], false));
    engine.faults(0, Fault::Snapshot(SnapshotMode::Refuse)).unwrap();
    let history = ask(&dealer, request(0), DEADLINE);
    assert!(history.ended && history.batches.is_empty());
    engine.faults(0, Fault::Snapshot(SnapshotMode::Malformed)).unwrap();
    let history = ask(&dealer, request(0), DEADLINE);
    assert_eq!(history.seqs(), [0, 1]);
    let mut batch = Batch::default();
    assert!(decode_batch(&history.batches[0].1, &mut batch).is_err());
    engine.faults(0, Fault::Snapshot(SnapshotMode::Stall)).unwrap();
    let history = ask(&dealer, request(0), SILENCE);
    assert!(!history.ended && history.batches.is_empty());
}

#[test]
fn each_rank_has_its_own_history_and_dp_rank() {
    let engine = vllm(100, 2);
    publish(&engine, 0, 3);
    publish(&engine, 1, 1);
    assert_eq!(replay(&engine, 0, 0).seqs(), [0, 1, 2]);
    let rank1 = replay(&engine, 1, 0);
    assert_eq!(rank1.seqs(), [0]);
    assert_eq!(decode(&rank1.batches[0].1).dp_rank, 1);
}

#[test]
fn a_restart_starts_again_at_zero_with_an_empty_history_on_the_same_ports() {
    let engine = vllm(100, 2);
    publish(&engine, 0, 3);
    publish(&engine, 1, 2);
    let (endpoints, started) = (engine.endpoints(), engine.process_start_time());
    engine.restart_all().unwrap();
    assert_eq!(engine.endpoints(), endpoints);
    assert!(engine.process_start_time() > started, "a new process start time");
    for rank in 0..2 {
        assert_eq!(engine.next_sequence(rank).unwrap(), 0);
        let history = replay(&engine, rank, 0);
        assert!(history.ended && history.batches.is_empty(), "rank {rank}: {history:?}");
    }
    let sub = Subscriber::connect(&engine, 0);
    publish(&engine, 0, 1);
    assert_eq!(sub.recv_live().0, 0, "the restarted rank publishes from seq 0");
    assert_eq!(replay(&engine, 0, 0).seqs(), [0]);
}

#[test]
fn the_duplicate_store_sequence_of_a_recomputed_last_block() {
    let engine = vllm(100, 1);
    let sub = Subscriber::connect(&engine, 0);
    let prompt = blocks(1, 2, B);
    let hashes = kvdir_sim::block_hashes(B, &prompt);
    engine.process(0, &prompt).unwrap();
    sub.recv_live();
    assert_eq!(engine.store_duplicate(0, &prompt).unwrap(), Some(1));
    let (_, again) = sub.recv_live();
    let Event::Stored(stored) = &again.events[0] else { panic!("{:?}", again.events) };
    assert_eq!(
        again.hashes(stored.hashes),
        [EngineHash(u128::from(hashes[1]))],
        "the last block, stored again"
    );
    assert_eq!(stored.parent, Some(EngineHash(u128::from(hashes[0]))));
    assert_eq!(engine.remove_duplicate(0, &prompt).unwrap(), Some(2));
    let (_, removed) = sub.recv_live();
    assert!(matches!(&removed.events[0], Event::Removed { .. }), "{:?}", removed.events);
    assert_eq!(engine.resident(0, &prompt).unwrap(), (2 * u64::from(B), 0), "the copy stays");
    let longer = blocks(1, 3, B);
    engine.process(0, &longer).unwrap();
    let (_, child) = sub.recv_live();
    let Event::Stored(stored) = &child.events[0] else { panic!("{:?}", child.events) };
    assert_eq!(
        stored.parent,
        Some(EngineHash(u128::from(hashes[1]))),
        "a child names the removed hash"
    );
    assert_eq!(engine.store_duplicate(0, &blocks(900, 1, B)).unwrap(), None, "not cached");
    assert_eq!(engine.remove_duplicate(0, &blocks(900, 1, B)).unwrap(), None, "not cached");
}
