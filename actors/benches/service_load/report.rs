//! What the load prints: CPU seconds by thread group (from `/proc/self/task`), rates,
//! latencies and the streams report.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::queries::Latencies;
use crate::Carried;

/// CPU seconds (user + system) of the whole process, from `/proc/self/stat` (USER_HZ = 100;
/// exited threads included).
pub(crate) fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> =
        stat.rfind(')').map_or(Vec::new(), |close| stat[close + 1..].split_whitespace().collect());
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// CPU seconds a thread has run, from the first field of its `schedstat` (nanoseconds, exact;
/// the tick-sampled times in `task/*/stat` miss much of what short-sleeping threads use).
pub(crate) fn thread_cpu(task: &std::path::Path) -> f64 {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()))
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// The thread group a thread name belongs to.
pub(crate) fn thread_group(name: &str) -> &'static str {
    [
        ("sim-", "engine rank threads"),
        ("kvdir-", "stream worker threads"),
        // Index and router arbiters and the HTTP workers are all `actix-rt|system:0|arbiter:N`.
        ("actix-rt", "actix threads (index, router, HTTP workers)"),
        ("actix-server", "HTTP acceptor"),
        ("query-client", "query clients"),
        // The runtime thread of the shared blocking client behind `http` does the clients' I/O.
        ("reqwest-", "query clients"),
        ("driver-", "drivers"),
    ]
    .iter()
    .find(|(prefix, _)| name.starts_with(prefix))
    // libzmq's I/O threads keep the process name.
    .map_or("other (main, ZeroMQ I/O)", |(_, group)| group)
}

/// CPU seconds of the live threads by group, and of the whole process (exited threads too).
#[derive(Default)]
pub(crate) struct Cpu {
    pub(crate) groups: BTreeMap<&'static str, f64>,
    pub(crate) process: f64,
}

impl Cpu {
    pub(crate) fn now() -> Cpu {
        let mut cpu = Cpu::default();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                *cpu.groups.entry(thread_group(name.trim())).or_default() +=
                    thread_cpu(&task.path());
            }
        }
        cpu.process = process_cpu();
        cpu
    }

    /// What was used since `before`, by groups alive at the end (`extra` adds exited ones).
    pub(crate) fn since(&self, before: &Cpu, extra: &[(&'static str, f64)]) -> Cpu {
        let mut groups: BTreeMap<&'static str, f64> = self
            .groups
            .iter()
            .map(|(g, s)| (*g, s - before.groups.get(g).copied().unwrap_or(0.0)))
            .collect();
        for (g, s) in extra {
            *groups.entry(g).or_default() += s;
        }
        Cpu { groups, process: self.process - before.process }
    }

    pub(crate) fn print(&self, label: &str, wall: Duration) {
        let parts: Vec<String> = self
            .groups
            .iter()
            .filter(|(_, s)| **s >= 0.005)
            .map(|(g, s)| format!("{g} {s:.2}"))
            .collect();
        println!(
            "CPU s {label} ({:.2} s wall, {:.2} cores busy in this process): {}",
            wall.as_secs_f64(),
            self.process / wall.as_secs_f64(),
            parts.join(", ")
        );
    }
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.trim().to_string()).unwrap_or_default()
}

pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub(crate) fn print_rates(label: &str, batches: u64, c: &Carried, time: Duration) {
    let t = time.as_secs_f64();
    println!(
        "{label:<44} {batches:>7} batches {:>9} blocks ({} stored, {} host copies, {} removed), \
         {:.2} s: {:>8.0} batches/s {:>10.0} blocks/s {:>8.0} events/s",
        c.blocks(),
        c.stored_blocks,
        c.host_copies,
        c.removed_blocks,
        t,
        batches as f64 / t,
        c.blocks() as f64 / t,
        c.events as f64 / t,
    );
}

pub(crate) fn print_latencies(label: &str, l: &Latencies) {
    println!(
        "{label:<44} {:>6} queries {:>6.0} q/s  p50 {:>8.0} µs  p99 {:>8.0} µs  max {:>8.0} µs  \
         errors {} late {}",
        l.times.len(),
        l.qps(),
        us(l.pct(50.0)),
        us(l.pct(99.0)),
        us(l.times.last().copied().unwrap_or_default()),
        l.errors,
        l.late,
    );
}

/// Sums the numeric counters of the streams report and lists what is not healthy.
pub(crate) fn print_report(streams: &[Value]) {
    let counters = [
        "messages",
        "decode_errors",
        "gaps",
        "initial_syncs",
        "resyncs",
        "recoveries",
        "snapshot_failures",
        "dropped_batches",
        "skipped_events",
        "restarts",
    ];
    let sums: Vec<String> = counters
        .iter()
        .map(|k| format!("{k} {}", streams.iter().filter_map(|s| s[k].as_u64()).sum::<u64>()))
        .collect();
    println!("streams report, summed over {} streams: {}", streams.len(), sums.join(", "));
    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    let mut faults: BTreeMap<String, usize> = BTreeMap::new();
    for s in streams {
        *phases.entry(s["phase"].as_str().unwrap_or("?").to_string()).or_default() += 1;
        if let Some(f) = s["last_fault"].as_str() {
            *faults.entry(f.to_string()).or_default() += 1;
        }
        let bad = ["gaps", "recoveries", "dropped_batches", "decode_errors", "restarts"]
            .iter()
            .any(|k| s[*k].as_u64().unwrap_or(0) > 0)
            || s["initial_syncs"].as_u64().unwrap_or(0) != 1;
        if bad {
            println!("  unhealthy stream: {s}");
        }
    }
    println!("phases: {phases:?}; last faults: {faults:?}");
}
