//! Property test: arbitrary bytes, and valid payloads with bytes flipped, cut or inserted, never
//! panic the decoder. Each input gives a typed error or a valid batch, and a batch that decodes
//! is internally consistent (every span lies inside its arena).

use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, StoredRecord, WireHash};
use kvdir::wire::{
    decode_batch, decode_live, decode_snapshot_frame, encode_batch, Batch, Event, Tier,
};
use proptest::prelude::*;

fn valid_payload(form: u8, seed: u64) -> Vec<u8> {
    let tokens: Vec<i32> =
        (0..8).map(|i| (seed.wrapping_mul(31).wrapping_add(i) % 200_000) as i32).collect();
    let mut lora =
        StoredRecord::new(vec![WireHash::Uint(9)], None, tokens[..4].to_vec(), 4, Tier::Device);
    lora.lora_name = Some("a".into());
    let rec = BatchRecord {
        timestamp: seed as f64,
        events: vec![
            EventRecord::Stored(StoredRecord::new(
                vec![WireHash::Uint(seed), WireHash::Bin(vec![7; 32])],
                Some(WireHash::Int(-5)),
                tokens,
                4,
                Tier::Device,
            )),
            EventRecord::Stored(lora),
            EventRecord::removed(vec![WireHash::Uint(seed)], Tier::Host),
            EventRecord::cleared(Some(Tier::Device)),
            EventRecord::Unknown { type_name: "Future".into() },
        ],
        dp_rank: Some((seed % 4) as u32),
    };
    let batch_form = [BatchForm::Array, BatchForm::ShortArray, BatchForm::Map][form as usize % 3];
    let event_form = if form % 2 == 0 { EventForm::Map } else { EventForm::Positional };
    encode_batch(&rec, batch_form, event_form)
}

/// Decodes and, on success, touches every span so an out-of-range span would panic here.
fn check(bytes: &[u8], batch: &mut Batch) {
    if decode_batch(bytes, batch).is_ok() {
        let mut n = 0usize;
        for e in &batch.events {
            match e {
                Event::Stored(s) => {
                    n += batch.hashes(s.hashes).len() + batch.tokens(s.tokens).len()
                }
                Event::OutOfScope { hashes, .. } | Event::Removed { hashes, .. } => {
                    n += batch.hashes(*hashes).len()
                }
                Event::Cleared { .. } => {}
            }
        }
        assert!(n <= bytes.len() * 2, "more decoded items than input bytes could hold");
    }
    // The envelopes must hold up too.
    let _ = decode_live(&[b"t".as_slice(), &[0; 8], bytes], b"t", 1 << 20, batch);
    let _ = decode_snapshot_frame(&[&[][..], &[1; 8], bytes], 1 << 20, batch);
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Cut(usize),
    Insert(usize, u8),
}

fn mutate(mut bytes: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if bytes.is_empty() {
            break;
        }
        match *m {
            Mutation::Flip(i, x) => {
                let i = i % bytes.len();
                bytes[i] ^= x.max(1);
            }
            Mutation::Cut(i) => bytes.truncate(i % bytes.len()),
            Mutation::Insert(i, x) => {
                let i = i % bytes.len();
                bytes.insert(i, x);
            }
        }
    }
    bytes
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, x)| Mutation::Flip(i, x)),
        1 => any::<usize>().prop_map(Mutation::Cut),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(i, x)| Mutation::Insert(i, x)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes, &mut Batch::default());
    }

    #[test]
    fn mutated_payloads_never_panic(form in 0u8..6, seed in any::<u64>(),
                                    muts in prop::collection::vec(mutation(), 1..6)) {
        let mut batch = Batch::default();
        let valid = valid_payload(form, seed);
        prop_assert!(decode_batch(&valid, &mut batch).is_ok(), "the unmutated payload decodes");
        // The unknown event type is skipped; the LoRA store is indexed in its namespace.
        prop_assert_eq!(batch.skipped.total(), 1);
        prop_assert_eq!(batch.skipped.unknown_type, 1);
        check(&mutate(valid, &muts), &mut batch);
    }
}
