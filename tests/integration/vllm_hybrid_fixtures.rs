//! A real vLLM 0.32.0 serving hybrid-attention models (`tests/fixtures/vllm-hybrid`, recorded
//! by `scripts/vllm-record-hybrid.sh`, see its README): every live message is decoded and
//! applied in order to a stream of the index the service runs, and before each recorded
//! request the stream's credit for its prompt is compared with the `cached_tokens` vLLM
//! reported for it.
//!
//! - A tiny Gemma3 (a sliding-window group of window 64 and a full-attention group) at vLLM's
//!   default retention, at 32 (dense) and at 128: kvdir's credit equals vLLM's on every
//!   request.
//! - A model of windows alone at the default retention: its window stores cannot be located,
//!   so the credit is never more than vLLM's (and is what the dense stores locate).

use std::path::PathBuf;

use kvdir::index::{IndexConfig, SharedIndex};
use kvdir::wire::{decode_live, Batch};
use serde_json::Value;

const TOPIC: &[u8] = b"kv";
const MAX_MESSAGE: usize = 8 << 20;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm-hybrid").join(name)
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn jsonl(name: &str, file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir(name).join(file)).expect("fixture present");
    text.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect()
}

/// The decoded live batches, seq 0 first.
fn batches(name: &str) -> Vec<Batch> {
    jsonl(name, "live.jsonl")
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let frames =
                ["topic_hex", "seq_hex", "payload_hex"].map(|k| unhex(m[k].as_str().unwrap()));
            let seq = u64::from_be_bytes(frames[1].clone().try_into().unwrap());
            assert_eq!(seq, i as u64, "{name}: consecutive seqs from 0");
            let mut b = Batch::default();
            decode_live(&frames, TOPIC, MAX_MESSAGE, &mut b).expect("a real vLLM message decodes");
            b
        })
        .collect()
}

/// Per request: (vLLM's cached tokens, kvdir's credit), kvdir's read when the request was
/// sent (after the batch `seq_before`).
fn replay(name: &str) -> Vec<(u64, u64)> {
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir(name).join("meta.json")).unwrap())
            .unwrap();
    let block_size = meta["block_size"].as_u64().unwrap() as u32;
    let config = IndexConfig { block_size, hash_seed: 1024, salt: 0, max_blocks: 4096 };
    let shared = SharedIndex::new(block_size, 1024, 1);
    let mut stream = shared.add_stream(config).unwrap();
    let mut view = shared.reader().handle();
    stream.load_snapshot(&Batch::default(), 0).unwrap();
    let live = batches(name);
    let mut applied = 0usize;
    let mut out = Vec::new();
    for r in jsonl(name, "requests.jsonl") {
        let before = r["seq_before"].as_i64().unwrap();
        while (applied as i64) <= before {
            stream.apply(applied as u64, &live[applied]).unwrap_or_else(|e| {
                panic!("{name}: batch {applied} is refused: {e}");
            });
            applied += 1;
        }
        stream.publish();
        let tokens: Vec<i32> = r["prompt_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap() as i32)
            .collect();
        let (device, host) = view.query(&tokens).tokens(stream.slot());
        out.push((r["cached_tokens"].as_u64().unwrap(), device + host));
    }
    let status = view.status(stream.slot()).unwrap();
    assert!(status.synchronized, "{name}: {:?}", status.error);
    assert!(!status.attention.is_empty(), "{name}: a hybrid stream");
    out
}

fn summary(rows: &[(u64, u64)]) -> String {
    let exact = rows.iter().filter(|(v, k)| v == k).count();
    let over = rows.iter().filter(|(v, k)| k > v).count();
    format!("{exact} of {} exact, {over} over", rows.len())
}

#[test]
fn gemma3_credit_equals_vllms_cached_tokens_at_every_retention() {
    for name in ["gemma3-r0", "gemma3-r32", "gemma3-r128"] {
        let rows = replay(name);
        let reused = rows.iter().filter(|(v, _)| *v > 0).count();
        assert!(reused * 4 >= rows.len(), "{name}: the recording reuses its cache ({reused})");
        let wrong: Vec<_> = rows.iter().enumerate().filter(|(_, (v, k))| v != k).collect();
        eprintln!("{name}: {}, {reused} reused", summary(&rows));
        assert!(
            wrong.is_empty(),
            "{name}: {}; (request, (vllm, kvdir)): {wrong:?}",
            summary(&rows)
        );
    }
}

#[test]
fn a_model_of_windows_alone_is_never_over_credited() {
    let rows = replay("sliding-r0");
    let over: Vec<_> = rows.iter().enumerate().filter(|(_, (v, k))| k > v).collect();
    eprintln!("sliding-r0: {}", summary(&rows));
    assert!(over.is_empty(), "sliding-r0: {}; {over:?}", summary(&rows));
}
