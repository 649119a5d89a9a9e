//! Property test: random event sequences (stores, tokenless replicas, removals per tier, clears,
//! full-state batches, snapshots with orphans, limit hits, invalidations) drive the real index
//! and a small naive model side by side; every apply result, every query answer and every
//! count must agree.

use std::collections::BTreeMap;

use kvdir::index::{ContentKey, IndexConfig, IndexError, KeyHasher, StreamIndex, ViewHandle};
use kvdir::wire::{Batch, EngineHash, Tier};
use proptest::prelude::*;

const B: u32 = 2;
const SEED: u64 = 1024;
const MAX_BLOCKS: usize = 16;

/// A block hash chosen at run time: an existing block of the model (most of the time), or any
/// id from a small space, so that unknown parents, unknown hashes, conflicts and aliases occur.
#[derive(Debug, Clone, Copy)]
enum Pick {
    Known(usize),
    Any(u8),
}

/// One generated event, before its picks are resolved against the model.
#[derive(Debug, Clone)]
enum GenEv {
    Store { parent: Option<Pick>, hashes: Vec<u8>, tokens: Vec<i32>, tier: Tier },
    Tokenless { hashes: Vec<Pick>, tier: Tier },
    Remove { hashes: Vec<Pick>, tier: Tier },
    Clear(Option<Tier>),
}

/// One event with concrete hash ids.
#[derive(Debug, Clone)]
enum Ev {
    Store { parent: Option<u8>, hashes: Vec<u8>, tokens: Vec<i32>, tier: Tier },
    Tokenless { hashes: Vec<u8>, tier: Tier },
    Remove { hashes: Vec<u8>, tier: Tier },
    Clear(Option<Tier>),
}

#[derive(Debug, Clone)]
enum Op {
    Live(Vec<GenEv>),
    FullState(Vec<GenEv>),
    Snapshot(Vec<GenEv>),
    Invalidate,
    QueryKnown { pick: usize, extra: Vec<i32> },
    Query(Vec<i32>),
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Device), Just(Tier::Host)]
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![30 => any::<usize>().prop_map(Pick::Known), 1 => (0u8..=255).prop_map(Pick::Any)]
}

fn picks() -> impl Strategy<Value = Vec<Pick>> {
    prop::collection::vec(pick(), 1..4)
}

fn store() -> impl Strategy<Value = GenEv> {
    let parent = prop::option::weighted(0.6, pick());
    let hashes = prop::collection::vec(0u8..=255, 1..4);
    (parent, hashes, tier(), any::<u64>()).prop_map(|(parent, hashes, tier, seed)| {
        // Tokens from a 3-letter alphabet: equal content under different hashes happens.
        let n = hashes.len() * B as usize;
        let tokens = (0..n).map(|i| ((seed >> (2 * i)) % 3) as i32).collect();
        GenEv::Store { parent, hashes, tokens, tier }
    })
}

fn tokenless() -> impl Strategy<Value = GenEv> {
    (picks(), tier()).prop_map(|(hashes, tier)| GenEv::Tokenless { hashes, tier })
}

