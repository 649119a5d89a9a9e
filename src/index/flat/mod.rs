//! A flat open-addressing hash table for the index's two big maps (engine hash -> block, and
//! content key -> presence).
//!
//! Why not `std::collections::HashMap`: both maps hold hundreds of thousands of entries that do
//! not fit in cache, so their cost is cache misses and bytes. The std table keeps its control
//! bytes apart from its entries (two misses per lookup) and sizes to a power of two (a stream of
//! 2^18 blocks sat in 2^19 slots, half empty). Here an entry is its own occupancy mark (a value
//! that [`Vacancy::is_vacant`] says is empty, which the index never stores), a key's home slot is
//! `hash * capacity >> 64` so any capacity works, and growth stops at the capacity the table's
//! entry limit needs. Collisions are resolved by Robin Hood linear probing: each run of entries
//! is kept in home order, so a lookup stops as soon as it passes where its key would be, and a
//! removal shifts back only the entries displaced behind it (no tombstones, so a stream that
//! stores and removes forever keeps short probes). [`FlatTable::prefetch`] lets a caller start
//! loading the home slots of the next keys while it works on the current one, so their misses
//! overlap with work instead of coming one after the other.

use std::fmt;

/// A key that hashes itself to 64 well-mixed bits.
pub(crate) trait FlatKey: Copy + Eq {
    /// The key stored in vacant slots (any value; vacancy is the value's).
    const FILLER: Self;
    fn hash64(&self) -> u64;
}

/// A value whose default is the empty-slot mark; the table never holds a vacant value.
pub(crate) trait Vacancy: Copy + Default {
    fn is_vacant(&self) -> bool;
}

/// Tables are at most `LOAD_NUM / LOAD_DEN` full (see `max_len`).
const LOAD_NUM: usize = 3;
const LOAD_DEN: usize = 4;

/// Tables are at most 3/4 full: a full table costs 4/3 slots per entry, and probes stay short
/// (a hit takes 2.5 slots on average at the fullest, far less after growth). At 4/5 the ingest
/// bench's applies were 15 % slower (the slots a new key shifts grow as 1 / (1 - load)^2); at
/// 7/10, 5 % faster for 7 % more bytes.
fn max_len(capacity: usize) -> usize {
    capacity / LOAD_DEN * LOAD_NUM + capacity % LOAD_DEN * LOAD_NUM / LOAD_DEN
}

/// The smallest capacity that holds `n` entries.
fn capacity_for(n: usize) -> usize {
    if n > usize::MAX / LOAD_DEN {
        return usize::MAX; // only a growth bound (`limit`) can be this large
    }
    n / LOAD_NUM * LOAD_DEN + (n % LOAD_NUM * LOAD_DEN).div_ceil(LOAD_NUM)
}

/// The smallest capacity a growing table takes.
const MIN_CAPACITY: usize = 16;

/// See the module documentation.
pub(crate) struct FlatTable<K, V> {
    slots: Vec<(K, V)>,
    len: usize,
    /// Entries the table is ever expected to hold (`max_blocks`): growth stops at the capacity
    /// for it instead of growing past it. Only a bound on growth steps, never on entries.
    limit: usize,
}

impl<K: FlatKey, V: Vacancy> FlatTable<K, V> {
    /// An empty table that will not grow past the capacity for `limit` entries unless it must.
    pub fn with_limit(limit: usize) -> Self {
        FlatTable { slots: Vec::new(), len: 0, limit }
    }

