//! The naive model and the generators shared by the oracle property tests
//! (`index_oracle.rs`: one stream alone in a `SharedIndex`; `shared_oracle.rs`: many streams
//! in one). Random event sequences (stores, tokenless replicas, removals per tier,
//! clears, full-state batches, snapshots with orphans, limit hits, invalidations, the partial
//! mode) are resolved against the model and applied to both; the model is the spec. Blocks
//! that leave their last tier are retired in the model (never evicted: the index remembers at
//! least 4,096, far more than the 256 ids used here).

use kvdir::index::{IndexError, StreamWriter};
use kvdir::wire::{Batch, EngineHash, Tier};
use proptest::prelude::*;

mod model;
pub use model::*;

pub const B: u32 = 2;
pub const SEED: u64 = 1024;
pub const MAX_BLOCKS: usize = 16;

/// A block hash chosen at run time: an existing block of the model (most of the time), a
/// retired one, or any id from a small space, so that unknown parents, unknown hashes,
/// conflicts and aliases occur.
#[derive(Debug, Clone, Copy)]
pub enum Pick {
    Known(usize),
    Retired(usize),
    Any(u8),
}

/// One generated event, before its picks are resolved against the model.
#[derive(Debug, Clone)]
pub enum GenEv {
    Store { parent: Option<Pick>, hashes: Vec<u8>, tokens: Vec<i32>, tier: Tier },
    Tokenless { hashes: Vec<Pick>, tier: Tier },
    Remove { hashes: Vec<Pick>, tier: Tier },
    Clear(Option<Tier>),
}

/// One event with concrete hash ids.
#[derive(Debug, Clone)]
pub enum Ev {
    Store { parent: Option<u8>, hashes: Vec<u8>, tokens: Vec<i32>, tier: Tier },
    Tokenless { hashes: Vec<u8>, tier: Tier },
    Remove { hashes: Vec<u8>, tier: Tier },
    Clear(Option<Tier>),
}

#[derive(Debug, Clone)]
pub enum Op {
    Live(Vec<GenEv>),
    FullState(Vec<GenEv>),
    Snapshot(Vec<GenEv>),
    Invalidate,
    /// `set_partial(true)`.
    Partial,
    QueryKnown {
        pick: usize,
        extra: Vec<i32>,
    },
    Query(Vec<i32>),
}

pub fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Device), Just(Tier::Host)]
}

pub fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        30 => any::<usize>().prop_map(Pick::Known),
        3 => any::<usize>().prop_map(Pick::Retired),
        1 => (0u8..=255).prop_map(Pick::Any),
    ]
}

pub fn picks() -> impl Strategy<Value = Vec<Pick>> {
    prop::collection::vec(pick(), 1..4)
}

pub fn store() -> impl Strategy<Value = GenEv> {
    let parent = prop::option::weighted(0.6, pick());
    let hashes = prop::collection::vec(0u8..=255, 1..4);
    (parent, hashes, tier(), any::<u64>()).prop_map(|(parent, hashes, tier, seed)| {
        // Tokens from a 3-letter alphabet: equal content under different hashes happens.
        let n = hashes.len() * B as usize;
        let tokens = (0..n).map(|i| ((seed >> (2 * i)) % 3) as i32).collect();
        GenEv::Store { parent, hashes, tokens, tier }
    })
}

pub fn tokenless() -> impl Strategy<Value = GenEv> {
    (picks(), tier()).prop_map(|(hashes, tier)| GenEv::Tokenless { hashes, tier })
}

pub fn event() -> impl Strategy<Value = GenEv> {
    prop_oneof![
        6 => store(),
        2 => tokenless(),
        2 => (picks(), tier()).prop_map(|(hashes, tier)| GenEv::Remove { hashes, tier }),
        1 => prop::option::weighted(0.8, tier()).prop_map(GenEv::Clear),
    ]
}

pub fn op() -> impl Strategy<Value = Op> {
    let stores = prop::collection::vec(prop_oneof![3 => store(), 1 => tokenless()], 0..10);
    prop_oneof![
        8 => prop::collection::vec(event(), 1..4).prop_map(Op::Live),
        2 => stores.clone().prop_map(Op::FullState),
        2 => stores.prop_map(Op::Snapshot),
        1 => Just(Op::Invalidate),
        4 => Just(Op::Partial),
        6 => (any::<usize>(), prop::collection::vec(0i32..3, 0..5))
            .prop_map(|(pick, extra)| Op::QueryKnown { pick, extra }),
        1 => prop::collection::vec(0i32..3, 0..8).prop_map(Op::Query),
    ]
}

