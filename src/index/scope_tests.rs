//! Unit tests of out-of-scope blocks (multimodal) and the blocks that chain to them, and of
//! salted blocks (indexed in their salt's namespace), fed through the wire decoder as vLLM
//! publishes them: `extra_keys` set only on the blocks that carry the context, text blocks
//! after them unmarked.

use super::tests::{index, View, B};
use super::*;
use crate::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, ExtraKey, StoredRecord};
use crate::wire::{decode_batch, encode_batch, Batch, Tier};

/// The context a block's `extra_keys` entry carries.
#[derive(Clone, Copy)]
pub(super) enum Context {
    Salt(&'static str),
    Image(&'static str),
}

/// A `BlockStored` of `hashes` (tokens `10 * hash`, `10 * hash + 1` per block) on `tier`, with
/// vLLM's per-block `extra_keys`.
pub(super) fn store(
    hashes: &[u64],
    parent: Option<u64>,
    extra: &[Option<Context>],
    tier: Tier,
) -> EventRecord {
    let tokens = hashes.iter().flat_map(|h| [*h as i32 * 10, *h as i32 * 10 + 1]).collect();
    let mut s =
        StoredRecord::new(hashes.iter().map(|h| (*h).into()).collect(), None, tokens, B, tier);
    s.parent = parent.map(Into::into);
    s.extra_keys = extra
        .iter()
        .map(|e| match e {
            None => None,
            Some(Context::Salt(salt)) => ExtraKey::salt(salt),
            Some(Context::Image(id)) => ExtraKey::image(id),
        })
        .collect();
    EventRecord::Stored(s)
}

/// A tokenless replica of `hashes` on `tier`.
pub(super) fn replica(hashes: &[u64], tier: Tier) -> EventRecord {
    let hs = hashes.iter().map(|h| (*h).into()).collect();
    EventRecord::Stored(StoredRecord::new(hs, None, Vec::new(), B, tier))
}

/// The batch as vLLM's publisher sends it (map batch, map events), decoded.
pub(super) fn batch(events: Vec<EventRecord>) -> Batch {
    let record = BatchRecord { timestamp: 1.0, events, dp_rank: None };
    let mut b = Batch::default();
    decode_batch(&encode_batch(&record, BatchForm::Map, EventForm::Map), &mut b).unwrap();
    b
}

pub(super) fn apply(idx: &mut StreamWriter, seq: u64, b: &Batch) -> Result<ApplyStats, IndexError> {
    let r = idx.apply(seq, b);
    idx.publish();
    r
}

/// Device and Host-only hit tokens of the prompt made of `hashes`' blocks.
pub(super) fn hits(view: &View, hashes: &[u64]) -> (u64, u64) {
    hits_in(view, Namespace::default(), hashes)
}

/// [`hits`] for a query in namespace `ns`.
fn hits_in(view: &View, ns: Namespace, hashes: &[u64]) -> (u64, u64) {
    let tokens: Vec<i32> =
        hashes.iter().flat_map(|h| [*h as i32 * 10, *h as i32 * 10 + 1]).collect();
    let mut keys = Vec::new();
    ns.hasher(B, 1024).prefix_keys(&tokens, &mut keys);
    view.match_keys(&keys)
}

fn salted(salt: &str) -> Namespace {
    Namespace { lora: 0, salt: Namespace::salt(salt.as_bytes()) }
}

const SALT: Option<Context> = Some(Context::Salt("cache-salt"));
const IMAGE: Option<Context> = Some(Context::Image("mm-hash-1"));

#[test]
fn a_salted_first_block_and_its_text_children_are_indexed_in_the_salts_namespace() {
    let (mut idx, view) = index(100);
    // A salted request: the salt rides on its first block only.
    let first = batch(vec![store(&[1, 2, 3], None, &[SALT, None, None], Tier::Device)]);
    assert_eq!(first.skipped.lora_or_multimodal, 0, "a salt is not skipped");
    apply(&mut idx, 0, &first).unwrap();
    // Its decode continues in later batches: text blocks chaining to the salted ones, in one
    // batch with a child of that child, then a tokenless Host copy of the whole chain.
    let later = batch(vec![
        store(&[4], Some(3), &[], Tier::Device),
        store(&[5], Some(4), &[], Tier::Device),
    ]);
    let stats = apply(&mut idx, 1, &later).unwrap();
    assert_eq!((stats.stored, stats.out_of_scope), (2, 0), "the children are indexed");
    apply(&mut idx, 2, &batch(vec![replica(&[1, 2, 3, 4, 5], Tier::Host)])).unwrap();

    let s = view.status();
    assert!(s.synchronized, "{:?}", s.error);
    assert_eq!((s.sequence, s.device_blocks, s.host_blocks), (Some(2), 5, 5));
    let all = [1, 2, 3, 4, 5];
    assert_eq!(hits_in(&view, salted("cache-salt"), &all), (10, 0), "the same salt: all");
    assert_eq!(hits(&view, &all), (0, 0), "no salt: nothing");
    assert_eq!(hits_in(&view, salted("other"), &all), (0, 0), "another salt: nothing");
    assert_eq!(hits_in(&view, salted("cache-salt"), &[1, 2, 9]), (4, 0), "a salted prefix");
}

#[test]
fn blocks_before_the_first_image_stay_in_scope_and_keep_their_children() {
    let (mut idx, view) = index(100);
    // Text 1, 2, then a block overlapping an image, then text 4 chaining to it.
    let mm = batch(vec![store(&[1, 2, 3, 4], None, &[None, None, IMAGE, None], Tier::Device)]);
    assert_eq!(mm.skipped.lora_or_multimodal, 1);
    apply(&mut idx, 0, &mm).unwrap();
    assert_eq!(hits(&view, &[1, 2, 3, 4]), (4, 0), "the text prefix before the image counts");
    // Another request with the same text prefix and other text after it.
    let text = batch(vec![
        store(&[7], Some(2), &[], Tier::Device),
        store(&[8], Some(4), &[], Tier::Device),
    ]);
    let stats = apply(&mut idx, 1, &text).unwrap();
    assert_eq!((stats.stored, stats.out_of_scope), (1, 1));
    assert_eq!(hits(&view, &[1, 2, 7]), (6, 0));
    assert_eq!(view.status().device_blocks, 3);
}

#[test]
fn removals_retire_out_of_scope_blocks_with_their_mark_and_a_truly_unknown_parent_recovers() {
    let (mut idx, view) = index(100);
    apply(&mut idx, 0, &batch(vec![store(&[1, 2], None, &[IMAGE, None], Tier::Device)])).unwrap();
    let err = apply(&mut idx, 1, &batch(vec![store(&[9], Some(99), &[], Tier::Device)]));
    assert_eq!(err.unwrap_err(), IndexError::UnknownParent(crate::wire::EngineHash(99)));
    assert!(!view.status().synchronized, "an unknown parent still forces a snapshot");

    let (mut idx, _) = index(100);
    apply(&mut idx, 0, &batch(vec![store(&[1, 2], None, &[IMAGE, None], Tier::Device)])).unwrap();
    let mut gone = batch(vec![EventRecord::removed(vec![2u64.into()], Tier::Device)]);
    apply(&mut idx, 1, &gone).unwrap();
    assert_eq!(idx.block_count(), 1, "a removal takes the block out");
    // vLLM may still hold another copy of it: its child is out of scope, as its parent was.
    let child_of_removed = batch(vec![store(&[3], Some(2), &[], Tier::Device)]);
    assert_eq!(apply(&mut idx, 2, &child_of_removed).unwrap().out_of_scope, 1);
    assert!(idx.is_synchronized());

    let (mut idx, _) = index(100);
    apply(&mut idx, 0, &batch(vec![store(&[1, 2], None, &[IMAGE, None], Tier::Device)])).unwrap();
    apply(&mut idx, 1, &batch(vec![replica(&[1, 2], Tier::Host)])).unwrap();
    gone = batch(vec![EventRecord::cleared(Some(Tier::Device))]);
    apply(&mut idx, 2, &gone).unwrap();
    assert_eq!(idx.block_count(), 2, "still on Host");
    apply(&mut idx, 3, &batch(vec![store(&[3], Some(2), &[], Tier::Host)])).unwrap();
    apply(&mut idx, 4, &batch(vec![EventRecord::cleared(None)])).unwrap();
    assert_eq!(idx.block_count(), 0, "AllBlocksCleared forgets them");
    let after_clear = batch(vec![store(&[4], Some(3), &[], Tier::Device)]);
    assert!(matches!(apply(&mut idx, 5, &after_clear), Err(IndexError::UnknownParent(_))));
}

#[test]
fn an_out_of_scope_block_removed_from_a_tier_it_is_not_on_keeps_its_mark_where_it_is() {
    let (mut idx, view) = index(100);
    apply(&mut idx, 0, &batch(vec![store(&[1, 2], None, &[IMAGE, None], Tier::Device)])).unwrap();
    // Removed from Host, where it never was: by hash, then by clearing the tier.
    let host = batch(vec![EventRecord::removed(vec![1u64.into(), 2u64.into()], Tier::Host)]);
    let stats = apply(&mut idx, 1, &host).unwrap();
    assert_eq!((stats.removed, stats.unknown_removals), (0, 0));
    apply(&mut idx, 2, &batch(vec![EventRecord::cleared(Some(Tier::Host))])).unwrap();
    assert_eq!(idx.block_count(), 2, "still on Device");
    // A text child of it is still out of scope, not a child of an unknown parent.
    let child = apply(&mut idx, 3, &batch(vec![store(&[3], Some(2), &[], Tier::Device)])).unwrap();
    assert_eq!((child.out_of_scope, child.stored), (1, 0));
    let s = view.status();
    assert!(s.synchronized, "{:?}", s.error);
    assert_eq!((s.device_blocks, s.host_blocks), (0, 0), "none indexed");
    // And a tokenless Host copy of it stays out of scope too.
    let copy = apply(&mut idx, 4, &batch(vec![replica(&[2, 3], Tier::Host)])).unwrap();
    assert_eq!((copy.out_of_scope, copy.stored), (1, 0));
    assert_eq!(view.status().host_blocks, 0);
}

#[test]
fn out_of_scope_blocks_count_against_max_blocks_per_stream() {
    let (mut idx, view) = index(3);
    apply(&mut idx, 0, &batch(vec![store(&[1, 2], None, &[IMAGE, None], Tier::Device)])).unwrap();
    let err = apply(&mut idx, 1, &batch(vec![store(&[3, 4], Some(2), &[], Tier::Device)]));
    assert_eq!(err.unwrap_err(), IndexError::LimitExceeded { limit: 3 });
    assert!(!view.status().synchronized);
}

#[test]
fn a_snapshot_keeps_children_of_out_of_scope_blocks_out_of_scope_not_orphans() {
    let (mut idx, view) = index(100);
    let snapshot = batch(vec![
        store(&[1, 2], None, &[IMAGE, None], Tier::Device),
        store(&[3], Some(2), &[], Tier::Device),
        store(&[5, 6], None, &[], Tier::Device),
    ]);
    let mut builder = idx.snapshot_builder();
    let stats = builder.add(&snapshot).unwrap();
    assert_eq!((stats.orphans, stats.out_of_scope, stats.stored), (0, 1, 2));
    idx.install_snapshot(builder, 7);
    idx.publish();
    assert_eq!(hits(&view, &[5, 6]), (4, 0));
    // The live child of an out-of-scope block from the snapshot is skipped too.
    let child = apply(&mut idx, 7, &batch(vec![store(&[4], Some(3), &[], Tier::Device)])).unwrap();
    assert_eq!(child.out_of_scope, 1);
    assert!(view.status().synchronized);
}

#[test]
fn one_hash_cannot_be_both_in_and_out_of_scope() {
    let (mut idx, _) = index(100);
    apply(&mut idx, 0, &batch(vec![store(&[1], None, &[], Tier::Device)])).unwrap();
    let err = apply(&mut idx, 1, &batch(vec![store(&[1], None, &[IMAGE], Tier::Host)]));
    assert_eq!(err.unwrap_err(), IndexError::HashConflict(crate::wire::EngineHash(1)));
}

#[test]
fn a_full_state_batch_may_hold_out_of_scope_blocks() {
    let full = batch(vec![
        EventRecord::cleared(None),
        store(&[1], None, &[IMAGE], Tier::Device),
        store(&[2], Some(1), &[], Tier::Device),
    ]);
    assert!(full.is_full_state());
    let config = IndexConfig { block_size: B, hash_seed: 1024, salt: 0, max_blocks: 10 };
    let mut idx = SharedIndex::new(B, 1024, 1).add_stream(config).unwrap();
    let stats = idx.apply(0, &full).unwrap();
    assert_eq!(stats.out_of_scope, 1);
    assert!(idx.is_synchronized());
}

#[test]
fn the_decoder_splits_a_store_at_its_first_marked_block() {
    use crate::wire::{EngineHash, Event};
    let shape = |b: &Batch| -> Vec<(bool, Vec<EngineHash>, usize)> {
        b.events
            .iter()
            .map(|e| match e {
                Event::Stored(s) => (true, b.hashes(s.hashes).to_vec(), s.tokens.len as usize),
                Event::OutOfScope { hashes, .. } => (false, b.hashes(*hashes).to_vec(), 0),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    };
    let hs = |v: &[u128]| v.iter().map(|h| EngineHash(*h)).collect::<Vec<_>>();
    let mm = batch(vec![store(&[1, 2, 3, 4], None, &[None, None, IMAGE, None], Tier::Device)]);
    assert_eq!(shape(&mm), [(true, hs(&[1, 2]), 4), (false, hs(&[3, 4]), 0)]);
    assert_eq!(mm.tokens(crate::wire::Span { start: 0, len: 4 }), [10, 11, 20, 21]);
    let unmarked = batch(vec![store(&[1, 2], None, &[None, None], Tier::Device)]);
    assert_eq!(shape(&unmarked), [(true, hs(&[1, 2]), 4)], "entries of None mark nothing");
    assert_eq!(unmarked.skipped.lora_or_multimodal, 0);

    let mut lora =
        StoredRecord::new(vec![1u64.into(), 2u64.into()], None, vec![1, 2, 3, 4], B, Tier::Device);
    lora.lora_name = Some("adapter".into());
    let lora = batch(vec![EventRecord::Stored(lora)]);
    assert_eq!(shape(&lora), [(true, hs(&[1, 2]), 4)], "LoRA blocks are indexed");
    assert!(
        matches!(lora.events[0], Event::Stored(s) if s.lora == crate::index::Namespace::lora_name(b"adapter")),
        "in the adapter's namespace"
    );
    assert_eq!(lora.skipped.lora_or_multimodal, 0);
    let mut named =
        StoredRecord::new(vec![1u64.into(), 2u64.into()], None, vec![1, 2, 3, 4], B, Tier::Device);
    named.lora_name = Some("adapter".into());
    named.extra_keys = vec![Some(vec![ExtraKey::Text("adapter".into())]); 2];
    let named = batch(vec![EventRecord::Stored(named)]);
    assert_eq!(
        shape(&named),
        [(true, hs(&[1, 2]), 4)],
        "extra_keys repeating the adapter mark nothing"
    );
    let mut by_id =
        StoredRecord::new(vec![1u64.into(), 2u64.into()], None, vec![1, 2, 3, 4], B, Tier::Device);
    by_id.lora_id = Some(3);
    let by_id = batch(vec![EventRecord::Stored(by_id)]);
    assert!(
        matches!(by_id.events[0], Event::Stored(s) if s.lora == crate::index::Namespace::lora_id(3)),
        "an id without a name is the namespace"
    );
    let mut odd =
        StoredRecord::new(vec![1u64.into(), 2u64.into()], None, vec![1, 2, 3], B, Tier::Device);
    odd.extra_keys = vec![None, ExtraKey::image("mm-hash-1")];
    assert_eq!(
        shape(&batch(vec![EventRecord::Stored(odd)])),
        [(false, hs(&[1, 2]), 0)],
        "no split without whole blocks"
    );

    let record = BatchRecord {
        timestamp: 1.0,
        events: vec![store(&[1, 2], None, &[None, SALT], Tier::Host)],
        dp_rank: None,
    };
    let mut positional = Batch::default();
    decode_batch(&encode_batch(&record, BatchForm::Array, EventForm::Positional), &mut positional)
        .unwrap();
    assert_eq!(shape(&positional), [(true, hs(&[1]), 2), (false, hs(&[2]), 0)]);
}

#[test]
fn the_decoder_tells_a_salt_from_multimodal_and_embedding_keys() {
    use crate::wire::Event;
    // One block, parent `parent`, adapter `lora`, first entry `entry`, in both event forms:
    // `Some((lora tag, salt tag))` when indexed, `None` when out of scope.
    let decode = |parent: Option<u64>, lora: Option<&str>, entry: Vec<ExtraKey>| {
        let mut s = StoredRecord::new(vec![1u64.into()], None, vec![1, 2], B, Tier::Device);
        s.parent = parent.map(Into::into);
        s.lora_name = lora.map(str::to_string);
        s.extra_keys = vec![Some(entry)];
        let mut seen = Vec::new();
        for (bf, ef) in
            [(BatchForm::Map, EventForm::Map), (BatchForm::Array, EventForm::Positional)]
        {
            let events = vec![EventRecord::Stored(s.clone())];
            let record = BatchRecord { timestamp: 1.0, events, dp_rank: None };
            let mut b = Batch::default();
            decode_batch(&encode_batch(&record, bf, ef), &mut b).unwrap();
            seen.push(match b.events[..] {
                [Event::Stored(s)] => Some((s.lora, s.salt)),
                [Event::OutOfScope { .. }] => None,
                ref other => panic!("unexpected {other:?}"),
            });
        }
        assert_eq!(seen[0], seen[1], "map and positional forms agree");
        seen[0]
    };
    let text = |t: &str| ExtraKey::Text(t.into());
    let image = ExtraKey::Multimodal("mm-hash-1".into(), 0);
    let (salt, adapter) = (Namespace::salt(b"s"), Namespace::lora_name(b"adapter"));
    assert_eq!(decode(None, None, vec![text("s")]), Some((0, salt)), "a lone string: the salt");
    assert_eq!(
        decode(None, Some("adapter"), vec![text("adapter"), text("s")]),
        Some((adapter, salt)),
        "after the adapter's name"
    );
    assert_eq!(decode(None, Some("adapter"), vec![text("adapter")]), Some((adapter, 0)));
    assert_eq!(decode(Some(7), None, vec![text("s")]), None, "not a first block: unknown");
    assert_eq!(decode(None, None, vec![image.clone()]), None, "multimodal");
    assert_eq!(decode(None, None, vec![text("s"), image]), None, "salt and image");
    assert_eq!(decode(None, None, vec![ExtraKey::Bytes(vec![1; 32])]), None, "embeddings");
    assert_eq!(decode(None, None, vec![text("a"), text("b")]), None, "two strings");
}
