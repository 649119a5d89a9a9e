//! The timed part of the Mooncake scale bench: the workload's batches published into the
//! service's [`Directory`] as its stream pool does, while query clients ask it for every
//! request's prompt.
//!
//! Threads (all in this process, on the machine's cores):
//! - the **engines**: one thread publishes every batch when it is due (simulated time over
//!   `speed`), building it as an engine's publisher would (block tokens, engine hashes, parent),
//!   and queues it for the apply thread of its worker;
//! - the **apply threads** (`apply_threads`, the service's `io_threads`): worker `w` belongs
//!   to thread `w % apply_threads`, which owns its [`StreamWriter`], applies what is queued for
//!   its workers (up to [`TURN`] batches a turn) and publishes each touched stream once a turn,
//!   as the pool's threads do; a batch's lag is its publication minus its due time;
//! - the **query clients** (`query_threads`): client `q` asks for requests `q`, `q + Q`, ...
//!   at their arrival, the query endpoint's work without HTTP ([`Directory::query_json_in`],
//!   the compact answer past 128 streams); a query's latency is that call alone, and its CPU
//!   time the thread's CPU clock over the call (what the machine's other load inflates less).
//!
//! At the scheduled end (the last arrival or batch due) the events applied so far are read:
//! the rest were still queued (or not yet built, if the engines fell behind).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use kvdir::index::{IndexConfig, StreamLabel, StreamWriter};
use kvdir::query::QueryScope;
use kvdir::wire::{Batch, EngineHash, Tier};
use kvdir_bench::replay::trace::{push_block_tokens, TraceRequest, TRACE_BLOCK};
use kvdir_service::directory::Directory;

use super::workload::{Item, Workload};

/// Most batches an apply thread takes before it publishes.
pub const TURN: usize = 256;

/// How the workload is replayed.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Simulated seconds per wall second; 0 publishes and queries as fast as possible.
    pub speed: f64,
    /// Tokens per kvdir block (divides 512: a trace block is `512 / block_size` blocks).
    pub block_size: u32,
    /// Threads applying batches.
    pub apply_threads: usize,
    /// Query clients.
    pub query_threads: usize,
}

/// The directory after the replay, with its writers (dropping one removes its stream).
pub struct Fleet {
    /// The index.
    pub directory: Directory,
    /// Worker `w`'s writer at `w`.
    pub writers: Vec<StreamWriter>,
}

/// What the replay measured.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// The scheduled span: the last arrival or batch, in wall time.
    pub span: Duration,
    /// From the start until every query was answered and every batch applied.
    pub elapsed: Duration,
    /// KV events applied and published by the scheduled end.
    pub applied_at_end: u64,
    /// KV events applied and published in all.
    pub applied: u64,
    /// Batches the index refused.
    pub index_errors: u64,
    /// Each query's latency, ns, sorted.
    pub query_ns: Vec<u64>,
    /// Each query's CPU time, ns, sorted.
    pub query_cpu_ns: Vec<u64>,
    /// CPU time of the apply threads, all of it.
    pub apply_cpu: Duration,
    /// From the start until the last batch was published.
    pub events_done: Duration,
    /// From the start until the last query was answered.
    pub queries_done: Duration,
    /// Each batch's publication minus its due time, µs, sorted.
    pub lag_us: Vec<u64>,
    /// How late the engines thread built a batch at worst.
    pub engines_late: Duration,
    /// How late a client sent a query at worst.
    pub clients_late: Duration,
    /// Bytes of all answers.
    pub answer_bytes: u64,
}

/// A queued batch.
struct Sent {
    local: usize,
    seq: u64,
    events: u64,
    due: Instant,
    batch: Batch,
}

/// What an apply thread returns.
struct Applied {
    writers: Vec<StreamWriter>,
    lag_us: Vec<u64>,
    errors: u64,
    cpu: Duration,
    last: Option<Instant>,
}

/// What a query client returns.
struct Queried {
    ns: Vec<u64>,
    cpu_ns: Vec<u64>,
    late: Duration,
    bytes: u64,
    last: Option<Instant>,
}

