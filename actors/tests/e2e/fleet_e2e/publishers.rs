//! Light xLLM-style publishers for many streams in one test process: a few threads, each owning
//! the PUB and ROUTER sockets of many ranks (one ZeroMQ context per thread, under libzmq's
//! 1,023 sockets per context). Each rank publishes live batches of one stored block and answers
//! snapshot requests with everything it published, so a stream that synchronizes at any moment
//! is exact.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, StoredRecord, WireHash};
use kvdir::wire::{encode_batch, encode_live, encode_snapshot_end, encode_snapshot_reply, Tier};
use serde_json::{json, Value};

/// Tokens per block.
pub const BLOCK: u32 = 16;
/// The topic every rank publishes on.
const TOPIC: &str = "fleet";

/// The tokens of batch `batch` of stream `stream` (one block, distinct across the fleet).
pub fn block_tokens(stream: usize, batch: u64) -> Vec<i32> {
    let first = ((stream as i64 * 1000 + batch as i64) * i64::from(BLOCK)) as i32;
    (first..first + BLOCK as i32).collect()
}

struct Rank {
    stream: usize,
    publisher: zmq::Socket,
    router: zmq::Socket,
    next_seq: u64,
}

impl Rank {
    fn stored(&self, batch: u64) -> EventRecord {
        let hash = WireHash::Uint(((self.stream as u64) << 24) | (batch + 1));
        EventRecord::Stored(StoredRecord::new(
            vec![hash],
            None,
            block_tokens(self.stream, batch),
            BLOCK,
            Tier::Device,
        ))
    }

    fn encode(events: Vec<EventRecord>) -> Vec<u8> {
        let batch = BatchRecord { timestamp: 0.0, events, dp_rank: Some(0) };
        encode_batch(&batch, BatchForm::Array, EventForm::Map)
    }

    fn publish(&mut self) {
        let payload = Self::encode(vec![self.stored(self.next_seq)]);
        let frames = encode_live(TOPIC.as_bytes(), self.next_seq, payload);
        self.publisher.send_multipart(frames, 0).expect("a PUB send does not fail");
        self.next_seq += 1;
    }

    /// Answers every pending snapshot request with all blocks published so far.
    fn serve(&self) -> u64 {
        let mut served = 0;
        while let Ok(request) = self.router.recv_multipart(zmq::DONTWAIT) {
            let identity = request[0].clone();
            let events = (0..self.next_seq).map(|b| self.stored(b)).collect();
            let reply = encode_snapshot_reply(self.next_seq, Self::encode(events));
            for frames in [reply, encode_snapshot_end()] {
                let message = std::iter::once(identity.clone()).chain(frames);
                let _ = self.router.send_multipart(message, 0);
            }
            served += 1;
        }
        served
    }
}

/// What a publisher thread is asked to do.
enum Command {
    /// Publish this many more batches on each of its ranks, then answer.
    Publish(u64, mpsc::Sender<()>),
    /// Lose the next batch of each rank (it is in their snapshots, never sent live).
    Lose(mpsc::Sender<()>),
}

/// The publishers of `streams` ranks.
pub struct Fleet {
    streams: Vec<Value>,
    commands: Vec<mpsc::Sender<Command>>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// Snapshot requests answered.
    pub snapshots: Arc<AtomicU64>,
}

impl Fleet {
    /// `streams` ranks on 127.0.0.1 (ephemeral ports), served by `threads` threads.
    pub fn start(streams: usize, threads: usize) -> Fleet {
        let (stop, snapshots) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let mut fleet = Fleet {
            streams: Vec::new(),
            commands: Vec::new(),
            threads: Vec::new(),
            stop,
            snapshots,
        };
        let per_thread = streams.div_ceil(threads);
        for t in 0..threads {
            let ctx = zmq::Context::new();
            let ranks: Vec<Rank> = (t * per_thread..((t + 1) * per_thread).min(streams))
                .map(|stream| fleet.rank(&ctx, stream))
                .collect();
            let (tx, rx) = mpsc::channel();
            let (stop, snapshots) = (Arc::clone(&fleet.stop), Arc::clone(&fleet.snapshots));
            fleet.threads.push(std::thread::spawn(move || run(ranks, rx, &stop, &snapshots)));
            fleet.commands.push(tx);
        }
        fleet
    }

    fn rank(&mut self, ctx: &zmq::Context, stream: usize) -> Rank {
        let bind = |kind| {
            let s = ctx.socket(kind).expect("a socket (file descriptors)");
            s.set_linger(0).unwrap();
            s.bind("tcp://127.0.0.1:0").expect("an ephemeral port");
            let ep = s.get_last_endpoint().unwrap().expect("a UTF-8 endpoint");
            (s, ep)
        };
        let (publisher, event) = bind(zmq::PUB);
        publisher.set_sndhwm(0).unwrap();
        let (router, replay) = bind(zmq::ROUTER);
        self.streams.push(json!({"instance_name": format!("fleet-{stream}"), "dp_rank": 0,
            "block_size": BLOCK, "endpoint": event, "replay_endpoint": replay, "topic": TOPIC}));
        Rank { stream, publisher, router, next_seq: 0 }
    }

    /// The `streams` entries of kvdir's config.
    pub fn streams(&self) -> Vec<Value> {
        self.streams.clone()
    }

    /// Publishes `batches` more batches on every rank; returns once all are sent.
    pub fn publish(&self, batches: u64) {
        self.each_thread(|done| Command::Publish(batches, done));
    }

    /// Every rank loses its next batch: the one after it is a gap for every stream at once.
    pub fn lose_one(&self) {
        self.each_thread(Command::Lose);
    }

    fn each_thread(&self, command: impl Fn(mpsc::Sender<()>) -> Command) {
        let (tx, rx) = mpsc::channel();
        for c in &self.commands {
            c.send(command(tx.clone())).expect("the publisher thread runs");
        }
        for _ in &self.commands {
            rx.recv().expect("the publisher thread answers");
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn run(
    mut ranks: Vec<Rank>,
    commands: mpsc::Receiver<Command>,
    stop: &AtomicBool,
    snapshots: &AtomicU64,
) {
    while !stop.load(Ordering::Relaxed) {
        match commands.try_recv() {
            Ok(Command::Publish(n, done)) => {
                for r in &mut ranks {
                    for _ in 0..n {
                        r.publish();
                    }
                }
                let _ = done.send(());
            }
            Ok(Command::Lose(done)) => {
                ranks.iter_mut().for_each(|r| r.next_seq += 1);
                let _ = done.send(());
            }
            Err(_) => {}
        }
        let mut items: Vec<_> = ranks.iter().map(|r| r.router.as_poll_item(zmq::POLLIN)).collect();
        if zmq::poll(&mut items, 20).is_err() {
            continue;
        }
        let ready: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
        drop(items);
        for (r, _) in ranks.iter().zip(ready).filter(|(_, ready)| *ready) {
            snapshots.fetch_add(r.serve(), Ordering::Relaxed);
        }
    }
}
