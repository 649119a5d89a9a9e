//! Helpers for the socket tests: a synchronized SUB, a one-shot DEALER snapshot request, and a
//! kvdir index fed from what the sockets deliver, to compare with the simulator's ground truth.
//!
//! The SUB synchronization pattern: a PUB drops messages for subscribers whose subscription has
//! not reached it yet, and nothing tells the subscriber when that has happened. So
//! [`Subscriber::connect`] sends *probe* messages with `send_raw` (which consume no sequence
//! number and change no state) until one arrives, polling the SUB with a short timeout under an
//! overall deadline. From then on every live batch reaches the SUB, in order; [`Subscriber::recv`]
//! skips any probes still in flight. After `restart` the SUB reconnects on its own, and
//! [`Subscriber::resync`] repeats the probing. No test sleeps for synchronization.

use std::time::{Duration, Instant};

use kvdir::index::{IndexConfig, KeyHasher, SharedIndex, SharedReader, StreamWriter};
use kvdir::wire::{decode_live, decode_snapshot_frame, Batch, SnapshotFrame};
use kvdir_sim::{EngineConfig, SimEngine};

/// Upper bound for anything that should happen promptly.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// Second frame of a probe message.
const PROBE: &[u8] = b"kvdir-sim-test-probe";
/// Generous payload limit for decoding.
pub const MAX_BYTES: usize = 64 << 20;

/// A started engine on ephemeral ports with `config`'s other settings.
pub fn start(config: EngineConfig) -> SimEngine {
    SimEngine::start(config).expect("the engine starts")
}

/// `n` blocks of `block_size` distinct tokens starting at `first`.
pub fn blocks(first: i32, n: usize, block_size: u32) -> Vec<i32> {
    (first..).take(n * block_size as usize).collect()
}

/// A SUB socket that is known to receive the rank's live messages.
pub struct Subscriber {
    socket: zmq::Socket,
    topic: Vec<u8>,
    rank: u32,
}

impl Subscriber {
    /// Connects to `rank` of `engine`, subscribes to its topic and probes until subscribed.
    pub fn connect(engine: &SimEngine, rank: u32) -> Subscriber {
        let socket = zmq::Context::new().socket(zmq::SUB).expect("SUB socket");
        socket.set_linger(0).expect("linger");
        let topic = engine.config().topic.as_bytes().to_vec();
        socket.set_subscribe(&topic).expect("subscribe");
        socket.connect(&engine.endpoints()[rank as usize].event).expect("connect");
        let sub = Subscriber { socket, topic, rank };
        sub.resync(engine);
        sub
    }

    /// Probes until a probe arrives (see the module docs).
    pub fn resync(&self, engine: &SimEngine) {
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            let probe = vec![self.topic.clone(), PROBE.to_vec()];
            engine.send_raw(self.rank, probe).expect("probe sent");
            if self.poll(Duration::from_millis(20)) {
                let msg = self.socket.recv_multipart(0).expect("recv");
                assert!(is_probe(&msg), "a live message arrived before any probe: {msg:?}");
                return;
            }
        }
        panic!("the SUB did not receive a probe within {DEADLINE:?}");
    }

    fn poll(&self, timeout: Duration) -> bool {
        self.socket.poll(zmq::POLLIN, timeout.as_millis() as i64).expect("poll") > 0
    }

    /// The next non-probe message, or `None` after `timeout`.
    pub fn recv(&self, timeout: Duration) -> Option<Vec<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.poll(left) {
                return None;
            }
            let msg = self.socket.recv_multipart(0).expect("recv");
            if !is_probe(&msg) {
                return Some(msg);
            }
        }
    }

    /// The next live message, decoded: its sequence number and batch.
    pub fn recv_live(&self) -> (u64, Batch) {
        let frames = self.recv(DEADLINE).expect("a live message within the deadline");
        let mut batch = Batch::default();
        let seq = decode_live(&frames, &self.topic, MAX_BYTES, &mut batch).expect("decodes");
        (seq, batch)
    }

    /// Asserts that no non-probe message arrives within `wait` (only for negative checks).
    pub fn assert_nothing_within(&self, wait: Duration) {
        assert_eq!(self.recv(wait), None, "unexpected message");
    }
}

