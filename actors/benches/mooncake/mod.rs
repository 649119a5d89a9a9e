//! The Mooncake trace through thousands of simulated workers, into the shared indexes behind
//! kvdir's stream pool, in one process (the shape of Dynamo's `mooncake_bench`, so the two
//! can be compared): operations a second (KV events applied plus queries answered), query
//! latency, and the share of events still queued when the replay's schedule ended.
//!
//! [`workload`] builds the batches from the trace (untimed); [`replay`] publishes them and asks
//! the queries on the clock. Run by `cargo bench -p kvdir-service --bench mooncake_scale`
//! (flags in [`USAGE`]; docs/load-tool.md) and, tiny, by the e2e test `mooncake_scale`;
//! each uses a part of it.
#![allow(dead_code)]

pub mod replay;
pub mod workload;

use std::path::PathBuf;

use kvdir_bench::replay::trace::{Trace, TRACE_BLOCK};
use serde_json::{json, Value};

use replay::{Fleet, Measured, Pace};
use workload::{Counts, Shape, Workload};

/// The flags.
pub const USAGE: &str = "\
mooncake_scale: the Mooncake trace through N simulated workers into kvdir's shared indexes
  --trace PATH          Mooncake JSONL (default sim/data/mooncake/conversation_trace.jsonl)
  --requests N          first N requests of the trace (default all)
  --workers N,N,..      one run per worker count (default 256,1024,4096)
  --copies K            K copies of the trace in disjoint block ids, replayed together (1)
  --cache_blocks N      512-token blocks each worker's cache holds (64)
  --block_size N        tokens per kvdir block, dividing 512 (128)
  --speed X             simulated seconds per wall second; 0 = as fast as possible (120)
  --apply_threads N     threads applying batches (2)
  --query_threads N     query clients (1)
  --seed N              seed of the workers' draw (42)
  --json                one JSON object per run";

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The trace file.
    pub trace: PathBuf,
    /// Only the first requests.
    pub requests: Option<usize>,
    /// Worker counts, one run each.
    pub workers: Vec<usize>,
    /// Copies, cache capacity and seed of the workload (`workers` set per run).
    pub shape: Shape,
    /// Pace and threads of the replay.
    pub pace: Pace,
    /// Print JSON.
    pub json: bool,
}

impl Default for Options {
    fn default() -> Self {
        let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../sim/data/mooncake/");
        Options {
            trace: PathBuf::from(trace).join("conversation_trace.jsonl"),
            requests: None,
            workers: vec![256, 1024, 4096],
            shape: Shape { workers: 0, copies: 1, cache_blocks: 64, seed: 42 },
            pace: Pace { speed: 120.0, block_size: 128, apply_threads: 2, query_threads: 1 },
            json: false,
        }
    }
}

impl Options {
    /// Parses `--flag value` pairs (a bench's `--bench` is ignored).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
        let mut o = Options::default();
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            if flag == "--bench" || flag == "--json" {
                o.json |= flag == "--json";
                continue;
            }
            let value = args.next().ok_or(format!("{flag} needs a value\n{USAGE}"))?;
            let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
            match flag.as_str() {
                "--trace" => o.trace = PathBuf::from(value),
                "--requests" => o.requests = Some(num(&value)?),
                "--workers" => o.workers = value.split(',').map(num).collect::<Result<_, _>>()?,
                "--copies" => o.shape.copies = num(&value)?,
                "--cache_blocks" => o.shape.cache_blocks = num(&value)?,
                "--block_size" => o.pace.block_size = num(&value)? as u32,
                "--speed" => o.pace.speed = value.parse().map_err(|e| format!("{flag}: {e}"))?,
                "--apply_threads" => o.pace.apply_threads = num(&value)?,
                "--query_threads" => o.pace.query_threads = num(&value)?,
                "--seed" => o.shape.seed = num(&value)? as u64,
                _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
            }
        }
        o.check().map(|()| o)
    }

    fn check(&self) -> Result<(), String> {
        let b = self.pace.block_size as usize;
        if b == 0 || TRACE_BLOCK % b != 0 {
            return Err(format!("--block_size {b} must divide {TRACE_BLOCK}, e.g. 128"));
        }
        if self.workers.iter().any(|&w| w == 0 || w > 65_536) {
            return Err(format!("--workers {:?}: each in 1..=65536", self.workers));
        }
        Ok(())
    }
}

/// One run's figures.
#[derive(Debug, Clone)]
pub struct Report {
    /// Simulated workers.
    pub workers: usize,
    /// Queries asked (one per request).
    pub queries: u64,
    /// Events and blocks the workload produced.
    pub counts: Counts,
    /// What the replay measured.
    pub measured: Measured,
}

