//! The [`Report`] of a run, as plain text ([`Report::text`]) or JSON ([`Report::json`]).
//!
//! Rates: "published" divides what the engines handed to their PUB sockets by the publishing
//! time; "applied" divides the batches kvdir applied (the sum over the fleet's streams of the
//! advance of their last applied `sequence`) by the time from the start of the load until
//! kvdir had caught up (or the deadline). Blocks applied are the published blocks when kvdir
//! caught up; kvdir does not count blocks itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use super::clients::KindStats;
use super::handler::HandlerLatency;
use super::kvdir::Rss;
use super::scale::Scale;
use kvdir_sim::Published;

/// What kvdir applied during the load.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// Batches applied (advance of the streams' last applied sequence).
    pub batches: u64,
    /// Live messages received (advance of the streams report's `messages`).
    pub messages: u64,
    /// From the start of the load until caught up (or the deadline).
    pub wall: Duration,
    /// Whether every stream reached its engine's last sequence, synchronized.
    pub caught_up: bool,
    /// After the last publish, how long catching up took.
    pub catch_up: Duration,
    /// Streams that had not caught up at the deadline.
    pub lagging: Vec<String>,
    /// Advance of the streams report's counters (gaps, recoveries, decode errors ...).
    pub counters: BTreeMap<&'static str, u64>,
    /// The first fault a stream reported after the load, if any.
    pub last_fault: Option<String>,
}

impl Applied {
    /// Counters that should not move during a healthy load, with their advance when they did:
    /// gaps, recoveries, decode errors, failed snapshots, dropped batches, restarts. Initial
    /// syncs and periodic resyncs are not among them: every stream resyncs once per
    /// `resync_interval_ms`, so any run longer than that would "fault".
    pub fn faults(&self) -> Vec<(&'static str, u64)> {
        let healthy = ["messages", "skipped_events", "initial_syncs", "resyncs"];
        let moved = self.counters.iter().filter(|(k, v)| !healthy.contains(k) && **v > 0);
        moved.map(|(k, v)| (*k, *v)).collect()
    }
}

/// Everything a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// One line describing the setup.
    pub setup: String,
    /// Streams (engines x DP ranks).
    pub streams: usize,
    /// From kvdir's address known until every stream was synchronized.
    pub sync: Duration,
    /// Engine requests the drivers sent.
    pub requests: u64,
    /// What the engines published during the load.
    pub published: Published,
    /// How long the drivers published.
    pub publish_wall: Duration,
    /// What kvdir applied.
    pub applied: Applied,
    /// HTTP clients during the load, one entry per kind.
    pub load: Vec<KindStats>,
    /// The same clients without ingest (empty when skipped).
    pub baseline: Vec<KindStats>,
    /// kvdir's own handler latency (its `/metrics` histograms) during the load and the baseline.
    pub handler: (Vec<HandlerLatency>, Vec<HandlerLatency>),
    /// kvdir's RSS before the load.
    pub rss_before: Rss,
    /// kvdir's RSS after the load.
    pub rss_after: Rss,
    /// CPU seconds kvdir used from the start of the load until it caught up (pid known).
    pub kvdir_cpu: Option<f64>,
    /// `(answered, last answer not 200)` heartbeats, in etcd mode.
    pub heartbeats: Option<(u64, u64)>,
    /// `/proc/loadavg` at the start and the end.
    pub loadavg: (String, String),
    /// Idle CPU, threads, time to synchronize, the tool's own cost.
    pub scale: Scale,
}

fn per_second(n: u64, wall: Duration) -> f64 {
    n as f64 / wall.as_secs_f64().max(1e-9)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "unknown".to_string(), |b| format!("{:.1} MiB", b as f64 / 1048576.0))
}

fn errors_text(s: &KindStats) -> String {
    if s.errors.is_empty() {
        return "0".to_string();
    }
    let parts: Vec<String> = s.errors.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    format!("{} ({})", s.error_count(), parts.join(", "))
}

fn stats_line(label: &str, s: &KindStats) -> String {
    let line = format!(
        "  {label:<16} {:>7} ok {:>8.0}/s  p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms  \
         errors {}\n",
        s.latencies.len(),
        s.per_second(),
        ms(s.percentile(50.0)),
        ms(s.percentile(99.0)),
        ms(s.max()),
        errors_text(s)
    );
    match s.stages.text() {
        stages if stages.is_empty() => line,
        stages => format!("{line}    stages p50/p99 ms: {stages}\n"),
    }
}

