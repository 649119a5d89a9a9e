//! The changes that take the shared view from one stream's old contents to its new ones (a
//! snapshot install).
//!
//! The view is locked while changes apply, so an install of a stream that readers see (a
//! periodic resync) should send what differs, not the removal of everything and the addition
//! of everything: a resync finds the stream mostly as it was. The view counts, per (key, stream,
//! tier), the stream's resident engine blocks with that content, so any set of changes that
//! takes each count from its old value to its new one gives the same view; the changes below
//! are, per (key, tier), `new - old` additions or `old - new` removals, never both.

use std::collections::HashMap;

use super::super::apply::Change;
use super::super::apply::Table;
use super::super::key::ContentKey;
use crate::wire::Tier;

/// Appends the changes from `old` to `new` (see the module documentation).
pub(crate) fn changes_between(old: &Table, new: &Table, out: &mut Vec<Change>) {
    if old.len() == 0 || new.len() == 0 {
        // Nothing to pair: all of the old go, all of the new come (either may be empty).
        old.changes_of_all(false, out);
        new.changes_of_all(true, out);
        return;
    }
    let mut scratch = Vec::with_capacity(old.len().max(new.len()));
    let mut delta: HashMap<ContentKey, [i32; 2]> = HashMap::with_capacity(new.len());
    old.changes_of_all(false, &mut scratch);
    count(&scratch, &mut delta);
    scratch.clear();
    new.changes_of_all(true, &mut scratch);
    count(&scratch, &mut delta);
    for (key, d) in delta {
        for (tier, n) in [(Tier::Device, d[0]), (Tier::Host, d[1])] {
            let change = Change { key, tier, add: n > 0 };
            out.extend(std::iter::repeat_n(change, n.unsigned_abs() as usize));
        }
    }
}

fn count(changes: &[Change], delta: &mut HashMap<ContentKey, [i32; 2]>) {
    for c in changes {
        let d = delta.entry(c.key).or_default();
        d[usize::from(c.tier == Tier::Host)] += if c.add { 1 } else { -1 };
    }
}
