//! Content keys in a namespace (protocol.md section 1.1). The [`Namespace`] itself, its tags and
//! its seed are the wire's (`crate::wire::namespace`: the decoder tags events as it reads
//! them); here is how a namespace keys blocks. A salt seeds only the first block of a prefix
//! ([`Namespace::hasher`]); an adapter seeds every block.
//!
//! [`Keys`] is what the index writers hold: the hasher of the stream's own namespace (its
//! salt, no adapter) plus one cached hasher for the last other namespace seen, since LoRA or
//! salted events of one namespace tend to come together.

use super::key::KeyHasher;
use crate::wire::Namespace;

impl Namespace {
    /// The key hasher of this namespace for blocks of `block_size` under `hash_seed`: a prefix's
    /// first block is keyed with [`Namespace::seed`], the blocks after it with the seed of the
    /// adapter alone. The salt thus enters only the first key, as vLLM's `cache_salt` enters
    /// only a request's first block hash, and the blocks chained to it stay apart by chaining.
    pub fn hasher(self, block_size: u32, hash_seed: u64) -> KeyHasher {
        let chain = Namespace { lora: self.lora, salt: 0 }.seed(hash_seed);
        KeyHasher::with_root_seed(block_size, self.seed(hash_seed), chain)
    }
}

/// The hashers of one stream: its own namespace (its salt, no adapter) and the last other
/// namespace an event named (an adapter, a request's salt).
#[derive(Debug, Clone)]
pub struct Keys {
    hash_seed: u64,
    salt: u64,
    base: KeyHasher,
    other: Option<(Namespace, KeyHasher)>,
}

impl Keys {
    /// The hashers for blocks of `block_size` under `hash_seed` and salt tag `salt`.
    pub fn new(block_size: u32, hash_seed: u64, salt: u64) -> Self {
        let base = Namespace { lora: 0, salt }.hasher(block_size, hash_seed);
        Keys { hash_seed, salt, base, other: None }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.base.block_size()
    }

    /// The hasher of adapter tag `lora` and salt tag `salt`; 0 for either means none, and a
    /// salt of 0 is the stream's own.
    pub fn hasher(&mut self, lora: u64, salt: u64) -> &mut KeyHasher {
        let ns = Namespace { lora, salt: if salt == 0 { self.salt } else { salt } };
        if ns == (Namespace { lora: 0, salt: self.salt }) {
            return &mut self.base;
        }
        if self.other.as_ref().is_none_or(|(n, _)| *n != ns) {
            let block_size = self.base.block_size() as u32;
            self.other = Some((ns, ns.hasher(block_size, self.hash_seed)));
        }
        &mut self.other.as_mut().expect("set above").1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::ContentKey;

    fn keys(seed: u64, tokens: &[i32]) -> Vec<ContentKey> {
        let mut out = Vec::new();
        KeyHasher::new(4, seed).prefix_keys(tokens, &mut out);
        out
    }

    #[test]
    fn the_empty_namespace_is_the_hash_seed_itself() {
        assert_eq!(Namespace::default().seed(1024), 1024);
        assert_eq!(
            Namespace { lora: Namespace::lora_name(b""), salt: Namespace::salt(b"") },
            Namespace::default()
        );
    }

    #[test]
    fn adapters_salts_and_ids_get_distinct_seeds() {
        let a = Namespace { lora: Namespace::lora_name(b"adapter-a"), salt: 0 };
        let b = Namespace { lora: Namespace::lora_name(b"adapter-b"), salt: 0 };
        let s = Namespace { lora: 0, salt: Namespace::salt(b"adapter-a") };
        let id = Namespace { lora: Namespace::lora_id(7), salt: 0 };
        let seeds = [Namespace::default(), a, b, s, id].map(|n| n.seed(1024));
        for i in 0..seeds.len() {
            for j in i + 1..seeds.len() {
                assert_ne!(seeds[i], seeds[j], "namespaces {i} and {j}");
            }
        }
        assert_ne!(a.seed(1024), a.seed(1025), "the hash_seed still matters");
    }

    #[test]
    fn golden_vector_of_a_namespaced_key() {
        let ns = Namespace { lora: Namespace::lora_name(b"adapter-a"), salt: 0 };
        let tokens: Vec<i32> = (1..=8).collect();
        let got: Vec<String> =
            keys(ns.seed(1024), &tokens).iter().map(|k| format!("{k:?}")).collect();
        assert_eq!(got, ["cb637646265beba5b810f4d5ccb9d659", "daff586a621357f7e2101cd2466f5bd4"]);
    }

    #[test]
    fn keys_cache_the_last_adapter_and_keep_the_base() {
        let mut k = Keys::new(4, 1024, 0);
        let tokens = [1, 2, 3, 4];
        let base = k.hasher(0, 0).chain(None, &tokens);
        assert_eq!(base, keys(1024, &tokens)[0]);
        let a = Namespace::lora_name(b"a");
        let ka = k.hasher(a, 0).chain(None, &tokens);
        assert_ne!(ka, base);
        assert_eq!(ka, keys(Namespace { lora: a, salt: 0 }.seed(1024), &tokens)[0]);
        let salted = Keys::new(4, 1024, Namespace::salt(b"s")).hasher(0, 0).chain(None, &tokens);
        assert_ne!(salted, base);
        let s = Namespace::salt(b"s");
        assert_eq!(k.hasher(0, s).chain(None, &tokens), salted, "an event's salt, as a stream's");
    }

    #[test]
    fn a_salt_seeds_the_first_block_and_the_rest_chain_from_it() {
        let tokens: Vec<i32> = (1..=8).collect();
        let s = Namespace { lora: 0, salt: Namespace::salt(b"tenant-7") };
        let mut got = Vec::new();
        s.hasher(4, 1024).prefix_keys(&tokens, &mut got);
        let base = keys(1024, &tokens);
        let first = keys(s.seed(1024), &tokens[..4])[0];
        assert_eq!(got[0], first, "the first block under the salted seed");
        assert_eq!(got[1], KeyHasher::new(4, 1024).chain(Some(first), &tokens[4..]));
        assert!(got[0] != base[0] && got[1] != base[1], "every key differs from the base's");
        let hex: Vec<String> = got.iter().map(|k| format!("{k:?}")).collect();
        assert_eq!(hex, ["2f8727f584234a8e7b266405674d84e2", "5711f495d303b33f28f7ccc36840609e"]);
    }
}