fn stats_json(s: &KindStats) -> Value {
    json!({
        "kind": s.kind.name(),
        "ok": s.latencies.len(),
        "per_second": s.per_second(),
        "p50_ms": ms(s.percentile(50.0)),
        "p99_ms": ms(s.percentile(99.0)),
        "max_ms": ms(s.max()),
        "errors": s.errors,
        "seconds": s.wall.as_secs_f64(),
        "stages": s.stages.json(),
    })
}

fn rss_json(r: &Rss) -> Value {
    json!({ "bytes": r.bytes, "peak_bytes": r.peak, "source": r.source })
}

impl Report {
    /// Every failed request, load and baseline.
    pub fn total_errors(&self) -> u64 {
        self.load.iter().chain(&self.baseline).map(KindStats::error_count).sum()
    }

    /// The load stats of `kind`, if it had clients.
    pub fn kind(&self, kind: super::Kind) -> Option<&KindStats> {
        self.load.iter().find(|s| s.kind == kind)
    }

    /// Load latency over baseline latency per kind: `(kind, p50 ratio, p99 ratio)`.
    pub fn ratios(&self) -> Vec<(&'static str, f64, f64)> {
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
        self.load
            .iter()
            .filter_map(|l| {
                let b =
                    self.baseline.iter().find(|b| b.kind == l.kind && !b.latencies.is_empty())?;
                let p50 = ratio(l.percentile(50.0), b.percentile(50.0));
                Some((l.kind.name(), p50, ratio(l.percentile(99.0), b.percentile(99.0))))
            })
            .collect()
    }

    /// The plain-text report.
    pub fn text(&self) -> String {
        let mut t = format!("kvdir-bench: {}\n", self.setup);
        let _ = writeln!(t, "loadavg at start {} / at end {}", self.loadavg.0, self.loadavg.1);
        let _ = writeln!(
            t,
            "synchronized: {} streams in {:.2} s",
            self.streams,
            self.sync.as_secs_f64()
        );
        self.ingest_text(&mut t);
        self.http_text(&mut t);
        let _ = match self.rss_after.bytes {
            None => writeln!(t, "kvdir RSS: {}", self.rss_after.source),
            Some(_) => writeln!(
                t,
                "kvdir RSS: before {}, after {}{} (from {})",
                mib(self.rss_before.bytes),
                mib(self.rss_after.bytes),
                self.rss_after.peak.map_or(String::new(), |p| format!(", peak {}", mib(Some(p)))),
                self.rss_after.source
            ),
        };
        if let Some(cpu) = self.kvdir_cpu {
            let _ = writeln!(
                t,
                "kvdir CPU from the start of the load until caught up: {cpu:.2} s = {:.2} cores, \
                 {:.0} µs per applied batch (HTTP requests included)",
                cpu / self.applied.wall.as_secs_f64().max(1e-9),
                cpu * 1e6 / self.applied.batches.max(1) as f64
            );
        }
        self.scale.text(&mut t, &self.applied, self.publish_wall);
        if let Some((answered, bad)) = self.heartbeats {
            let _ = writeln!(
                t,
                "heartbeats answered: {answered} (engines whose last answer was not 200: {bad})"
            );
        }
        t
    }

    /// Published and applied rates, and the streams report's counters.
    fn ingest_text(&self, t: &mut String) {
        let (p, a) = (&self.published, &self.applied);
        let _ = writeln!(
            t,
            "published: {} requests, {} batches, {} events, {} blocks in {:.2} s: {:.0} batches/s, \
             {:.0} events/s, {:.0} blocks/s",
            self.requests,
            p.batches,
            p.events,
            p.blocks,
            self.publish_wall.as_secs_f64(),
            per_second(p.batches, self.publish_wall),
            per_second(p.events, self.publish_wall),
            per_second(p.blocks, self.publish_wall)
        );
        let _ = write!(
            t,
            "applied by kvdir: {} batches ({} live messages received) in {:.2} s: {:.0} batches/s",
            a.batches,
            a.messages,
            a.wall.as_secs_f64(),
            per_second(a.batches, a.wall)
        );
        let _ = match a.caught_up {
            true => writeln!(
                t,
                ", {:.0} events/s, {:.0} blocks/s; caught up {:.0} ms after the last publish",
                per_second(p.events, a.wall),
                per_second(p.blocks, a.wall),
                ms(a.catch_up)
            ),
            false => writeln!(
                t,
                "; NOT caught up: {} streams lag, first {:?}",
                a.lagging.len(),
                a.lagging.first()
            ),
        };
        let counters: Vec<String> = a.counters.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(t, "streams report during the load: {}", counters.join(", "));
        let faults = a.faults();
        if !faults.is_empty() {
            let list: Vec<String> = faults.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(
                t,
                "WARNING: kvdir's streams faulted during the load ({}): batches reached it by \
                 resnapshot, not live; last fault: {:?}",
                list.join(", "),
                a.last_fault
            );
        }
    }

