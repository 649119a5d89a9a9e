//! Decoding one MessagePack batch into a reusable [`Batch`].
//!
//! Accepted (protocol.md section 2.1 and 2.2): a batch as `[ts, events, dp_rank]`, `[ts, events]`
//! or a map `{ts, events, data_parallel_rank | dp_rank}`; each event as a map tagged by `"type"`
//! or as a positional array `[type, fields...]`. Fields are read into the batch's arenas as they
//! come, so the `type` key may appear anywhere in a map; an event that turns out to be skipped
//! rolls its arena entries back.

use super::extra_keys::{read_extra_keys, salt_and_mark, Extra};
use super::group::{AttentionKind, Group, MAX_GROUPS};
use super::msgpack::{Int, Reader};
use super::types::{Batch, EngineHash, Event, Span, Stored, Tier};
use super::WireError;

/// Field order of the positional (array) event form, after the type name.
const STORED_FIELDS: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];
const REMOVED_FIELDS: &[&str] = &["block_hashes", "medium", "group_idx"];
const CLEARED_FIELDS: &[&str] = &["medium"];

/// Decodes `payload` into `batch`, replacing its contents.
pub fn decode_batch(payload: &[u8], batch: &mut Batch) -> Result<(), WireError> {
    batch.clear();
    let mut r = Reader::new(payload);
    match r.peek()? {
        0x90..=0x9f | 0xdc | 0xdd => decode_array_batch(&mut r, batch)?,
        0x80..=0x8f | 0xde | 0xdf => decode_map_batch(&mut r, batch)?,
        m => {
            return Err(WireError::Type {
                field: "batch",
                expected: "array or map",
                found: super::msgpack::marker_name(m),
                offset: 0,
            })
        }
    }
    if r.remaining() > 0 {
        return Err(WireError::TrailingBytes(r.remaining()));
    }
    Ok(())
}

fn decode_array_batch(r: &mut Reader<'_>, batch: &mut Batch) -> Result<(), WireError> {
    let n = r.array_len("batch")?;
    if n != 2 && n != 3 {
        return Err(WireError::BatchArity(n));
    }
    batch.timestamp = read_timestamp(r)?;
    decode_events(r, batch)?;
    if n == 3 {
        batch.dp_rank = read_dp_rank(r)?;
    }
    Ok(())
}

fn decode_map_batch(r: &mut Reader<'_>, batch: &mut Batch) -> Result<(), WireError> {
    let n = r.map_len("batch")?;
    let mut saw_events = false;
    for _ in 0..n {
        match r.str_bytes("batch key")? {
            b"ts" => batch.timestamp = read_timestamp(r)?,
            b"events" => {
                decode_events(r, batch)?;
                saw_events = true;
            }
            b"data_parallel_rank" | b"dp_rank" => batch.dp_rank = read_dp_rank(r)?,
            _ => r.skip()?,
        }
    }
    if !saw_events {
        return Err(WireError::MissingKey { context: "batch", key: "events" });
    }
    Ok(())
}

fn read_timestamp(r: &mut Reader<'_>) -> Result<f64, WireError> {
    if r.eat_nil()? {
        return Ok(0.0);
    }
    r.number("timestamp")
}

fn read_dp_rank(r: &mut Reader<'_>) -> Result<u32, WireError> {
    if r.eat_nil()? {
        return Ok(0);
    }
    match r.int("dp_rank")? {
        Int::U(v) if v <= u64::from(u32::MAX) => Ok(v as u32),
        Int::U(v) => Err(range("dp_rank", v, "0..=4294967295")),
        Int::I(v) => Err(range("dp_rank", v, "0..=4294967295")),
    }
}

fn range(field: &'static str, value: impl ToString, allowed: &'static str) -> WireError {
    WireError::Range { field, value: value.to_string(), allowed }
}

fn decode_events(r: &mut Reader<'_>, batch: &mut Batch) -> Result<(), WireError> {
    let n = r.array_len("events")?;
    for index in 0..n {
        decode_event(r, batch).map_err(|e| WireError::Event { index, source: Box::new(e) })?;
    }
    Ok(())
}

