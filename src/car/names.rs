//! [`NameMap`]: the router's maps keyed by instance name or [`InstanceId`], with a fast hash
//! ([`KeyMap`]: by content key).
//!
//! A decision over a thousand instances looks each of them up in several maps (its queued
//! work, its requests in flight, its predictions, its place in the snapshot). With std's
//! SipHash a lookup cost about 70 ns here, most of a decision's time per instance; the
//! multiply-rotate hash below (FxHash's) costs a few. Its weakness, keys crafted to collide,
//! does not apply: instance names come from the operator's registry and configuration, not
//! from clients.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

/// A map keyed by instance name.
pub type NameMap<K, V> = HashMap<K, V, BuildHasherDefault<NameHasher>>;

/// A map keyed by content key (`u128`; uniform already, so the same cheap hash serves).
pub type KeyMap<V> = HashMap<u128, V, BuildHasherDefault<NameHasher>>;

/// An instance's dense id: what the router keys its per-instance state by (work, requests in
/// flight, predictions), so that a decision hashes and compares a number, not a name. The
/// router gives each instance of its snapshot one, keeps it while the instance is known, and
/// gives a freed one to a later instance only after clearing its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(pub u32);

/// What per-instance state is keyed by: an instance's name (`str`) or its [`InstanceId`].
pub trait InstanceKey {
    /// The key as a map holds it.
    type Owned: Hash + Eq + Clone + Borrow<Self> + std::fmt::Debug;

    /// The key to hold.
    fn owned(&self) -> Self::Owned;
}

impl InstanceKey for str {
    /// Shared: a prediction queue holds an instance's name once per recorded key.
    type Owned = Arc<str>;

    fn owned(&self) -> Arc<str> {
        Arc::from(self)
    }
}

impl InstanceKey for InstanceId {
    type Owned = InstanceId;

    fn owned(&self) -> InstanceId {
        *self
    }
}

/// FxHash: each word rotated into the state and multiplied by a constant.
#[derive(Debug, Default, Clone, Copy)]
pub struct NameHasher(u64);

const K: u64 = 0x517c_c1b7_2722_0a95;

impl NameHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for NameHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last));
        }
    }

    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The product's low bits depend only on the low bits of the last word, which barely
        // vary between names that differ in a later byte ("engine-0001", "engine-0002"): the
        // table indexes by the low bits, so those would collide. The high bits mix them all.
        self.0.rotate_left(26)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_find_their_values_and_differ_in_hash() {
        let mut m: NameMap<String, usize> = NameMap::default();
        let names: Vec<String> = (0..5000).map(|i| format!("engine-{i:04}:8000")).collect();
        for (i, n) in names.iter().enumerate() {
            m.insert(n.clone(), i);
        }
        assert!(names.iter().enumerate().all(|(i, n)| m.get(n.as_str()) == Some(&i)));
        assert_eq!(m.get("engine-5000:8000"), None);
        let hash = |s: &str| {
            let mut h = NameHasher::default();
            h.write(s.as_bytes());
            h.finish()
        };
        let mut hashes: Vec<u64> = names.iter().map(|n| hash(n)).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), names.len(), "no two names collide");
    }
}
