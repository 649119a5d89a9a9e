//! Content keys: the directory's own 128-bit key for each complete block (protocol.md section 1).
//!
//! `key(0) = XXH3_128(le_i32(tokens[0..B]), seed)` and
//! `key(i) = XXH3_128(key(i-1).to_le_bytes() ++ le_i32(tokens[iB..(i+1)B]), seed)`.
//! The key of a block therefore depends on every token before it, which is what makes a walk
//! over a query's keys a prefix match. One call over a reused `16 + 4B` byte buffer is about
//! twice as fast as the streaming API for the same digest (dependencies.md).
//!
//! For inputs over 240 bytes (every block from `B = 60` up) XXH3 with a seed first derives a
//! 192-byte secret from the seed, on every call; [`KeyHasher`] derives it once and passes it
//! in, which XXH3 defines to give the same digest (the test below checks it against the
//! seeded call).

use std::fmt;
use std::hash::{Hash, Hasher};

/// A block's content key, stored as `u128::to_le_bytes()` so that map entries need no 16-byte
/// alignment padding.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ContentKey(pub [u8; 16]);

impl ContentKey {
    /// The key as a number.
    pub fn to_u128(self) -> u128 {
        u128::from_le_bytes(self.0)
    }

    /// A key from its numeric value.
    pub fn from_u128(v: u128) -> Self {
        ContentKey(v.to_le_bytes())
    }
}

impl Hash for ContentKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0);
    }
}

impl fmt::Debug for ContentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// XXH3's default secret (`XXH3_kSecret` of the reference implementation).
const DEFAULT_SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

/// Inputs longer than this take XXH3's long path, the only one where a seed and the secret
/// derived from it give the same digest.
const MID_SIZE_MAX: usize = 240;

/// The secret XXH3 derives from `seed` for long inputs (`XXH3_initCustomSecret`): each 16-byte
/// lane of the default secret with the seed added to its low half and subtracted from its high.
fn seeded_secret(seed: u64) -> [u8; 192] {
    let mut out = DEFAULT_SECRET;
    for lane in out.chunks_exact_mut(16) {
        let (lo, hi) = lane.split_at_mut(8);
        let l = u64::from_le_bytes(lo.try_into().expect("8 bytes")).wrapping_add(seed);
        let h = u64::from_le_bytes(hi.try_into().expect("8 bytes")).wrapping_sub(seed);
        lo.copy_from_slice(&l.to_le_bytes());
        hi.copy_from_slice(&h.to_le_bytes());
    }
    out
}

/// A token id as the content key reads it: its four little-endian bytes. Ids arrive as `i32`
/// (JSON bodies, engine events) or as `u32` (a tokenizer's output); an id below 2^31, which
/// every valid id is, has the same bytes either way, so both hash alike without a conversion
/// pass over the prompt.
pub trait TokenId: Copy {
    /// The id's bytes in the key's input.
    fn le_bytes(self) -> [u8; 4];
}

impl TokenId for i32 {
    #[inline]
    fn le_bytes(self) -> [u8; 4] {
        self.to_le_bytes()
    }
}

impl TokenId for u32 {
    #[inline]
    fn le_bytes(self) -> [u8; 4] {
        self.to_le_bytes()
    }
}

/// Computes chained content keys for one `(block_size, seed)` pair, reusing its buffer.
#[derive(Debug, Clone)]
pub struct KeyHasher {
    seed: u64,
    block_size: usize,
    buf: Vec<u8>,
    /// Boxed so that holders of a hasher (the snapshot builder, in enums) stay small.
    secret: Box<[u8; 192]>,
    /// The seed (and its secret) of a prefix's first block when it differs from `seed`: a
    /// request salt's namespace ([`KeyHasher::with_root_seed`]).
    root: Option<(u64, Box<[u8; 192]>)>,
}

impl KeyHasher {
    /// A hasher for blocks of `block_size` tokens under `seed` (the stream's `hash_seed`).
    pub fn new(block_size: u32, seed: u64) -> Self {
        let block_size = block_size.max(1) as usize;
        let buf = vec![0; 16 + 4 * block_size];
        KeyHasher { seed, block_size, buf, secret: Box::new(seeded_secret(seed)), root: None }
    }