/// The fields of one event as read so far.
#[derive(Default)]
struct Fields<'a> {
    kind: Option<&'a [u8]>,
    hashes: Option<Span>,
    parent: Option<EngineHash>,
    tokens: Option<Span>,
    block_size: Option<u32>,
    medium: Option<&'a [u8]>,
    /// The adapter's namespace tag from `lora_name` (preferred) or `lora_id`; 0 = base model.
    lora_name: u64,
    lora_id: u64,
    /// The adapter name as sent, to recognise `extra_keys` entries that only repeat it.
    lora_bytes: Option<&'a [u8]>,
    /// What `extra_keys` says of the blocks (vLLM sends one entry per block).
    extra: Extra<'a>,
    /// SGLang's `cache_salt` (its salted requests' stores carry it; vLLM's is in `extra_keys`).
    cache_salt: Option<&'a [u8]>,
    /// `group_idx`: the KV cache group (vLLM's hybrid allocator).
    group_idx: Option<u32>,
    /// `kv_cache_spec_kind` and `kv_cache_spec_sliding_window`.
    spec_kind: Option<&'a [u8]>,
    window: Option<u32>,
}

impl Fields<'_> {
    /// The group the event names; a store's kind is full attention when neither a group nor
    /// a kind was sent.
    fn group(&self, store: bool) -> Group {
        let idx = self.group_idx.unwrap_or(0);
        let named = self.group_idx.is_some() || self.spec_kind.is_some();
        let kind = (store && named).then(|| AttentionKind::from_wire(self.spec_kind, self.window));
        Group { idx, kind }
    }
}

fn decode_event(r: &mut Reader<'_>, batch: &mut Batch) -> Result<(), WireError> {
    let marks = batch.arena_marks();
    let mut f = Fields::default();
    match r.peek()? {
        0x80..=0x8f | 0xde | 0xdf => {
            let n = r.map_len("event")?;
            for _ in 0..n {
                let key = r.str_bytes("event key")?;
                read_field(key, r, batch, &mut f)?;
            }
        }
        0x90..=0x9f | 0xdc | 0xdd => read_positional(r, batch, &mut f)?,
        m => {
            return Err(WireError::Type {
                field: "event",
                expected: "map or array",
                found: super::msgpack::marker_name(m),
                offset: r.offset(),
            })
        }
    }
    let Some(kind) = f.kind else {
        return Err(WireError::MissingKey { context: "event", key: "type" });
    };
    finish_event(kind, &f, batch, marks)
}

fn read_positional<'a>(
    r: &mut Reader<'a>,
    batch: &mut Batch,
    f: &mut Fields<'a>,
) -> Result<(), WireError> {
    let n = r.array_len("event")?;
    if n == 0 {
        return Err(WireError::MissingKey { context: "event", key: "type" });
    }
    let kind = r.str_bytes("type")?;
    f.kind = Some(kind);
    let names: &[&str] = match kind {
        b"BlockStored" => STORED_FIELDS,
        b"BlockRemoved" => REMOVED_FIELDS,
        b"AllBlocksCleared" => CLEARED_FIELDS,
        _ => &[],
    };
    for i in 1..n {
        match names.get(i - 1) {
            Some(name) => read_field(name.as_bytes(), r, batch, f)?,
            None => r.skip()?,
        }
    }
    Ok(())
}

fn read_field<'a>(
    key: &[u8],
    r: &mut Reader<'a>,
    batch: &mut Batch,
    f: &mut Fields<'a>,
) -> Result<(), WireError> {
    match key {
        b"type" => f.kind = Some(r.str_bytes("type")?),
        b"block_hashes" => f.hashes = Some(read_hashes(r, batch)?),
        b"parent_block_hash" => {
            if !r.eat_nil()? {
                f.parent = Some(read_hash(r, "parent_block_hash")?);
            }
        }
        b"token_ids" => f.tokens = Some(read_tokens(r, batch)?),
        b"block_size" => f.block_size = Some(read_block_size(r)?),
        b"medium" => f.medium = if r.eat_nil()? { None } else { Some(r.str_bytes("medium")?) },
        b"lora_id" => f.lora_id = read_lora_id(r)?,
        b"lora_name" => {
            f.lora_bytes = read_lora_name(r)?;
            f.lora_name = super::Namespace::lora_name(f.lora_bytes.unwrap_or_default());
        }
        b"extra_keys" => f.extra = read_extra_keys(r, f.lora_bytes)?,
        b"cache_salt" => {
            let salt = if r.eat_nil()? { None } else { Some(r.str_bytes("cache_salt")?) };
            f.cache_salt = salt.filter(|s| !s.is_empty());
        }
        b"group_idx" => {
            let allowed = "0..=31 (kvdir keeps at most 32 KV cache groups per stream)";
            f.group_idx = read_small(r, "group_idx", MAX_GROUPS - 1, allowed)?
        }
        b"kv_cache_spec_kind" => {
            let kind = if r.eat_nil()? { None } else { Some(r.str_bytes("kv_cache_spec_kind")?) };
            f.spec_kind = kind;
        }
        b"kv_cache_spec_sliding_window" => {
            let allowed = "0..=4294967295";
            f.window = read_small(r, "kv_cache_spec_sliding_window", u32::MAX, allowed)?
        }
        _ => r.skip()?,
    }
    Ok(())
}