fn event() -> impl Strategy<Value = GenEv> {
    prop_oneof![
        6 => store(),
        2 => tokenless(),
        2 => (picks(), tier()).prop_map(|(hashes, tier)| GenEv::Remove { hashes, tier }),
        1 => prop::option::weighted(0.8, tier()).prop_map(GenEv::Clear),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let stores = prop::collection::vec(prop_oneof![3 => store(), 1 => tokenless()], 0..10);
    prop_oneof![
        8 => prop::collection::vec(event(), 1..4).prop_map(Op::Live),
        2 => stores.clone().prop_map(Op::FullState),
        2 => stores.prop_map(Op::Snapshot),
        1 => Just(Op::Invalidate),
        6 => (any::<usize>(), prop::collection::vec(0i32..3, 0..5))
            .prop_map(|(pick, extra)| Op::QueryKnown { pick, extra }),
        1 => prop::collection::vec(0i32..3, 0..8).prop_map(Op::Query),
    ]
}

/// A concrete id for a pick; `None` when a known block was asked for and there is none.
fn resolve_pick(model: &Model, p: Pick) -> Option<u8> {
    match p {
        Pick::Known(_) if model.blocks.is_empty() => None,
        Pick::Known(i) => Some(*model.blocks.keys().nth(i % model.blocks.len()).unwrap()),
        Pick::Any(id) => Some(id),
    }
}

fn resolve(model: &Model, events: &[GenEv]) -> Vec<Ev> {
    let many = |ps: &[Pick]| ps.iter().filter_map(|p| resolve_pick(model, *p)).collect();
    events
        .iter()
        .map(|e| match e {
            GenEv::Store { parent, hashes, tokens, tier } => Ev::Store {
                parent: parent.and_then(|p| resolve_pick(model, p)),
                hashes: hashes.clone(),
                tokens: tokens.clone(),
                tier: *tier,
            },
            GenEv::Tokenless { hashes, tier } => {
                Ev::Tokenless { hashes: many(hashes), tier: *tier }
            }
            GenEv::Remove { hashes, tier } => Ev::Remove { hashes: many(hashes), tier: *tier },
            GenEv::Clear(t) => Ev::Clear(*t),
        })
        .collect()
}

fn eh(id: u8) -> EngineHash {
    EngineHash(u128::from(id) * 0x1_0000_0001 + 7)
}

/// An unlimited clear followed only by stores (tokenless ones included).
fn is_full_state(events: &[Ev]) -> bool {
    matches!(events.first(), Some(Ev::Clear(None)))
        && events[1..].iter().all(|e| matches!(e, Ev::Store { .. } | Ev::Tokenless { .. }))
}

fn to_batch(events: &[Ev], full_state: bool) -> Batch {
    let mut b = Batch::default();
    if full_state {
        b.push_cleared(None);
    }
    for e in events {
        match e {
            Ev::Store { parent, hashes, tokens, tier } => {
                let hs: Vec<_> = hashes.iter().map(|h| eh(*h)).collect();
                b.push_stored(&hs, parent.map(eh), tokens, B, *tier);
            }
            Ev::Tokenless { hashes, tier } => {
                let hs: Vec<_> = hashes.iter().map(|h| eh(*h)).collect();
                b.push_stored(&hs, None, &[], B, *tier);
            }
            Ev::Remove { hashes, tier } => {
                let hs: Vec<_> = hashes.iter().map(|h| eh(*h)).collect();
                b.push_removed(&hs, *tier);
            }
            Ev::Clear(t) => b.push_cleared(*t),
        }
    }
    b
}

/// The naive content key: a fresh buffer per block, no reuse.
fn naive_key(prev: Option<u128>, block: &[i32]) -> u128 {
    let mut bytes = Vec::new();
    if let Some(p) = prev {
        bytes.extend_from_slice(&p.to_le_bytes());
    }
    for t in block {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_128_with_seed(&bytes, SEED)
}

#[derive(Debug, Clone, Default)]
struct ModelBlock {
    key: u128,
    device: bool,
    host: bool,
    /// The full token prefix ending with this block, to generate hitting queries.
    prefix: Vec<i32>,
}

#[derive(Debug, Clone, Default)]
struct Model {
    blocks: BTreeMap<u8, ModelBlock>,
    synced: bool,
    sequence: Option<u64>,
}

fn set(b: &mut ModelBlock, t: Tier, on: bool) {
    match t {
        Tier::Device => b.device = on,
        Tier::Host => b.host = on,
    }
}

impl Model {
    fn apply(&mut self, events: &[Ev], snapshot: bool) -> Result<(), IndexError> {
        for e in events {
            match e {
                Ev::Store { parent, hashes, tokens, tier } => {
                    self.store(*parent, hashes, tokens, *tier, snapshot)?
                }
                Ev::Tokenless { hashes, tier } => {
                    for h in hashes {
                        match self.blocks.get_mut(h) {
                            Some(b) => set(b, *tier, true),
                            None if snapshot => {}
                            None => return Err(IndexError::UnknownHash(eh(*h))),
                        }
                    }
                }
                Ev::Remove { hashes, tier } => {
                    for h in hashes {
                        if let Some(b) = self.blocks.get_mut(h) {
                            set(b, *tier, false);
                            if !b.device && !b.host {
                                self.blocks.remove(h);
                            }
                        }
                    }
                }
                Ev::Clear(None) => self.blocks.clear(),
                Ev::Clear(Some(t)) => {
                    for b in self.blocks.values_mut() {
                        set(b, *t, false);
                    }
                    self.blocks.retain(|_, b| b.device || b.host);
                }
            }
        }
        Ok(())
    }

    fn store(
        &mut self,
        parent: Option<u8>,
        hashes: &[u8],
        tokens: &[i32],
        tier: Tier,
        snapshot: bool,
    ) -> Result<(), IndexError> {
        let (mut prev, mut prefix) = match parent {
            None => (None, Vec::new()),
            Some(p) => match self.blocks.get(&p) {
                Some(b) => (Some(b.key), b.prefix.clone()),
                None if snapshot => return Ok(()),
                None => return Err(IndexError::UnknownParent(eh(p))),
            },
        };
        for (h, block) in hashes.iter().zip(tokens.chunks(B as usize)) {
            let key = naive_key(prev, block);
            prefix.extend_from_slice(block);
            let len = self.blocks.len();
            match self.blocks.get_mut(h) {
                Some(b) if b.key != key => return Err(IndexError::HashConflict(eh(*h))),
                Some(b) => set(b, tier, true),
                None if len >= MAX_BLOCKS => {
                    return Err(IndexError::LimitExceeded { limit: MAX_BLOCKS })
                }
                None => {
                    let mut b = ModelBlock { key, prefix: prefix.clone(), ..Default::default() };
                    set(&mut b, tier, true);
                    self.blocks.insert(*h, b);
                }
            }
            prev = Some(key);
        }
        Ok(())
    }

    fn hits(&self, tokens: &[i32]) -> (u64, u64) {
        let (mut dev, mut host, mut prev) = (0, 0, None);
        if !self.synced {
            return (0, 0);
        }
        for block in tokens.chunks_exact(B as usize) {
            let key = naive_key(prev, block);
            let on =
                |f: fn(&ModelBlock) -> bool| self.blocks.values().any(|b| b.key == key && f(b));
            if on(|b| b.device) {
                dev += u64::from(B);
            } else if on(|b| b.host) {
                host += u64::from(B);
            } else {
                break;
            }
            prev = Some(key);
        }
        (dev, host)
    }
}

fn query(view: &ViewHandle, tokens: &[i32]) -> (u64, u64) {
    let mut keys: Vec<ContentKey> = Vec::new();
    KeyHasher::new(B, SEED).prefix_keys(tokens, &mut keys);
    let m = view.match_prefix(&keys);
    (m.device_hit_tokens, m.host_only_hit_tokens)
}

/// What the generated cases exercised, so a degenerate generator fails the test.
#[derive(Debug, Default)]
struct Coverage {
    device_hits: u64,
    host_only_hits: u64,
    errors: std::collections::BTreeMap<&'static str, u64>,
    synced_checks: u64,
}

fn error_kind(e: &IndexError) -> &'static str {
    match e {
        IndexError::UnknownParent(_) => "unknown parent",
        IndexError::UnknownHash(_) => "unknown hash",
        IndexError::HashConflict(_) => "conflict",
        IndexError::LimitExceeded { .. } => "limit",
        IndexError::NotSynchronized(_) => "not synchronized",
        _ => "other",
    }
}

fn apply_op(
    idx: &mut StreamIndex,
    model: &mut Model,
    op: &Op,
    seq: u64,
) -> Result<Option<IndexError>, TestCaseError> {
    match op {
        Op::Live(gen) | Op::FullState(gen) => {
            let events = resolve(model, gen);
            let prepend = matches!(op, Op::FullState(_));
            let got = idx.apply(seq, &to_batch(&events, prepend));
            let full = prepend || is_full_state(&events);
            let want = if model.synced || full {
                let mut next =
                    if full { Model { synced: true, ..Model::default() } } else { model.clone() };
                let r = next.apply(&events, false);
                *model = next;
                model.synced = r.is_ok();
                if r.is_ok() {
                    model.sequence = Some(seq);
                }
                r
            } else {
                Err(IndexError::NotSynchronized(String::new()))
            };
            match (&got, &want) {
                (Err(IndexError::NotSynchronized(_)), Err(IndexError::NotSynchronized(_))) => {}
                _ => prop_assert_eq!(got.clone().map(|_| ()), want, "live {:?}", events),
            }
            Ok(got.err())
        }
        Op::Snapshot(gen) => {
            let events = resolve(model, gen);
            let got = idx.load_snapshot(&to_batch(&events, false), seq + 1);
            let mut next = Model { synced: true, sequence: Some(seq), ..Model::default() };
            let want = next.apply(&events, true);
            if want.is_ok() {
                *model = next;
            } else {
                model.synced = false;
            }
            prop_assert_eq!(got.clone().map(|_| ()), want, "snapshot {:?}", events);
            Ok(got.err())
        }
        Op::Invalidate => {
            idx.invalidate("test");
            model.synced = false;
            Ok(None)
        }
        Op::QueryKnown { .. } | Op::Query(_) => Ok(None),
    }
}

fn query_tokens(model: &Model, op: &Op) -> Vec<i32> {
    match op {
        Op::QueryKnown { pick, extra } if !model.blocks.is_empty() => {
            let b = model.blocks.values().nth(pick % model.blocks.len()).unwrap();
            let mut t = b.prefix.clone();
            t.extend_from_slice(extra);
            t
        }
        Op::Query(t) => t.clone(),
        _ => Vec::new(),
    }
}

fn run(ops: &[Op], cov: &mut Coverage) -> Result<(), TestCaseError> {
    let config = IndexConfig { block_size: B, hash_seed: SEED, max_blocks: MAX_BLOCKS };
    let mut idx = StreamIndex::new(config);
    let view = idx.reader().handle();
    idx.load_snapshot(&Batch::default(), 0).unwrap();
    let mut model = Model { synced: true, ..Model::default() };
    for (i, op) in ops.iter().enumerate() {
        let seq = i as u64 + 1;
        if let Some(e) = apply_op(&mut idx, &mut model, op, seq)? {
            *cov.errors.entry(error_kind(&e)).or_default() += 1;
        }
        idx.publish();
        let tokens = query_tokens(&model, op);
        let got = query(&view, &tokens);
        prop_assert_eq!(got, model.hits(&tokens), "query {:?} after {:?}", tokens, op);
        cov.device_hits += u64::from(got.0 > 0);
        cov.host_only_hits += u64::from(got.1 > 0);
        let status = view.status();
        prop_assert_eq!(status.synchronized, model.synced);
        if model.synced {
            cov.synced_checks += 1;
            let dev = model.blocks.values().filter(|b| b.device).count() as u64;
            let host = model.blocks.values().filter(|b| b.host).count() as u64;
            prop_assert_eq!((status.device_blocks, status.host_blocks), (dev, host));
            prop_assert_eq!(status.sequence, model.sequence);
            prop_assert_eq!(idx.block_count(), model.blocks.len());
            let distinct: std::collections::BTreeSet<u128> =
                model.blocks.values().map(|b| b.key).collect();
            prop_assert_eq!(view.content_entries(), distinct.len());
        }
    }
    Ok(())
}

#[test]
fn index_agrees_with_the_naive_model() {
    use proptest::test_runner::{Config, TestRunner};
    let cov = std::cell::RefCell::new(Coverage::default());
    let mut runner = TestRunner::new(Config { cases: 512, ..Config::default() });
    let result =
        runner.run(&prop::collection::vec(op(), 1..80), |ops| run(&ops, &mut cov.borrow_mut()));
    if let Err(e) = result {
        panic!("{e}");
    }
    let cov = cov.into_inner();
    println!("coverage: {cov:?}");
    // The generator must keep reaching the interesting states, or this test proves little.
    assert!(cov.device_hits > 500 && cov.host_only_hits > 300, "{cov:?}");
    for kind in ["unknown parent", "unknown hash", "conflict", "limit", "not synchronized"] {
        assert!(cov.errors.get(kind).copied().unwrap_or(0) > 20, "too few {kind} errors: {cov:?}");
    }
    assert!(cov.synced_checks > 5_000, "{cov:?}");
}
