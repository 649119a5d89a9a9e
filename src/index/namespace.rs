//! Content-key namespaces (protocol.md section 1.1): a LoRA adapter and a salt select the seed
//! of the content keys, so blocks cached under adapter A, adapter B, the base model or another
//! salt never share a key.
//!
//! A namespace is two 64-bit tags, 0 meaning "none". The seed of a namespace is the stream's
//! `hash_seed` when both tags are 0 (so base-model keys are exactly the golden vectors), and
//! otherwise `XXH3_64("kvdir-namespace-v1" ++ le_u64(lora) ++ le_u64(salt), seed = hash_seed)`.
//! Tags are XXH3-64 digests of the adapter name, the adapter id or the salt, each under its own
//! seed so that a name, an id and a salt with the same bytes never give the same tag.
//!
//! [`Keys`] is what the index writers hold: the hasher of the stream's own namespace (its
//! salt, no adapter) plus one cached hasher for the last adapter seen, since LoRA events of
//! one adapter tend to come together.

use super::key::KeyHasher;

/// Domain separation of [`Namespace::seed`].
const DOMAIN: &[u8] = b"kvdir-namespace-v1";
/// XXH3-64 seeds of the three kinds of tag.
const LORA_NAME_SEED: u64 = 1;
const LORA_ID_SEED: u64 = 2;
const SALT_SEED: u64 = 3;

/// A content-key namespace: LoRA adapter and salt tags (0 = none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Namespace {
    /// The adapter's tag ([`Namespace::lora_name`], [`Namespace::lora_id`]); 0 = base model.
    pub lora: u64,
    /// The salt's tag ([`Namespace::salt`]); 0 = no salt.
    pub salt: u64,
}

fn tag(bytes: &[u8], seed: u64) -> u64 {
    if bytes.is_empty() {
        return 0;
    }
    // 0 means "none"; a digest of 0 (probability 2^-64) is moved off it.
    xxhash_rust::xxh3::xxh3_64_with_seed(bytes, seed).max(1)
}

impl Namespace {
    /// The tag of a LoRA adapter name; `""` is the base model (0).
    pub fn lora_name(name: &[u8]) -> u64 {
        tag(name, LORA_NAME_SEED)
    }

    /// The tag of a LoRA adapter id, for events and queries that carry no name.
    pub fn lora_id(id: i64) -> u64 {
        tag(&id.to_le_bytes(), LORA_ID_SEED)
    }

    /// The tag of a salt; `""` is no salt (0).
    pub fn salt(salt: &[u8]) -> u64 {
        tag(salt, SALT_SEED)
    }

    /// The content-key seed of this namespace for a stream of `hash_seed`.
    pub fn seed(self, hash_seed: u64) -> u64 {
        if self == Namespace::default() {
            return hash_seed;
        }
        let mut input = [0u8; DOMAIN.len() + 16];
        input[..DOMAIN.len()].copy_from_slice(DOMAIN);
        input[DOMAIN.len()..DOMAIN.len() + 8].copy_from_slice(&self.lora.to_le_bytes());
        input[DOMAIN.len() + 8..].copy_from_slice(&self.salt.to_le_bytes());
        xxhash_rust::xxh3::xxh3_64_with_seed(&input, hash_seed)
    }
}

/// The hashers of one stream: its own namespace (salt, no adapter) and the last adapter's.
#[derive(Debug, Clone)]
pub struct Keys {
    hash_seed: u64,
    salt: u64,
    base: KeyHasher,
    lora: Option<(u64, KeyHasher)>,
}

impl Keys {
    /// The hashers for blocks of `block_size` under `hash_seed` and salt tag `salt`.
    pub fn new(block_size: u32, hash_seed: u64, salt: u64) -> Self {
        let seed = Namespace { lora: 0, salt }.seed(hash_seed);
        Keys { hash_seed, salt, base: KeyHasher::new(block_size, seed), lora: None }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.base.block_size()
    }

    /// The hasher of adapter tag `lora` (0: the stream's own namespace).
    pub fn hasher(&mut self, lora: u64) -> &mut KeyHasher {
        if lora == 0 {
            return &mut self.base;
        }
        if self.lora.as_ref().is_none_or(|(l, _)| *l != lora) {
            let seed = Namespace { lora, salt: self.salt }.seed(self.hash_seed);
            self.lora = Some((lora, KeyHasher::new(self.base.block_size() as u32, seed)));
        }
        &mut self.lora.as_mut().expect("set above").1
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
        let base = k.hasher(0).chain(None, &tokens);
        assert_eq!(base, keys(1024, &tokens)[0]);
        let a = Namespace::lora_name(b"a");
        let ka = k.hasher(a).chain(None, &tokens);
        assert_ne!(ka, base);
        assert_eq!(ka, keys(Namespace { lora: a, salt: 0 }.seed(1024), &tokens)[0]);
        let salted = Keys::new(4, 1024, Namespace::salt(b"s")).hasher(0).chain(None, &tokens);
        assert_ne!(salted, base);
    }
}