/// A concrete id for a pick; `None` when a known block was asked for and there is none.
pub fn resolve_pick(model: &Model, p: Pick) -> Option<u8> {
    match p {
        Pick::Known(_) if model.blocks.is_empty() => None,
        Pick::Known(i) => Some(*model.blocks.keys().nth(i % model.blocks.len()).unwrap()),
        Pick::Retired(_) if model.retired.is_empty() => None,
        Pick::Retired(i) => Some(*model.retired.keys().nth(i % model.retired.len()).unwrap()),
        Pick::Any(id) => Some(id),
    }
}

pub fn resolve(model: &Model, events: &[GenEv]) -> Vec<Ev> {
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

pub fn eh(id: u8) -> EngineHash {
    EngineHash(u128::from(id) * 0x1_0000_0001 + 7)
}

/// An unlimited clear followed only by stores (tokenless ones included).
pub fn is_full_state(events: &[Ev]) -> bool {
    matches!(events.first(), Some(Ev::Clear(None)))
        && events[1..].iter().all(|e| matches!(e, Ev::Store { .. } | Ev::Tokenless { .. }))
}

pub fn to_batch(events: &[Ev], full_state: bool) -> Batch {
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

/// What the generated cases exercised, so a degenerate generator fails the test.
#[derive(Debug, Default)]
pub struct Coverage {
    pub device_hits: u64,
    pub host_only_hits: u64,
    pub errors: std::collections::BTreeMap<&'static str, u64>,
    pub synced_checks: u64,
    /// Blocks skipped as unknown parents while partial, and retired blocks used.
    pub partial_skips: u64,
    pub retired_used: u64,
}

pub fn error_kind(e: &IndexError) -> &'static str {
    match e {
        IndexError::UnknownParent(_) => "unknown parent",
        IndexError::UnknownHash(_) => "unknown hash",
        IndexError::HashConflict(_) => "conflict",
        IndexError::LimitExceeded { .. } => "limit",
        IndexError::NotSynchronized(_) => "not synchronized",
        _ => "other",
    }
}

/// What an op did: the index's error, and the model's counts for [`Coverage`].
#[derive(Debug, Default)]
pub struct Applied {
    pub error: Option<IndexError>,
    pub unknown_parents: u64,
    pub retired_used: u64,
}

impl Applied {
    /// Adds this op's figures to the coverage.
    pub fn count(self, cov: &mut Coverage) {
        if let Some(e) = &self.error {
            *cov.errors.entry(error_kind(e)).or_default() += 1;
        }
        cov.partial_skips += self.unknown_parents;
        cov.retired_used += self.retired_used;
    }
}

pub fn apply_op(
    idx: &mut StreamWriter,
    model: &mut Model,
    op: &Op,
    seq: u64,
) -> Result<Applied, TestCaseError> {
    match op {
        Op::Live(gen) | Op::FullState(gen) => {
            let events = resolve(model, gen);
            let prepend = matches!(op, Op::FullState(_));
            let got = idx.apply(seq, &to_batch(&events, prepend)).map(|s| s.unknown_parents);
            let full = prepend || is_full_state(&events);
            let want = if model.synced || full {
                // A full state starts with AllBlocksCleared: nothing of the old model is left.
                let mut next =
                    if full { Model { synced: true, ..Model::default() } } else { model.clone() };
                let r = next.apply(&events, false).map(|()| next.unknown_parents);
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
                _ => prop_assert_eq!(&got, &want, "live {:?}", events),
            }
            let (unknown_parents, retired_used) = (*got.as_ref().unwrap_or(&0), model.retired_used);
            Ok(Applied { error: got.err(), unknown_parents, retired_used })
        }
        Op::Snapshot(gen) => {
            let events = resolve(model, gen);
            let got = idx.load_snapshot(&to_batch(&events, false), seq + 1).map(|_| ());
            let mut next = Model { synced: true, sequence: Some(seq), ..Model::default() };
            let want = next.apply(&events, true);
            if want.is_ok() {
                *model = next;
            } else {
                model.synced = false;
            }
            prop_assert_eq!(got.clone().map(|_| ()), want, "snapshot {:?}", events);
            Ok(Applied { error: got.err(), ..Applied::default() })
        }
        Op::Invalidate => {
            idx.invalidate("test");
            model.synced = false;
            Ok(Applied::default())
        }
        Op::Partial => {
            idx.set_partial(true);
            model.partial = true;
            Ok(Applied::default())
        }
        Op::QueryKnown { .. } | Op::Query(_) => Ok(Applied::default()),
    }
}

pub fn query_tokens(model: &Model, op: &Op) -> Vec<i32> {
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
