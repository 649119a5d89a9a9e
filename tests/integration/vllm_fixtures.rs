//! Compatibility with vLLM's own publisher: every live message recorded from
//! `ZmqEventPublisher` (`tests/fixtures/vllm`, see its README) decodes into exactly the events its
//! `expected.json` lists. LoRA events are indexed in their adapter's namespace (protocol.md
//! section 1.1), and a store whose first block carries a `cache_salt` in the salt's;
//! multimodal events are skipped and counted. Skipped stores keep their hashes as
//! out-of-scope events; the fixtures mark their first block, so the whole event is out of scope.

use std::path::PathBuf;

use kvdir::index::{IndexConfig, Namespace, SharedHandle, SharedIndex};
use kvdir::wire::{decode_live, Batch, EngineHash, Event, Stored, Tier};
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
        lora: u64,
        salt: u64,
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
                lora: s.lora,
                salt: s.salt,
            },
            Event::OutOfScope { hashes, tier } => {
                Owned::OutOfScope { hashes: batch.hashes(*hashes).to_vec(), tier: *tier }
            }
            Event::Removed { hashes, tier, .. } => {
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

/// The expected events of one batch, how many were multimodal (skipped) and how many LoRA
/// (indexed in their adapter's namespace).
fn expected(batch: &Value) -> (Vec<Owned>, u64, u64) {
    let mut out = Vec::new();
    let (mut skipped, mut lora_events) = (0, 0);
    for e in batch["events"].as_array().unwrap() {
        let hashes = || e["block_hashes"].as_array().unwrap().iter().map(hash).collect();
        match e["type"].as_str().unwrap() {
            "BlockStored" => {
                let salt = e["cache_salt"].as_str().map_or(0, |s| Namespace::salt(s.as_bytes()));
                if e["has_extra_keys"] == Value::Bool(true) && salt == 0 {
                    skipped += 1;
                    out.push(Owned::OutOfScope { hashes: hashes(), tier: tier(&e["medium"]) });
                    continue;
                }
                let parent =
                    (!e["parent_block_hash"].is_null()).then(|| hash(&e["parent_block_hash"]));
                let tokens = e["token_ids"].as_array().unwrap();
                let lora =
                    e["lora_name"].as_str().map_or(0, |n| Namespace::lora_name(n.as_bytes()));
                lora_events += u64::from(lora != 0);
                out.push(Owned::Stored {
                    hashes: hashes(),
                    parent,
                    tokens: tokens.iter().map(|t| t.as_i64().unwrap() as i32).collect(),
                    block_size: e["block_size"].as_u64().unwrap() as u32,
                    tier: tier(&e["medium"]),
                    lora,
                    salt,
                });
            }
            "BlockRemoved" => {
                out.push(Owned::Removed { hashes: hashes(), tier: tier(&e["medium"]) })
            }
            "AllBlocksCleared" => out.push(Owned::Cleared { tier: None }),
            other => panic!("unexpected event type {other} in fixture"),
        }
    }
    (out, skipped, lora_events)
}

/// Checks every message of fixture `name`; returns (messages, LoRA events indexed).
fn check_fixture(name: &str) -> (usize, u64) {
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
    let mut lora_total = 0;
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
        let (events, skipped, lora_events) = expected(exp);
        lora_total += lora_events;
        assert_eq!(owned(&batch), events, "{name} message {i}: events");
        assert_eq!(batch.skipped.lora_or_multimodal, skipped, "{name} message {i}: skipped");
        assert_eq!(batch.skipped.unknown_type + batch.skipped.out_of_scope_medium, 0);
    }
    (lines.len(), lora_total)
}

#[test]
fn vllm_integer_hashes_decode_exactly() {
    assert_eq!(check_fixture("vllm-int-hashes-dp0"), (12, 1), "one LoRA event, indexed");
}

#[test]
fn vllm_bin_hashes_decode_exactly() {
    assert_eq!(check_fixture("vllm-bytes-hashes-dp1"), (12, 3), "three LoRA events, indexed");
}

