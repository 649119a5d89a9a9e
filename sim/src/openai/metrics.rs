//! The vLLM dialect's `GET /metrics`: Prometheus text as vLLM's API server sends it, with
//! the process start time and, per DP rank (vLLM's `engine` label), the load gauges kvdir
//! reads. Numbers are written as Python's `prometheus_client` writes them (`3.0`,
//! `1.76470123456e+09`), so a consumer is tested against the real spelling.

use std::fmt::Write;

/// The `Content-Type` of the answer.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One DP rank's gauges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RankGauges {
    /// Requests assigned to the rank and not yet producing tokens.
    pub(crate) waiting: u64,
    /// Requests producing tokens.
    pub(crate) running: u64,
    /// Device blocks in use over Device capacity, 0..=1.
    pub(crate) kv_cache_usage: f64,
    /// Prefills so far, the uncached tokens they computed and the seconds they took.
    pub(crate) prefill: (u64, f64, f64),
}

/// Reads one gauge's value from a rank's gauges.
type Gauge = fn(&RankGauges) -> f64;

/// The whole exposition: `process_start_time_seconds`, then `vllm:num_requests_running`,
/// `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc` labelled
/// `{engine="<rank>",model_name="<model>"}` (labels sorted, as `prometheus_client` does),
/// then the prefill histograms `vllm:request_prefill_kv_computed_tokens` and
/// `vllm:request_prefill_time_seconds` (their `+Inf` bucket, count and sum; the simulator
/// keeps no finer buckets).
pub(crate) fn render(process_start: f64, model: &str, ranks: &[RankGauges]) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
    );
    let _ = writeln!(out, "process_start_time_seconds {}", go_float(process_start));
    let gauges: [(&str, &str, Gauge); 3] = [
        ("vllm:num_requests_running", "Number of requests in model execution batches.", |g| {
            g.running as f64
        }),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", |g| {
            g.waiting as f64
        }),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", |g| {
            g.kv_cache_usage
        }),
    ];
    let model = escape(model);
    for (name, help, value) in gauges {
        family(&mut out, name, help);
        for (rank, g) in ranks.iter().enumerate() {
            let v = go_float(value(g));
            let _ = writeln!(out, "{name}{{engine=\"{rank}\",model_name=\"{model}\"}} {v}");
        }
    }
    let histograms: [(&str, &str, Gauge); 2] = [
        ("vllm:request_prefill_kv_computed_tokens", "Tokens computed in prefill.", |g| g.prefill.1),
        ("vllm:request_prefill_time_seconds", "Time spent in the prefill phase.", |g| g.prefill.2),
    ];
    for (name, help, sum) in histograms {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (rank, g) in ranks.iter().enumerate() {
            let labels = format!("engine=\"{rank}\",model_name=\"{model}\"");
            let count = go_float(g.prefill.0 as f64);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", go_float(sum(g)));
        }
    }
    out
}

fn family(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// `prometheus_client`'s `floatToGoString`: Python's shortest `repr` (`3.0`), switched to an
/// exponent as Go does once the integer part has more than 6 digits.
fn go_float(d: f64) -> String {
    let s = format!("{d:?}");
    match s.find('.') {
        Some(dot) if d > 0.0 && dot > 6 && !s.contains('e') => {
            let digits = format!("{}{}", &s[1..dot], &s[dot + 1..]);
            let mantissa = format!("{}.{digits}", &s[..1]);
            format!("{}e+0{}", mantissa.trim_end_matches(['0', '.']), dot - 1)
        }
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_spelled_as_prometheus_client_spells_them() {
        assert_eq!(go_float(3.0), "3.0");
        assert_eq!(go_float(0.0), "0.0");
        assert_eq!(go_float(0.25), "0.25");
        assert_eq!(go_float(1_764_701_234.56), "1.76470123456e+09");
        assert_eq!(go_float(1_764_701_200.0), "1.7647012e+09");
    }

    #[test]
    fn every_gauge_is_labelled_per_rank() {
        let g = |waiting, running, kv_cache_usage| RankGauges {
            waiting,
            running,
            kv_cache_usage,
            prefill: (waiting, 100.0 * waiting as f64, 0.25),
        };
        let text = render(1_764_701_234.5, "m\"x", &[g(1, 2, 0.5), g(0, 0, 0.0)]);
        for line in [
            "# TYPE process_start_time_seconds gauge",
            "process_start_time_seconds 1.7647012345e+09",
            "vllm:num_requests_running{engine=\"0\",model_name=\"m\\\"x\"} 2.0",
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\\\"x\"} 1.0",
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\\\"x\"} 0.5",
            "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\\\"x\"} 0.0",
            "# TYPE vllm:request_prefill_time_seconds histogram",
            "vllm:request_prefill_kv_computed_tokens_sum{engine=\"0\",model_name=\"m\\\"x\"} 100.0",
            "vllm:request_prefill_time_seconds_count{engine=\"1\",model_name=\"m\\\"x\"} 0.0",
            "vllm:request_prefill_time_seconds_bucket{engine=\"0\",model_name=\"m\\\"x\",le=\"+Inf\"} 1.0",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
    }
}
