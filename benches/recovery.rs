//! Recovery: building, installing and publishing a snapshot of 262,144 blocks, for one stream
//! alone in a shared index.
//!
//! The snapshot is 1,024 prefixes of 256 blocks, sent parent-first as 512 `[ts, events, dp_rank]`
//! payloads of 512 blocks (32 `BlockStored` events of 16), about 280 KB each: one payload of
//! the whole stream would be about 140 MB, far over the 8 MiB default of `max_message_bytes`.
//!
//! - `decode_build_install_publish`: decode every payload, `SharedSnapshot::add` it, install,
//!   publish (which adds every key to the shared view);
//! - `build_install_publish`: the same from pre-decoded batches;
//! - `decode_build_install_publish_sized`: the same with `SharedSnapshot::with_capacity` told
//!   the snapshot's size (what a resync of a running stream can pass: its current block count),
//!   so the maps never rehash while they grow;
//! - `decode_only`: decoding the 512 payloads alone;
//! - `baseline_xxh3_128_tokens`: XXH3-128 over every block's token bytes, the least work any
//!   content-keyed snapshot must do, measured in the same run.
//!
//! Every iteration starts from a fresh stream; creating and dropping it is not timed.

mod common;

use std::hint::black_box;
use std::time::Duration;

use common::{Estimates, BLOCK_SIZE, STREAM_BLOCKS};
use criterion::{BatchSize, Criterion, SamplingMode, Throughput};
use kvdir::index::{SharedSnapshot, StreamWriter};
use kvdir::wire::{decode_batch, Batch};

const GROUP: &str = "recovery_262144_blocks";

/// A fresh stream with room for the snapshot.
fn fresh() -> StreamWriter {
    common::one_stream(common::config(STREAM_BLOCKS)).0
}

fn main() {
    let estimates = Estimates::new();
    let prefixes = common::stream_prefixes(3);
    let payloads = common::snapshot_payloads(&prefixes);
    let batches = common::decode_all(&payloads);
    let bytes: Vec<u8> =
        prefixes.iter().flat_map(|p| p.tokens.iter().flat_map(|t| t.to_le_bytes())).collect();
    drop(prefixes);
    let wire: usize = payloads.iter().map(Vec::len).sum();
    println!(
        "recovery workload: {} payloads, {:.1} MB on the wire, largest {} bytes",
        payloads.len(),
        wire as f64 / 1e6,
        payloads.iter().map(Vec::len).max().unwrap_or(0)
    );

    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group(GROUP);
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(STREAM_BLOCKS as u64));

    g.bench_function("baseline_xxh3_128_tokens", |b| {
        b.iter(|| {
            let mut acc = 0u128;
            for block in bytes.chunks_exact(4 * BLOCK_SIZE as usize) {
                acc ^= xxhash_rust::xxh3::xxh3_128_with_seed(black_box(block), 1024);
            }
            acc
        })
    });

    let mut scratch = Batch::default();
    g.bench_function("decode_only", |b| {
        b.iter(|| {
            let mut events = 0;
            for p in &payloads {
                decode_batch(black_box(p), &mut scratch).expect("decodes");
                events += scratch.events.len();
            }
            events
        })
    });

    g.bench_function("build_install_publish", |b| {
        b.iter_batched(
            fresh,
            |mut index| {
                common::install(&mut index, &batches);
                index
            },
            BatchSize::PerIteration,
        )
    });

    for (name, sized) in
        [("decode_build_install_publish", false), ("decode_build_install_publish_sized", true)]
    {
        g.bench_function(name, |b| {
            b.iter_batched(
                fresh,
                |mut index| {
                    let mut builder = match sized {
                        true => SharedSnapshot::with_capacity(
                            common::config(STREAM_BLOCKS),
                            STREAM_BLOCKS,
                        ),
                        false => index.snapshot_builder(),
                    };
                    for p in &payloads {
                        decode_batch(p, &mut scratch).expect("decodes");
                        builder.add(&scratch).expect("applies");
                    }
                    index.install_snapshot(builder, 1);
                    index.publish();
                    index
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
    c.final_summary();

    let (mut check, reader) = common::one_stream(common::config(STREAM_BLOCKS));
    common::install(&mut check, &batches);
    assert_eq!(check.block_count(), STREAM_BLOCKS);
    assert_eq!(reader.handle().content_entries(), STREAM_BLOCKS);

    println!("\nratios measured in this run (median time for 262,144 blocks):");
    let subjects = [
        "decode_build_install_publish",
        "decode_build_install_publish_sized",
        "build_install_publish",
        "decode_only",
    ];
    for subject in subjects {
        estimates.print_time_ratio(GROUP, subject, "baseline_xxh3_128_tokens");
    }
}
