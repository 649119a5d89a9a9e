//! Decoding rules of protocol.md section 2: every accepted batch and event dialect, hash
//! canonicalisation, medium mapping, skipped events, and errors that name field and value.

use kvdir::index::Namespace;
use kvdir::wire::msgpack::Writer;
use kvdir::wire::record::{
    BatchForm, BatchRecord, EventForm, EventRecord, ExtraKey, GroupRecord, StoredRecord, WireHash,
};
use kvdir::wire::{decode_batch, encode_batch, Batch, EngineHash, Event, Tier, WireError};

fn stored(hashes: Vec<WireHash>, parent: Option<WireHash>, tier: Tier) -> StoredRecord {
    let tokens = (0..hashes.len() as i32 * 2).collect();
    StoredRecord::new(hashes, parent, tokens, 2, tier)
}

fn sample() -> BatchRecord {
    BatchRecord {
        timestamp: 12.5,
        events: vec![
            EventRecord::Stored(stored(
                vec![WireHash::Uint(1), WireHash::Uint(2)],
                None,
                Tier::Device,
            )),
            EventRecord::Stored(stored(
                vec![WireHash::Uint(3)],
                Some(WireHash::Uint(2)),
                Tier::Host,
            )),
            EventRecord::removed(vec![WireHash::Uint(1)], Tier::Device),
            EventRecord::cleared(Some(Tier::Host)),
            EventRecord::cleared(None),
        ],
        dp_rank: Some(3),
    }
}

fn decode(bytes: &[u8]) -> Result<Batch, WireError> {
    let mut b = Batch::default();
    decode_batch(bytes, &mut b).map(|_| b)
}

#[test]
fn every_batch_and_event_form_decodes_to_the_same_batch() {
    let rec = sample();
    let reference = decode(&encode_batch(&rec, BatchForm::Array, EventForm::Map)).unwrap();
    assert_eq!(reference.dp_rank, 3);
    assert_eq!(reference.timestamp, 12.5);
    assert_eq!(reference.events.len(), 5);
    assert_eq!(
        reference.hashes(match reference.events[0] {
            Event::Stored(s) => s.hashes,
            _ => panic!("first event is a store"),
        }),
        [EngineHash(1), EngineHash(2)]
    );
    for form in [BatchForm::Array, BatchForm::Map] {
        for ev in [EventForm::Map, EventForm::Positional] {
            let got = decode(&encode_batch(&rec, form, ev)).unwrap();
            assert_eq!(got, reference, "{form:?} batch with {ev:?} events");
        }
    }
    let short = decode(&encode_batch(&rec, BatchForm::ShortArray, EventForm::Positional)).unwrap();
    assert_eq!(short.dp_rank, 0, "a 2-element batch means dp_rank 0");
    assert_eq!(short.events, reference.events);
    let no_rank = BatchRecord { dp_rank: None, ..rec };
    assert_eq!(decode(&encode_batch(&no_rank, BatchForm::Map, EventForm::Map)).unwrap().dp_rank, 0);
    assert_eq!(
        decode(&encode_batch(&no_rank, BatchForm::Array, EventForm::Map)).unwrap().dp_rank,
        0
    );
}

#[test]
fn dp_rank_key_and_unknown_keys_in_any_order() {
    let mut w = Writer::new();
    w.map(4);
    w.str("future_field");
    w.array(2);
    w.nil();
    w.str("x");
    w.str("events");
    w.array(1);
    w.map(3);
    w.str("medium");
    w.str("cpu");
    w.str("block_hashes");
    w.array(1);
    w.uint(9);
    w.str("type");
    w.str("BlockRemoved");
    w.str("dp_rank");
    w.uint(5);
    w.str("ts");
    w.uint(7);
    let b = decode(&w.buf).unwrap();
    assert_eq!((b.dp_rank, b.timestamp), (5, 7.0));
    assert!(matches!(b.events[0], Event::Removed { tier: Tier::Host, .. }));
}