    /// A hasher whose prefixes start under `root_seed`: the first block of a prefix (no
    /// `prev`) is keyed with `root_seed`, every later one with `seed`. The first key differs
    /// from `seed`'s, so every key chained to it does too (protocol.md section 1.1, salts).
    pub fn with_root_seed(block_size: u32, root_seed: u64, seed: u64) -> Self {
        let mut h = KeyHasher::new(block_size, seed);
        if root_seed != seed {
            h.root = Some((root_seed, Box::new(seeded_secret(root_seed))));
        }
        h
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The key of one complete block (`block.len() == block_size`) after `prev`.
    pub fn chain<T: TokenId>(&mut self, prev: Option<ContentKey>, block: &[T]) -> ContentKey {
        debug_assert_eq!(block.len(), self.block_size);
        for (dst, t) in self.buf[16..].chunks_exact_mut(4).zip(block) {
            dst.copy_from_slice(&t.le_bytes());
        }
        let (input, seed, secret) = match (prev, &self.root) {
            (Some(p), _) => {
                self.buf[..16].copy_from_slice(&p.0);
                (&self.buf[..], self.seed, &self.secret)
            }
            (None, Some((seed, secret))) => (&self.buf[16..], *seed, secret),
            (None, None) => (&self.buf[16..], self.seed, &self.secret),
        };
        ContentKey::from_u128(xxh3_seeded(input, seed, secret))
    }

    /// Appends the keys of every complete block of `tokens` to `out`; a partial tail is ignored.
    pub fn prefix_keys<T: TokenId>(&mut self, tokens: &[T], out: &mut Vec<ContentKey>) {
        let blocks = tokens.chunks_exact(self.block_size);
        self.chain_blocks(None, blocks, out);
    }

    /// Continues `out`, the keys of the first `out.len()` blocks of `tokens`, with the keys of
    /// at most `max` further complete blocks; returns how many it appended.
    pub fn extend_keys<T: TokenId>(
        &mut self,
        tokens: &[T],
        out: &mut Vec<ContentKey>,
        max: usize,
    ) -> usize {
        let start = out.len();
        let blocks = tokens.chunks_exact(self.block_size).skip(start).take(max);
        self.chain_blocks(out.last().copied(), blocks, out);
        out.len() - start
    }

    /// Appends the keys of `blocks`, the first chained to `prev`.
    fn chain_blocks<'a, T: TokenId + 'a>(
        &mut self,
        mut prev: Option<ContentKey>,
        blocks: impl Iterator<Item = &'a [T]>,
        out: &mut Vec<ContentKey>,
    ) {
        for block in blocks {
            let k = self.chain(prev, block);
            out.push(k);
            prev = Some(k);
        }
    }
}

/// `xxh3_128_with_seed(input, seed)`, given `secret = seeded_secret(seed)`.
///
/// Long inputs (every block from `B = 60` up) go through `twox-hash`, whose XXH3 picks its AVX2
/// loop at run time: 43-45 ns per 528-byte input here against 53-62 ns for `xxhash-rust`, which
/// chooses its vector width when it is compiled (SSE2 for a portable build). The digests are
/// the same (the test below checks the two crates against each other).
fn xxh3_seeded(input: &[u8], seed: u64, secret: &[u8; 192]) -> u128 {
    if input.len() > MID_SIZE_MAX {
        twox_hash::XxHash3_128::oneshot_with_secret(secret, input)
            .expect("a 192-byte secret is long enough")
    } else {
        xxhash_rust::xxh3::xxh3_128_with_seed(input, seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_derived_secret_gives_the_seeded_digest_at_every_length() {
        let input: Vec<u8> =
            (0..2_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for seed in [0, 1, 1024, u64::MAX, 0x9e37_79b9_7f4a_7c15] {
            let secret = seeded_secret(seed);
            for len in (0..=600).chain([1_000, 1_024, 1_040, 2_000]) {
                let want = xxhash_rust::xxh3::xxh3_128_with_seed(&input[..len], seed);
                assert_eq!(
                    xxh3_seeded(&input[..len], seed, &secret),
                    want,
                    "seed {seed} len {len}"
                );
            }
        }
    }

    fn hex(k: ContentKey) -> String {
        format!("{k:?}")
    }

    fn keys(tokens: &[i32], b: u32) -> Vec<String> {
        let mut out = Vec::new();
        KeyHasher::new(b, 1024).prefix_keys(tokens, &mut out);
        out.into_iter().map(hex).collect()
    }

    #[test]
    fn golden_vectors_small_blocks() {
        let tokens: Vec<i32> = (1..=8).collect();
        assert_eq!(
            keys(&tokens, 4),
            ["b0c6037e37a15e2de8d8689c759e965f", "94600a4a64fa896e3c6f4572bb0437f0"]
        );
    }

    #[test]
    fn golden_vectors_ascending_256() {
        let tokens: Vec<i32> = (0..256).collect();
        assert_eq!(
            keys(&tokens, 128),
            ["a6c0e2fc92c32b1c1ccff29b710ca0d2", "f981264b143b2d5f81fd86ed5d58d2a1"]
        );
    }

    #[test]
    fn golden_vectors_repeated_blocks() {
        let mut tokens = vec![1; 128];
        tokens.extend(std::iter::repeat_n(2, 128));
        assert_eq!(
            keys(&tokens, 128),
            ["1a0a276afd344c4f556a1798ca291398", "5aad1aa279233a13225857500e1fc839"]
        );
    }

    #[test]
    fn u32_ids_give_the_keys_of_the_same_i32_ids() {
        let ids: Vec<i32> = (0..512).map(|i| i * 4_194_301 % i32::MAX).collect();
        let unsigned: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        KeyHasher::new(128, 1024).prefix_keys(&ids, &mut a);
        KeyHasher::new(128, 1024).prefix_keys(&unsigned, &mut b);
        assert_eq!(a.len(), 4);
        assert_eq!(a, b);
    }

    #[test]
    fn partial_tail_gets_no_key_and_seed_matters() {
        let tokens: Vec<i32> = (1..=11).collect();
        assert_eq!(keys(&tokens, 4).len(), 2);
        let mut a = Vec::new();
        KeyHasher::new(4, 1).prefix_keys(&tokens, &mut a);
        assert_ne!(hex(a[0]), keys(&tokens, 4)[0]);
    }

    #[test]
    fn key_depends_on_the_whole_prefix() {
        let a: Vec<i32> = vec![1, 2, 3, 4, 9, 9, 9, 9];
        let b: Vec<i32> = vec![5, 6, 7, 8, 9, 9, 9, 9];
        assert_ne!(keys(&a, 4)[1], keys(&b, 4)[1]);
    }
}
