//! The load tool behind the `kvdir-bench` binary: simulated engines publish a shared-prefix
//! workload into a running kvdir while HTTP clients query and route, then a [`Report`].
//!
//! A run ([`run`]):
//! 1. starts `--engines` [`kvdir_sim::SimEngine`]s ([`fleet`]);
//! 2. tells kvdir about them: registers them in etcd, or writes the static `streams` config,
//!    and with `--spawn_kvdir` starts kvdir itself ([`kvdir`]);
//! 3. polls kvdir until every stream is synchronized ([`probe`]), and in etcd mode until every
//!    instance has a load report; then measures kvdir idle for `--idle_seconds` ([`scale`]);
//! 4. for `--duration_seconds`: the drivers publish ([`drive`]) while the clients send queries
//!    and routes ([`clients`], over the keep-alive client in [`http`]);
//! 5. polls until kvdir has applied every published batch (or the deadline), reads its RSS;
//! 6. runs the same clients `--baseline_seconds` without ingest, for ratios in the same run.
//!
//! Modules: [`flags`] (options, `--help`), [`fleet`], [`kvdir`], [`probe`], [`drive`],
//! [`clients`], [`http`], [`handler`] (kvdir's own latency histograms), [`report`], [`scale`]
//! (idle CPU, threads, the tool's own cost) and [`fds`] (the open-file budget); [`replay`]
//! is the `kvdir-bench replay` subcommand, which replays a request trace through the same
//! fleet, kvdir and probe; [`chat`] is `kvdir-bench chat`, the OpenAI front door under a chat
//! load. The one error type is [`BenchError`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use thiserror::Error;

use kvdir_sim::{Published, SimError};

pub mod chat;
pub mod clients;
pub mod drive;
pub mod fds;
pub mod flags;
pub mod fleet;
pub mod handler;
pub mod http;
pub mod kvdir;
pub mod nice;
pub mod probe;
pub mod replay;
pub mod report;
pub mod scale;
pub mod stages;

pub use clients::{Kind, KindStats};
pub use flags::{help, parse_args, BenchCommand, BenchOptions, Mode};
pub use report::{Applied, Report};

use clients::{with_clients, ClientPlan};
use fleet::{Fleet, StreamName};
use handler::{HandlerLatency, Snapshot};
use http::Conn;
use kvdir::{cpu_seconds, Kvdir, Rss};
use probe::{Probe, StreamView, COUNTERS};
use scale::Scale;

/// Upper bound of one probe request.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything that can stop a run.
#[derive(Debug, Error)]
pub enum BenchError {
    /// Flags are invalid; every problem is listed.
    #[error("invalid flags: {}; run kvdir-bench --help", .0.join("; "))]
    Flags(Vec<String>),
    /// A simulated engine or its registration failed.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A file could not be written or a program not started.
    #[error("cannot {op} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or program.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A trace file is malformed.
    #[error("trace {0}")]
    Trace(String),
    /// kvdir did not answer as expected.
    #[error("kvdir: {0}")]
    Kvdir(String),
    /// kvdir did not get ready in time.
    #[error(
        "kvdir did not get {what} within {seconds:.0} s: {count} not ready, first: {first}; \
         check that kvdir's config matches (block_size, etcd address and namespace) or raise \
         --sync_timeout_seconds"
    )]
    Timeout {
        /// What was awaited.
        what: String,
        /// The deadline.
        seconds: f64,
        /// How many streams or instances were not ready.
        count: usize,
        /// The first few, with their state.
        first: String,
    },
    /// A worker thread panicked.
    #[error("{0} panicked")]
    Panicked(&'static str),
}

impl BenchError {
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> BenchError {
        BenchError::Io { op, path: path.to_path_buf(), source }
    }
}