    /// An empty table with room for `n` entries before it grows.
    pub fn with_capacity(n: usize, limit: usize) -> Self {
        let cap = capacity_for(n.min(limit));
        FlatTable { slots: vec![(K::FILLER, V::default()); cap], len: 0, limit }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn home(&self, k: &K) -> usize {
        ((u128::from(k.hash64()) * self.slots.len() as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// How far `at` is past the home slot of `k`, wrapping around the end.
    fn dist(&self, k: &K, at: usize) -> usize {
        let home = self.home(k);
        if at >= home {
            at - home
        } else {
            at + self.slots.len() - home
        }
    }

    /// `Ok(slot)` of `k`, or `Err(slot)` where it would be inserted (`Err(0)` in a table with no
    /// slots). Runs are in home order, so the search stops at the first entry whose home is
    /// after `k`'s (it is nearer its home than `k` would be), or at a vacant slot.
    pub fn find(&self, k: &K) -> Result<usize, usize> {
        if self.slots.is_empty() {
            return Err(0);
        }
        let mut i = self.home(k);
        let mut d = 0;
        loop {
            let (key, v) = &self.slots[i];
            if v.is_vacant() {
                return Err(i);
            }
            if key == k {
                return Ok(i);
            }
            if self.dist(key, i) < d {
                return Err(i);
            }
            i = self.next(i);
            d += 1;
        }
    }

    pub fn get(&self, k: &K) -> Option<&V> {
        self.find(k).ok().map(|i| &self.slots[i].1)
    }

    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.find(k).ok().map(|i| &mut self.slots[i].1)
    }

    /// Slots in the table (occupied or not): the range of [`Self::slot_mut`].
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The value in slot `i`, if it is occupied (for a caller that walks the slots, such as a
    /// clock hand).
    pub fn slot_mut(&mut self, i: usize) -> Option<&mut V> {
        let v = &mut self.slots[i].1;
        (!v.is_vacant()).then_some(v)
    }

    /// The value in an occupied slot returned by [`Self::find`].
    pub fn at_mut(&mut self, slot: usize) -> &mut V {
        &mut self.slots[slot].1
    }

    /// Inserts `k`, known to be absent, at `at` (its `Err` from [`Self::find`] since the last
    /// change), growing first if the table is full, and returns its slot.
    pub fn insert_at(&mut self, at: usize, k: K, v: V) -> usize {
        debug_assert!(!v.is_vacant());
        let at = if self.len + 1 > max_len(self.slots.len()) {
            self.grow();
            self.find(&k).expect_err("inserted keys are absent")
        } else {
            at
        };
        self.place(at, k, v);
        self.len += 1;
        at
    }

    /// Writes `(k, v)` at `at`, moving the rest of the run one slot on (len unchanged).
    fn place(&mut self, at: usize, k: K, v: V) {
        let mut end = at;
        while !self.slots[end].1.is_vacant() {
            end = self.next(end);
        }
        while end != at {
            let prev = if end == 0 { self.slots.len() - 1 } else { end - 1 };
            self.slots[end] = self.slots[prev];
            end = prev;
        }
        self.slots[at] = (k, v);
    }

    /// Grows by half, not double: a table is then 1/2 to 3/4 full rather than 3/8 to 3/4. In
    /// the peer bench (128 streams in one shared index) that took the heap from 138 to 96-113
    /// bytes per (block, worker), for 5-10 % more ingest CPU (more, smaller rehashes).
    fn grow(&mut self) {
        *self = self.grown(self.len + 1);
    }

    /// Whether `extra` more entries fit without growing.
    pub fn has_room(&self, extra: usize) -> bool {
        self.len.saturating_add(extra) <= max_len(self.slots.len())
    }

    /// A copy with room for `extra` more entries, or `None` when this table has it already.
    /// The shared view builds it while readers still read this one, so they never wait for a
    /// rehash.
    pub fn grown_for(&self, extra: usize) -> Option<Self> {
        (!self.has_room(extra)).then(|| self.grown(self.len.saturating_add(extra)))
    }

    /// A copy with the capacity of the first growth step that holds `need` entries: whether a
    /// table grows one insert at a time or ahead of a whole batch, it goes through the same
    /// capacities (a step is half the capacity, and stops once at the capacity for `limit`).
    fn grown(&self, need: usize) -> Self {
        let at_limit = capacity_for(self.limit);
        let need_cap = capacity_for(need);
        let mut new_cap = self.slots.len();
        loop {
            let grown = (new_cap + new_cap / 2).max(MIN_CAPACITY);
            new_cap = if new_cap < at_limit { grown.min(at_limit) } else { grown };
            if new_cap >= need_cap {
                break;
            }
        }
        let slots = vec![(K::FILLER, V::default()); new_cap];
        let mut t = FlatTable { slots, len: self.len, limit: self.limit };
        for &(k, v) in &self.slots {
            if !v.is_vacant() {
                let at = t.find(&k).expect_err("keys are unique");
                t.place(at, k, v);
            }
        }
        t
    }

    /// Empties an occupied slot and moves the entries displaced behind it one slot back, up
    /// to a vacant slot or an entry in its home slot, so runs stay in home order without gaps.
    pub fn remove_at(&mut self, slot: usize) {
        let mut hole = slot;
        loop {
            let j = self.next(hole);
            let (k, v) = self.slots[j];
            if v.is_vacant() || self.dist(&k, j) == 0 {
                break;
            }
            self.slots[hole] = (k, v);
            hole = j;
        }
        self.slots[hole] = (K::FILLER, V::default());
        self.len -= 1;
    }

    /// Lets `f` update every value (seeing its key) and removes those for which it returns
    /// false (it must return false exactly when it leaves the value vacant).
    pub fn retain(&mut self, mut f: impl FnMut(&K, &mut V) -> bool) {
        let Some(start) = self.slots.iter().position(|(_, v)| v.is_vacant()) else { return };
        // From just after a vacant slot, a removal only pulls back entries not yet visited:
        // shifting stops at the first vacant slot, at the latest at `start`.
        let mut i = self.next(start);
        let mut left = self.slots.len() - 1;
        while left > 0 {
            let (k, v) = &mut self.slots[i];
            if !v.is_vacant() && !f(k, v) {
                self.remove_at(i);
                if !self.slots[i].1.is_vacant() {
                    continue; // an unvisited entry moved into `i`: visit it
                }
            }
            i = self.next(i);
            left -= 1;
        }
    }

    /// Removes every entry, keeping the capacity.
    pub fn clear(&mut self) {
        self.slots.fill((K::FILLER, V::default()));
        self.len = 0;
    }

    /// Starts loading the home slot of `k` (a hint: nothing waits for it), so that an
    /// operation on `k` a little later finds it in cache.
    #[inline]
    pub fn prefetch(&self, k: &K) {
        if !self.slots.is_empty() {
            kvdir_prefetch::prefetch(&self.slots[self.home(k)]);
        }
    }

    /// The entries, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots.iter().filter(|(_, v)| !v.is_vacant()).map(|(k, v)| (k, v))
    }
}

impl<K: FlatKey, V: Vacancy> Default for FlatTable<K, V> {
    fn default() -> Self {
        Self::with_limit(usize::MAX)
    }
}

impl<K: Copy, V: Copy> Clone for FlatTable<K, V> {
    fn clone(&self) -> Self {
        FlatTable { slots: self.slots.clone(), len: self.len, limit: self.limit }
    }

    /// Reuses this table's allocation: a view copy takes a whole snapshot map this way.
    fn clone_from(&mut self, source: &Self) {
        self.slots.clone_from(&source.slots);
        (self.len, self.limit) = (source.len, source.limit);
    }
}

impl<K: FlatKey + fmt::Debug, V: Vacancy + fmt::Debug> fmt::Debug for FlatTable<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests;