    /// Latency lines per kind, under load and in the baseline, and their ratios.
    fn http_text(&self, t: &mut String) {
        t.push_str("HTTP during the load:\n");
        self.load.iter().for_each(|s| t.push_str(&stats_line(s.kind.name(), s)));
        if !self.baseline.is_empty() {
            t.push_str("HTTP baseline, same clients without ingest:\n");
            self.baseline.iter().for_each(|s| t.push_str(&stats_line(s.kind.name(), s)));
        }
        for (kind, p50, p99) in self.ratios() {
            let _ = writeln!(t, "ratio load / baseline, {kind}: p50 {p50:.2}x, p99 {p99:.2}x");
        }
        for (phase, lines) in [("the load", &self.handler.0), ("the baseline", &self.handler.1)] {
            if !lines.is_empty() {
                let _ = writeln!(t, "kvdir's own histograms (bucket bounds), {phase}:");
                lines.iter().for_each(|h| t.push_str(&h.text()));
            }
        }
    }

    /// The report as JSON.
    pub fn json(&self) -> Value {
        let (p, a) = (&self.published, &self.applied);
        json!({
            "setup": self.setup,
            "streams": self.streams,
            "loadavg": [self.loadavg.0, self.loadavg.1],
            "sync_seconds": self.sync.as_secs_f64(),
            "published": {
                "requests": self.requests, "batches": p.batches, "events": p.events,
                "blocks": p.blocks, "seconds": self.publish_wall.as_secs_f64(),
                "batches_per_second": per_second(p.batches, self.publish_wall),
                "events_per_second": per_second(p.events, self.publish_wall),
                "blocks_per_second": per_second(p.blocks, self.publish_wall),
            },
            "applied": {
                "batches": a.batches, "messages": a.messages, "seconds": a.wall.as_secs_f64(),
                "batches_per_second": per_second(a.batches, a.wall),
                "caught_up": a.caught_up, "catch_up_ms": ms(a.catch_up),
                "lagging": a.lagging, "counters": a.counters,
                "faults": a.faults().into_iter().collect::<BTreeMap<_, _>>(),
                "last_fault": a.last_fault,
            },
            "load": self.load.iter().map(stats_json).collect::<Vec<_>>(),
            "baseline": self.baseline.iter().map(stats_json).collect::<Vec<_>>(),
            "handler": {
                "load": self.handler.0.iter().map(HandlerLatency::json).collect::<Vec<_>>(),
                "baseline": self.handler.1.iter().map(HandlerLatency::json).collect::<Vec<_>>(),
            },
            "ratios": self.ratios().iter().map(|(k, p50, p99)| json!({"kind": k, "p50": p50, "p99": p99})).collect::<Vec<_>>(),
            "rss_before": rss_json(&self.rss_before),
            "rss_after": rss_json(&self.rss_after),
            "kvdir_cpu_seconds": self.kvdir_cpu,
            "heartbeats": self.heartbeats.map(|(answered, bad)| json!({"answered": answered, "last_not_ok": bad})),
            "scale": self.scale.json(a, self.publish_wall, self.kvdir_cpu),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_fault_counters_are_faults_and_received_messages_are_not() {
        let mut applied = Applied {
            batches: 3,
            messages: 3,
            wall: Duration::from_secs(1),
            caught_up: true,
            catch_up: Duration::ZERO,
            lagging: Vec::new(),
            counters: [("gaps", 0), ("skipped_events", 2), ("recoveries", 0)].into(),
            last_fault: None,
        };
        assert_eq!(applied.faults(), []);
        applied.counters.insert("decode_errors", 3);
        applied.counters.insert("resyncs", 3);
        assert_eq!(applied.faults(), [("decode_errors", 3)], "periodic resyncs are no fault");
        applied.counters.insert("recoveries", 1);
        assert_eq!(applied.faults(), [("decode_errors", 3), ("recoveries", 1)]);
    }
}
