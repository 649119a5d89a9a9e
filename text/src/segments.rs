//! [`SegmentCache`]: token ids of the text between added tokens, remembered.
//!
//! A Hugging Face tokenizer first splits its input at added tokens (`<|im_start|>` ...), then
//! normalizes, pre-tokenizes and encodes every piece between them on its own. So the ids of a
//! prompt are the concatenation of the ids of its pieces and of the added tokens, and a piece
//! seen before (a shared system prompt, a tool list) need not be encoded again. Chat traffic
//! repeats long pieces all the time, and encoding them is most of the front door's CPU.
//!
//! The cache is used only where that decomposition is exact: no added token strips spaces,
//! must be a single word or is matched after normalization, and the tokenizer neither
//! truncates nor pads. Splitting follows the tokenizer's own rule (leftmost-longest match of
//! the added tokens' contents). Pieces shorter than [`MIN_PIECE_BYTES`] are encoded directly;
//! the cache holds at most [`MAX_CACHED_BYTES`] of piece text and starts over when full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use tokenizers::Tokenizer;

/// Pieces shorter than this are encoded every time (cheap, and rarely repeated verbatim).
pub const MIN_PIECE_BYTES: usize = 256;
/// Upper bound of the cached piece text.
pub const MAX_CACHED_BYTES: usize = 64 << 20;

/// Added tokens of a tokenizer and the remembered ids of the pieces between them.
pub struct SegmentCache {
    splitter: AhoCorasick,
    ids: Vec<u32>,
    pieces: Mutex<Pieces>,
}

#[derive(Default)]
struct Pieces {
    map: HashMap<String, Arc<[u32]>>,
    bytes: usize,
}

impl SegmentCache {
    /// The cache for `tokenizer`, or `None` where encoding does not decompose exactly.
    pub fn new(tokenizer: &Tokenizer) -> Option<SegmentCache> {
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return None;
        }
        let added = tokenizer.get_added_tokens_decoder();
        let plain =
            added.values().all(|t| !(t.lstrip || t.rstrip || t.single_word || t.normalized));
        if !plain {
            return None;
        }
        let (contents, ids): (Vec<String>, Vec<u32>) =
            added.into_iter().map(|(id, t)| (t.content, id)).unzip();
        let splitter = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&contents)
            .ok()?;
        Some(SegmentCache { splitter, ids, pieces: Mutex::default() })
    }

    /// The ids of `text` without added special tokens, as `tokenizer.encode(text, false)`.
    pub fn encode(&self, tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, tokenizers::Error> {
        let mut out = Vec::new();
        let mut at = 0;
        for m in self.splitter.find_iter(text) {
            self.piece(tokenizer, &text[at..m.start()], &mut out)?;
            out.push(self.ids[m.pattern().as_usize()]);
            at = m.end();
        }
        self.piece(tokenizer, &text[at..], &mut out)?;
        Ok(out)
    }

    fn piece(
        &self,
        tokenizer: &Tokenizer,
        piece: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), tokenizers::Error> {
        if piece.is_empty() {
            return Ok(());
        }
        if piece.len() < MIN_PIECE_BYTES {
            out.extend_from_slice(tokenizer.encode_fast(piece, false)?.get_ids());
            return Ok(());
        }
        let known = self.lock().map.get(piece).cloned();
        let ids = match known {
            Some(ids) => ids,
            None => {
                let ids: Arc<[u32]> = tokenizer.encode_fast(piece, false)?.get_ids().into();
                let mut p = self.lock();
                if p.bytes + piece.len() > MAX_CACHED_BYTES {
                    *p = Pieces::default();
                }
                p.bytes += piece.len();
                p.map.insert(piece.to_string(), Arc::clone(&ids));
                ids
            }
        };
        out.extend_from_slice(&ids);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pieces> {
        self.pieces.lock().unwrap_or_else(|e| e.into_inner())
    }
}
