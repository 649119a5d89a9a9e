//! A hybrid stream's hit, by vLLM's rule (protocol.md, *Hybrid attention*): after the walk,
//! each synchronized hybrid stream's hit is computed again from its attention classes.
//!
//! vLLM (0.32, `HybridKVCacheCoordinator.find_longest_cache_hit`) starts from the longest hit a
//! prompt allows (its last token is always computed, so whole blocks within `n - 1` tokens),
//! lets each class, full attention first, cut it to what that class can serve within it, and
//! repeats until no class cuts. Full attention serves its contiguous cached prefix; a sliding
//! window of `w` tokens serves up to the end of the rightmost run of `cdiv(w - 1, block_size)`
//! consecutive cached blocks, scanning from the right, or, when there is no such run, the run
//! that starts at block 0. A class holds a block while each of its groups does. A stream with
//! a kind this rule does not model credits nothing.
//!
//! Tiers: the hit over blocks held on any tier is the stream's total; the same rule over
//! Device alone, within it, is its Device hit, and the rest is Host-only.

use super::super::groups::{class_key, AttentionClass};
use super::super::key::ContentKey;
use super::holders::SharedData;
use super::read::{Bits, SharedMatches};
use crate::wire::AttentionKind;

/// Which tiers count as holding a block.
#[derive(Clone, Copy)]
enum Held {
    AnyTier,
    Device,
}

/// One stream's classes, probed in the view.
struct Probe<'a> {
    data: &'a SharedData,
    keys: &'a [ContentKey],
    bit: u128,
    held: Held,
    block_size: u32,
}

impl Probe<'_> {
    fn holds(&self, i: usize, kind: AttentionKind) -> bool {
        let Some(h) = self.data.map.get(&class_key(self.keys[i], kind)) else { return false };
        let set = self.data.sets_of(*h);
        let tiers = match self.held {
            Held::AnyTier => set.device | set.host,
            Held::Device => set.device,
        };
        tiers & self.bit != 0
    }

    /// What class `class` serves of a hit of at most `max` blocks.
    fn class_hit(&self, class: &AttentionClass, max: usize) -> usize {
        match class.kind.window_blocks(self.block_size) {
            None => (0..max).take_while(|i| self.holds(*i, class.kind)).count(),
            Some(need) => self.window_hit(class.kind, need as usize, max),
        }
    }

    /// vLLM's `SlidingWindowManager.find_longest_cache_hit`, without EAGLE.
    fn window_hit(&self, kind: AttentionKind, need: usize, max: usize) -> usize {
        let mut run = 0;
        for i in (0..max).rev() {
            if self.holds(i, kind) {
                run += 1;
                if run >= need {
                    return i + run;
                }
            } else {
                run = 0;
            }
        }
        run
    }

    /// The classes' fixed point from `max` blocks.
    fn hit(&self, classes: &[AttentionClass], max: usize) -> usize {
        let mut hit = max;
        loop {
            let start = hit;
            for class in classes {
                hit = self.class_hit(class, hit);
            }
            if hit >= start {
                return hit;
            }
        }
    }
}

/// Whether some synchronized hybrid stream has no full-attention class: its hit is not
/// bounded by the walk, so the query's keys must be complete.
pub(super) fn needs_all_keys(data: &SharedData) -> bool {
    Bits(data.hybrid & data.synced)
        .any(|s| classes(data, s).first().is_some_and(|c| c.kind != AttentionKind::Full))
}

fn classes(data: &SharedData, slot: u8) -> &[AttentionClass] {
    match data.status.get(usize::from(slot)) {
        Some(Some(status)) => &status.attention,
        _ => &[],
    }
}

/// Replaces each synchronized hybrid stream's hit in `out` with its hit by vLLM's rule, for a
/// query of `keys` whose hit may be at most `max` blocks.
pub(super) fn rehit(data: &SharedData, keys: &[ContentKey], max: usize, out: &mut SharedMatches) {
    let block_size = out.block_size();
    for slot in Bits(data.hybrid & data.synced) {
        let classes = classes(data, slot);
        let unmodelled = classes.iter().any(|c| matches!(c.kind, AttentionKind::Unmodelled(_)));
        let (device, total) = if unmodelled || classes.is_empty() {
            (0, 0)
        } else {
            let bit = 1u128 << slot;
            let mut probe = Probe { data, keys, bit, held: Held::AnyTier, block_size };
            let total = probe.hit(classes, max.min(keys.len()));
            probe.held = Held::Device;
            (probe.hit(classes, total), total)
        };
        out.set(slot, device as u32, (total - device) as u32);
    }
}
