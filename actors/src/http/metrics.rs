//! What `/metrics` exposes: per-stream counters kept by the stream's thread
//! ([`crate::stream::StreamCounters`]), service-wide request latencies and errors ([`ServiceMetrics`]), and the
//! rendering of both with the streams' reports and residency ([`render`]).
//!
//! Labels are bounded to `instance`, `dp_rank`, `tier` and `reason`: one series per stream (or
//! per stream and tier), and a fixed set of error reasons.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvdir::car::PredictCounters;
use kvdir::metrics::{Exposition, Histogram, Kind};
use kvdir::query::StreamMatch;
use kvdir::stream::{StreamPhase, FAULT_LABELS};

use super::descriptors::{self, Connections};
use super::frontdoor::FrontMetrics;
use super::timing::{Stages, STAGES};
use super::{ApiError, ErrorKind};
use crate::stream::StreamCounters;
use crate::stream::{PoolStats, StreamReport};

/// The request kinds whose latency is measured.
#[derive(Debug, Clone, Copy)]
pub enum Endpoint {
    /// `POST /v1/internal/kv-cache/query`.
    Query,
    /// `POST /v1/internal/route`.
    Route,
}

impl Endpoint {
    /// The `endpoint` label of the stage histograms, and the stages its handler times.
    fn stages(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Endpoint::Query => ("query", &STAGES[..4]),
            Endpoint::Route => ("route", &STAGES),
        }
    }
}

/// Service-wide request metrics.
#[derive(Debug, Default)]
pub struct ServiceMetrics {
    query: Histogram,
    route: Histogram,
    /// Each answered request's stages ([`STAGES`]), query then route.
    stages: [[Histogram; STAGES.len()]; 2],
    errors: [AtomicU64; ErrorKind::ALL.len()],
    /// HTTP connections open now and at most.
    pub connections: Connections,
}

