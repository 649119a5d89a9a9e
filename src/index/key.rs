//! Content keys: the directory's own 128-bit key for each complete block (protocol.md section 1).
//!
//! `key(0) = XXH3_128(le_i32(tokens[0..B]), seed)` and
//! `key(i) = XXH3_128(key(i-1).to_le_bytes() ++ le_i32(tokens[iB..(i+1)B]), seed)`.
//! The key of a block therefore depends on every token before it, which is what makes a walk
//! over a query's keys a prefix match. One call over a reused `16 + 4B` byte buffer is about
//! twice as fast as the streaming API for the same digest (dependencies.md).

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

/// Computes chained content keys for one `(block_size, seed)` pair, reusing its buffer.
#[derive(Debug, Clone)]
pub struct KeyHasher {
    seed: u64,
    block_size: usize,
    buf: Vec<u8>,
}

impl KeyHasher {
    /// A hasher for blocks of `block_size` tokens under `seed` (the stream's `hash_seed`).
    pub fn new(block_size: u32, seed: u64) -> Self {
        let block_size = block_size.max(1) as usize;
        KeyHasher { seed, block_size, buf: vec![0; 16 + 4 * block_size] }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The key of one complete block (`block.len() == block_size`) after `prev`.
    pub fn chain(&mut self, prev: Option<ContentKey>, block: &[i32]) -> ContentKey {
        debug_assert_eq!(block.len(), self.block_size);
        for (dst, t) in self.buf[16..].chunks_exact_mut(4).zip(block) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        let input = match prev {
            Some(p) => {
                self.buf[..16].copy_from_slice(&p.0);
                &self.buf[..]
            }
            None => &self.buf[16..],
        };
        ContentKey::from_u128(xxhash_rust::xxh3::xxh3_128_with_seed(input, self.seed))
    }

    /// Appends the keys of every complete block of `tokens` to `out`; a partial tail is ignored.
    pub fn prefix_keys(&mut self, tokens: &[i32], out: &mut Vec<ContentKey>) {
        let mut prev = None;
        for block in tokens.chunks_exact(self.block_size) {
            let k = self.chain(prev, block);
            out.push(k);
            prev = Some(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
