//! Encoding batch records into MessagePack, in every form the decoder accepts.

use super::msgpack::Writer;
use super::record::{
    BatchForm, BatchRecord, EventForm, EventRecord, ExtraKey, StoredRecord, WireHash,
};

/// Encodes a batch in the given batch and event forms.
pub fn encode_batch(batch: &BatchRecord, form: BatchForm, events: EventForm) -> Vec<u8> {
    let mut w = Writer::new();
    match form {
        BatchForm::Array | BatchForm::ShortArray => {
            w.array(if form == BatchForm::Array { 3 } else { 2 });
            w.f64(batch.timestamp);
            write_events(&mut w, &batch.events, events);
            if form == BatchForm::Array {
                match batch.dp_rank {
                    Some(r) => w.uint(u64::from(r)),
                    None => w.nil(),
                }
            }
        }
        BatchForm::Map => {
            w.map(if batch.dp_rank.is_some() { 3 } else { 2 });
            w.str("ts");
            w.f64(batch.timestamp);
            w.str("events");
            write_events(&mut w, &batch.events, events);
            if let Some(r) = batch.dp_rank {
                w.str("data_parallel_rank");
                w.uint(u64::from(r));
            }
        }
    }
    w.buf
}

fn write_events(w: &mut Writer, events: &[EventRecord], form: EventForm) {
    w.array(events.len());
    for e in events {
        write_event(w, e, form);
    }
}

fn write_event(w: &mut Writer, e: &EventRecord, form: EventForm) {
    let positional = form == EventForm::Positional;
    match e {
        EventRecord::Stored(s) => write_stored(w, s, positional),
        EventRecord::Removed { hashes, medium, group_idx } => {
            header(w, positional, "BlockRemoved", 2 + usize::from(group_idx.is_some()));
            key(w, positional, "block_hashes");
            write_hashes(w, hashes);
            key(w, positional, "medium");
            opt_str(w, medium.as_deref());
            if let Some(g) = group_idx {
                key(w, positional, "group_idx");
                w.uint(u64::from(*g));
            }
        }
        EventRecord::Cleared { medium } => {
            let fields = usize::from(medium.is_some());
            header(w, positional, "AllBlocksCleared", fields);
            if let Some(m) = medium {
                key(w, positional, "medium");
                w.str(m);
            }
        }
        EventRecord::Unknown { type_name } => header(w, positional, type_name, 0),
    }
}

fn write_stored(w: &mut Writer, s: &StoredRecord, positional: bool) {
    // Positional group fields come after `extra_keys`, which is then written (nil if none).
    let group = s.group.as_ref();
    let extra = !s.extra_keys.is_empty() || (positional && group.is_some());
    let fields = 7 + usize::from(extra) + 3 * usize::from(group.is_some());
    header(w, positional, "BlockStored", fields);
    key(w, positional, "block_hashes");
    write_hashes(w, &s.hashes);
    key(w, positional, "parent_block_hash");
    match &s.parent {
        Some(p) => write_hash(w, p),
        None => w.nil(),
    }
    key(w, positional, "token_ids");
    w.array(s.tokens.len());
    for t in &s.tokens {
        w.int(i64::from(*t));
    }
    key(w, positional, "block_size");
    w.uint(u64::from(s.block_size));
    key(w, positional, "lora_id");
    match s.lora_id {
        Some(id) => w.int(id),
        None => w.nil(),
    }
    key(w, positional, "medium");
    opt_str(w, s.medium.as_deref());
    key(w, positional, "lora_name");
    opt_str(w, s.lora_name.as_deref());
    if extra {
        key(w, positional, "extra_keys");
        write_extra_keys(w, &s.extra_keys);
    }
    if let Some(g) = group {
        key(w, positional, "group_idx");
        w.uint(u64::from(g.idx));
        key(w, positional, "kv_cache_spec_kind");
        opt_str(w, g.kind.as_deref());
        key(w, positional, "kv_cache_spec_sliding_window");
        match g.window {
            Some(v) => w.uint(u64::from(v)),
            None => w.nil(),
        }
    }
}

/// `extra_keys`: one entry per block, nil or a list; none at all is nil.
fn write_extra_keys(w: &mut Writer, entries: &[Option<Vec<ExtraKey>>]) {
    if entries.is_empty() {
        return w.nil();
    }
    w.array(entries.len());
    for entry in entries {
        match entry {
            Some(keys) => {
                w.array(keys.len());
                keys.iter().for_each(|k| write_extra_key(w, k));
            }
            None => w.nil(),
        }
    }
}

/// Opens an event: a map with `type` plus `fields` keys, or an array of type plus fields.
fn header(w: &mut Writer, positional: bool, type_name: &str, fields: usize) {
    if positional {
        w.array(1 + fields);
    } else {
        w.map(1 + fields);
        w.str("type");
    }
    w.str(type_name);
}

fn key(w: &mut Writer, positional: bool, name: &str) {
    if !positional {
        w.str(name);
    }
}

fn opt_str(w: &mut Writer, s: Option<&str>) {
    match s {
        Some(s) => w.str(s),
        None => w.nil(),
    }
}

fn write_extra_key(w: &mut Writer, k: &ExtraKey) {
    match k {
        ExtraKey::Text(t) => w.str(t),
        ExtraKey::Multimodal(id, offset) => {
            w.array(2);
            w.str(id);
            w.int(*offset);
        }
        ExtraKey::Bytes(b) => w.bin(b),
    }
}

fn write_hashes(w: &mut Writer, hashes: &[WireHash]) {
    w.array(hashes.len());
    for h in hashes {
        write_hash(w, h);
    }
}

fn write_hash(w: &mut Writer, h: &WireHash) {
    match h {
        WireHash::Uint(v) => w.uint(*v),
        WireHash::Int(v) => w.int(*v),
        WireHash::Bin(b) => w.bin(b),
    }
}
