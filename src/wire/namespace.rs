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
//! It is the wire's because the decoder tags each event as it reads it; the index keys blocks
//! with it (`Namespace::hasher`, in `crate::index`), and the golden vectors are tested there.

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
