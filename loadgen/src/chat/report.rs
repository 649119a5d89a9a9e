//! The chat run's report ([`ChatReport`]), as text or JSON.
//!
//! - latency: from sending a request to its last byte; TTFT: to the first SSE `data:` line
//!   (without `--stream`, the latency);
//! - cached-token share: the engines' `usage.prompt_tokens_details.cached_tokens` over
//!   `usage.prompt_tokens`, summed over the served requests;
//! - kvdir CPU: user + system seconds of the spawned kvdir over the client phase
//!   (`/proc/<pid>/stat`), and per served request;
//! - siblings (`--siblings K`): over the groups whose K siblings were all served, the share of
//!   siblings on their group's most used instance (1/K at worst, 1 when every group stayed on
//!   one instance), and the largest gap between a group's first and last send;
//! - tokenization: kvdir's `kvdir_frontend_tokenization_seconds` histogram (sum / count over the
//!   client phase), per tokenized request.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use super::super::clients::percentile;
use super::super::kvdir::Rss;
use super::load::ChatStats;

/// What a chat run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatReport {
    /// One line on the setup.
    pub setup: String,
    /// Mean prompt tokens the workload aimed at (system prompt + user turn), approximate.
    pub target_prompt_tokens: usize,
    /// What the clients saw.
    pub stats: ChatStats,
    /// kvdir's CPU seconds during the client phase; `None` with `--direct`.
    pub kvdir_cpu: Option<f64>,
    /// kvdir's tokenization histogram over the client phase: (sum seconds, count).
    pub tokenization: Option<(f64, u64)>,
    /// kvdir's memory after the run.
    pub rss: Option<Rss>,
    /// `/proc/loadavg` before and after.
    pub loadavg: (String, String),
    /// `--siblings`: copies of each prompt (1: off).
    pub siblings: u32,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl ChatReport {
    /// Served requests.
    pub fn served(&self) -> u64 {
        self.stats.latencies.len() as u64
    }

    /// Failed requests.
    pub fn errors(&self) -> u64 {
        self.stats.errors.values().sum()
    }

    /// Cached prompt tokens over prompt tokens (0 without any).
    pub fn cached_share(&self) -> f64 {
        self.stats.cached_tokens as f64 / (self.stats.prompt_tokens.max(1)) as f64
    }

    /// `--siblings`: siblings on their group's most used instance over all counted siblings.
    pub fn siblings_together_share(&self) -> Option<f64> {
        let s = &self.stats;
        let k = self.siblings_per_group()?;
        Some(s.siblings_together as f64 / (s.sibling_groups * k) as f64)
    }

    fn siblings_per_group(&self) -> Option<u64> {
        (self.siblings > 1 && self.stats.sibling_groups > 0).then_some(u64::from(self.siblings))
    }

    /// kvdir CPU seconds per served request.
    pub fn cpu_per_request(&self) -> Option<f64> {
        self.kvdir_cpu.map(|c| c / self.served().max(1) as f64)
    }

    /// Mean tokenization seconds per tokenized request.
    pub fn tokenization_mean(&self) -> Option<f64> {
        self.tokenization.filter(|(_, n)| *n > 0).map(|(s, n)| s / n as f64)
    }

    /// The report as JSON.
    pub fn json(&self) -> Value {
        let s = &self.stats;
        json!({
            "setup": self.setup,
            "requests": {"ok": self.served(), "errors": s.errors},
            "wall_seconds": s.wall.as_secs_f64(),
            "requests_per_second": self.served() as f64 / s.wall.as_secs_f64().max(1e-9),
            "prompt_tokens": {
                "target": self.target_prompt_tokens,
                "mean": s.prompt_tokens as f64 / self.served().max(1) as f64,
                "sum": s.prompt_tokens,
                "cached": s.cached_tokens,
                "cached_share": self.cached_share(),
            },
            "latency_ms": {"p50": ms(percentile(&s.latencies, 50.0)),
                           "p99": ms(percentile(&s.latencies, 99.0))},
            "ttft_ms": {"p50": ms(percentile(&s.ttft, 50.0)), "p99": ms(percentile(&s.ttft, 99.0))},
            "instances": s.instances,
            "siblings": self.siblings_together_share().map(|share| json!({
                "groups": s.sibling_groups,
                "together": s.siblings_together,
                "together_share": share,
                "largest_send_gap_ms": ms(s.sibling_spread),
            })),
            "kvdir_cpu_seconds": self.kvdir_cpu,
            "kvdir_cpu_seconds_per_request": self.cpu_per_request(),
            "tokenization": self.tokenization.map(|(sum, count)| json!({
                "seconds_sum": sum, "count": count, "mean_ms": self.tokenization_mean().map(|m| m * 1e3),
            })),
            "kvdir_rss_bytes": self.rss.as_ref().and_then(|r| r.bytes),
            "loadavg": {"start": self.loadavg.0, "end": self.loadavg.1},
        })
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let s = &self.stats;
        let mut out = format!("kvdir-bench chat: {}\n", self.setup);
        let rate = self.served() as f64 / s.wall.as_secs_f64().max(1e-9);
        let _ = writeln!(
            out,
            "requests: {} ok, {} errors {:?}, {:.1} s, {rate:.1}/s",
            self.served(),
            self.errors(),
            s.errors,
            s.wall.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "prompt: {:.0} tokens mean (target ~{}), cached-token share {:.1}% ({} of {})",
            s.prompt_tokens as f64 / self.served().max(1) as f64,
            self.target_prompt_tokens,
            self.cached_share() * 100.0,
            s.cached_tokens,
            s.prompt_tokens
        );
        let (p50, p99) = (percentile(&s.latencies, 50.0), percentile(&s.latencies, 99.0));
        let (t50, t99) = (percentile(&s.ttft, 50.0), percentile(&s.ttft, 99.0));
        let _ = writeln!(out, "latency: p50 {:.2} ms, p99 {:.2} ms", ms(p50), ms(p99));
        let _ = writeln!(out, "TTFT:    p50 {:.2} ms, p99 {:.2} ms", ms(t50), ms(t99));
        let spread: Vec<String> = s.instances.iter().map(|(i, n)| format!("{i} {n}")).collect();
        let _ = writeln!(out, "served by: {}", spread.join(", "));
        if let Some(share) = self.siblings_together_share() {
            let _ = writeln!(
                out,
                "siblings: {:.1}% on their group's most used instance ({} of {} in {} groups; \
                 sends within {:.2} ms)",
                share * 100.0,
                s.siblings_together,
                s.sibling_groups * self.siblings_per_group().unwrap_or(1),
                s.sibling_groups,
                ms(s.sibling_spread)
            );
        }
        self.kvdir_lines(&mut out);
        let _ =
            writeln!(out, "load average: {} at start, {} at end", self.loadavg.0, self.loadavg.1);
        out
    }

    fn kvdir_lines(&self, out: &mut String) {
        let (Some(cpu), Some(per)) = (self.kvdir_cpu, self.cpu_per_request()) else {
            let _ = writeln!(out, "kvdir: not in the path (--direct) or its CPU is unknown");
            return;
        };
        let _ = writeln!(out, "kvdir CPU: {cpu:.2} s, {per:.4} s per request");
        if let Some(mean) = self.tokenization_mean() {
            let (sum, count) = self.tokenization.unwrap_or_default();
            let _ = writeln!(
                out,
                "kvdir tokenization: {:.3} ms per request ({sum:.3} s over {count})",
                mean * 1e3
            );
        }
        if let Some(bytes) = self.rss.as_ref().and_then(|r| r.bytes) {
            let _ = writeln!(out, "kvdir RSS: {:.1} MiB", bytes as f64 / (1 << 20) as f64);
        }
    }
}
