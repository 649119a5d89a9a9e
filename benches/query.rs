//! Query latency: a 32,768-token prompt (256 blocks of 128) matched against a stream of 262,144
//! blocks alone in a shared index, content-key hashing included (`SharedHandle::query`, the walk
//! the service runs, which hashes only as far as the stream matches).
//!
//! The stream is 1,024 prefixes of 256 blocks installed as one snapshot. Cases: `full_hit` (the
//! prompt is one of those prefixes), `half_hit` (its first 128 blocks are, the rest differ),
//! `miss` (no block is). The split is measured separately: `hash_only` computes the 256 keys,
//! `match_only_full_hit` walks precomputed keys. Baselines in the same run:
//! `baseline_std_hashmap_probe`, the same 256 probes into a `std::collections::HashMap<u128, u8>`
//! of the stream's 262,144 keys, and `baseline_xxh3_128_tokens`, XXH3-128 over the same 256
//! blocks' token bytes (the hashing a content key cannot avoid).
//!
//! Criterion reports medians; after it, the bench times 10,000 single queries of each case with
//! `Instant` and prints p50, p99 and the maximum (the target is a p99).
//!
//! A second group, `query_body`, reads the query endpoint's body (`parse_scoped_query`): 9,000
//! six-digit ids, as a tokenizer with a 150k vocabulary gives, written with `,` and with `, `,
//! and 32,768 (a 256-block prompt).

mod common;

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{Estimates, Prefix, Rng, BLOCK_SIZE, PREFIX_BLOCKS, STREAM_BLOCKS};
use criterion::{Criterion, Throughput};
use kvdir::index::{IndexConfig, KeyHasher, SharedHandle};

const GROUP: &str = "query_256_blocks";
/// Single queries timed for the percentiles.
const TIMED: usize = 10_000;

/// A query's tokens and what it should match.
struct Case {
    name: &'static str,
    tokens: Vec<i32>,
    expect_blocks: u64,
}

fn cases(prefixes: &[Prefix]) -> Vec<Case> {
    let mut rng = Rng::new(99);
    let resident = prefixes[prefixes.len() / 2].tokens.clone();
    let half = PREFIX_BLOCKS / 2 * BLOCK_SIZE as usize;
    let mut half_hit = resident[..half].to_vec();
    half_hit.extend(rng.tokens(resident.len() - half));
    let miss = rng.tokens(resident.len());
    vec![
        Case { name: "full_hit", tokens: resident, expect_blocks: PREFIX_BLOCKS as u64 },
        Case { name: "half_hit", tokens: half_hit, expect_blocks: PREFIX_BLOCKS as u64 / 2 },
        Case { name: "miss", tokens: miss, expect_blocks: 0 },
    ]
}

/// The service's query: one walk that hashes `tokens` as far as the stream (slot 0) matches.
fn query(view: &mut SharedHandle, tokens: &[i32]) -> u64 {
    view.query(tokens).tokens(0).0
}

/// `query_body`: the endpoint's body read into ids (see the module documentation).
fn bench_body(c: &mut Criterion) {
    let ids = |n: u64| -> Vec<String> {
        (0..n).map(|i| (100_000 + i * 7_919 % 51_000).to_string()).collect()
    };
    let mut g = c.benchmark_group("query_body");
    g.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    let cases = [
        ("9000_ids_comma", 9_000, ","),
        ("9000_ids_comma_space", 9_000, ", "),
        ("32768_ids_comma", 32_768, ","),
    ];
    for (name, n, sep) in cases {
        let ids = ids(n);
        g.throughput(Throughput::Elements(n));
        let body = format!("{{\"token_ids\": [{}]}}", ids.join(sep));
        let parse = || kvdir::query::parse_scoped_query(black_box(body.as_bytes()), 1 << 20);
        assert_eq!(parse().expect("a plain body").0.len(), ids.len());
        g.bench_function(name, |b| b.iter(|| parse().expect("a plain body").0.len()));
    }
    g.finish();
}

/// The baseline: walk the keys through a std `HashMap` until the first absent one.
fn probe(map: &HashMap<u128, u8>, keys: &[u128]) -> u64 {
    let mut hits = 0;
    for k in keys {
        match map.get(k) {
            Some(_) => hits += 1,
            None => break,
        }
    }
    hits
}

