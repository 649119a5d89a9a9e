//! A real vLLM 0.32.0 serving a hybrid-attention model (`tests/fixtures/vllm-hybrid/gemma3-r0`:
//! a tiny Gemma3 with a sliding-window group and a full-attention group, at vLLM's default
//! retention) served over real ZeroMQ sockets on loopback as its history: kvdir, started after
//! the engine published, synchronizes, reports the stream's attention kinds, and answers every
//! recorded prompt over HTTP as an index fed the same batches in process does.

use std::path::PathBuf;

use kvdir::index::{IndexConfig, SharedIndex};
use kvdir::wire::{decode_live, Batch};
use kvdir_testkit::eventually;
use serde_json::{json, Value};

use super::recorded::{unhex, Recorded};
use crate::common::*;

const BLOCK: u32 = 32;

fn fixture(file: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/vllm-hybrid/gemma3-r0")
        .join(file);
    let text = std::fs::read_to_string(path).expect("fixture present");
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn live() -> Vec<Vec<Vec<u8>>> {
    let frames = |m: &Value| {
        ["topic_hex", "seq_hex", "payload_hex"]
            .iter()
            .map(|k| unhex(m[k].as_str().unwrap()))
            .collect()
    };
    fixture("live.jsonl").iter().map(frames).collect()
}

fn prompts() -> Vec<Vec<i32>> {
    let ids = |r: &Value| -> Vec<i32> {
        r["prompt_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap() as i32)
            .collect()
    };
    fixture("requests.jsonl").iter().map(ids).collect()
}

#[test]
fn a_real_hybrid_vllm_history_is_credited_as_the_index_in_process_credits_it() {
    let live = live();
    let engine = Recorded::serve(live.clone(), 0);
    let stream = json!({"instance_name": "gemma", "block_size": BLOCK, "endpoint": engine.event,
                        "replay_endpoint": engine.replay, "topic": "kv", "replay": "history"});
    let svc = service(vec![stream], json!({}));
    let last = live.len() as u64 - 1;
    let report = eventually("the recorded history to be replayed", || {
        let s = report(&svc)["streams"][0].clone();
        let m = query(&svc, &[]);
        match (s["phase"] == "live", entry(&m, "gemma", 0).sequence) {
            (true, Some(seq)) if seq == last => Ok(s),
            _ => Err(format!("{s}")),
        }
    });
    assert_eq!(report["attention"], json!(["full_attention x1", "sliding_window(64) x1"]));
    assert_eq!(report["index_backoffs"], 0, "no batch was refused: {report}");
    let config = IndexConfig { block_size: BLOCK, hash_seed: 1024, salt: 0, max_blocks: 4096 };
    let index = SharedIndex::new(BLOCK, 1024, 1);
    let mut writer = index.add_stream(config).unwrap();
    writer.load_snapshot(&Batch::default(), 0).unwrap();
    for (seq, frames) in live.iter().enumerate() {
        let mut b = Batch::default();
        decode_live(frames, b"kv", 8 << 20, &mut b).unwrap();
        writer.apply(seq as u64, &b).unwrap();
    }
    writer.publish();
    let mut handle = index.reader().handle();
    let (mut credited, mut differs_from_full_attention) = (0, 0);
    for tokens in prompts() {
        let want = handle.query(&tokens).tokens(0);
        let got = hits(&svc, "gemma", 0, &tokens).unwrap();
        assert_eq!(got, want, "a prompt of {} tokens", tokens.len());
        credited += u64::from(got.0 > 0);
        differs_from_full_attention += u64::from(got.0 < (tokens.len() as u64 - 1) / 32 * 32);
    }
    assert!(credited > 0, "some recorded prompt is cached");
    assert!(differs_from_full_attention > 0, "the window's rule matters");
}