fn is_probe(msg: &[Vec<u8>]) -> bool {
    msg.len() == 2 && msg[1] == PROBE
}

/// What one snapshot request got back.
#[derive(Debug, Default)]
pub struct SnapshotReply {
    /// Every reply message except the terminator, as the DEALER sees it.
    pub replies: Vec<Vec<Vec<u8>>>,
    /// Whether the terminator arrived.
    pub ended: bool,
}

impl SnapshotReply {
    /// The single reply decoded: watermark and full-state batch.
    pub fn decode(&self) -> (u64, Batch) {
        assert!(self.ended, "the snapshot was not terminated");
        assert_eq!(self.replies.len(), 1, "one reply message expected");
        let mut batch = Batch::default();
        match decode_snapshot_frame(&self.replies[0], MAX_BYTES, &mut batch) {
            Ok(SnapshotFrame::Reply { watermark }) => (watermark, batch),
            other => panic!("not a snapshot reply: {other:?}"),
        }
    }
}

/// Asks `rank` of `engine` for a snapshot through a fresh DEALER (which queues the request
/// until connected), and collects messages until the terminator or `wait` elapses.
pub fn request_snapshot(
    engine: &SimEngine,
    rank: u32,
    start_seq: u64,
    wait: Duration,
) -> SnapshotReply {
    let dealer = zmq::Context::new().socket(zmq::DEALER).expect("DEALER socket");
    dealer.set_linger(0).expect("linger");
    dealer.connect(&engine.endpoints()[rank as usize].replay).expect("connect");
    dealer.send_multipart([Vec::new(), start_seq.to_be_bytes().to_vec()], 0).expect("request");
    let deadline = Instant::now() + wait;
    let mut reply = SnapshotReply::default();
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).as_millis() as i64;
        if dealer.poll(zmq::POLLIN, left).expect("poll") == 0 {
            return reply;
        }
        let msg = dealer.recv_multipart(0).expect("recv");
        let mut batch = Batch::default();
        if let Ok(SnapshotFrame::End) = decode_snapshot_frame(&msg, MAX_BYTES, &mut batch) {
            reply.ended = true;
            return reply;
        }
        reply.replies.push(msg);
    }
}

/// One stream alone in a kvdir shared index (the index the service runs), with a reader of
/// it; it derefs to the stream's writer.
pub struct OneStream {
    writer: StreamWriter,
    reader: SharedReader,
    config: IndexConfig,
}

impl std::ops::Deref for OneStream {
    type Target = StreamWriter;
    fn deref(&self) -> &StreamWriter {
        &self.writer
    }
}

impl std::ops::DerefMut for OneStream {
    fn deref_mut(&mut self) -> &mut StreamWriter {
        &mut self.writer
    }
}

/// A kvdir stream for `engine`'s block size with the default seed.
pub fn index_for(engine: &SimEngine) -> OneStream {
    let config = IndexConfig { block_size: engine.config().block_size, ..IndexConfig::default() };
    let shared = SharedIndex::new(config.block_size, config.hash_seed, 1);
    let writer = shared.add_stream(config).expect("one free slot");
    OneStream { writer, reader: shared.reader(), config }
}

/// What the index answers for `tokens` (as published): `(device_hit_tokens,
/// host_only_hit_tokens)`.
pub fn index_match(index: &OneStream, tokens: &[i32]) -> (u64, u64) {
    let mut keys = Vec::new();
    KeyHasher::new(index.config.block_size, index.config.hash_seed).prefix_keys(tokens, &mut keys);
    index.reader.handle().match_keys(&keys).tokens(index.writer.slot())
}

/// Asserts that every block of `batch`'s stores names a parent stored earlier in the batch (or
/// none), and that tokenless stores name blocks stored earlier: the parent-first rule.
pub fn assert_parent_first(batch: &Batch) {
    let mut seen = std::collections::HashSet::new();
    for event in &batch.events {
        if let kvdir::wire::Event::Stored(s) = event {
            let hashes = batch.hashes(s.hashes);
            if batch.tokens(s.tokens).is_empty() {
                assert!(hashes.iter().all(|h| seen.contains(h)), "tokenless store of unseen block");
            } else if let Some(p) = s.parent {
                assert!(seen.contains(&p), "parent {p} not stored before its child");
            }
            seen.extend(hashes.iter().copied());
        }
    }
}