#[test]
fn hashes_are_canonicalised() {
    let long: Vec<u8> = (0..32).collect();
    let rec = BatchRecord {
        timestamp: 0.0,
        events: vec![EventRecord::removed(
            vec![
                WireHash::Uint(u64::MAX),
                WireHash::Int(-1),
                WireHash::Bin(vec![0xab]),
                WireHash::Bin(vec![0x11; 16]),
                WireHash::Bin(long.clone()),
                WireHash::Bin(vec![1; 64]),
            ],
            Tier::Device,
        )],
        dp_rank: Some(0),
    };
    let b = decode(&encode_batch(&rec, BatchForm::Array, EventForm::Positional)).unwrap();
    let Event::Removed { hashes, .. } = b.events[0] else { panic!("removal expected") };
    let got = b.hashes(hashes);
    assert_eq!(got[0], EngineHash(u128::from(u64::MAX)));
    assert_eq!(got[1], EngineHash(u128::from(u64::MAX)), "negative i64 is bit-cast");
    assert_eq!(got[2], EngineHash(0xab));
    assert_eq!(got[3], EngineHash(u128::from_be_bytes([0x11; 16])));
    assert_eq!(got[4], EngineHash(xxhash_rust::xxh3::xxh3_128(&long)));
    assert_eq!(got[5], EngineHash(xxhash_rust::xxh3::xxh3_128(&[1; 64])));
    assert_ne!(got[4], got[5]);
}

#[test]
fn bin_hashes_outside_1_to_64_bytes_are_errors_naming_the_field() {
    for len in [0usize, 65] {
        let rec = BatchRecord {
            timestamp: 0.0,
            events: vec![EventRecord::removed(vec![WireHash::Bin(vec![0; len])], Tier::Device)],
            dp_rank: Some(0),
        };
        let err = decode(&encode_batch(&rec, BatchForm::Array, EventForm::Map)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("events[0]: block_hashes: value bin of {len} bytes is out of range (bin of 1..=64 bytes)")
        );
    }
}

#[test]
fn out_of_scope_events_are_skipped_and_counted_and_lora_events_are_namespaced() {
    let mut lora = stored(vec![WireHash::Uint(5)], None, Tier::Device);
    lora.lora_id = Some(3);
    let mut named = stored(vec![WireHash::Uint(6)], None, Tier::Device);
    named.lora_name = Some("adapter".into());
    let mut mm = stored(vec![WireHash::Uint(7)], None, Tier::Device);
    mm.extra_keys = vec![ExtraKey::image("image-hash")];
    let mut empty_name = stored(vec![WireHash::Uint(8)], None, Tier::Device);
    empty_name.lora_name = Some(String::new());
    let mut disk = stored(vec![WireHash::Uint(9)], None, Tier::Device);
    disk.medium = Some("disk".into());
    let rec = BatchRecord {
        timestamp: 0.0,
        events: vec![
            EventRecord::Stored(lora),
            EventRecord::Stored(named),
            EventRecord::Stored(mm),
            EventRecord::Unknown { type_name: "BlockMoved".into() },
            EventRecord::Stored(empty_name),
            EventRecord::Stored(disk),
            EventRecord::Removed {
                hashes: vec![WireHash::Uint(8)],
                medium: Some("Storage".into()),
                group_idx: None,
            },
            EventRecord::Cleared { medium: Some("disk".into()) },
        ],
        dp_rank: Some(0),
    };
    let want_lora = [Namespace::lora_id(3), Namespace::lora_name(b"adapter")];
    for ev in [EventForm::Map, EventForm::Positional] {
        let b = decode(&encode_batch(&rec, BatchForm::Array, ev)).unwrap();
        assert_eq!(b.events.len(), 4, "{ev:?}: two LoRA stores, one out of scope, one base");
        for (i, (h, lora)) in [(5, want_lora[0]), (6, want_lora[1])].into_iter().enumerate() {
            let Event::Stored(s) = b.events[i] else { panic!("a LoRA store is indexed") };
            assert_eq!((b.hashes(s.hashes), s.lora), (&[EngineHash(h)][..], lora));
        }
        let Event::OutOfScope { hashes, .. } = b.events[2] else { panic!("out of scope") };
        assert_eq!(b.hashes(hashes), [EngineHash(7)], "only the hash is kept");
        let Event::Stored(s) = b.events[3] else { panic!("store expected") };
        assert_eq!((b.hashes(s.hashes), s.lora), (&[EngineHash(8)][..], 0), "empty name: base");
        assert_eq!(b.tokens(s.tokens), [0, 1], "skipped events leave no tokens behind");
        assert_eq!(b.skipped.lora_or_multimodal, 1);
        assert_eq!(b.skipped.unknown_type, 1);
        assert_eq!(b.skipped.out_of_scope_medium, 3);
    }
}