/// Runs the load described by `o` and returns its report.
pub fn run(o: &BenchOptions) -> Result<Report, BenchError> {
    let loadavg_start = loadavg();
    let mut fleet = Fleet::start(o)?;
    let kvdir_start = Instant::now();
    let mut kvdir = Kvdir::start(o, &fleet.kvdir_config(o))?;
    if let (Some(path), None) = (&o.write_config, &o.spawn_kvdir) {
        eprintln!(
            "kvdir-bench: wrote {}; waiting up to {:.0} s for kvdir at {} to synchronize",
            path.display(),
            o.sync_timeout.as_secs_f64(),
            kvdir.addr
        );
    }
    match measure(o, &mut fleet, &kvdir, kvdir_start) {
        Ok(mut report) => {
            report.loadavg.0 = loadavg_start;
            Ok(report)
        }
        Err(e) => Err(kvdir.explain(e)),
    }
}

/// Steps 3 to 6 of a run, against a kvdir that knows the fleet (started at `kvdir_start`).
fn measure(
    o: &BenchOptions,
    fleet: &mut Fleet,
    kvdir: &Kvdir,
    kvdir_start: Instant,
) -> Result<Report, BenchError> {
    fleet.register(o, &kvdir.addr)?;
    let conn = Conn::new(&kvdir.addr, o.internal_api_token.clone(), PROBE_TIMEOUT);
    let mut probe = Probe::new(conn, fleet.streams());
    let sync = probe.wait_synchronized(o.route_clients > 0, o.sync_timeout)?;
    let mut scale = Scale {
        start_to_sync: kvdir_start.elapsed(),
        bench: Scale::own(fleet.fd_limit),
        kvdir_threads: (kvdir.pid.and_then(scale::threads), None),
        kvdir_fds: (kvdir.pid.and_then(scale::open_fds), None),
        ..Scale::default()
    };
    scale.idle_cpu = scale::idle_cpu(kvdir.pid, o.idle);
    let before = probe.views()?;
    let rss_before = Rss::read(kvdir.pid, probe.conn());
    let prompts = drive::prompts(o, fleet.streams().len());
    let plan = ClientPlan {
        addr: kvdir.addr.clone(),
        token: o.internal_api_token.clone(),
        clients: vec![(Kind::Query, o.query_clients), (Kind::Route, o.route_clients)],
        rate: o.client_rate,
    };
    let published_before = fleet.published()?;
    let handler_before = handler_snapshot(&mut probe);
    let cpu_before = kvdir.pid.and_then(cpu_seconds);
    let own_before = cpu_seconds(std::process::id());
    if o.engines_nice > 0 {
        // The engines' threads (the drivers lower themselves); the clients keep this thread's.
        nice::lower_others(o.engines_nice)
            .map_err(|e| BenchError::Kvdir(format!("--engines_nice: {e}")))?;
    }
    let start = Instant::now();
    let (requests, load) =
        with_clients(&plan, &prompts, || drive::run(fleet, o, start + o.duration))?;
    let requests = requests?;
    let publish_wall = start.elapsed();
    scale.bench_cpu = cpu_seconds(std::process::id()).zip(own_before).map(|(a, b)| a - b);
    let published = minus(fleet.published()?, published_before);
    let (after, lagging) = probe.wait_caught_up(&fleet.last_sequences()?, o.sync_timeout)?;
    let applied = applied(&fleet.streams(), &before, &after, lagging, start, publish_wall);
    let cpu = kvdir.pid.and_then(cpu_seconds).zip(cpu_before).map(|(a, b)| a - b);
    scale.kvdir_threads.1 = kvdir.pid.and_then(scale::threads);
    scale.kvdir_fds.1 = kvdir.pid.and_then(scale::open_fds);
    let rss_after = Rss::read(kvdir.pid, probe.conn());
    let metrics_after = metrics_text(&mut probe);
    scale.read_metrics(&metrics_after);
    let handler_after = Snapshot::parse(&metrics_after);
    let (baseline, handler_baseline) = match o.baseline.is_zero() {
        true => (Vec::new(), Vec::new()),
        false => {
            let clients = with_clients(&plan, &prompts, || thread::sleep(o.baseline))?.1;
            (clients, HandlerLatency::between(&handler_after, &handler_snapshot(&mut probe)))
        }
    };
    Ok(Report {
        setup: setup(o, kvdir),
        streams: fleet.streams().len(),
        sync,
        requests,
        published,
        publish_wall,
        applied,
        load,
        baseline,
        handler: (HandlerLatency::between(&handler_before, &handler_after), handler_baseline),
        rss_before,
        rss_after,
        kvdir_cpu: cpu,
        heartbeats: fleet.heartbeats(),
        loadavg: (String::new(), loadavg()),
        scale,
    })
}

