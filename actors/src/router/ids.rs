//! [`Ids`]: each instance of the router's snapshot gets a dense [`InstanceId`], which keys its
//! work, requests in flight and predictions, so that a decision hashes a number rather than a
//! name. An id is kept by name from one snapshot to the next while the instance is known. An
//! instance that leaves gives its id back only after the router cleared that id's state
//! ([`Ids::assign`] then [`Ids::release`]), so a later instance never inherits its queue or
//! its predictions. The front door's progress messages name the instance; a name no longer
//! known has no id, and a request to an instance that left is simply not counted any more.

use kvdir::car::{InstanceId, NameMap};

/// The ids of the snapshot's instances.
#[derive(Debug, Default)]
pub(super) struct Ids {
    by_name: NameMap<String, InstanceId>,
    /// By position in the snapshot.
    of: Vec<InstanceId>,
    /// By id: the position of its instance (`usize::MAX` when free).
    at: Vec<usize>,
    /// Ids whose state was cleared, to give again.
    free: Vec<InstanceId>,
}

impl Ids {
    /// Gives each of `names` (the new snapshot, in position order) its id: its own if it had one,
    /// else a released one or a new one. Returns the ids of the instances that left, whose
    /// state the caller clears before [`Self::release`].
    pub fn assign<'a>(&mut self, names: impl Iterator<Item = &'a str>) -> Vec<InstanceId> {
        let mut old = std::mem::take(&mut self.by_name);
        self.of.clear();
        self.at.iter_mut().for_each(|p| *p = usize::MAX);
        for (position, name) in names.enumerate() {
            let id = match old.remove(name) {
                Some(id) => id,
                None => self.free.pop().unwrap_or_else(|| {
                    self.at.push(usize::MAX);
                    InstanceId(self.at.len() as u32 - 1)
                }),
            };
            self.at[id.0 as usize] = position;
            self.of.push(id);
            self.by_name.insert(name.to_string(), id);
        }
        old.into_values().collect()
    }

    /// Ids whose state is cleared: given again from now on.
    pub fn release(&mut self, ids: Vec<InstanceId>) {
        self.free.extend(ids);
    }

    /// The id of the instance at `position`.
    pub fn at(&self, position: usize) -> InstanceId {
        self.of[position]
    }

    /// The id of the instance `name`, if it is known.
    pub fn of(&self, name: &str) -> Option<InstanceId> {
        self.by_name.get(name).copied()
    }

    /// The position of the instance with `id`, if one has it.
    pub fn position(&self, id: InstanceId) -> Option<usize> {
        self.at.get(id.0 as usize).copied().filter(|&p| p != usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_kept_by_name_and_given_again_only_after_its_release() {
        let mut ids = Ids::default();
        assert!(ids.assign(["a", "b", "c"].into_iter()).is_empty());
        let (a, b, c) = (ids.of("a").unwrap(), ids.of("b").unwrap(), ids.of("c").unwrap());
        assert_eq!((ids.at(0), ids.position(c)), (a, Some(2)));
        // b leaves, d arrives: d gets a new id, since b's state is not cleared yet.
        let gone = ids.assign(["c", "a", "d"].into_iter());
        assert_eq!(gone, [b]);
        assert_eq!((ids.of("a"), ids.of("c"), ids.position(a)), (Some(a), Some(c), Some(1)));
        let d = ids.of("d").unwrap();
        assert!(![a, b, c].contains(&d));
        assert_eq!((ids.of("b"), ids.position(b)), (None, None));
        ids.release(gone);
        assert!(ids.assign(["c", "a", "d", "e"].into_iter()).is_empty());
        assert_eq!(ids.of("e"), Some(b), "a released id is given again");
    }
}
