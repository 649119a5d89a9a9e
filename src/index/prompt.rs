//! [`PromptKeys`]: one query's content keys, hashed once and shared by every shared index of
//! one `(block_size, hash_seed)` that the query walks.
//!
//! A fleet of more than [`super::MAX_STREAMS`] streams of one block size lives in several
//! shared indexes (128 streams each). Hashing the prompt once per index cost a 4,096-stream
//! query 32 hashing passes; with these keys a query hashes each block at most once: an index's
//! walk reads the keys hashed so far and hashes further blocks only when one of its streams
//! may still match them (see `shared/read.rs`), so the keys end as far as the deepest walk
//! went. The engines without KV events (approximate credit) take the completed keys.
//!
//! Invariant: the keys are a prefix of the keys of the tokens given since the last
//! [`PromptKeys::start`], in its namespace; the caller passes the same tokens until the next
//! start.

use super::key::{ContentKey, KeyHasher, TokenId};
use crate::wire::Namespace;

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct PromptKeys {
    block_size: u32,
    hash_seed: u64,
    /// The default namespace's hasher.
    hasher: KeyHasher,
    /// The hasher of the last other namespace a query named.
    namespaced: Option<(Namespace, KeyHasher)>,
    /// The namespace of the current query.
    ns: Namespace,
    keys: Vec<ContentKey>,
}

impl PromptKeys {
    /// Keys for blocks of `block_size` tokens under `hash_seed`, in the default namespace.
    pub fn new(block_size: u32, hash_seed: u64) -> Self {
        PromptKeys {
            block_size,
            hash_seed,
            hasher: KeyHasher::new(block_size, hash_seed),
            namespaced: None,
            ns: Namespace::default(),
            keys: Vec::new(),
        }
    }

    /// The block size and seed the keys are for.
    pub fn settings(&self) -> (u32, u64) {
        (self.block_size, self.hash_seed)
    }

    /// Starts a new query in namespace `ns` (a LoRA adapter, a salt): no key yet.
    pub fn start(&mut self, ns: Namespace) {
        self.keys.clear();
        self.ns = ns;
        if ns != Namespace::default() && self.namespaced.as_ref().is_none_or(|(n, _)| *n != ns) {
            self.namespaced = Some((ns, ns.hasher(self.block_size, self.hash_seed)));
        }
    }

    /// The keys hashed so far: those of the query's first blocks.
    pub fn keys(&self) -> &[ContentKey] {
        &self.keys
    }

    /// Hashes at most `max` further complete blocks of `tokens`; returns how many.
    pub fn extend<T: TokenId>(&mut self, tokens: &[T], max: usize) -> usize {
        let hasher = match &mut self.namespaced {
            Some((n, h)) if *n == self.ns => h,
            _ => &mut self.hasher,
        };
        hasher.extend_keys(tokens, &mut self.keys, max)
    }

    /// Every complete block's key of `tokens`, hashing those not hashed yet.
    pub fn complete<T: TokenId>(&mut self, tokens: &[T]) -> &[ContentKey] {
        self.extend(tokens, usize::MAX);
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_extend_to_the_same_chain_in_any_steps_and_restart_per_query() {
        let tokens: Vec<i32> = (0..40).collect();
        let mut whole = Vec::new();
        KeyHasher::new(4, 7).prefix_keys(&tokens, &mut whole);
        let mut k = PromptKeys::new(4, 7);
        k.start(Namespace::default());
        assert_eq!(k.extend(&tokens, 3), 3);
        assert_eq!(k.keys(), &whole[..3]);
        assert_eq!(k.complete(&tokens), &whole[..], "continued from the third key");
        assert_eq!(k.extend(&tokens, 5), 0, "nothing left to hash");
        k.start(Namespace::default());
        assert!(k.keys().is_empty());
    }

    #[test]
    fn a_namespace_keys_apart_until_the_next_start() {
        let tokens: Vec<i32> = (0..16).collect();
        let ns = Namespace { lora: 0, salt: Namespace::salt(b"tenant-a") };
        let mut want = Vec::new();
        ns.hasher(4, 7).prefix_keys(&tokens, &mut want);
        let mut k = PromptKeys::new(4, 7);
        k.start(ns);
        k.extend(&tokens, 1);
        assert_eq!(k.complete(&tokens), &want[..]);
        k.start(Namespace::default());
        let mut plain = Vec::new();
        KeyHasher::new(4, 7).prefix_keys(&tokens, &mut plain);
        assert_eq!(k.complete(&tokens), &plain[..]);
        assert_ne!(plain, want);
    }
}
