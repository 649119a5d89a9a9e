//! Workloads shared by the benches: a seeded token and hash generator, snapshot streams of whole
//! prefixes, and a reader for criterion's saved estimates so that a bench can print its ratio to
//! a baseline measured in the same run.
//!
//! Every bench includes this file as `mod common;` and uses a different part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use kvdir::index::{ContentKey, IndexConfig, KeyHasher, SharedIndex, SharedReader, StreamWriter};
use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, StoredRecord, WireHash};
use kvdir::wire::{decode_batch, encode_batch, Batch, Tier};

/// Tokens per block (the issue's `B`).
pub const BLOCK_SIZE: u32 = 128;
/// Token ids are drawn from `0..VOCAB`, so 56 % of them encode as 5-byte uint32.
pub const VOCAB: u64 = 150_000;
/// Blocks per `BlockStored` event.
pub const BLOCKS_PER_EVENT: usize = 16;
/// `BlockStored` events per batch.
pub const EVENTS_PER_BATCH: usize = 32;
/// Blocks per batch (32 events of 16).
pub const BLOCKS_PER_BATCH: usize = BLOCKS_PER_EVENT * EVENTS_PER_BATCH;
/// Blocks in the snapshot stream of the query, recovery and memory benches.
pub const STREAM_BLOCKS: usize = 262_144;
/// Blocks per prefix in the snapshot stream (a 32,768-token prompt).
pub const PREFIX_BLOCKS: usize = 256;

/// splitmix64: a small seeded generator, so every run builds the same workload.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// `n` token ids from the vocabulary.
    pub fn tokens(&mut self, n: usize) -> Vec<i32> {
        (0..n).map(|_| self.below(VOCAB) as i32).collect()
    }
}

/// The settings of the benches' streams.
pub fn config(max_blocks: usize) -> IndexConfig {
    IndexConfig { max_blocks, ..IndexConfig::default() }
}

/// One prefix of the snapshot stream: engine hashes and the tokens of every block.
#[derive(Debug, Clone)]
pub struct Prefix {
    /// Engine hashes, one per block.
    pub hashes: Vec<u64>,
    /// `BLOCK_SIZE` tokens per block.
    pub tokens: Vec<i32>,
}

/// `STREAM_BLOCKS / PREFIX_BLOCKS` (1,024) independent prefixes of 256 blocks.
pub fn stream_prefixes(seed: u64) -> Vec<Prefix> {
    let mut rng = Rng::new(seed);
    (0..STREAM_BLOCKS / PREFIX_BLOCKS)
        .map(|_| Prefix {
            hashes: (0..PREFIX_BLOCKS).map(|_| rng.next_u64()).collect(),
            tokens: rng.tokens(PREFIX_BLOCKS * BLOCK_SIZE as usize),
        })
        .collect()
}

/// The `BlockStored` events of a prefix, 16 blocks each, each naming the previous one's last
/// block as its parent.
fn prefix_events(p: &Prefix) -> impl Iterator<Item = EventRecord> + '_ {
    let b = BLOCK_SIZE as usize;
    (0..p.hashes.len()).step_by(BLOCKS_PER_EVENT).map(move |start| {
        let end = start + BLOCKS_PER_EVENT;
        EventRecord::Stored(StoredRecord::new(
            p.hashes[start..end].iter().map(|h| WireHash::Uint(*h)).collect(),
            start.checked_sub(1).map(|i| WireHash::Uint(p.hashes[i])),
            p.tokens[start * b..end * b].to_vec(),
            BLOCK_SIZE,
            Tier::Device,
        ))
    })
}

/// The snapshot as xLLM would send it: parent-first `BlockStored` events in `[ts, events,
/// dp_rank]` batches of 512 blocks (512 payloads of about 280 KB, under the 8 MiB default of
/// `max_message_bytes`).
pub fn snapshot_payloads(prefixes: &[Prefix]) -> Vec<Vec<u8>> {
    let events: Vec<EventRecord> = prefixes.iter().flat_map(prefix_events).collect();
    events
        .chunks(EVENTS_PER_BATCH)
        .map(|chunk| {
            let rec = BatchRecord { timestamp: 1.0, events: chunk.to_vec(), dp_rank: Some(0) };
            encode_batch(&rec, BatchForm::Array, EventForm::Map)
        })
        .collect()
}