/// Replays `w` into a fresh directory of `w.caches.len()` synchronized streams.
pub fn replay(w: &Workload, pace: Pace) -> (Measured, Fleet) {
    let directory = Directory::default();
    let threads = pace.apply_threads.max(1);
    let mut owned: Vec<Vec<StreamWriter>> = (0..threads).map(|_| Vec::new()).collect();
    for worker in 0..w.caches.len() {
        owned[worker % threads].push(join(&directory, worker, pace.block_size));
    }
    let applied = AtomicU64::new(0);
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..threads).map(|_| channel()).unzip();
    let mut m = Measured { span: wall(w.span_us(), pace.speed), ..Measured::default() };
    let start = Instant::now() + Duration::from_millis(20);
    let mut applied_threads = Vec::new();
    thread::scope(|s| {
        let appliers: Vec<_> = (owned.into_iter().zip(receivers))
            .map(|(writers, rx)| s.spawn(|| apply_loop(writers, rx, &applied)))
            .collect();
        let engines = s.spawn(|| publish(w, pace, senders, start));
        let q = pace.query_threads.max(1);
        let dir = &directory;
        let clients: Vec<_> =
            (0..q).map(|first| s.spawn(move || ask(w, dir, first, q, pace, start))).collect();
        wait_until(start + m.span);
        m.applied_at_end = applied.load(Ordering::Acquire);
        m.engines_late = engines.join().expect("the engines thread does not panic");
        for c in clients {
            let c = c.join().expect("a query client does not panic");
            m.query_ns.extend(c.ns);
            m.query_cpu_ns.extend(c.cpu_ns);
            m.queries_done = m.queries_done.max(since(start, c.last));
            m.clients_late = m.clients_late.max(c.late);
            m.answer_bytes += c.bytes;
        }
        applied_threads = appliers.into_iter().map(|a| a.join().expect("no panic")).collect();
    });
    m.elapsed = start.elapsed();
    m.applied = applied.load(Ordering::Acquire);
    let mut writers: Vec<Option<StreamWriter>> = (0..w.caches.len()).map(|_| None).collect();
    for (t, a) in applied_threads.into_iter().enumerate() {
        m.lag_us.extend(a.lag_us);
        m.index_errors += a.errors;
        m.apply_cpu += a.cpu;
        m.events_done = m.events_done.max(since(start, a.last));
        for (local, writer) in a.writers.into_iter().enumerate() {
            writers[local * threads + t] = Some(writer);
        }
    }
    m.query_ns.sort_unstable();
    m.query_cpu_ns.sort_unstable();
    m.lag_us.sort_unstable();
    let writers = writers.into_iter().map(|w| w.expect("every worker's writer")).collect();
    (m, Fleet { directory, writers })
}

/// Worker `worker`'s stream, synchronized and empty.
fn join(directory: &Directory, worker: usize, block_size: u32) -> StreamWriter {
    let label = StreamLabel { instance_name: format!("worker-{worker:05}"), ..Default::default() };
    let config = IndexConfig { block_size, ..IndexConfig::default() };
    let mut writer = directory.add_stream(config, label).expect("a slot for every worker");
    writer.load_snapshot(&Batch::default(), 0).expect("an empty snapshot applies");
    writer.publish();
    writer
}

/// `us` simulated µs in wall time at `speed` (none when unpaced).
fn wall(us: u64, speed: f64) -> Duration {
    if speed > 0.0 {
        Duration::from_secs_f64(us as f64 / 1e6 / speed)
    } else {
        Duration::ZERO
    }
}