impl ServiceMetrics {
    /// Records a request that started at `started`, and its error's reason when it failed.
    pub fn observe(&self, endpoint: Endpoint, started: Instant, error: Option<&ApiError>) {
        let h = match endpoint {
            Endpoint::Query => &self.query,
            Endpoint::Route => &self.route,
        };
        h.observe(started.elapsed());
        if let Some(error) = error {
            self.errors[error.kind() as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records the stages of an answered request.
    pub(crate) fn observe_stages(&self, endpoint: Endpoint, stages: &Stages) {
        let per_stage = &self.stages[endpoint as usize];
        for (i, d) in stages.each() {
            per_stage[i].observe(d);
        }
    }
}

/// What is known about one stream at scrape time.
pub struct StreamSample {
    /// The stream's report.
    pub report: StreamReport,
    /// Its published view (synchronized, residency), if the router has it.
    pub view: Option<StreamMatch>,
    /// Its counters.
    pub counters: Arc<StreamCounters>,
}

/// Resident set size of this process, from `/proc/self/status`.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kvdir::metrics::proc_status_bytes(&status, "VmRSS:")
}

/// What the service itself contributes to a scrape.
pub struct ServiceSample<'a> {
    /// Request latencies and errors.
    pub metrics: &'a ServiceMetrics,
    /// The front door's families.
    pub front: &'a FrontMetrics,
    /// Predict-on-route's counters and the predictions kept now.
    pub predictions: (PredictCounters, usize),
    /// Overload admission's counters and settings.
    pub overload: kvdir::overload::OverloadReport,
    /// The process's resident set size.
    pub rss: Option<u64>,
    /// The bind endpoint's counters, when kvdir binds one.
    pub bind: Option<crate::stream::BindReport>,
    /// The streams' I/O threads.
    pub pool: PoolStats,
    /// Per listed engine whose parity was checked: whether something disagrees.
    pub parity: Vec<(String, bool)>,
}

/// Per listed engine whose parity check ran, whether it found a disagreement.
pub fn parity_of(instances: &crate::discovery::InstancesReport) -> Vec<(String, bool)> {
    let checked = instances.instances.iter().filter_map(|i| {
        let parity = i.engine.as_ref()?.parity.as_ref()?;
        Some((i.name.clone(), !parity.problems().is_empty()))
    });
    checked.collect()
}

fn render_parity(e: &mut Exposition, parity: &[(String, bool)]) {
    let name = "kvdir_engine_parity_mismatch";
    let help =
        "1 when a listed engine tokenizes kvdir's check chat differently, or its block size \
                or model differs from the config (engine.parity in /v1/internal/instances).";
    e.family(name, Kind::Gauge, help);
    for (instance, mismatch) in parity {
        e.sample(name, &[("instance", instance.as_str())], f64::from(u8::from(*mismatch)));
    }
}

/// Renders every metric in the Prometheus text format.
pub fn render(streams: &[StreamSample], service: &ServiceSample) -> String {
    let mut e = Exposition::default();
    render_service(&mut e, streams, service.metrics, service.rss);
    render_pool(&mut e, &service.pool);
    descriptors::render(&mut e, &service.metrics.connections, &service.pool);
    service.front.render(&mut e);
    super::frontdoor::render_overload(&mut e, service.overload);
    render_predictions(&mut e, service.predictions);
    render_parity(&mut e, &service.parity);
    if let Some(bind) = &service.bind {
        render_bind(&mut e, bind);
    }
    render_per_stream(&mut e, streams);
    render_per_tier(&mut e, streams);
    render_faults(&mut e, streams);
    e.family(
        "kvdir_recovery_duration_seconds",
        Kind::Histogram,
        "Time from requesting a snapshot or history to synchronizing (every initial sync, \
         periodic resync and recovery).",
    );
    for s in streams {
        let dp = s.report.dp_rank.to_string();
        let labels = [("instance", s.report.instance_name.as_str()), ("dp_rank", dp.as_str())];
        e.histogram("kvdir_recovery_duration_seconds", &labels, &s.counters.recovery.snapshot());
    }
    e.finish()
}

fn render_service(
    e: &mut Exposition,
    streams: &[StreamSample],
    service: &ServiceMetrics,
    rss: Option<u64>,
) {
    e.family("kvdir_streams", Kind::Gauge, "Streams kvdir follows.");
    e.sample("kvdir_streams", &[], streams.len() as f64);
    let unsynced = streams.iter().filter(|s| !s.view.as_ref().is_some_and(|v| v.synchronized));
    e.family("kvdir_streams_unsynchronized", Kind::Gauge, "Streams that give no credit now.");
    e.sample("kvdir_streams_unsynchronized", &[], unsynced.count() as f64);
    let help = "Latency of POST /v1/internal/kv-cache/query, from request to response.";
    e.family("kvdir_query_duration_seconds", Kind::Histogram, help);
    e.histogram("kvdir_query_duration_seconds", &[], &service.query.snapshot());
    let help = "Latency of POST /v1/internal/route, from request to response.";
    e.family("kvdir_route_duration_seconds", Kind::Histogram, help);
    e.histogram("kvdir_route_duration_seconds", &[], &service.route.snapshot());
    render_stages(e, service);
    e.family("kvdir_http_errors_total", Kind::Counter, "Error responses to query and route.");
    for (kind, n) in ErrorKind::ALL.iter().zip(&service.errors) {
        let n = n.load(Ordering::Relaxed) as f64;
        e.sample("kvdir_http_errors_total", &[("reason", kind.label())], n);
    }
    if let Some(rss) = rss {
        e.family("process_resident_memory_bytes", Kind::Gauge, "Resident memory size in bytes.");
        e.sample("process_resident_memory_bytes", &[], rss as f64);
    }
}

fn render_stages(e: &mut Exposition, service: &ServiceMetrics) {
    let name = "kvdir_request_stage_duration_seconds";
    let help = "Time of each stage of an answered query or route (its Server-Timing header): \
                wait (from the client's X-Request-Start to the handler), body, parse, read, lock, \
                decide, json.";
    e.family(name, Kind::Histogram, help);
    for endpoint in [Endpoint::Query, Endpoint::Route] {
        let (label, stages) = endpoint.stages();
        for (i, stage) in stages.iter().enumerate() {
            let h = service.stages[endpoint as usize][i].snapshot();
            e.histogram(name, &[("endpoint", label), ("stage", stage)], &h);
        }
    }
}

fn render_pool(e: &mut Exposition, pool: &PoolStats) {
    let help = "I/O threads serving the streams (io_threads; they do not grow with the streams).";
    e.family("kvdir_io_threads", Kind::Gauge, help);
    e.sample("kvdir_io_threads", &[], pool.io_threads.len() as f64);
    e.family("kvdir_io_thread_streams", Kind::Gauge, "Streams each I/O thread serves.");
    for (i, t) in pool.io_threads.iter().enumerate() {
        let thread = i.to_string();
        e.sample("kvdir_io_thread_streams", &[("thread", &thread)], t.streams as f64);
    }
    let help = "Streams waiting for a replay slot (max_concurrent_replays).";
    e.family("kvdir_replays_waiting", Kind::Gauge, help);
    e.sample("kvdir_replays_waiting", &[], pool.replays_waiting as f64);
}

/// Picks one per-tier counter pair out of a stream's counters.
type TierSlots = fn(&StreamCounters) -> &[AtomicU64; 2];

/// One per-stream family: its name, kind, help and value.
type StreamFamily = (&'static str, Kind, &'static str, fn(&StreamSample) -> u64);

const STREAM_FAMILIES: [StreamFamily; 20] = [
    ("kvdir_live_messages_total", Kind::Counter, "Live messages received.", |s| {
        s.report.status.messages
    }),
    ("kvdir_decode_errors_total", Kind::Counter, "Live messages that failed to decode.", |s| {
        s.report.status.decode_errors
    }),
    ("kvdir_sequence_gaps_total", Kind::Counter, "Sequence gaps and regressions.", |s| {
        s.report.status.stats.gaps
    }),
    ("kvdir_initial_syncs_total", Kind::Counter, "First synchronizations completed.", |s| {
        s.report.status.stats.initial_syncs
    }),
    ("kvdir_resyncs_total", Kind::Counter, "Periodic resyncs completed.", |s| {
        s.report.status.stats.resyncs
    }),
    (
        "kvdir_recoveries_total",
        Kind::Counter,
        "Synchronizations regained after a fault (gap, restart, disconnect...).",
        |s| s.report.status.stats.recoveries,
    ),
    ("kvdir_snapshot_failures_total", Kind::Counter, "Snapshots that failed.", |s| {
        s.report.status.stats.snapshot_failures
    }),
    ("kvdir_snapshot_bytes_total", Kind::Counter, "Snapshot bytes received.", |s| {
        s.report.status.snapshot_bytes
    }),
    ("kvdir_skipped_events_total", Kind::Counter, "Out-of-scope events skipped.", |s| {
        s.report.status.skipped_events
    }),
    ("kvdir_stream_restarts_total", Kind::Counter, "Stream thread restarts.", |s| {
        s.report.restarts
    }),
    ("kvdir_batches_applied_total", Kind::Counter, "Live batches applied to the index.", |s| {
        s.counters.batches_applied.load(Ordering::Relaxed)
    }),
    ("kvdir_all_blocks_cleared_total", Kind::Counter, "AllBlocksCleared events applied.", |s| {
        s.counters.cleared.load(Ordering::Relaxed)
    }),
    ("kvdir_stream_synchronized", Kind::Gauge, "1 when the stream gives credit.", |s| {
        u64::from(s.view.as_ref().is_some_and(|v| v.synchronized))
    }),
    (
        "kvdir_stream_partial",
        Kind::Gauge,
        "1 when the stream knows only the blocks learned since a truncated history.",
        |s| u64::from(s.report.status.phase == StreamPhase::Partial),
    ),
    (
        "kvdir_truncated_histories_total",
        Kind::Counter,
        "History replays that no longer reached back to the asked sequence.",
        |s| s.report.status.stats.truncated_histories,
    ),
    ("kvdir_replayed_batches_total", Kind::Counter, "History batches applied.", |s| {
        s.report.status.stats.replayed_batches
    }),
    (
        "kvdir_duplicate_batches_total",
        Kind::Counter,
        "Live batches dropped as copies of replayed ones.",
        |s| s.report.status.stats.duplicate_batches,
    ),
    (
        "kvdir_index_backoffs_total",
        Kind::Counter,
        "Back-offs after the index refused a batch (1 s doubling to 60 s).",
        |s| s.report.status.stats.index_backoffs,
    ),
    (
        "kvdir_stream_attention_classes",
        Kind::Gauge,
        "A hybrid stream's attention classes (KV cache groups by kind); 0 for a dense stream.",
        |s| s.report.status.attention.len() as u64,
    ),
    (
        "kvdir_stream_unlocated_blocks",
        Kind::Gauge,
        "Hashes a group stored without content that no store located: no credit.",
        |s| s.report.status.unlocated_blocks,
    ),
];

fn render_per_stream(e: &mut Exposition, streams: &[StreamSample]) {
    for (name, kind, help, value) in STREAM_FAMILIES {
        e.family(name, kind, help);
        for s in streams {
            let dp = s.report.dp_rank.to_string();
            let labels = [("instance", s.report.instance_name.as_str()), ("dp_rank", dp.as_str())];
            e.sample(name, &labels, value(s) as f64);
        }
    }
}

fn render_per_tier(e: &mut Exposition, streams: &[StreamSample]) {
    let per_tier: [(&str, &str, TierSlots); 2] = [
        ("kvdir_blocks_stored_total", "Blocks stored by applied BlockStored events.", |c| {
            &c.blocks_stored
        }),
        ("kvdir_blocks_removed_total", "Blocks removed by applied BlockRemoved events.", |c| {
            &c.blocks_removed
        }),
    ];
    for (name, help, slots) in per_tier {
        e.family(name, Kind::Counter, help);
        for s in streams {
            let dp = s.report.dp_rank.to_string();
            for (tier, n) in ["device", "host"].iter().zip(slots(&s.counters)) {
                let labels = [
                    ("instance", s.report.instance_name.as_str()),
                    ("dp_rank", &dp),
                    ("tier", tier),
                ];
                e.sample(name, &labels, n.load(Ordering::Relaxed) as f64);
            }
        }
    }
    e.family("kvdir_resident_blocks", Kind::Gauge, "Blocks resident per tier, as indexed.");
    for s in streams {
        let Some(v) = &s.view else { continue };
        let dp = s.report.dp_rank.to_string();
        for (tier, n) in [("device", v.device_blocks), ("host", v.host_blocks)] {
            let labels =
                [("instance", s.report.instance_name.as_str()), ("dp_rank", &dp), ("tier", tier)];
            e.sample("kvdir_resident_blocks", &labels, n as f64);
        }
    }
}

fn render_faults(e: &mut Exposition, streams: &[StreamSample]) {
    let name = "kvdir_stream_faults_total";
    e.family(
        name,
        Kind::Counter,
        "Faults that ended, or kept, a stream without credit, by reason.",
    );
    for s in streams {
        let dp = s.report.dp_rank.to_string();
        for (reason, n) in FAULT_LABELS.iter().zip(&s.counters.faults) {
            let labels = [
                ("instance", s.report.instance_name.as_str()),
                ("dp_rank", dp.as_str()),
                ("reason", reason),
            ];
            e.sample(name, &labels, n.load(Ordering::Relaxed) as f64);
        }
    }
}

fn render_predictions(e: &mut Exposition, (counters, kept): (PredictCounters, usize)) {
    let name = "kvdir_route_predictions_total";
    e.family(name, Kind::Counter, "Predict-on-route: content keys expected on a chosen instance.");
    let events = [
        ("recorded", counters.recorded),
        ("confirmed", counters.confirmed),
        ("expired", counters.expired),
        ("evicted", counters.evicted),
    ];
    for (event, n) in events {
        e.sample(name, &[("event", event)], n as f64);
    }
    let help = "Predict-on-route: (key, instance) predictions kept now.";
    e.family("kvdir_route_predictions", Kind::Gauge, help);
    e.sample("kvdir_route_predictions", &[], kept as f64);
}

fn render_bind(e: &mut Exposition, bind: &crate::stream::BindReport) {
    let name = "kvdir_bind_messages_total";
    e.family(name, Kind::Counter, "Messages on kv_events_bind handed to their stream.");
    e.sample(name, &[], bind.messages as f64);
    let name = "kvdir_bind_unknown_messages_total";
    e.family(name, Kind::Counter, "Messages on kv_events_bind whose topic names no stream.");
    e.sample(name, &[], bind.unknown_messages as f64);
    let name = "kvdir_bind_connections";
    e.family(
        name,
        Kind::Gauge,
        "Engine connections open on the kv_events_bind ports kvdir listens on.",
    );
    e.sample(name, &[], bind.connections as f64);
}