#[test]
fn medium_selects_the_tier_and_cleared_without_medium_clears_both() {
    let mut nil = stored(vec![WireHash::Uint(1)], None, Tier::Device);
    nil.medium = None;
    let mut cpu = stored(vec![WireHash::Uint(2)], None, Tier::Device);
    cpu.medium = Some("cpu_pinned".into());
    let rec = BatchRecord {
        timestamp: 0.0,
        events: vec![
            EventRecord::Stored(nil),
            EventRecord::Stored(cpu),
            EventRecord::Cleared { medium: Some("GPU".into()) },
            EventRecord::Cleared { medium: None },
        ],
        dp_rank: Some(0),
    };
    let b = decode(&encode_batch(&rec, BatchForm::Array, EventForm::Map)).unwrap();
    let tiers: Vec<_> = b
        .events
        .iter()
        .map(|e| match e {
            Event::Stored(s) => Some(s.tier),
            Event::Cleared { tier } => *tier,
            Event::Removed { tier, .. } | Event::OutOfScope { tier, .. } => Some(*tier),
        })
        .collect();
    assert_eq!(tiers, [Some(Tier::Device), Some(Tier::Host), Some(Tier::Device), None]);
}

#[test]
fn malformed_batches_give_typed_errors_that_name_the_problem() {
    let mut w = Writer::new();
    w.array(4);
    for _ in 0..4 {
        w.nil();
    }
    assert_eq!(decode(&w.buf).unwrap_err(), WireError::BatchArity(4));

    let mut w = Writer::new();
    w.array(3);
    w.f64(0.0);
    w.str("not events");
    assert_eq!(
        decode(&w.buf).unwrap_err().to_string(),
        "events: expected array, found string at offset 10"
    );

    let mut w = Writer::new();
    w.array(3);
    w.f64(0.0);
    w.array(0);
    w.int(-2);
    assert_eq!(
        decode(&w.buf).unwrap_err().to_string(),
        "dp_rank: value -2 is out of range (0..=4294967295)"
    );

    let mut w = Writer::new();
    w.map(1);
    w.str("ts");
    w.f64(0.0);
    assert_eq!(decode(&w.buf).unwrap_err().to_string(), "batch lacks the required key \"events\"");

    let mut w = Writer::new();
    w.array(2);
    w.f64(0.0);
    w.array(0);
    w.nil();
    assert_eq!(decode(&w.buf).unwrap_err(), WireError::TrailingBytes(1));
}

#[test]
fn malformed_events_name_the_event_index_and_field() {
    let event = |build: &dyn Fn(&mut Writer)| {
        let mut w = Writer::new();
        w.array(2);
        w.f64(0.0);
        w.array(2);
        w.array(1);
        w.str("AllBlocksCleared");
        build(&mut w);
        decode(&w.buf).unwrap_err().to_string()
    };
    assert_eq!(
        event(&|w| {
            w.map(1);
            w.str("block_hashes");
            w.array(0);
        }),
        "events[1]: event lacks the required key \"type\""
    );
    assert_eq!(
        event(&|w| {
            w.map(2);
            w.str("type");
            w.str("BlockStored");
            w.str("block_hashes");
            w.array(0);
        }),
        "events[1]: BlockStored lacks the required key \"token_ids\""
    );
    assert_eq!(
        event(&|w| {
            w.array(4);
            w.str("BlockStored");
            w.array(0);
            w.nil();
            w.array(1);
            w.uint(1 << 31);
        }),
        "events[1]: token_ids: value 2147483648 is out of range (a 32-bit signed integer)"
    );
    assert_eq!(
        event(&|w| {
            w.array(2);
            w.str("BlockRemoved");
            w.array(1);
            w.str("abc");
        }),
        "events[1]: block_hashes: expected integer or bin, found string at offset 44"
    );
    assert_eq!(
        event(&|w| w.uint(3)),
        "events[1]: event: expected map or array, found integer at offset 29"
    );
}