/// From `start` to `end` (zero when nothing ended).
fn since(start: Instant, end: Option<Instant>) -> Duration {
    end.map_or(Duration::ZERO, |e| e.saturating_duration_since(start))
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn wait_until(when: Instant) {
    let now = Instant::now();
    if when > now {
        thread::sleep(when - now);
    }
}

/// The engines: every batch built and queued when due; returns how late it was at worst.
fn publish(w: &Workload, pace: Pace, senders: Vec<Sender<Sent>>, start: Instant) -> Duration {
    let threads = senders.len();
    let mut seqs = vec![0u64; w.caches.len()];
    let mut late = Duration::ZERO;
    for item in &w.items {
        let due = start + wall(item.due_us, pace.speed);
        wait_until(due);
        late = late.max(Instant::now().saturating_duration_since(due));
        let batch = batch_of(item, &w.requests[item.request as usize], pace.block_size);
        let worker = item.worker as usize;
        let seq = seqs[worker];
        seqs[worker] += 1;
        let events = item.events() as u64;
        let sent = Sent { local: worker / threads, seq, events, due, batch };
        senders[worker % threads].send(sent).expect("the apply thread runs");
    }
    late
}

/// Trace block `id`'s `j`-th kvdir block of `split`.
fn engine_hash(id: u64, j: u128, split: u128) -> EngineHash {
    EngineHash(id as u128 * split + j)
}

/// The batch an engine publishes for `item`: its stored runs, then its removals.
pub fn batch_of(item: &Item, r: &TraceRequest, block_size: u32) -> Batch {
    let split = (TRACE_BLOCK / block_size as usize) as u128;
    let ids = r.full_blocks();
    let hashes_of = |ids: &[u64]| -> Vec<EngineHash> {
        ids.iter().flat_map(|&id| (0..split).map(move |j| engine_hash(id, j, split))).collect()
    };
    let mut batch = Batch::default();
    let mut tokens = Vec::new();
    for run in &item.stored {
        let run_ids = &ids[run.start..run.end];
        let parent = run.start.checked_sub(1).map(|p| engine_hash(ids[p], split - 1, split));
        tokens.clear();
        run_ids.iter().for_each(|&id| push_block_tokens(id, &mut tokens));
        batch.push_stored(&hashes_of(run_ids), parent, &tokens, block_size, Tier::Device);
    }
    if !item.removed.is_empty() {
        batch.push_removed(&hashes_of(&item.removed), Tier::Device);
    }
    batch
}

/// An apply thread: applies what is queued, publishes each touched stream once a turn.
fn apply_loop(mut writers: Vec<StreamWriter>, rx: Receiver<Sent>, applied: &AtomicU64) -> Applied {
    let (mut lag_us, mut errors, mut last) = (Vec::new(), 0, None);
    let (mut touched, mut dues) = (Vec::new(), Vec::new());
    let cpu = thread_cpu();
    while let Ok(first) = rx.recv() {
        let mut events = 0;
        let mut next = Some(first);
        while let Some(sent) = next {
            if writers[sent.local].apply(sent.seq, &sent.batch).is_err() {
                errors += 1;
            }
            touched.push(sent.local);
            dues.push(sent.due);
            events += sent.events;
            next = if dues.len() < TURN { rx.try_recv().ok() } else { None };
        }
        touched.sort_unstable();
        touched.dedup();
        touched.drain(..).for_each(|local| writers[local].publish());
        let now = Instant::now();
        lag_us.extend(dues.drain(..).map(|d| now.saturating_duration_since(d).as_micros() as u64));
        applied.fetch_add(events, Ordering::Release);
        last = Some(now);
    }
    Applied { writers, lag_us, errors, cpu: thread_cpu() - cpu, last }
}

/// Query client `first` of `step`: every `step`-th request's prompt at its arrival.
fn ask(
    w: &Workload,
    directory: &Directory,
    first: usize,
    step: usize,
    pace: Pace,
    start: Instant,
) -> Queried {
    let scope = QueryScope::default();
    let mut out =
        Queried { ns: Vec::new(), cpu_ns: Vec::new(), late: Duration::ZERO, bytes: 0, last: None };
    for r in w.requests.iter().skip(first).step_by(step) {
        let tokens = r.tokens();
        let due = start + wall(r.timestamp_ms * 1000, pace.speed);
        wait_until(due);
        let (t0, cpu) = (Instant::now(), thread_cpu());
        out.late = out.late.max(t0.saturating_duration_since(due));
        let answer = directory.query_json_in(&tokens, &scope);
        out.cpu_ns.push((thread_cpu() - cpu).as_nanos() as u64);
        let end = Instant::now();
        out.ns.push((end - t0).as_nanos() as u64);
        out.last = Some(end);
        out.bytes += answer.len() as u64;
    }
    out
}