/// kvdir's latency histograms now; empty if `/metrics` cannot be read (the report then has no
/// handler lines).
fn handler_snapshot(probe: &mut Probe) -> Snapshot {
    Snapshot::parse(&metrics_text(probe))
}

/// kvdir's `/metrics` text; empty if it cannot be read.
fn metrics_text(probe: &mut Probe) -> String {
    match probe.conn().get("/metrics") {
        Ok(r) if r.status == 200 => String::from_utf8_lossy(&r.body).into_owned(),
        _ => String::new(),
    }
}

fn minus(a: Published, b: Published) -> Published {
    Published {
        batches: a.batches - b.batches,
        events: a.events - b.events,
        blocks: a.blocks - b.blocks,
    }
}

/// What kvdir applied between the two views.
pub(crate) fn applied(
    streams: &[StreamName],
    before: &HashMap<StreamName, StreamView>,
    after: &HashMap<StreamName, StreamView>,
    lagging: Vec<String>,
    start: Instant,
    publish_wall: Duration,
) -> Applied {
    let next = |views: &HashMap<StreamName, StreamView>, s: &StreamName| {
        views.get(s).and_then(|v| v.sequence).map_or(0, |q| q + 1)
    };
    let counter = |views: &HashMap<StreamName, StreamView>, s: &StreamName, c: &str| {
        views.get(s).and_then(|v| v.counters.get(c).copied()).unwrap_or(0)
    };
    let mut counters = BTreeMap::new();
    for c in COUNTERS {
        let sum =
            streams.iter().map(|s| counter(after, s, c).saturating_sub(counter(before, s, c)));
        counters.insert(c, sum.sum());
    }
    let batches = streams.iter().map(|s| next(after, s).saturating_sub(next(before, s))).sum();
    let last_fault = streams.iter().find_map(|s| after.get(s).and_then(|v| v.error.clone()));
    let wall = start.elapsed();
    Applied {
        batches,
        messages: counters.remove("messages").unwrap_or(0),
        wall,
        caught_up: lagging.is_empty(),
        catch_up: wall.saturating_sub(publish_wall),
        lagging,
        counters,
        last_fault,
    }
}

fn setup(o: &BenchOptions, kvdir: &Kvdir) -> String {
    let rate = |r: Option<f64>| r.map_or("back to back".to_string(), |r| format!("{r}/s"));
    let mode = match &o.mode {
        Mode::Etcd { addr, namespace } => format!("etcd {addr} namespace {namespace:?}"),
        Mode::Static => "static streams".to_string(),
    };
    let target = match (&o.spawn_kvdir, kvdir.pid) {
        (Some(_), Some(pid)) => format!("spawned kvdir pid {pid} at {}", kvdir.addr),
        _ => format!("kvdir at {}", kvdir.addr),
    };
    format!(
        "{} engines x {} DP = {} streams, block size {}, {} Device + {} Host blocks per rank; \
         {} drivers, engine requests {}; {} query + {} route clients, {}; {:.1} s load, {:.1} s \
         baseline; {mode}; {target}{}",
        o.engines,
        o.dp_size,
        o.engines * o.dp_size,
        o.block_size,
        o.device_blocks,
        o.host_blocks,
        o.drivers,
        rate(o.rate),
        o.query_clients,
        o.route_clients,
        rate(o.client_rate),
        o.duration.as_secs_f64(),
        o.baseline.as_secs_f64(),
        match o.engines_nice {
            0 => String::new(),
            n => format!("; engines at nice {n}, clients not"),
        },
    )
}

pub(crate) fn loadavg() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}
