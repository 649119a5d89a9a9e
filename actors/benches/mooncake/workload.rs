//! The workload of the Mooncake scale bench, built before the clock starts (pure, no I/O):
//! the trace's requests (and `copies` copies of them in disjoint block ids) spread over the
//! simulated workers, and the KV event batches each worker's cache produces.
//!
//! A worker is one engine DP rank with a prefix cache of `cache_blocks` trace blocks (512
//! tokens), the load tool's LRU ([`Lru`]: leaf first, a request touches its complete blocks).
//! Request `n` goes to a worker drawn from a seeded generator (as Dynamo's bench partitions the
//! trace). The worker admits it at its arrival: the blocks it lacks are stored, the least
//! recently used evicted down to the capacity. The worker is a FIFO server that prefills one
//! request at a time in `OVERHEAD_US` plus `PREFILL_US_PER_TOKEN` per uncached token (the
//! replay's cost model); the request's batch (its stores, then its removals) is published when
//! its prefill ends, so a worker's batches keep their order and a request's query (at its
//! arrival) never sees its own blocks.

use kvdir_bench::replay::affinity::Lru;
use kvdir_bench::replay::trace::{Trace, TraceRequest, TRACE_BLOCK};

/// Fixed cost of a prefill, simulated µs.
pub const OVERHEAD_US: u64 = 5_000;
/// Prefill cost per uncached token, simulated µs (20,000 tokens a second).
pub const PREFILL_US_PER_TOKEN: u64 = 50;

/// What the workload is built from.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Simulated workers (streams).
    pub workers: usize,
    /// Copies of the trace, each in its own block ids, replayed together.
    pub copies: usize,
    /// Trace blocks each worker's cache holds.
    pub cache_blocks: usize,
    /// Seed of the worker draw.
    pub seed: u64,
}

/// A run of consecutive blocks of a request stored in one `BlockStored` event: positions
/// `start..end` of its complete blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First position.
    pub start: usize,
    /// One past the last.
    pub end: usize,
}

/// One batch of one worker.
#[derive(Debug, Clone)]
pub struct Item {
    /// When it is published, simulated µs from the trace's start.
    pub due_us: u64,
    /// The worker.
    pub worker: u32,
    /// The request whose prefill produced it (index into [`Workload::requests`]).
    pub request: u32,
    /// Blocks stored, in runs of the request's complete blocks.
    pub stored: Vec<Run>,
    /// Trace blocks evicted, least recent first.
    pub removed: Vec<u64>,
}

impl Item {
    /// KV events in the batch: one per stored run, one for the removals.
    pub fn events(&self) -> usize {
        self.stored.len() + usize::from(!self.removed.is_empty())
    }
}

/// Events and blocks the workload produces, counted from the simulation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Batches.
    pub batches: u64,
    /// `BlockStored` events.
    pub stores: u64,
    /// `BlockRemoved` events.
    pub removes: u64,
    /// Trace blocks stored.
    pub stored_blocks: u64,
    /// Trace blocks removed.
    pub removed_blocks: u64,
}

impl Counts {
    /// KV events.
    pub fn events(&self) -> u64 {
        self.stores + self.removes
    }
}

/// Requests, their workers, the batches in publication order, and every cache at the end.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Requests in arrival order (copies interleaved).
    pub requests: Vec<TraceRequest>,
    /// Batches ordered by `due_us` (stable: a worker's in its order).
    pub items: Vec<Item>,
    /// Each worker's cache after the last request.
    pub caches: Vec<Lru>,
    /// What the batches hold.
    pub counts: Counts,
}

impl Workload {
    /// Builds the workload of `trace` for `shape`.
    pub fn build(trace: &Trace, shape: Shape) -> Workload {
        let workers = shape.workers.max(1);
        let requests = copies(trace, shape.copies.max(1));
        let mut rng = shape.seed ^ 0x6d6f_6f6e_6361_6b65;
        let mut caches = vec![Lru::new(shape.cache_blocks); workers];
        let mut free_at = vec![0u64; workers];
        let mut items = Vec::new();
        let mut counts = Counts::default();
        for (n, r) in requests.iter().enumerate() {
            let w = (splitmix(&mut rng) % workers as u64) as usize;
            let item = admit(&mut caches[w], r, w, n);
            let new_tokens = item.stored.iter().map(|s| s.end - s.start).sum::<usize>();
            let start = free_at[w].max(r.timestamp_ms * 1000);
            free_at[w] =
                start + OVERHEAD_US + PREFILL_US_PER_TOKEN * (new_tokens * TRACE_BLOCK) as u64;
            if item.stored.is_empty() && item.removed.is_empty() {
                continue;
            }
            counts.batches += 1;
            counts.stores += item.stored.len() as u64;
            counts.removes += u64::from(!item.removed.is_empty());
            counts.stored_blocks += new_tokens as u64;
            counts.removed_blocks += item.removed.len() as u64;
            items.push(Item { due_us: free_at[w], ..item });
        }
        items.sort_by_key(|i| i.due_us);
        Workload { requests, items, caches, counts }
    }

    /// Simulated µs from the first arrival to the last arrival or batch.
    pub fn span_us(&self) -> u64 {
        let last_arrival = self.requests.last().map_or(0, |r| r.timestamp_ms * 1000);
        last_arrival.max(self.items.last().map_or(0, |i| i.due_us))
    }
}

/// Request `n` admitted by a worker's cache: what it stores and evicts.
fn admit(cache: &mut Lru, r: &TraceRequest, worker: usize, n: usize) -> Item {
    let blocks = r.full_blocks();
    let mut stored: Vec<Run> = Vec::new();
    for (i, &id) in blocks.iter().enumerate() {
        if cache.contains(id) {
            continue;
        }
        match stored.last_mut() {
            Some(run) if run.end == i => run.end = i + 1,
            _ => stored.push(Run { start: i, end: i + 1 }),
        }
    }
    let mut removed = Vec::new();
    cache.touch_evicting(blocks, &mut removed);
    Item { due_us: 0, worker: worker as u32, request: n as u32, stored, removed }
}

/// The trace `copies` times, copy `c`'s block ids shifted past copy `c - 1`'s, requests
/// interleaved by arrival (copy order within a millisecond).
fn copies(trace: &Trace, copies: usize) -> Vec<TraceRequest> {
    let max_id = trace.requests.iter().flat_map(|r| r.hash_ids.iter()).max().copied();
    let stride = max_id.unwrap_or(0) + 1;
    let n = trace.requests.len();
    let mut out = Vec::with_capacity(n * copies);
    for r in &trace.requests {
        for c in 0..copies {
            let shift = stride * c as u64;
            out.push(TraceRequest {
                index: c * n + r.index,
                timestamp_ms: r.timestamp_ms,
                input_length: r.input_length,
                hash_ids: r.hash_ids.iter().map(|id| id + shift).collect(),
            });
        }
    }
    out
}

/// splitmix64.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