/// Applies fixture `name`'s messages to a stream alone in a shared index (slot 0) and calls
/// `check` with a reader of the published view and the tokens of each store with no parent (one with a parent may chain to a block
/// stored before the recording began); returns how many it checked.
fn for_each_root_store(
    name: &str,
    mut check: impl FnMut(usize, &Stored, &[i32], &SharedHandle),
) -> usize {
    let frames =
        std::fs::read_to_string(fixture_dir().join(format!("{name}.frames.jsonl"))).unwrap();
    let config = IndexConfig { block_size: 16, hash_seed: 1024, salt: 0, max_blocks: 1 << 16 };
    let shared = SharedIndex::new(16, 1024, 1);
    let mut index = shared.add_stream(config).unwrap();
    let view = shared.reader().handle();
    let mut batch = Batch::default();
    let mut checked = 0;
    for (i, line) in frames.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let msg: Value = serde_json::from_str(line).unwrap();
        let parts: Vec<Vec<u8>> = ["topic_hex", "seq_hex", "payload_hex"]
            .iter()
            .map(|k| unhex(msg[*k].as_str().unwrap()))
            .collect();
        let seq = decode_live(&parts, TOPIC, 8 << 20, &mut batch).unwrap();
        if i == 0 {
            index.install_snapshot(index.snapshot_builder(), seq);
        }
        if index.apply(seq, &batch).is_err() {
            // A parent stored before the recording began: resynchronize, as the service
            // would, here from an empty snapshot, and go on with the next message.
            index.install_snapshot(index.snapshot_builder(), seq + 1);
            continue;
        }
        index.publish();
        for e in &batch.events {
            if let Event::Stored(s) = e {
                if s.parent.is_none() {
                    check(i, s, batch.tokens(s.tokens), &view);
                    checked += 1;
                }
            }
        }
    }
    checked
}

/// The tokens of `tokens` that `view`'s stream (slot 0) matches for a query in namespace `ns`.
fn matched(view: &SharedHandle, ns: Namespace, tokens: &[i32]) -> u64 {
    let mut keys = Vec::new();
    ns.hasher(16, 1024).prefix_keys(tokens, &mut keys);
    let (device, host_only) = view.match_keys(&keys).tokens(0);
    device + host_only
}

/// After each LoRA store with no parent, its tokens match for the adapter's query in full, and
/// for the base model and another adapter not at all.
#[test]
fn vllm_lora_stores_are_indexed_in_their_adapters_namespace() {
    let adapter = |name: &str| Namespace { lora: Namespace::lora_name(name.as_bytes()), salt: 0 };
    let mut lora = 0;
    for_each_root_store("vllm-bytes-hashes-dp1", |i, s, tokens, view| {
        if s.lora == 0 {
            return;
        }
        assert_eq!(matched(view, adapter("adapter-a"), tokens), tokens.len() as u64, "message {i}");
        assert_eq!(matched(view, adapter("adapter-b"), tokens), 0, "message {i}");
        assert_eq!(matched(view, Namespace::default(), tokens), 0, "message {i}: base model");
        lora += 1;
    });
    assert!(lora > 0, "no root LoRA store was applied, so nothing was checked");
}

/// The store whose first block carries a salt matches for that salt's query only.
#[test]
fn vllm_salted_stores_are_indexed_in_their_salts_namespace() {
    let salt = |s: &str| Namespace { lora: 0, salt: Namespace::salt(s.as_bytes()) };
    let mut salted = 0;
    for_each_root_store("vllm-int-hashes-dp0", |i, s, tokens, view| {
        if s.salt == 0 {
            return;
        }
        assert_eq!(s.salt, Namespace::salt(b"mm-hash-1"), "message {i}");
        assert_eq!(matched(view, salt("mm-hash-1"), tokens), tokens.len() as u64, "message {i}");
        assert_eq!(matched(view, salt("another"), tokens), 0, "message {i}");
        assert_eq!(matched(view, Namespace::default(), tokens), 0, "message {i}: no salt");
        salted += 1;
    });
    assert_eq!(salted, 1, "the one salted root store");
}
