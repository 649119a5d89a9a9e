//! The fleet-scale figures of a run ([`Scale`]): kvdir's CPU in an idle window (every stream
//! connected, nothing published), its thread count, its open file descriptors and the most
//! HTTP connections it held at once, the time from kvdir's start until every stream was
//! synchronized, and the load tool's own CPU, threads and file descriptors, so a report shows
//! whether the tool itself was the bottleneck.
//!
//! CPU comes from `/proc/<pid>/stat` (utime + stime), threads from `/proc/<pid>/status`; both
//! need kvdir's pid (`--spawn_kvdir` or `--kvdir_pid`).

use std::fmt::Write as _;
use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::fds;
use super::kvdir::cpu_seconds;
use super::report::Applied;

/// What the scale lines of a report need.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scale {
    /// From kvdir's start (or, for a running kvdir, the tool's) until every stream was
    /// synchronized.
    pub start_to_sync: Duration,
    /// kvdir's CPU seconds over the idle window, and the window.
    pub idle_cpu: Option<(f64, Duration)>,
    /// kvdir's threads after the sync (idle) and after the load.
    pub kvdir_threads: (Option<u64>, Option<u64>),
    /// The tool's CPU seconds over the load window (publishing and clients).
    pub bench_cpu: Option<f64>,
    /// The tool's threads and open descriptors after the sync, and its open-file limit.
    pub bench: (Option<u64>, Option<usize>, Option<u64>),
    /// kvdir's open descriptors after the sync (idle) and after the load (`/proc/<pid>/fd`).
    pub kvdir_fds: (Option<usize>, Option<usize>),
    /// kvdir's open-file limit (`process_max_fds` of its `/metrics`).
    pub kvdir_fd_limit: Option<u64>,
    /// The most HTTP connections kvdir had open at once (`kvdir_http_connections_peak`).
    pub http_connections_peak: Option<u64>,
}

/// Descriptors open in process `pid`.
pub fn open_fds(pid: u32) -> Option<usize> {
    fs::read_dir(format!("/proc/{pid}/fd")).ok().map(Iterator::count)
}

/// The value of an unlabelled sample `name` in a Prometheus text.
fn metric(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(' ').next() == Some(name))?;
    line.split(' ').nth(1)?.parse::<f64>().ok().map(|v| v as u64)
}

/// The `Threads:` line of `/proc/<pid>/status`.
pub fn threads(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Threads:"))?;
    line.trim().parse().ok()
}

/// kvdir's CPU seconds over `window` with nothing published (`None` without a pid, or when
/// the window is zero).
pub fn idle_cpu(pid: Option<u32>, window: Duration) -> Option<(f64, Duration)> {
    let pid = pid.filter(|_| !window.is_zero())?;
    let (before, start) = (cpu_seconds(pid)?, Instant::now());
    thread::sleep(window);
    Some((cpu_seconds(pid)? - before, start.elapsed()))
}

impl Scale {
    /// The tool's own threads, descriptors and limit, now.
    pub fn own(limit: Option<u64>) -> (Option<u64>, Option<usize>, Option<u64>) {
        (threads(std::process::id()), fds::open_fds(), limit)
    }

    /// Reads kvdir's HTTP connection peak and open-file limit from its `/metrics` text.
    pub fn read_metrics(&mut self, metrics: &str) {
        self.http_connections_peak = metric(metrics, "kvdir_http_connections_peak");
        self.kvdir_fd_limit = metric(metrics, "process_max_fds");
    }

    /// Batches that did not reach kvdir live: gaps it saw and batches it dropped.
    pub fn not_live(applied: &Applied) -> u64 {
        let count = |c: &str| applied.counters.get(c).copied().unwrap_or(0);
        count("gaps") + count("dropped_batches")
    }

    /// The plain-text lines.
    pub fn text(&self, t: &mut String, applied: &Applied, load_wall: Duration) {
        let _ = writeln!(
            t,
            "from kvdir's start until every stream was synchronized: {:.2} s",
            self.start_to_sync.as_secs_f64()
        );
        if let Some((cpu, window)) = self.idle_cpu {
            let _ = writeln!(
                t,
                "kvdir idle, every stream connected, nothing published: {:.2} % of one core over \
                 {:.1} s",
                cpu * 100.0 / window.as_secs_f64().max(1e-9),
                window.as_secs_f64()
            );
        }
        let n = |v: Option<u64>| v.map_or_else(|| "unknown".to_string(), |v| v.to_string());
        let (idle, after) = self.kvdir_threads;
        let _ = writeln!(t, "kvdir threads: {} idle, {} after the load", n(idle), n(after));
        let _ = writeln!(
            t,
            "batches not applied live (gaps + dropped_batches in kvdir's streams report): {}",
            Scale::not_live(applied)
        );
        let (idle, after) = self.kvdir_fds;
        let _ = writeln!(
            t,
            "kvdir file descriptors: {} idle, {} after the load (limit {}); HTTP connections: \
             {} at most at once",
            n(idle.map(|v| v as u64)),
            n(after.map(|v| v as u64)),
            n(self.kvdir_fd_limit),
            n(self.http_connections_peak)
        );
        let (threads, open, limit) = self.bench;
        let cpu = self.bench_cpu.map_or_else(
            || "unknown".to_string(),
            |c| format!("{:.2} cores", c / load_wall.as_secs_f64().max(1e-9)),
        );
        let _ = writeln!(
            t,
            "kvdir-bench itself: {cpu} during the load, {} threads, {} of {} file descriptors open",
            n(threads),
            open.map_or_else(|| "unknown".to_string(), |o| o.to_string()),
            n(limit)
        );
    }

    /// The JSON fields.
    pub fn json(&self, applied: &Applied, load_wall: Duration, kvdir_cpu: Option<f64>) -> Value {
        let (threads, open, limit) = self.bench;
        json!({
            "start_to_sync_seconds": self.start_to_sync.as_secs_f64(),
            "idle_cpu_percent_of_core": self.idle_cpu.map(|(c, w)| c * 100.0 / w.as_secs_f64().max(1e-9)),
            "idle_seconds": self.idle_cpu.map(|(_, w)| w.as_secs_f64()),
            "kvdir_cpu_us_per_applied_batch": kvdir_cpu.map(|c| c * 1e6 / applied.batches.max(1) as f64),
            "kvdir_threads_idle": self.kvdir_threads.0,
            "kvdir_threads_after": self.kvdir_threads.1,
            "not_applied_live": Scale::not_live(applied),
            "bench_cores": self.bench_cpu.map(|c| c / load_wall.as_secs_f64().max(1e-9)),
            "bench_threads": threads,
            "bench_open_fds": open,
            "bench_fd_limit": limit,
            "kvdir_fds_idle": self.kvdir_fds.0,
            "kvdir_fds_after": self.kvdir_fds.1,
            "kvdir_fd_limit": self.kvdir_fd_limit,
            "kvdir_http_connections_peak": self.http_connections_peak,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_threads_are_read_and_an_unknown_pid_gives_none() {
        assert!(threads(std::process::id()).is_some_and(|n| n >= 1));
        assert_eq!(threads(u32::MAX), None);
        assert_eq!(idle_cpu(None, Duration::from_secs(1)), None);
        assert_eq!(idle_cpu(Some(std::process::id()), Duration::ZERO), None);
    }
}