/// Decodes every payload into its own batch.
pub fn decode_all(payloads: &[Vec<u8>]) -> Vec<Batch> {
    payloads
        .iter()
        .map(|p| {
            let mut b = Batch::default();
            decode_batch(p, &mut b).expect("bench payload decodes");
            b
        })
        .collect()
}

/// One stream alone in a shared index (the index the service runs), and a reader of it.
pub fn one_stream(config: IndexConfig) -> (StreamWriter, SharedReader) {
    let shared = SharedIndex::new(config.block_size, config.hash_seed, 1);
    let writer = shared.add_stream(config).expect("one free slot");
    (writer, shared.reader())
}

/// Builds, installs and publishes a snapshot from pre-decoded batches.
pub fn install(index: &mut StreamWriter, batches: &[Batch]) {
    let mut builder = index.snapshot_builder();
    for b in batches {
        builder.add(b).expect("bench snapshot applies");
    }
    index.install_snapshot(builder, 1);
    index.publish();
}

/// The content keys of every block of `tokens`.
pub fn content_keys(tokens: &[i32]) -> Vec<ContentKey> {
    let cfg = IndexConfig::default();
    let mut out = Vec::new();
    KeyHasher::new(cfg.block_size, cfg.hash_seed).prefix_keys(tokens, &mut out);
    out
}

/// Nearest-rank percentile of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Criterion's saved estimates, read back so a bench can print ratios measured in this run.
#[derive(Debug)]
pub struct Estimates {
    dir: PathBuf,
    started: SystemTime,
}

impl Default for Estimates {
    fn default() -> Self {
        Self::new()
    }
}

impl Estimates {
    /// Call before the benches run: estimates older than this are ignored as stale.
    pub fn new() -> Self {
        // Where criterion writes: `$CRITERION_HOME`, else `<target>/criterion`; the target
        // directory is found from this bench binary (`<target>/<profile>/deps/<bench>`), which
        // works for every package of the workspace and any `CARGO_TARGET_DIR`.
        let target = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()));
        let dir = match (std::env::var_os("CRITERION_HOME"), target) {
            (Some(home), _) => PathBuf::from(home),
            (None, Some(target)) => target.join("criterion"),
            (None, None) => PathBuf::from("target/criterion"),
        };
        Estimates { dir, started: SystemTime::now() }
    }

    /// The median time per iteration of `group/bench`, in ns, if it ran in this process.
    pub fn median_ns(&self, group: &str, bench: &str) -> Option<f64> {
        let path = self.dir.join(group).join(bench).join("new").join("estimates.json");
        let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
        if modified < self.started {
            return None;
        }
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        json["median"]["point_estimate"].as_f64()
    }

    /// Prints `subject` as a throughput and as a percentage of `baseline`'s throughput, both
    /// doing `elements` per iteration; prints why not when either did not run.
    pub fn print_throughput_ratio(&self, group: &str, subject: &str, baseline: &str, n: f64) {
        match (self.median_ns(group, subject), self.median_ns(group, baseline)) {
            (Some(s), Some(b)) => println!(
                "{group}: {subject} {:.2} M elem/s = {:.1} % of {baseline} ({:.2} M elem/s)",
                n / s * 1e3,
                100.0 * b / s,
                n / b * 1e3,
            ),
            _ => println!("{group}: {subject} vs {baseline}: not both measured in this run"),
        }
    }

    /// Prints `subject`'s median time and its ratio to `baseline`'s.
    pub fn print_time_ratio(&self, group: &str, subject: &str, baseline: &str) {
        match (self.median_ns(group, subject), self.median_ns(group, baseline)) {
            (Some(s), Some(b)) => println!(
                "{group}: {subject} {} = {:.2} x {baseline} ({})",
                fmt_ns(s),
                s / b,
                fmt_ns(b),
            ),
            _ => println!("{group}: {subject} vs {baseline}: not both measured in this run"),
        }
    }
}