/// An optional unsigned integer field (nil: absent) of at most `max`, which `allowed` says.
fn read_small(
    r: &mut Reader<'_>,
    field: &'static str,
    max: u32,
    allowed: &'static str,
) -> Result<Option<u32>, WireError> {
    if r.eat_nil()? {
        return Ok(None);
    }
    match r.int(field)? {
        Int::U(v) if v <= u64::from(max) => Ok(Some(v as u32)),
        Int::U(v) => Err(range(field, v, allowed)),
        Int::I(v) => Err(range(field, v, allowed)),
    }
}

/// `lora_name`: nil and `""` are the base model.
fn read_lora_name<'a>(r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, WireError> {
    if r.eat_nil()? {
        return Ok(None);
    }
    Ok(Some(r.str_bytes("lora_name")?).filter(|n| !n.is_empty()))
}

/// `lora_id`: nil is the base model; an integer is the adapter's id.
fn read_lora_id(r: &mut Reader<'_>) -> Result<u64, WireError> {
    if r.eat_nil()? {
        return Ok(0);
    }
    Ok(match r.int("lora_id")? {
        Int::U(v) => super::Namespace::lora_id(v as i64),
        Int::I(v) => super::Namespace::lora_id(v),
    })
}

fn read_hash(r: &mut Reader<'_>, field: &'static str) -> Result<EngineHash, WireError> {
    if r.at_bin() {
        let b = r.bin_bytes(field)?;
        if b.is_empty() || b.len() > 64 {
            return Err(range(field, format!("bin of {} bytes", b.len()), "bin of 1..=64 bytes"));
        }
        return Ok(EngineHash::from_bin(b));
    }
    match r.int(field) {
        Ok(Int::U(v)) => Ok(EngineHash(u128::from(v))),
        Ok(Int::I(v)) => Ok(EngineHash(u128::from(v as u64))),
        Err(WireError::Type { found, offset, .. }) => {
            Err(WireError::Type { field, expected: "integer or bin", found, offset })
        }
        Err(e) => Err(e),
    }
}

fn read_hashes(r: &mut Reader<'_>, batch: &mut Batch) -> Result<Span, WireError> {
    let n = r.array_len("block_hashes")?;
    let (start, _) = batch.arena_marks();
    for _ in 0..n {
        let h = read_hash(r, "block_hashes")?;
        batch.arena_hash(h);
    }
    Ok(Span { start, len: n as u32 })
}

fn read_tokens(r: &mut Reader<'_>, batch: &mut Batch) -> Result<Span, WireError> {
    let n = r.array_len("token_ids")?;
    let (_, start) = batch.arena_marks();
    // `array_len` bounded `n` by the bytes left, so this cannot be a hostile allocation; an
    // error leaves the slots behind, which `decode_batch` clears before its next use.
    let slots = batch.token_slots(n);
    let mut done = 0;
    while done < n {
        // The fast path takes the common encodings; whatever it stops at (a negative id, a
        // 64-bit one, a wrong type, anything in the last 7 bytes) goes through `read_token`,
        // which accepts or rejects it exactly as before.
        done += r.i32_fill(&mut slots[done..]);
        if done < n {
            slots[done] = read_token(r)?;
            done += 1;
        }
    }
    Ok(Span { start, len: n as u32 })
}

fn read_token(r: &mut Reader<'_>) -> Result<i32, WireError> {
    match r.int("token_ids")? {
        Int::U(v) if v <= i32::MAX as u64 => Ok(v as i32),
        Int::I(v) if v >= i64::from(i32::MIN) => Ok(v as i32),
        Int::U(v) => Err(range("token_ids", v, "a 32-bit signed integer")),
        Int::I(v) => Err(range("token_ids", v, "a 32-bit signed integer")),
    }
}

