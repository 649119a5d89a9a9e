//! kvdir's own view of its request latency: the `kvdir_query_duration_seconds` and
//! `kvdir_route_duration_seconds` histograms of its `/metrics`, read before and after a phase,
//! so that a report sets the handler's time beside what the clients measured. The difference is
//! the network stack, the clients themselves, and waiting for a CPU before the handler runs.
//!
//! The histograms have fixed buckets (50 µs up to 10 s), so a quantile here is the upper
//! bound of the bucket that holds it: "p99 <= 2.5 ms", not a measured 1.9 ms.

use serde_json::{json, Value};

use super::clients::Kind;

/// The cumulative bucket counts of one histogram: `(upper bound in seconds, count)`, in the
/// order `/metrics` lists them (ascending; the last bound is infinite).
pub type Buckets = Vec<(f64, u64)>;

/// Both histograms as read once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// `kvdir_query_duration_seconds`.
    pub query: Buckets,
    /// `kvdir_route_duration_seconds`.
    pub route: Buckets,
}

impl Snapshot {
    /// The histograms in a `/metrics` text (missing ones are empty).
    pub fn parse(text: &str) -> Snapshot {
        Snapshot {
            query: buckets(text, "kvdir_query_duration_seconds"),
            route: buckets(text, "kvdir_route_duration_seconds"),
        }
    }

    fn of(&self, kind: Kind) -> &Buckets {
        match kind {
            Kind::Query => &self.query,
            Kind::Route => &self.route,
        }
    }
}

fn buckets(text: &str, family: &str) -> Buckets {
    let prefix = format!("{family}_bucket{{le=\"");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// What kvdir's handler took for the requests of one kind during a phase.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerLatency {
    /// Query or route.
    pub kind: Kind,
    /// Requests the handler finished during the phase.
    pub count: u64,
    /// Upper bound of the median's bucket, in seconds.
    pub p50_le: f64,
    /// Upper bound of the 99th percentile's bucket, in seconds.
    pub p99_le: f64,
}

impl HandlerLatency {
    /// The handler's latency per kind between two snapshots; kinds with no request are left out.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Vec<HandlerLatency> {
        [Kind::Query, Kind::Route]
            .into_iter()
            .filter_map(|kind| {
                let delta = delta(before.of(kind), after.of(kind));
                let count = delta.last().map_or(0, |(_, n)| *n);
                Some(HandlerLatency {
                    kind,
                    count,
                    p50_le: quantile(&delta, 0.50)?,
                    p99_le: quantile(&delta, 0.99)?,
                })
            })
            .collect()
    }

    /// One line of the text report.
    pub fn text(&self) -> String {
        format!(
            "  {:<16} {:>7} in kvdir's handler  p50 <= {} ms  p99 <= {} ms\n",
            self.kind.name(),
            self.count,
            bound_ms(self.p50_le),
            bound_ms(self.p99_le)
        )
    }

    /// The JSON of [`Self::text`] (an infinite bound is `null`).
    pub fn json(&self) -> Value {
        let ms = |s: f64| s.is_finite().then_some(s * 1e3);
        json!({
            "kind": self.kind.name(), "count": self.count,
            "p50_le_ms": ms(self.p50_le), "p99_le_ms": ms(self.p99_le),
        })
    }
}

fn bound_ms(s: f64) -> String {
    if s.is_finite() {
        format!("{}", s * 1e3)
    } else {
        "+Inf".into()
    }
}

/// `after - before`, bucket by bucket (a restarted kvdir, whose counts went down, gives
/// `after`).
fn delta(before: &Buckets, after: &Buckets) -> Buckets {
    let restarted =
        before.len() != after.len() || before.iter().zip(after).any(|((_, b), (_, a))| a < b);
    if restarted {
        return after.clone();
    }
    after.iter().zip(before).map(|((le, a), (_, b))| (*le, a - b)).collect()
}

/// The upper bound of the bucket holding the `q`-quantile; `None` without observations.
fn quantile(cumulative: &Buckets, q: f64) -> Option<f64> {
    let total = cumulative.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).max(1);
    cumulative.iter().find(|(_, n)| *n >= rank).map(|(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE kvdir_query_duration_seconds histogram
kvdir_query_duration_seconds_bucket{le=\"0.0001\"} 10
kvdir_query_duration_seconds_bucket{le=\"0.00025\"} 90
kvdir_query_duration_seconds_bucket{le=\"0.001\"} 99
kvdir_query_duration_seconds_bucket{le=\"+Inf\"} 100
kvdir_query_duration_seconds_sum 0.02
kvdir_query_duration_seconds_count 100
kvdir_route_duration_seconds_bucket{le=\"0.0001\"} 0
kvdir_route_duration_seconds_bucket{le=\"+Inf\"} 0
";

    #[test]
    fn quantiles_are_the_bounds_of_their_buckets_over_the_phase() {
        let before = Snapshot::parse(TEXT);
        assert_eq!(before.query.len(), 4);
        let after = Snapshot::parse(
            &TEXT
                .replace("\"0.001\"} 99", "\"0.001\"} 198")
                .replace("\"+Inf\"} 100", "\"+Inf\"} 200"),
        );
        let got = HandlerLatency::between(&before, &after);
        assert_eq!(got.len(), 1, "no route request, no route line: {got:?}");
        assert_eq!((got[0].count, got[0].p50_le, got[0].p99_le), (100, 0.001, 0.001));
        let all = HandlerLatency::between(&Snapshot::default(), &before);
        assert_eq!((all[0].p50_le, all[0].p99_le), (0.00025, 0.001));
        assert_eq!(
            all[0].text().trim(),
            "query                100 in kvdir's handler  p50 <= 0.25 ms  p99 <= 1 ms"
        );
    }

    #[test]
    fn an_observation_beyond_the_last_bound_is_infinite() {
        let b = vec![(0.001, 0), (f64::INFINITY, 1)];
        assert_eq!(quantile(&b, 0.5), Some(f64::INFINITY));
        assert_eq!(bound_ms(f64::INFINITY), "+Inf");
        assert_eq!(quantile(&vec![(f64::INFINITY, 0)], 0.5), None);
    }
}
