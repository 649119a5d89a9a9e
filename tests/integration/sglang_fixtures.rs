//! A real SGLang 0.5.23 server's frames (`tests/fixtures/sglang`, recorded by
//! `scripts/sglang-e2e.sh --record`, see its README): its whole history from seq 0, replayed
//! into a stream of page size 16, credits each step's prompt as SGLang reused it, and keeps a
//! salted request's pages (SGLang's `cache_salt` field) in the salt's namespace: an unsalted
//! prompt with the same tokens is never credited with them.

use std::path::PathBuf;

use kvdir::index::{IndexConfig, Namespace, SharedHandle, SharedIndex, SlotRead};
use kvdir::wire::{decode_history_frame, Batch, Event, HistoryFrame};
use serde_json::Value;

const PAGE: u32 = 16;

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sglang").join(name);
    std::fs::read_to_string(path).expect("fixture present")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// The replayed batches from seq 0, in order.
fn history() -> Vec<Batch> {
    let mut out = Vec::new();
    for line in fixture("replay-from-0.jsonl").lines() {
        let m: Value = serde_json::from_str(line).unwrap();
        let frames: Vec<Vec<u8>> = m["frames_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| unhex(f.as_str().unwrap()))
            .collect();
        let mut b = Batch::default();
        match decode_history_frame(&frames, b"kv", 8 << 20, &mut b).expect("a real reply decodes") {
            HistoryFrame::Batch { seq } => {
                assert_eq!(seq, out.len() as u64, "consecutive seqs from 0");
                out.push(b);
            }
            HistoryFrame::End => break,
        }
    }
    out
}

/// The first store's 48 token ids (A's three pages).
fn a_tokens(batches: &[Batch]) -> Vec<i32> {
    let b = &batches[1];
    let Some(Event::Stored(s)) = b.events.first() else { panic!("seq 1 stores A") };
    b.tokens(s.tokens).to_vec()
}

fn credit(view: &mut SharedHandle, ns: Namespace, tokens: &[i32]) -> u64 {
    let mut streams: Vec<SlotRead> = Vec::new();
    let (d, h) = view.query_streams_in(ns, tokens, &mut streams).tokens(0);
    d + h
}

#[test]
fn sglang_salted_pages_stay_in_the_salts_namespace() {
    let batches = history();
    assert!(batches.len() >= 12, "seqs 0..=12: {}", batches.len());
    let config = IndexConfig { block_size: PAGE, hash_seed: 1024, salt: 0, max_blocks: 4096 };
    let index = SharedIndex::new(PAGE, 1024, 1);
    let mut stream = index.add_stream(config).unwrap();
    let mut view = index.reader().handle();
    stream.load_snapshot(&Batch::default(), 0).unwrap();
    let mut a = a_tokens(&batches);
    a.push(7); // a prompt one token longer than A's three pages: they are all reusable
    let salted = Namespace { lora: 0, salt: Namespace::salt(b"fixture-salt") };
    for (seq, b) in batches.iter().enumerate().take(10) {
        stream.apply(seq as u64, b).unwrap();
        stream.publish();
        let (plain, salty) =
            (credit(&mut view, Namespace::default(), &a), credit(&mut view, salted, &a));
        match seq {
            // A stored (seq 1), the salted copy not yet: the salt gets nothing.
            1..=4 => assert_eq!((plain, salty), (48, 0), "seq {seq}"),
            // The salted copy (seq 5): each namespace has its own pages.
            5..=8 => assert_eq!((plain, salty), (48, 48), "seq {seq}"),
            // Seq 9 evicts the unsalted A: the salted copy must not stand in for it.
            9 => assert_eq!((plain, salty), (0, 48), "seq {seq}"),
            _ => {}
        }
    }
}
