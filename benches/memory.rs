//! Memory per indexed block for a stream of 262,144 blocks alone in a shared index, counted by
//! an allocation-counting global allocator (`stats_alloc`), not estimated.
//!
//! The figure is the heap bytes held after building a snapshot, installing it and publishing
//! it, minus those held before, over the number of blocks: the stream's engine-hash table, the
//! shared view and the status are included; the input batches are not. It also prints the
//! figure after each step, so the share of the engine-hash table and of the view shows, and the
//! same count for a stream filled by live batches instead of a snapshot. Baseline counted the same way in the same run: a
//! `std::collections::HashMap<u128, u8>` holding the stream's 262,144 content keys, the smallest
//! map that could answer a match. Not a criterion bench: it prints and exits.

mod common;

use std::alloc::System;
use std::collections::HashMap;

use common::{BLOCKS_PER_BATCH, STREAM_BLOCKS};

use kvdir::wire::{Batch, Event};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The target, bytes per indexed block.
const TARGET: f64 = 48.0;

/// Heap bytes held now minus at the region's start.
fn held(region: &Region<'_, System>) -> isize {
    let c = region.change();
    c.bytes_allocated as isize - c.bytes_deallocated as isize
}

fn per_block(bytes: isize) -> f64 {
    bytes as f64 / STREAM_BLOCKS as f64
}

/// The snapshot batches as live batches: a leading unlimited `AllBlocksCleared` makes the first
/// a full state, which synchronizes the stream; the rest apply as ordinary deltas.
fn as_live(batches: &[Batch]) -> Vec<Batch> {
    batches
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut live = Batch::default();
            if i == 0 {
                live.push_cleared(None);
            }
            for e in &b.events {
                if let Event::Stored(s) = e {
                    let (hashes, tokens) = (b.hashes(s.hashes), b.tokens(s.tokens));
                    live.push_stored(hashes, s.parent, tokens, s.block_size, s.tier);
                }
            }
            live
        })
        .collect()
}

fn snapshot_figure(batches: &[Batch]) -> f64 {
    let region = Region::new(GLOBAL);
    let (mut index, reader) = common::one_stream(common::config(STREAM_BLOCKS));
    let empty = held(&region);
    let mut builder = index.snapshot_builder();
    for b in batches {
        builder.add(b).expect("snapshot applies");
    }
    let built = held(&region);
    index.install_snapshot(builder, 1);
    index.publish();
    let published = held(&region);
    assert_eq!(index.block_count(), STREAM_BLOCKS);
    assert_eq!(reader.handle().content_entries(), STREAM_BLOCKS);

    println!("snapshot of {STREAM_BLOCKS} blocks, heap bytes held per block:");
    println!("  empty stream                          {:>7.1}", per_block(empty));
    println!("  built aside (engine-hash table + map) {:>7.1}", per_block(built));
    println!("  installed and published (+ the view)  {:>7.1}", per_block(published));
    drop(index);
    println!("  after dropping the stream             {:>7.1}", per_block(held(&region)));
    per_block(published)
}

fn live_figure(batches: &[Batch]) -> f64 {
    let region = Region::new(GLOBAL);
    let (mut index, _reader) = common::one_stream(common::config(STREAM_BLOCKS));
    for (seq, b) in batches.iter().enumerate() {
        index.apply(seq as u64, b).expect("live batch applies");
        index.publish();
    }
    let held = held(&region);
    assert_eq!(index.block_count(), STREAM_BLOCKS);
    println!(
        "live: {} batches of {BLOCKS_PER_BATCH} blocks, published after each: {:>7.1} bytes/block",
        batches.len(),
        per_block(held)
    );
    per_block(held)
}

/// Bytes per key of a std `HashMap<u128, u8>` filled with the stream's content keys.
fn baseline_figure(prefixes: &[common::Prefix]) -> f64 {
    let keys: Vec<u128> = prefixes
        .iter()
        .flat_map(|p| common::content_keys(&p.tokens))
        .map(|k| k.to_u128())
        .collect();
    let region = Region::new(GLOBAL);
    let map: HashMap<u128, u8> = keys.iter().map(|k| (*k, 1)).collect();
    let bytes = held(&region);
    assert_eq!(map.len(), STREAM_BLOCKS);
    println!(
        "baseline std HashMap<u128, u8> of the same keys: {:>7.1} bytes/key",
        per_block(bytes)
    );
    per_block(bytes)
}

fn main() {
    let prefixes = common::stream_prefixes(5);
    let batches = common::decode_all(&common::snapshot_payloads(&prefixes));
    let snapshot = snapshot_figure(&batches);
    let live = live_figure(&as_live(&batches));
    let baseline = baseline_figure(&prefixes);
    let verdict = |v: f64| if v <= TARGET { "met" } else { "missed" };
    println!(
        "\nmemory per indexed block: {snapshot:.1} B (snapshot), {live:.1} B (live) = {:.2} x the \
         baseline's {baseline:.1} B; target <= {TARGET} B: {} / {}",
        snapshot / baseline,
        verdict(snapshot),
        verdict(live)
    );
}
