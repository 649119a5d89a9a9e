//! Unit tests of the directory's reads: the order across indexes, the compact answer of a
//! large fleet and routing's read of it.

use kvdir::query::ListMode;
use kvdir::wire::{Batch, EngineHash, Tier};

use super::*;

fn label(instance_name: &str, dp_rank: u32) -> StreamLabel {
    StreamLabel { instance_name: instance_name.into(), dp_rank, ..StreamLabel::default() }
}

/// A full-state batch: the stream holds one block of `tokens`.
fn holding(tokens: &[i32]) -> Batch {
    let mut b = Batch::default();
    b.push_cleared(None);
    let n = tokens.len();
    let size = n as u32;
    b.push_stored_with(&[EngineHash(7)], None, n, size, Tier::Device, |out| {
        out.copy_from_slice(tokens)
    });
    b
}

#[test]
fn the_json_answer_is_the_query_answer_in_name_order_across_indexes() {
    let directory = Directory::default();
    let config = |block_size| IndexConfig { block_size, ..IndexConfig::default() };
    let mut b1 = directory.add_stream(config(2), label("b", 1)).unwrap();
    let mut a0 = directory.add_stream(config(4), label("a", 0)).unwrap();
    let mut a2 = directory.add_stream(config(2), label("a\"2", 2)).unwrap();
    b1.apply(1, &holding(&[1, 2])).unwrap();
    b1.publish();
    a0.apply(1, &holding(&[1, 2, 3, 4])).unwrap();
    a0.invalidate("a gap: expected sequence 2, got \"9\"");
    a0.publish();
    a2.publish();
    let tokens = [1, 2, 3, 4];
    let want = directory.query_in(&tokens, &QueryScope::default());
    let order: Vec<_> =
        want.matches.iter().map(|m| (m.instance_name.as_str(), m.dp_rank)).collect();
    assert_eq!(order, [("a", 0), ("a\"2", 2), ("b", 1)]);
    let hits: Vec<_> = want.matches.iter().map(|m| m.device_hit_tokens).collect();
    assert_eq!(hits, [0, 0, 2], "only b holds the query's first block and is synchronized");
    assert!(want.matches[0].error.is_some());
    let json = directory.query_json_in(&tokens, &QueryScope::default());
    assert_eq!(String::from_utf8(json).unwrap(), serde_json::to_string(&want).unwrap());
}

#[test]
fn streams_beyond_one_indexs_slots_get_another_index_and_all_answer() {
    let directory = Directory::default();
    let config = IndexConfig { block_size: 2, ..IndexConfig::default() };
    let n = MAX_STREAMS + 2;
    let mut writers: Vec<_> = (0..n)
        .map(|i| directory.add_stream(config, label("s", i as u32)).expect("room for all"))
        .collect();
    let last = writers.last_mut().unwrap();
    last.apply(1, &holding(&[1, 2])).unwrap();
    last.publish();
    let r = directory.query(&[1, 2]);
    assert_eq!(r.matches.len(), n, "every stream is listed");
    let ranks: Vec<u32> = r.matches.iter().map(|m| m.dp_rank).collect();
    assert_eq!(ranks, (0..n as u32).collect::<Vec<_>>(), "in rank order across indexes");
    assert_eq!(r.matches[n - 1].device_hit_tokens, 2, "the overflow stream's blocks count");
    writers.clear();
    assert!(directory.query(&[1, 2]).matches.is_empty(), "dropped writers free their slots");
}

/// A full-state batch: the stream holds the first `blocks` blocks of 2 tokens of `tokens`.
fn holding_blocks(tokens: &[i32], blocks: usize) -> Batch {
    let mut b = Batch::default();
    b.push_cleared(None);
    if blocks > 0 {
        let hashes: Vec<EngineHash> = (1..=blocks as u128).map(EngineHash).collect();
        b.push_stored(&hashes, None, &tokens[..2 * blocks], 2, Tier::Device);
    }
    b
}