impl Report {
    /// Events produced and still unapplied at the scheduled end.
    pub fn queued_at_end(&self) -> u64 {
        self.counts.events() - self.measured.applied_at_end
    }

    /// The report as JSON.
    pub fn to_json(&self) -> Value {
        let m = &self.measured;
        let (span, elapsed) = (m.span.as_secs_f64(), m.elapsed.as_secs_f64());
        let ops = (self.counts.events() + self.queries) as f64;
        let q = |p: f64| percentile(&m.query_ns, p) as f64 / 1e3;
        let cpu = |p: f64| percentile(&m.query_cpu_ns, p) as f64 / 1e3;
        let after = |d: std::time::Duration| (d.as_secs_f64() - span).max(0.0);
        let lag = |p: f64| percentile(&m.lag_us, p) as f64 / 1e3;
        json!({
            "workers": self.workers, "queries": self.queries,
            "events": self.counts.events(), "stores": self.counts.stores,
            "removes": self.counts.removes, "batches": self.counts.batches,
            "stored_blocks": self.counts.stored_blocks, "removed_blocks": self.counts.removed_blocks,
            "span_s": span, "elapsed_s": elapsed,
            "offered_ops_per_s": if span > 0.0 { ops / span } else { f64::INFINITY },
            "achieved_ops_per_s": ops / elapsed.max(1e-9),
            "query_p50_us": q(50.0), "query_p99_us": q(99.0), "query_max_us": q(100.0),
            "query_cpu_p50_us": cpu(50.0), "query_cpu_p99_us": cpu(99.0),
            "apply_cpu_per_batch_us": m.apply_cpu.as_secs_f64() * 1e6 / self.counts.batches.max(1) as f64,
            "lag_p50_ms": lag(50.0), "lag_p99_ms": lag(99.0), "lag_max_ms": lag(100.0),
            "applied_at_end": m.applied_at_end, "applied": m.applied,
            "queued_at_end": self.queued_at_end(),
            "queued_share": self.queued_at_end() as f64 / self.counts.events().max(1) as f64,
            "events_drained_s": after(m.events_done), "queries_drained_s": after(m.queries_done),
            "index_errors": m.index_errors,
            "engines_late_ms": m.engines_late.as_secs_f64() * 1e3,
            "clients_late_ms": m.clients_late.as_secs_f64() * 1e3,
            "answer_bytes_mean": m.answer_bytes / self.queries.max(1),
        })
    }

    /// The report as text lines.
    pub fn text(&self) -> String {
        let j = self.to_json();
        let f = |k: &str| j[k].as_f64().unwrap_or(f64::NAN);
        format!(
            "workers {}: {} queries, {} events ({} stores, {} removes) in {:.1} s scheduled, \
             {:.1} s taken\n  ops/s offered {:.0}, achieved {:.0}; query p50 {:.0} µs, p99 {:.0} \
             µs, max {:.0} µs (CPU p50 {:.0}, p99 {:.0} µs); batch lag p50 {:.2} ms, p99 {:.2} \
             ms, apply CPU {:.0} µs a batch\n  events queued at the end {} ({:.2} %), all applied \
             {:.2} s after it, all queries answered {:.2} s after it; index errors {}; late at \
             worst: engines {:.1} ms, clients {:.1} ms",
            self.workers,
            self.queries,
            self.counts.events(),
            self.counts.stores,
            self.counts.removes,
            f("span_s"),
            f("elapsed_s"),
            f("offered_ops_per_s"),
            f("achieved_ops_per_s"),
            f("query_p50_us"),
            f("query_p99_us"),
            f("query_max_us"),
            f("query_cpu_p50_us"),
            f("query_cpu_p99_us"),
            f("lag_p50_ms"),
            f("lag_p99_ms"),
            f("apply_cpu_per_batch_us"),
            self.queued_at_end(),
            100.0 * f("queued_share"),
            f("events_drained_s"),
            f("queries_drained_s"),
            self.measured.index_errors,
            f("engines_late_ms"),
            f("clients_late_ms"),
        )
    }
}

/// The `p`-th percentile (0 to 100) of `sorted` (0 when empty).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied().unwrap_or(0)
}

/// Builds the workload of `trace` over `workers` workers and replays it.
pub fn run(o: &Options, trace: &Trace, workers: usize) -> (Report, Workload, Fleet) {
    let workload = Workload::build(trace, Shape { workers, ..o.shape });
    let (measured, fleet) = replay::replay(&workload, o.pace);
    let queries = workload.requests.len() as u64;
    let report = Report { workers, queries, counts: workload.counts, measured };
    (report, workload, fleet)
}
