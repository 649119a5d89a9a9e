//! Ingest throughput: decoding live batches and applying them to one stream's writer in the
//! shared index (alone there), publishing after each, in blocks/s.
//!
//! Workload (the figures): block_size 128, 16 blocks per `BlockStored`, 32 stores per
//! batch (512 blocks), tokens from a 150k vocabulary, random u64 engine hashes, Device tier,
//! `[ts, events, dp_rank]` batches of map events as xLLM sends them. Each store continues one of
//! 128 open prefixes from its last block (parent = that block), or starts a new one; a prefix
//! stops growing at 256 blocks.
//!
//! The stream is kept at a steady 245,760 blocks (under the default 262,144 limit): every batch
//! also removes, in one `BlockRemoved`, the 512 blocks stored 480 batches earlier. A cycle of 640
//! payloads is replayed in a loop; a parent is always less than 240 batches old, so every parent
//! is still resident and every removal names a resident block. Throughput counts the 512 stored
//! blocks per batch; the 512 removals are extra work on top. `apply_publish_8k_resident` runs the
//! same kind of workload on a stream of 8,192 blocks, whose maps fit in cache.
//!
//! Baseline in the same run: XXH3-128 over the same blocks' token bytes, which is the least work
//! any content-keyed index must do per block. `cargo bench --bench ingest` prints the ratio last.

mod common;

use std::hint::black_box;
use std::time::Duration;

use common::{live_cycle, Estimates, Shape, BLOCKS_PER_BATCH, BLOCK_SIZE};
use criterion::{Criterion, Throughput};
use kvdir::index::{ApplyStats, ContentKey, IndexConfig, KeyHasher, StreamWriter};
use kvdir::wire::{decode_batch, Batch, Event};

const GROUP: &str = "ingest_512_blocks_per_batch";

/// A synchronized stream replaying one cycle of batches from where it stopped.
struct Replay<'a> {
    index: StreamWriter,
    batches: &'a [Batch],
    next: usize,
}

impl<'a> Replay<'a> {
    /// A stream synchronized by an empty snapshot, then taken through two whole cycles: the
    /// first fills it, the second checks that the steady state holds (no unknown removals).
    fn steady(shape: Shape, batches: &'a [Batch]) -> Self {
        let (mut index, _) = common::one_stream(IndexConfig::default());
        index.load_snapshot(&Batch::default(), 0).expect("empty snapshot");
        let mut replay = Replay { index, batches, next: 0 };
        for _ in 0..shape.cycle {
            replay.step();
        }
        for _ in 0..shape.cycle {
            let stats = replay.step();
            assert_eq!((stats.stored, stats.removed), (512, 512), "steady state: {stats:?}");
        }
        assert_eq!(replay.index.block_count(), shape.resident_blocks());
        replay
    }

    /// The payload of the next batch.
    fn next_index(&self) -> usize {
        self.next % self.batches.len()
    }

    /// Applies and publishes the next pre-decoded batch.
    fn step(&mut self) -> ApplyStats {
        let batch = &self.batches[self.next_index()];
        self.apply(batch)
    }

    /// Applies and publishes `batch` in place of the next one.
    fn apply(&mut self, batch: &Batch) -> ApplyStats {
        let stats = self.index.apply(self.next as u64, batch).expect("bench batch applies");
        self.index.publish();
        self.next += 1;
        stats
    }
}

/// Each block's tokens as little-endian bytes, for the hashing baseline.
fn token_bytes(batch: &Batch) -> Vec<u8> {
    let mut out = Vec::new();
    for e in &batch.events {
        if let Event::Stored(s) = e {
            out.extend(batch.tokens(s.tokens).iter().flat_map(|t| t.to_le_bytes()));
        }
    }
    out
}

fn bench(c: &mut Criterion) {
    let payloads = live_cycle(Shape::FULL);
    let batches = common::decode_all(&payloads);
    let bytes: Vec<Vec<u8>> = batches.iter().map(token_bytes).collect();
    let wire: usize = payloads.iter().map(Vec::len).sum();
    let cycle = Shape::FULL.cycle;
    println!(
        "ingest workload: {cycle} batches of {BLOCKS_PER_BATCH} stored + {BLOCKS_PER_BATCH} \
         removed blocks, {:.0} wire bytes per stored block",
        wire as f64 / (cycle * BLOCKS_PER_BATCH) as f64
    );

    let mut g = c.benchmark_group(GROUP);
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(BLOCKS_PER_BATCH as u64));

    let mut i = 0;
    g.bench_function("baseline_xxh3_128_tokens", |b| {
        b.iter(|| {
            let buf = &bytes[i % cycle];
            i += 1;
            let mut acc = 0u128;
            for block in buf.chunks_exact(4 * BLOCK_SIZE as usize) {
                acc ^= xxhash_rust::xxh3::xxh3_128_with_seed(black_box(block), 1024);
            }
            acc
        })
    });

    let mut hasher = KeyHasher::new(BLOCK_SIZE, 1024);
    let mut keys: Vec<ContentKey> = Vec::with_capacity(BLOCKS_PER_BATCH);
    g.bench_function("content_keys_only", |b| {
        b.iter(|| {
            let batch = &batches[i % cycle];
            i += 1;
            keys.clear();
            for e in &batch.events {
                if let Event::Stored(s) = e {
                    hasher.prefix_keys(batch.tokens(s.tokens), &mut keys);
                }
            }
            keys.len()
        })
    });

    let mut batch = Batch::default();
    g.bench_function("decode", |b| {
        b.iter(|| {
            decode_batch(black_box(&payloads[i % cycle]), &mut batch).expect("decodes");
            i += 1;
            batch.events.len()
        })
    });

    let mut replay = Replay::steady(Shape::FULL, &batches);
    g.bench_function("apply_publish", |b| b.iter(|| replay.step()));

    g.bench_function("decode_apply_publish", |b| {
        b.iter(|| {
            decode_batch(black_box(&payloads[replay.next_index()]), &mut batch).expect("decodes");
            replay.apply(&batch)
        })
    });
    drop(replay);

    let small = common::decode_all(&live_cycle(Shape::SMALL));
    let mut replay = Replay::steady(Shape::SMALL, &small);
    g.bench_function("apply_publish_8k_resident", |b| b.iter(|| replay.step()));
    g.finish();
}

fn main() {
    let estimates = Estimates::new();
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    let n = BLOCKS_PER_BATCH as f64;
    println!("\nratios measured in this run (median, stored blocks per second):");
    let subjects = [
        "decode",
        "apply_publish",
        "decode_apply_publish",
        "apply_publish_8k_resident",
        "content_keys_only",
    ];
    for subject in subjects {
        estimates.print_throughput_ratio(GROUP, subject, "baseline_xxh3_128_tokens", n);
    }
}