fn read_block_size(r: &mut Reader<'_>) -> Result<u32, WireError> {
    match r.int("block_size")? {
        Int::U(v) if (1..=u64::from(u32::MAX)).contains(&v) => Ok(v as u32),
        Int::U(v) => Err(range("block_size", v, "1..=4294967295")),
        Int::I(v) => Err(range("block_size", v, "1..=4294967295")),
    }
}

/// Turns the fields into events, or drops the event (counted) and its arena entries.
fn finish_event(
    kind: &[u8],
    f: &Fields<'_>,
    batch: &mut Batch,
    marks: (u32, u32),
) -> Result<(), WireError> {
    let event = match kind {
        b"BlockStored" => return finish_stored(f, batch, marks),
        b"BlockRemoved" => {
            let hashes = f.hashes.ok_or_else(|| missing("BlockRemoved", "block_hashes"))?;
            let group = f.group(false);
            tier_or_skip(f.medium, batch).map(|tier| Event::Removed { hashes, tier, group })
        }
        b"AllBlocksCleared" => match f.medium {
            None => Some(Event::Cleared { tier: None }),
            Some(_) => tier_or_skip(f.medium, batch).map(|t| Event::Cleared { tier: Some(t) }),
        },
        _ => {
            batch.skipped.unknown_type += 1;
            None
        }
    };
    match event {
        Some(e) => batch.events.push(e),
        None => batch.arena_truncate(marks),
    }
    Ok(())
}

/// A `BlockStored`, in scope or not. LoRA context and a salt are the blocks' namespace;
/// `extra_keys` puts the first marked block and every block after it (they chain to it) out of
/// scope, and the blocks before it stay in scope when the tokens split there. Out-of-scope blocks keep
/// only their hashes ([`Event::OutOfScope`]); the event counts once as skipped.
fn finish_stored(f: &Fields<'_>, batch: &mut Batch, marks: (u32, u32)) -> Result<(), WireError> {
    let hashes = f.hashes.ok_or_else(|| missing("BlockStored", "block_hashes"))?;
    let tokens = f.tokens.ok_or_else(|| missing("BlockStored", "token_ids"))?;
    let block_size = f.block_size.ok_or_else(|| missing("BlockStored", "block_size"))?;
    let n = hashes.len;
    let lora = if f.lora_name != 0 { f.lora_name } else { f.lora_id };
    let (mut salt, marked) = salt_and_mark(&f.extra, f.lora_bytes, f.parent.is_some(), n as usize);
    if let (0, Some(s), None) = (salt, f.cache_salt, f.parent) {
        // SGLang names the salt on every store of a salted request; a store with a parent
        // chains to a block already keyed in the salt's namespace.
        salt = super::Namespace::salt(s);
    }
    let Some(tier) = Tier::from_medium(f.medium) else {
        match marked {
            Some(_) => batch.skipped.lora_or_multimodal += 1,
            None => batch.skipped.out_of_scope_medium += 1,
        }
        batch.arena_truncate(marks);
        return Ok(());
    };
    let group = f.group(true);
    let stored = |hashes, tokens| {
        let parent = f.parent;
        Event::Stored(Stored { hashes, parent, tokens, block_size, tier, lora, salt, group })
    };
    let Some(k) = marked else {
        batch.events.push(stored(hashes, tokens));
        return Ok(());
    };
    batch.skipped.lora_or_multimodal += 1;
    let whole = u64::from(n) * u64::from(block_size);
    let k = if tokens.len == 0 || u64::from(tokens.len) == whole { k as u32 } else { 0 };
    let kept = if tokens.len == 0 { 0 } else { k * block_size };
    if k > 0 {
        let prefix = Span { start: hashes.start, len: k };
        batch.events.push(stored(prefix, Span { start: tokens.start, len: kept }));
    }
    batch.tokens_truncate(if k > 0 { tokens.start + kept } else { marks.1 });
    let rest = Span { start: hashes.start + k, len: n - k };
    batch.events.push(Event::OutOfScope { hashes: rest, tier });
    Ok(())
}

fn missing(context: &'static str, key: &'static str) -> WireError {
    WireError::MissingKey { context, key }
}

fn tier_or_skip(medium: Option<&[u8]>, batch: &mut Batch) -> Option<Tier> {
    let tier = Tier::from_medium(medium);
    if tier.is_none() {
        batch.skipped.out_of_scope_medium += 1;
    }
    tier
}