#[test]
fn a_reused_batch_holds_only_the_latest_payload() {
    let mut b = Batch::default();
    decode_batch(&encode_batch(&sample(), BatchForm::Array, EventForm::Map), &mut b).unwrap();
    let one = BatchRecord {
        timestamp: 1.0,
        events: vec![EventRecord::Stored(stored(vec![WireHash::Uint(4)], None, Tier::Host))],
        dp_rank: Some(1),
    };
    decode_batch(&encode_batch(&one, BatchForm::Map, EventForm::Positional), &mut b).unwrap();
    assert_eq!(b, decode(&encode_batch(&one, BatchForm::Map, EventForm::Positional)).unwrap());
    assert_eq!(b.block_count(), 1);
}

/// vLLM 0.32's events of a model with a sliding-window group 0 (window 64) and a
/// full-attention group 1: the window's store lists one of its two blocks.
fn hybrid() -> BatchRecord {
    let group =
        |idx, kind: &str, window| Some(GroupRecord { idx, kind: Some(kind.into()), window });
    let mut window = stored(vec![WireHash::Uint(2)], None, Tier::Device);
    window.tokens = (0..4).collect();
    window.group = group(0, "sliding_window", Some(64));
    let mut full = stored(vec![WireHash::Uint(1), WireHash::Uint(2)], None, Tier::Device);
    full.group = group(1, "full_attention", None);
    let mut mamba = stored(vec![WireHash::Uint(3)], None, Tier::Device);
    mamba.group = group(2, "mamba", None);
    let removed = EventRecord::Removed {
        hashes: vec![WireHash::Uint(2)],
        medium: Some("GPU".into()),
        group_idx: Some(0),
    };
    let events = vec![
        EventRecord::Stored(window),
        EventRecord::Stored(full),
        EventRecord::Stored(mamba),
        removed,
    ];
    BatchRecord { timestamp: 1.0, events, dp_rank: Some(0) }
}

#[test]
fn kv_cache_groups_and_their_kinds_decode_in_both_event_forms() {
    use kvdir::wire::{AttentionKind, Group, Unmodelled};
    for form in [EventForm::Map, EventForm::Positional] {
        let b = decode(&encode_batch(&hybrid(), BatchForm::Array, form)).unwrap();
        let groups: Vec<Group> = b
            .events
            .iter()
            .map(|e| match e {
                Event::Stored(s) => s.group,
                Event::Removed { group, .. } => *group,
                other => panic!("{other:?}"),
            })
            .collect();
        let sw = AttentionKind::SlidingWindow { window: 64 };
        let mamba = AttentionKind::Unmodelled(Unmodelled::Mamba);
        assert_eq!(
            groups,
            [
                Group { idx: 0, kind: Some(sw) },
                Group { idx: 1, kind: Some(AttentionKind::Full) },
                Group { idx: 2, kind: Some(mamba) },
                Group { idx: 0, kind: None },
            ],
            "{form:?}"
        );
        let Event::Stored(s) = b.events[0] else { unreachable!() };
        assert_eq!((b.hashes(s.hashes).len(), b.tokens(s.tokens).len()), (1, 4), "kept as sent");
    }
    // A dense model's events, with no group fields, are group 0, no kind named.
    let b = decode(&encode_batch(&sample(), BatchForm::Array, EventForm::Map)).unwrap();
    let Event::Stored(s) = b.events[0] else { unreachable!() };
    assert!(s.group.is_default() && s.group.kind.is_none());
}

#[test]
fn a_group_index_past_the_limit_is_an_error_naming_it() {
    let mut record = hybrid();
    if let EventRecord::Stored(s) = &mut record.events[0] {
        s.group.as_mut().unwrap().idx = 40;
    }
    let err = decode(&encode_batch(&record, BatchForm::Array, EventForm::Map)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("group_idx") && text.contains("40"), "{text}");
}