/// 130 streams in two indexes of block size 2: `s005`, `s064` and `s129` hold 3, 2 and 1
/// blocks of `PROMPT`, `s100` and `s101` are unsynchronized, the others hold nothing.
fn fleet(directory: &Directory) -> Vec<StreamWriter> {
    let config = IndexConfig { block_size: 2, ..IndexConfig::default() };
    (0..130)
        .map(|i| {
            let mut w = directory.add_stream(config, label(&format!("s{i:03}"), 0)).unwrap();
            let blocks = match i {
                5 => 3,
                64 => 2,
                129 => 1,
                _ => 0,
            };
            if i != 100 && i != 101 {
                w.apply(1, &holding_blocks(&PROMPT, blocks)).unwrap();
            }
            w.publish();
            w
        })
        .collect()
}

const PROMPT: [i32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

fn json(directory: &Directory, scope: &QueryScope) -> serde_json::Value {
    serde_json::from_slice(&directory.query_json_in(&PROMPT, scope)).unwrap()
}

#[test]
fn past_the_threshold_the_answer_lists_the_streams_with_credit_longest_first() {
    let directory = Directory::default();
    let _writers = fleet(&directory);
    let answer = json(&directory, &QueryScope::default());
    let names: Vec<(&str, u64)> = answer["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (m["instance_name"].as_str().unwrap(), m["reusable_prefix_tokens"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(names, [("s005", 6), ("s064", 4), ("s129", 2)]);
    let summary = serde_json::json!({"streams": 130, "with_credit": 3, "unlisted_with_credit": 0,
        "zero_credit": 127, "unsynchronized": 2});
    assert_eq!(answer["summary"], summary);
    let all = QueryScope { list: ListMode::All, ..QueryScope::default() };
    let listed = json(&directory, &all);
    assert_eq!(listed["matches"].as_array().unwrap().len(), 130, "every stream on request");
    assert!(listed.get("summary").is_none());
    let want = directory.query_in(&PROMPT, &QueryScope::default());
    assert_eq!(serde_json::from_value::<QueryResponse>(listed).unwrap(), want);
    let one = QueryScope { instance: Some("s100".into()), ..QueryScope::default() };
    assert!(json(&directory, &one)["summary"].is_null(), "one stream in scope: listed in full");
    let compact = QueryScope { list: ListMode::Compact, ..one };
    let summary = serde_json::json!({"streams": 1, "with_credit": 0, "unlisted_with_credit": 0,
        "zero_credit": 1, "unsynchronized": 1});
    assert_eq!(
        json(&directory, &compact),
        serde_json::json!({"input_tokens": 8, "matches": [],
        "summary": summary})
    );
}

#[test]
fn routing_reads_the_streams_with_credit_and_asks_for_an_instances_others() {
    let directory = Directory::default();
    let _writers = fleet(&directory);
    let read = directory.read_route(&PROMPT, &QueryScope::default());
    assert!(!read.complete);
    let listed: Vec<&str> = read.hits.iter().map(StreamHit::instance_name).collect();
    assert_eq!(listed, ["s005", "s064", "s129"], "by handle: the order the names came in");
    assert_eq!((read.counts.streams, read.counts.with_credit), (130, 3));
    let keys: Vec<u32> = read.keys().map(|(b, k)| b * 100 + k.len() as u32).collect();
    assert_eq!(keys, [204], "the prompt's 4 keys of block size 2, once");
    assert!(directory.streams_of("s005", &read).is_empty(), "listed already");
    let others = directory.streams_of("s100", &read);
    assert_eq!(others.len(), 1);
    let m = others[0].matched();
    assert_eq!((m.synchronized, m.reusable_prefix_tokens, others[0].keys.len()), (false, 0, 4));
    assert!(directory.streams_of("nobody", &read).is_empty());
    let all = QueryScope { list: ListMode::All, ..QueryScope::default() };
    let whole = directory.read_route(&PROMPT, &all);
    assert!(whole.complete && whole.hits.len() == 130);
}
