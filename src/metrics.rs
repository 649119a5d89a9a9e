//! Prometheus building blocks: a lock-free latency [`Histogram`] and an [`Exposition`] writer
//! for the text format (version 0.0.4).
//!
//! Label values are escaped (`\`, `"`, newline); names are fixed by the caller. Samples of one
//! family must be written together, after its [`Exposition::family`] header.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds (50 us to 10 s).
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// A histogram over [`LATENCY_BUCKETS`]; observing is a few relaxed atomic adds.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// A consistent-enough copy of a [`Histogram`] for rendering.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Cumulative counts per bucket of [`LATENCY_BUCKETS`].
    pub cumulative: Vec<u64>,
    /// Observations.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_seconds: f64,
}

impl Histogram {
    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// A copy with cumulative bucket counts.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut total = 0;
        let cumulative = self
            .buckets
            .iter()
            .map(|b| {
                total += b.load(Ordering::Relaxed);
                total
            })
            .collect();
        HistogramSnapshot {
            cumulative,
            count: self.count.load(Ordering::Relaxed),
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// Bytes of a `kB` field (`VmRSS:`, `VmHWM:` ...) of a Linux `/proc/<pid>/status` text.
pub fn proc_status_bytes(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The kind of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets when the process restarts).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Bucketed observations.
    Histogram,
}

/// Builds a text-format exposition.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Writes the `# HELP` and `# TYPE` lines of a family.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// Writes one sample.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// Writes the `_bucket`, `_sum` and `_count` samples of a histogram.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        for (bound, n) in LATENCY_BUCKETS.iter().zip(&h.cumulative) {
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&bound.to_string()));
            let _ = writeln!(self.out, " {n}");
        }
        let _ = write!(self.out, "{name}_bucket");
        self.labels(labels, Some("+Inf"));
        let _ = writeln!(self.out, " {}", h.count);
        self.sample(&format!("{name}_sum"), labels, h.sum_seconds);
        self.sample(&format!("{name}_count"), labels, h.count as f64);
    }

    /// The text so far.
    pub fn finish(self) -> String {
        self.out
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let all = labels.iter().copied().chain(le.map(|v| ("le", v)));
        for (i, (k, v)) in all.enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            let _ = write!(self.out, "{k}=\"");
            for c in v.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        self.out.push('}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_sum_in_seconds() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(30));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.cumulative[0], 1, "30 us is in the first bucket");
        assert_eq!(s.cumulative[5], 1, "3 ms is above 2.5 ms");
        assert_eq!(s.cumulative[6], 2);
        assert_eq!(*s.cumulative.last().unwrap(), 2, "60 s is only in +Inf");
        assert!((s.sum_seconds - 60.00303).abs() < 1e-9);
    }

    #[test]
    fn proc_status_fields_are_read_in_bytes() {
        let status = "Name:\tkvdir\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(proc_status_bytes(status, "VmRSS:"), Some(1024 * 1024));
        assert_eq!(proc_status_bytes(status, "VmHWM:"), Some(2048 * 1024));
        assert_eq!(proc_status_bytes(status, "VmSwap:"), None);
    }

    #[test]
    fn exposition_escapes_labels_and_writes_histograms() {
        let mut e = Exposition::default();
        e.family("kvdir_x_total", Kind::Counter, "Things.");
        e.sample("kvdir_x_total", &[("instance", "a\"b\\c\nd"), ("dp_rank", "0")], 2.0);
        e.sample("kvdir_y", &[], 1.5);
        let h = Histogram::default();
        h.observe(Duration::from_millis(1));
        e.histogram("kvdir_lat_seconds", &[("instance", "i")], &h.snapshot());
        let text = e.finish();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# HELP kvdir_x_total Things.");
        assert_eq!(lines[1], "# TYPE kvdir_x_total counter");
        assert_eq!(lines[2], r#"kvdir_x_total{instance="a\"b\\c\nd",dp_rank="0"} 2"#);
        assert_eq!(lines[3], "kvdir_y 1.5");
        assert!(text.contains("kvdir_lat_seconds_bucket{instance=\"i\",le=\"0.0005\"} 0\n"));
        assert!(text.contains("kvdir_lat_seconds_bucket{instance=\"i\",le=\"0.001\"} 1\n"));
        assert!(text.contains("kvdir_lat_seconds_bucket{instance=\"i\",le=\"+Inf\"} 1\n"));
        assert!(text.contains("kvdir_lat_seconds_count{instance=\"i\"} 1\n"));
        assert!(text.contains("kvdir_lat_seconds_sum{instance=\"i\"} 0.001\n"));
    }
}
