//! Property test of hybrid streams: random requests, removals and clears of a model with a
//! full-attention group and two sliding-window groups (one class), published as vLLM 0.32
//! does (each window group lists only the blocks its mask keeps, with the token ids of the
//! whole range, before the full group's store), drive one stream in a `SharedIndex`; a naive
//! model keeps the copies per (hash, group) and applies vLLM's rule. Every query's credit must
//! equal the model's: never more (an over-credit), and never less while every window block is
//! located by a full store.

use std::collections::HashMap;

use kvdir::index::{IndexConfig, SharedIndex};
use kvdir::wire::{AttentionKind, Batch, EngineHash, Group, Tier};
use proptest::prelude::*;

const B: u32 = 2;
const SEED: u64 = 1024;
/// The window: 4 tokens, so `cdiv(3, 2) = 2` blocks in a row.
const WINDOW: u32 = 4;
const NEED: usize = 2;
/// Prompts: three conversations of 10 blocks; the second shares the first's first 4 blocks.
const PROMPTS: usize = 3;
const BLOCKS: usize = 10;

fn tokens_of(p: usize) -> Vec<i32> {
    (0..BLOCKS * B as usize)
        .map(|i| if p == 1 && i < 8 { i as i32 } else { (p * 1000 + i) as i32 })
        .collect()
}

/// The engine hash of block `i` of prompt `p`: a function of the prefix, as vLLM's.
fn hash_of(p: usize, i: usize) -> u128 {
    let t = tokens_of(p);
    let prefix = &t[..(i + 1) * B as usize];
    prefix.iter().fold(0xcbf2_9ce4_8422_2325u128, |h, v| {
        (h ^ (*v as u128 + 1)).wrapping_mul(0x1000_0000_01b3)
    })
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of prompt `p`, `len` blocks, of which `from` were cached; the window groups
    /// keep the blocks of their masks.
    Request {
        p: usize,
        len: usize,
        from: usize,
        mask1: u16,
        mask2: u16,
    },
    /// One copy of block `i` of prompt `p` leaves `group`.
    Remove {
        p: usize,
        i: usize,
        group: u32,
    },
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..PROMPTS, 1..=BLOCKS, 0..BLOCKS, mask(), mask()).prop_map(
            |(p, len, from, mask1, mask2)| Op::Request { p, len, from, mask1, mask2 }
        ),
        4 => (0..PROMPTS, 0..BLOCKS, 0..3u32).prop_map(|(p, i, group)| Op::Remove { p, i, group }),
        1 => Just(Op::Clear),
    ]
}

/// A window group's mask: each block kept with probability 7/8, or every block (dense
/// retention).
fn mask() -> impl Strategy<Value = u16> {
    prop_oneof![
        3 => (any::<u16>(), any::<u16>(), any::<u16>()).prop_map(|(a, b, c)| a | b | c),
        1 => Just(u16::MAX),
    ]
}

/// The naive model: copies per (hash, group), and the blocks kvdir can key (stored since the
/// last clear, resident or not).
#[derive(Default)]
struct Model {
    copies: HashMap<(u128, u32), u32>,
    known: HashMap<u128, ()>,
}

impl Model {
    fn holds(&self, h: u128, group: u32) -> bool {
        self.copies.get(&(h, group)).is_some_and(|n| *n > 0)
    }

    /// vLLM's hit for `n` tokens of prompt `p`, in tokens.
    fn hit(&self, p: usize, n: usize) -> u64 {
        let max = n.saturating_sub(1) / B as usize;
        let full = (0..max).take_while(|i| self.holds(hash_of(p, *i), 1)).count();
        let window = |i: usize| self.holds(hash_of(p, i), 0) && self.holds(hash_of(p, i), 2);
        let mut run = 0;
        for i in (0..full).rev() {
            if window(i) {
                run += 1;
                if run >= NEED {
                    return ((i + run) * B as usize) as u64;
                }
            } else {
                run = 0;
            }
        }
        (run * B as usize) as u64
    }
}

