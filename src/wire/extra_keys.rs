//! Reading vLLM's per-block `extra_keys` of a `BlockStored` (protocol.md section 2.2): which
//! block is the first to carry context kvdir does not index, and the request's `cache_salt`.

use super::msgpack::Reader;
use super::WireError;

/// What a store's `extra_keys` says of its blocks.
#[derive(Default)]
pub(super) struct Extra<'a> {
    /// The first block whose entry carries context kvdir does not index (multimodal, prompt
    /// embeddings, anything it cannot read).
    pub(super) first_marked: Option<usize>,
    /// The lone string of the first block's entry: the request's `cache_salt` when the store
    /// starts a prefix (no parent).
    pub(super) salt: Option<&'a [u8]>,
}

/// One block's `extra_keys` entry, less a leading string equal to the event's `lora_name`.
enum Entry<'a> {
    /// Nothing else: the block carries no context.
    Empty,
    /// One string alone: a `cache_salt` on a prefix's first block.
    Text(&'a [u8]),
    /// Anything else: a `(mm_identifier, offset)` pair, a prompt-embeddings digest (bin),
    /// several strings, or a value of another shape.
    Other,
}

/// Reads `extra_keys` (protocol.md section 2.2). vLLM 0.32 publishes one entry per block, nil
/// or a tuple of, in this order: the LoRA name (every block of an adapter's request),
/// `(mm_identifier, offset)` pairs (blocks holding an image's tokens), the request's
/// `cache_salt` (its first block only) and a prompt-embeddings digest as bytes
/// (`vllm/v1/core/kv_cache_utils.py`: `generate_block_hash_extra_keys`,
/// `to_event_extra_keys`). So, past a leading copy of the event's `lora_name`, a lone string
/// in the first entry is the salt, an empty rest marks nothing, and anything else marks the
/// block; a value that is not a list marks every block.
pub(super) fn read_extra_keys<'a>(
    r: &mut Reader<'a>,
    lora: Option<&[u8]>,
) -> Result<Extra<'a>, WireError> {
    let mut extra = Extra::default();
    if r.eat_nil()? {
        return Ok(extra);
    }
    if !is_array(r.peek()?) {
        r.skip()?;
        extra.first_marked = Some(0);
        return Ok(extra);
    }
    for i in 0..r.array_len("extra_keys")? {
        if r.eat_nil()? {
            continue;
        }
        match read_entry(r, lora)? {
            Entry::Empty => {}
            Entry::Text(salt) if i == 0 => extra.salt = Some(salt),
            Entry::Text(_) | Entry::Other => {
                extra.first_marked.get_or_insert(i);
            }
        }
    }
    Ok(extra)
}

fn is_array(marker: u8) -> bool {
    matches!(marker, 0x90..=0x9f | 0xdc | 0xdd)
}

fn read_entry<'a>(r: &mut Reader<'a>, lora: Option<&[u8]>) -> Result<Entry<'a>, WireError> {
    if !is_array(r.peek()?) {
        r.skip()?;
        return Ok(Entry::Other);
    }
    let (mut texts, mut last, mut other) = (0, None, false);
    for j in 0..r.array_len("extra_keys")? {
        if !matches!(r.peek()?, 0xa0..=0xbf | 0xd9..=0xdb) {
            r.skip()?;
            other = true;
            continue;
        }
        let text = r.str_bytes("extra_keys")?;
        if j > 0 || lora != Some(text) {
            texts += 1;
            last = Some(text);
        }
    }
    Ok(match (other, texts, last) {
        (false, 0, _) => Entry::Empty,
        (false, 1, Some(text)) => Entry::Text(text),
        _ => Entry::Other,
    })
}

/// The store's salt tag and its first marked block. The first entry's lone string is a salt
/// only on a store that starts a prefix (vLLM salts a request's first block, and only it); on a
/// store with a parent, or when it merely repeats a `lora_name` sent after `extra_keys`, it is
/// unknown context and marks the first block.
pub(super) fn salt_and_mark(
    extra: &Extra<'_>,
    lora: Option<&[u8]>,
    has_parent: bool,
    n: usize,
) -> (u64, Option<usize>) {
    let marked = extra.first_marked.filter(|&k| k < n);
    match extra.salt {
        Some(s) if lora == Some(s) => (0, marked),
        Some(s) if !has_parent => (super::Namespace::salt(s), marked),
        Some(_) if n > 0 => (0, Some(0)),
        _ => (0, marked),
    }
}
