//! Where a request's time went, from kvdir's `Server-Timing` header: each answer of the query
//! and route endpoints names its handler's stages (`wait` from the client's `X-Request-Start`
//! to the handler, `body`, `parse`, `read`, `lock`, `decide`, `json`, the whole `handler`;
//! docs/http-api.md). The tool adds `outside`: what the client measured beyond `wait` and
//! `handler` (writing the answer, the client reading it and waiting for a CPU).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use super::clients::percentile;

/// The name of the client's share of a request.
pub const OUTSIDE: &str = "outside";

/// Per stage, the durations of the requests that named it (sorted by [`Stages::sort`]), in
/// the order kvdir named the stages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stages {
    order: Vec<String>,
    by_stage: BTreeMap<String, Vec<Duration>>,
}

/// The stages of one `Server-Timing` value: `name;dur=<ms>` separated by commas (entries
/// without a duration are left out).
pub fn parse<'a>(header: &'a str) -> Vec<(&'a str, Duration)> {
    let entry = |part: &'a str| {
        let mut fields = part.split(';').map(str::trim);
        let name = fields.next().filter(|n| !n.is_empty())?;
        let ms: f64 = fields.find_map(|f| f.strip_prefix("dur="))?.parse().ok()?;
        (ms.is_finite() && ms >= 0.0).then(|| (name, Duration::from_secs_f64(ms / 1e3)))
    };
    header.split(',').filter_map(entry).collect()
}

impl Stages {
    /// Adds one request that took `total` at the client, with its `Server-Timing` value.
    pub fn add(&mut self, header: &str, total: Duration) {
        let stages = parse(header);
        let named = |n: &str| stages.iter().find(|(s, _)| *s == n).map(|(_, d)| *d);
        if let Some(handler) = named("handler") {
            let outside = total.saturating_sub(handler + named("wait").unwrap_or_default());
            self.push(OUTSIDE, outside);
        }
        for (name, d) in stages {
            self.push(name, d);
        }
    }

    fn push(&mut self, name: &str, d: Duration) {
        if !self.by_stage.contains_key(name) {
            self.order.push(name.to_string());
        }
        self.by_stage.entry(name.to_string()).or_default().push(d);
    }

    /// Adds `other`'s requests.
    pub fn merge(&mut self, other: Stages) {
        for name in other.order {
            if !self.by_stage.contains_key(&name) {
                self.order.push(name.clone());
            }
            let more = other.by_stage.get(&name).cloned().unwrap_or_default();
            self.by_stage.entry(name).or_default().extend(more);
        }
    }

    /// Sorts each stage's durations (before [`Self::percentile`]).
    pub fn sort(&mut self) {
        self.by_stage.values_mut().for_each(|v| v.sort());
    }

    /// The stages seen, in kvdir's order (`outside` first).
    pub fn names(&self) -> &[String] {
        &self.order
    }

    /// Nearest-rank percentile `p` of stage `name` (zero when never seen).
    pub fn percentile(&self, name: &str, p: f64) -> Duration {
        self.by_stage.get(name).map_or(Duration::ZERO, |v| percentile(v, p))
    }

    /// `stage p50/p99` in milliseconds, one line: empty when kvdir sent no header.
    pub fn text(&self) -> String {
        let mut t = String::new();
        for name in &self.order {
            let ms = |p| self.percentile(name, p).as_secs_f64() * 1e3;
            let _ = write!(t, "{}{name} {:.3}/{:.3}", sep(&t), ms(50.0), ms(99.0));
        }
        t
    }

    /// Per stage, p50 and p99 in milliseconds.
    pub fn json(&self) -> serde_json::Value {
        let stage = |name: &String| {
            let ms = |p| self.percentile(name, p).as_secs_f64() * 1e3;
            (name.clone(), serde_json::json!({ "p50_ms": ms(50.0), "p99_ms": ms(99.0) }))
        };
        serde_json::Value::Object(self.order.iter().map(stage).collect())
    }
}

fn sep(t: &str) -> &'static str {
    if t.is_empty() {
        ""
    } else {
        ", "
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_parses_into_its_stages() {
        let h = "wait;dur=0.250, body;dur=0.010, bad, x;desc=\"y\", handler;dur=1.5";
        let names: Vec<&str> = parse(h).iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["wait", "body", "handler"]);
        assert_eq!(parse(h)[2].1, Duration::from_micros(1500));
        assert!(parse("a;dur=-1, b;dur=NaN, c;dur=").is_empty());
    }

    #[test]
    fn outside_is_what_the_client_saw_beyond_the_wait_and_the_handler() {
        let mut s = Stages::default();
        s.add("wait;dur=1, read;dur=2, handler;dur=3", Duration::from_millis(10));
        s.add("wait;dur=1, read;dur=4, handler;dur=5", Duration::from_millis(7));
        let mut other = Stages::default();
        other.add("read;dur=1, handler;dur=1", Duration::from_millis(2));
        s.merge(other);
        s.sort();
        assert_eq!(s.names(), ["outside", "wait", "read", "handler"]);
        assert_eq!(s.percentile(OUTSIDE, 100.0), Duration::from_millis(6));
        assert_eq!(s.percentile(OUTSIDE, 1.0), Duration::from_millis(1));
        assert_eq!(s.percentile("read", 50.0), Duration::from_millis(2));
        assert_eq!(s.percentile("lock", 50.0), Duration::ZERO);
        assert!(s.text().starts_with("outside 1.000/6.000, wait 1.000/1.000"), "{}", s.text());
    }
}