fn group(idx: u32) -> Group {
    let kind = if idx == 1 {
        AttentionKind::Full
    } else {
        AttentionKind::SlidingWindow { window: WINDOW }
    };
    Group { idx, kind: Some(kind) }
}

/// The batch vLLM would publish for `op`, applied to the model; `None` when the op cannot
/// happen (a request resuming after a block kvdir never keyed, a removal of no copy).
fn publish(op: &Op, m: &mut Model) -> Option<Batch> {
    let mut b = Batch::default();
    match *op {
        Op::Request { p, len, from, mask1, mask2 } => {
            if from >= len || (from > 0 && !m.known.contains_key(&hash_of(p, from - 1))) {
                return None;
            }
            let t = tokens_of(p);
            let range = &t[from * B as usize..len * B as usize];
            let parent = (from > 0).then(|| EngineHash(hash_of(p, from - 1)));
            for (g, mask) in [(0, mask1), (1, u16::MAX), (2, mask2)] {
                let kept: Vec<usize> = (from..len).filter(|i| mask & (1 << i) != 0).collect();
                let hashes: Vec<EngineHash> =
                    kept.iter().map(|i| EngineHash(hash_of(p, *i))).collect();
                for i in &kept {
                    *m.copies.entry((hash_of(p, *i), g)).or_default() += 1;
                    m.known.insert(hash_of(p, *i), ());
                }
                b.push_stored_by(&hashes, parent, range, B, Tier::Device, group(g));
            }
        }
        Op::Remove { p, i, group: g } => {
            let n = m.copies.get_mut(&(hash_of(p, i), g)).filter(|n| **n > 0)?;
            *n -= 1;
            b.push_removed_from(
                &[EngineHash(hash_of(p, i))],
                Tier::Device,
                Group { idx: g, kind: None },
            );
        }
        Op::Clear => {
            m.copies.clear();
            m.known.clear();
            b.push_cleared(None);
        }
    }
    Some(b)
}

fn run(ops: &[Op], checks: &mut u64, credited: &mut u64) -> Result<(), TestCaseError> {
    let config = IndexConfig { block_size: B, hash_seed: SEED, salt: 0, max_blocks: 4096 };
    let shared = SharedIndex::new(B, SEED, 1);
    let mut idx = shared.add_stream(config).unwrap();
    let (mut view, slot) = (shared.reader().handle(), idx.slot());
    idx.load_snapshot(&Batch::default(), 0).unwrap();
    idx.publish();
    let mut model = Model::default();
    let mut seq = 1;
    for op in ops {
        let Some(batch) = publish(op, &mut model) else { continue };
        idx.apply(seq, &batch).map_err(|e| TestCaseError::fail(format!("{op:?}: {e}")))?;
        idx.publish();
        seq += 1;
        for p in 0..PROMPTS {
            let t = tokens_of(p);
            for n in [3, 8, 9, 12, 17, 20] {
                let (device, host) = view.query(&t[..n]).tokens(slot);
                let want = model.hit(p, n);
                prop_assert_eq!(
                    (device, host),
                    (want, 0),
                    "prompt {} of {} tokens after {:?}",
                    p,
                    n,
                    op
                );
                *checks += 1;
                *credited += u64::from(want > 0);
            }
        }
    }
    let status = view.status(slot).expect("present");
    prop_assert!(status.synchronized, "{:?}", status.error);
    prop_assert_eq!(status.unlocated_blocks, 0, "every window store came with its full store");
    Ok(())
}

#[test]
fn hybrid_credit_agrees_with_vllms_rule() {
    use proptest::test_runner::{Config, TestRunner};
    let counts = std::cell::RefCell::new((0u64, 0u64));
    let mut runner = TestRunner::new(Config { cases: 256, ..Config::default() });
    let strategy = prop::collection::vec(op(), 1..40);
    runner
        .run(&strategy, |ops| {
            let (checks, credited) = &mut *counts.borrow_mut();
            run(&ops, checks, credited)
        })
        .unwrap();
    let (checks, credited) = counts.into_inner();
    // The cases must exercise credit, not only zeros.
    assert!(credited * 10 > checks, "{credited} of {checks} queries credited something");
}