/// Times `f` `TIMED` times, one call each, and prints p50 / p99 / max.
fn percentiles(label: &str, mut f: impl FnMut() -> u64) {
    let mut times = Vec::with_capacity(TIMED);
    for _ in 0..TIMED {
        let start = Instant::now();
        black_box(f());
        times.push(start.elapsed());
    }
    times.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{label:<38} p50 {:>7.2} µs  p99 {:>7.2} µs  max {:>8.2} µs  ({TIMED} single queries)",
        us(common::percentile(&times, 50.0)),
        us(common::percentile(&times, 99.0)),
        us(*times.last().expect("timed")),
    );
}

fn main() {
    let estimates = Estimates::new();
    let prefixes = common::stream_prefixes(1);
    let cfg = IndexConfig { max_blocks: 300_000, ..IndexConfig::default() };
    let (mut index, reader) = common::one_stream(cfg);
    common::install(&mut index, &common::decode_all(&common::snapshot_payloads(&prefixes)));
    assert_eq!((index.block_count(), index.slot()), (STREAM_BLOCKS, 0));
    let mut view = reader.handle();
    let baseline: HashMap<u128, u8> = prefixes
        .iter()
        .flat_map(|p| common::content_keys(&p.tokens))
        .map(|k| (k.to_u128(), 1))
        .collect();

    let cases = cases(&prefixes);
    let mut hasher = KeyHasher::new(cfg.block_size, cfg.hash_seed);
    let mut keys = Vec::with_capacity(PREFIX_BLOCKS);
    for case in &cases {
        let got = query(&mut view, &case.tokens);
        assert_eq!(got, case.expect_blocks * u64::from(BLOCK_SIZE), "{}", case.name);
    }
    let full_keys = common::content_keys(&cases[0].tokens);
    let full_u128: Vec<u128> = full_keys.iter().map(|k| k.to_u128()).collect();
    assert_eq!(probe(&baseline, &full_u128), PREFIX_BLOCKS as u64);

    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group(GROUP);
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(PREFIX_BLOCKS as u64));
    for case in &cases {
        g.bench_function(case.name, |b| b.iter(|| query(&mut view, black_box(&case.tokens))));
    }
    g.bench_function("hash_only", |b| {
        b.iter(|| {
            keys.clear();
            hasher.prefix_keys(black_box(&cases[0].tokens), &mut keys);
            keys.len()
        })
    });
    g.bench_function("match_only_full_hit", |b| {
        b.iter(|| view.match_keys(black_box(&full_keys)).tokens(0).0)
    });
    g.bench_function("baseline_std_hashmap_probe", |b| {
        b.iter(|| probe(&baseline, black_box(&full_u128)))
    });
    let token_bytes: Vec<u8> = cases[0].tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    g.bench_function("baseline_xxh3_128_tokens", |b| {
        b.iter(|| {
            let mut acc = 0u128;
            for block in token_bytes.chunks_exact(4 * BLOCK_SIZE as usize) {
                acc ^= xxhash_rust::xxh3::xxh3_128_with_seed(black_box(block), cfg.hash_seed);
            }
            acc
        })
    });
    g.finish();
    bench_body(&mut c);
    c.final_summary();

    println!("\nratios measured in this run (median time per 256-block query):");
    for subject in ["match_only_full_hit", "full_hit", "half_hit", "miss"] {
        estimates.print_time_ratio(GROUP, subject, "baseline_std_hashmap_probe");
    }
    estimates.print_time_ratio(GROUP, "hash_only", "baseline_xxh3_128_tokens");

    println!("\nsingle-query latency (Instant around each call):");
    for case in &cases {
        percentiles(&format!("{} (hash + match)", case.name), || query(&mut view, &case.tokens));
    }
    percentiles("hash_only", || {
        keys.clear();
        hasher.prefix_keys(&cases[0].tokens, &mut keys);
        keys.len() as u64
    });
    percentiles("match_only_full_hit", || view.match_keys(&full_keys).tokens(0).0);
    percentiles("baseline_std_hashmap_probe", || probe(&baseline, &full_u128));
}
