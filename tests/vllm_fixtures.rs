//! Compatibility with vLLM's own publisher: every live message recorded from
//! `ZmqEventPublisher` (`tests/fixtures/vllm`, see its README) decodes into exactly the events its
//! `expected.json` lists, with LoRA and multimodal events skipped and counted. Skipped stores
//! keep their hashes as out-of-scope events; the fixtures mark their first block, so the whole
//! event is out of scope.

use std::path::PathBuf;

use kvdir::wire::{decode_live, Batch, EngineHash, Event, Tier};
use serde_json::Value;

const TOPIC: &[u8] = b"kv@vllm";

fn fixture_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm");
    assert!(dir.is_dir(), "fixtures not found at {}", dir.display());
    dir
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// An event in a comparable owned form.
#[derive(Debug, PartialEq)]
enum Owned {
    Stored {
        hashes: Vec<EngineHash>,
        parent: Option<EngineHash>,
        tokens: Vec<i32>,
        block_size: u32,
        tier: Tier,
    },
    OutOfScope {
        hashes: Vec<EngineHash>,
        tier: Tier,
    },
    Removed {
        hashes: Vec<EngineHash>,
        tier: Tier,
    },
    Cleared {
        tier: Option<Tier>,
    },
}

fn owned(batch: &Batch) -> Vec<Owned> {
    batch
        .events
        .iter()
        .map(|e| match e {
            Event::Stored(s) => Owned::Stored {
                hashes: batch.hashes(s.hashes).to_vec(),
                parent: s.parent,
                tokens: batch.tokens(s.tokens).to_vec(),
                block_size: s.block_size,
                tier: s.tier,
            },
            Event::OutOfScope { hashes, tier } => {
                Owned::OutOfScope { hashes: batch.hashes(*hashes).to_vec(), tier: *tier }
            }
            Event::Removed { hashes, tier } => {
                Owned::Removed { hashes: batch.hashes(*hashes).to_vec(), tier: *tier }
            }
            Event::Cleared { tier } => Owned::Cleared { tier: *tier },
        })
        .collect()
}

fn hash(v: &Value) -> EngineHash {
    if let Some(n) = v.get("int") {
        EngineHash(u128::from(n.as_u64().expect("int hash fits u64")))
    } else {
        EngineHash::from_bin(&unhex(v["hex"].as_str().unwrap()))
    }
}

fn tier(medium: &Value) -> Tier {
    Tier::from_medium(medium.as_str().map(str::as_bytes)).expect("fixture media are in scope")
}

/// The expected events of one batch, and how many were LoRA/multimodal.
fn expected(batch: &Value) -> (Vec<Owned>, u64) {
    let mut out = Vec::new();
    let mut skipped = 0;
    for e in batch["events"].as_array().unwrap() {
        let hashes = || e["block_hashes"].as_array().unwrap().iter().map(hash).collect();
        match e["type"].as_str().unwrap() {
            "BlockStored" => {
                if !e["lora_name"].is_null() || e["has_extra_keys"] == Value::Bool(true) {
                    skipped += 1;
                    out.push(Owned::OutOfScope { hashes: hashes(), tier: tier(&e["medium"]) });
                    continue;
                }
                let parent =
                    (!e["parent_block_hash"].is_null()).then(|| hash(&e["parent_block_hash"]));
                let tokens = e["token_ids"].as_array().unwrap();
                out.push(Owned::Stored {
                    hashes: hashes(),
                    parent,
                    tokens: tokens.iter().map(|t| t.as_i64().unwrap() as i32).collect(),
                    block_size: e["block_size"].as_u64().unwrap() as u32,
                    tier: tier(&e["medium"]),
                });
            }
            "BlockRemoved" => {
                out.push(Owned::Removed { hashes: hashes(), tier: tier(&e["medium"]) })
            }
            "AllBlocksCleared" => out.push(Owned::Cleared { tier: None }),
            other => panic!("unexpected event type {other} in fixture"),
        }
    }
    (out, skipped)
}

fn check_fixture(name: &str) -> usize {
    let dir = fixture_dir();
    let frames = std::fs::read_to_string(dir.join(format!("{name}.frames.jsonl"))).unwrap();
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{name}.expected.json"))).unwrap(),
    )
    .unwrap();
    let want = want.as_array().unwrap();
    let lines: Vec<&str> = frames.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), want.len(), "{name}: one expected batch per recorded message");
    let mut batch = Batch::default();
    for (i, (line, exp)) in lines.iter().zip(want).enumerate() {
        let msg: Value = serde_json::from_str(line).unwrap();
        let parts: Vec<Vec<u8>> = ["topic_hex", "seq_hex", "payload_hex"]
            .iter()
            .map(|k| unhex(msg[*k].as_str().unwrap()))
            .collect();
        let seq = decode_live(&parts, TOPIC, 8 << 20, &mut batch)
            .unwrap_or_else(|e| panic!("{name} message {i}: {e}"));
        assert_eq!(seq, exp["seq"].as_u64().unwrap(), "{name} message {i}: sequence");
        assert_eq!(
            u64::from(batch.dp_rank),
            exp["dp_rank"].as_u64().unwrap(),
            "{name} message {i}: dp_rank"
        );
        let (events, skipped) = expected(exp);
        assert_eq!(owned(&batch), events, "{name} message {i}: events");
        assert_eq!(batch.skipped.lora_or_multimodal, skipped, "{name} message {i}: skipped");
        assert_eq!(batch.skipped.unknown_type + batch.skipped.out_of_scope_medium, 0);
    }
    lines.len()
}

#[test]
fn vllm_integer_hashes_decode_exactly() {
    assert_eq!(check_fixture("vllm-int-hashes-dp0"), 12);
}

#[test]
fn vllm_bin_hashes_decode_exactly() {
    assert_eq!(check_fixture("vllm-bytes-hashes-dp1"), 12);
}