/// A duration in ns, printed with a readable unit.
pub fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.1} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// Open prefixes that stores continue.
const SLOTS: usize = 128;
/// A prefix stops growing at this many pieces (256 blocks, 32,768 tokens).
const MAX_PIECES: usize = 16;
/// A replayable live workload.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Batches in one replay cycle.
    pub cycle: usize,
    /// A batch's blocks are removed this many batches after they were stored.
    pub window: usize,
}

impl Shape {
    /// The stream: 245,760 resident blocks, near the default 262,144 limit.
    pub const FULL: Shape = Shape { cycle: 640, window: 480 };
    /// 8,192 resident blocks: the maps fit in cache, which isolates the cost of cache misses.
    pub const SMALL: Shape = Shape { cycle: 64, window: 16 };

    /// A prefix is continued only while its last piece is younger than this, in batches.
    pub fn max_parent_age(self) -> usize {
        self.window / 2
    }

    pub fn resident_blocks(self) -> usize {
        self.window * BLOCKS_PER_BATCH
    }
}

#[derive(Clone, Copy, Default)]
struct Slot {
    last: Option<u64>,
    batch: usize,
    pieces: usize,
}

/// The payloads of one replay cycle: each batch first removes the blocks stored `window`
/// batches earlier, then stores 512 blocks continuing open prefixes.
pub fn live_cycle(shape: Shape) -> Vec<Vec<u8>> {
    let Shape { cycle, window } = shape;
    let mut rng = Rng::new(7);
    let mut slots = [Slot::default(); SLOTS];
    let b = BLOCK_SIZE as usize;
    let mut stores: Vec<Vec<EventRecord>> = Vec::with_capacity(cycle);
    let mut stored_hashes: Vec<Vec<WireHash>> = Vec::with_capacity(cycle);
    for batch in 0..cycle {
        let mut events = Vec::with_capacity(EVENTS_PER_BATCH);
        let mut hashes = Vec::with_capacity(BLOCKS_PER_BATCH);
        for _ in 0..EVENTS_PER_BATCH {
            let slot = &mut slots[rng.below(SLOTS as u64) as usize];
            let continues = slot.last.is_some()
                && batch - slot.batch < shape.max_parent_age()
                && slot.pieces < MAX_PIECES;
            if !continues {
                *slot = Slot::default();
            }
            let piece: Vec<u64> = (0..BLOCKS_PER_EVENT).map(|_| rng.next_u64()).collect();
            let wire: Vec<WireHash> = piece.iter().map(|h| WireHash::Uint(*h)).collect();
            hashes.extend(wire.iter().cloned());
            events.push(EventRecord::Stored(StoredRecord::new(
                wire,
                slot.last.map(WireHash::Uint),
                rng.tokens(BLOCKS_PER_EVENT * b),
                BLOCK_SIZE,
                Tier::Device,
            )));
            *slot = Slot { last: piece.last().copied(), batch, pieces: slot.pieces + 1 };
        }
        stores.push(events);
        stored_hashes.push(hashes);
    }
    stores
        .into_iter()
        .enumerate()
        .map(|(batch, stores)| {
            // Engines evict before they store; the first cycle's removals name blocks not yet
            // stored and are only counted, from the second cycle on every one is resident.
            let evicted = stored_hashes[(batch + cycle - window) % cycle].clone();
            let mut events = vec![EventRecord::removed(evicted, Tier::Device)];
            events.extend(stores);
            let rec = BatchRecord { timestamp: batch as f64, events, dp_rank: Some(0) };
            encode_batch(&rec, BatchForm::Array, EventForm::Map)
        })
        .collect()
}
