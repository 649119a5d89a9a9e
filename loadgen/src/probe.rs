//! What kvdir says about the fleet's streams, read over HTTP ([`Probe`]).
//!
//! - `GET /v1/internal/streams` gives each stream's phase and counters (live messages, gaps,
//!   recoveries, decode errors ...);
//! - `POST /v1/internal/kv-cache/query` with no tokens and `"list": "all"` gives each stream's
//!   `synchronized` and last applied `sequence` (every stream, whatever the fleet's size);
//! - `GET /v1/internal/instances` (etcd mode) shows whether an instance has a load report,
//!   without which it cannot be routed to.
//!
//! Only the fleet's own streams count: a shared kvdir may follow other engines too. Every wait
//! polls every [`POLL`] until a deadline and then says what is still missing.

use std::collections::{BTreeMap, HashMap};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fleet::StreamName;
use super::http::Conn;
use super::BenchError;

/// The query endpoint.
const QUERY: &str = "/v1/internal/kv-cache/query";
/// Interval between polls.
const POLL: Duration = Duration::from_millis(50);
/// Phases of a synchronized stream (`resyncing` is a periodic snapshot that keeps serving).
const LIVE: [&str; 2] = ["live", "resyncing"];
/// Counters of the streams report summed per run.
pub const COUNTERS: [&str; 10] = [
    "messages",
    "gaps",
    "initial_syncs",
    "resyncs",
    "recoveries",
    "decode_errors",
    "snapshot_failures",
    "dropped_batches",
    "skipped_events",
    "restarts",
];

/// One stream as kvdir reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamView {
    /// Phase from the streams report (`live` or `resyncing` when synchronized).
    pub phase: String,
    /// `synchronized` from the query endpoint.
    pub synchronized: bool,
    /// Last applied sequence.
    pub sequence: Option<u64>,
    /// Counters of the streams report, by [`COUNTERS`] name.
    pub counters: BTreeMap<&'static str, u64>,
    /// The query endpoint's `error` or the report's `last_fault`.
    pub error: Option<String>,
}

/// Reads kvdir's view of the fleet's streams.
pub struct Probe {
    conn: Conn,
    streams: Vec<StreamName>,
}

fn kvdir_err(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Kvdir(format!("{what}: {e}"))
}

impl Probe {
    /// A probe of `streams` through `conn`.
    pub fn new(conn: Conn, streams: Vec<StreamName>) -> Probe {
        Probe { conn, streams }
    }

    /// The connection, for other reads (RSS).
    pub fn conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    fn json(&mut self, path: &str, body: Option<&[u8]>) -> Result<Value, BenchError> {
        let reply = match body {
            Some(body) => self.conn.post(path, body),
            None => self.conn.get(path),
        };
        let reply = reply.map_err(|e| kvdir_err(path, e))?;
        if reply.status != 200 {
            let body = String::from_utf8_lossy(&reply.body);
            return Err(kvdir_err(path, format!("HTTP {}: {body:.200}", reply.status)));
        }
        serde_json::from_slice(&reply.body).map_err(|e| kvdir_err(path, e))
    }

    /// The fleet's streams as kvdir reports them; a stream kvdir does not know is absent.
    pub fn views(&mut self) -> Result<HashMap<StreamName, StreamView>, BenchError> {
        let report = self.json("/v1/internal/streams", None)?;
        let query = self.json(QUERY, Some(br#"{"token_ids":[],"list":"all"}"#))?;
        let key = |v: &Value| StreamName {
            instance: v["instance_name"].as_str().unwrap_or_default().to_string(),
            rank: v["dp_rank"].as_u64().unwrap_or_default() as u32,
        };
        let mut views = HashMap::new();
        for s in report["streams"].as_array().into_iter().flatten() {
            let counters = COUNTERS.iter().map(|c| (*c, s[*c].as_u64().unwrap_or(0))).collect();
            let view = StreamView {
                phase: s["phase"].as_str().unwrap_or_default().to_string(),
                counters,
                error: s["last_fault"].as_str().map(str::to_string),
                ..StreamView::default()
            };
            views.insert(key(s), view);
        }
        for m in query["matches"].as_array().into_iter().flatten() {
            if let Some(view) = views.get_mut(&key(m)) {
                view.synchronized = m["synchronized"].as_bool().unwrap_or(false);
                view.sequence = m["sequence"].as_u64();
                view.error = m["error"].as_str().map(str::to_string).or(view.error.take());
            }
        }
        views.retain(|k, _| self.streams.contains(k));
        Ok(views)
    }

    /// Polls until every stream is live and synchronized and, with `loads`, every instance
    /// has a load report; returns how long it took.
    pub fn wait_synchronized(
        &mut self,
        loads: bool,
        timeout: Duration,
    ) -> Result<Duration, BenchError> {
        self.wait_for(timeout, |p| {
            let missing = p.unsynchronized()?;
            match loads && missing.is_empty() {
                true => p.without_load(),
                false => Ok(missing),
            }
        })
    }

    /// Polls until every instance has a load report (engines without KV events, whose credit
    /// is approximate, have no stream to wait for); returns how long it took.
    pub fn wait_loaded(&mut self, timeout: Duration) -> Result<Duration, BenchError> {
        self.wait_for(timeout, Probe::without_load)
    }

    /// Polls `missing` until it names nothing.
    fn wait_for(
        &mut self,
        timeout: Duration,
        mut missing: impl FnMut(&mut Probe) -> Result<Vec<String>, BenchError>,
    ) -> Result<Duration, BenchError> {
        let start = Instant::now();
        loop {
            // kvdir may not be up yet (--write_config): an error is one more reason to wait.
            let missing = missing(self).unwrap_or_else(|e| vec![e.to_string()]);
            if missing.is_empty() {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(BenchError::Timeout {
                    what: "synchronized".to_string(),
                    seconds: timeout.as_secs_f64(),
                    count: missing.len(),
                    first: missing.into_iter().take(3).collect::<Vec<_>>().join("; "),
                });
            }
            thread::sleep(POLL);
        }
    }

    fn unsynchronized(&mut self) -> Result<Vec<String>, BenchError> {
        let views = self.views()?;
        let streams = self.streams.clone();
        let lagging = streams.iter().filter_map(|s| match views.get(s) {
            None => Some(format!("{s}: not known to kvdir")),
            Some(v) if !LIVE.contains(&v.phase.as_str()) || !v.synchronized => Some(format!(
                "{s}: phase {}, synchronized {}, error {:?}",
                v.phase, v.synchronized, v.error
            )),
            Some(_) => None,
        });
        Ok(lagging.collect())
    }

    /// Instances of the fleet without a load report in `GET /v1/internal/instances`.
    fn without_load(&mut self) -> Result<Vec<String>, BenchError> {
        let report = self.json("/v1/internal/instances", None)?;
        let instances = report["instances"].as_array().cloned().unwrap_or_default();
        let loaded = |name: &str| {
            instances.iter().any(|i| i["name"] == name && !i["waiting_requests_num"].is_null())
        };
        let mut names: Vec<&str> = self.streams.iter().map(|s| s.instance.as_str()).collect();
        names.dedup();
        Ok(names
            .into_iter()
            .filter(|n| !loaded(n))
            .map(|n| format!("{n}: no load report in /v1/internal/instances"))
            .collect())
    }

    /// Polls until every stream is synchronized at `expected` (the engines' last sequences, in
    /// stream order); returns the views at that point, or after `timeout` with the laggards.
    pub fn wait_caught_up(
        &mut self,
        expected: &[Option<u64>],
        timeout: Duration,
    ) -> Result<(HashMap<StreamName, StreamView>, Vec<String>), BenchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let views = self.views()?;
            let lagging: Vec<String> = self
                .streams
                .iter()
                .zip(expected)
                .filter_map(|(s, want)| {
                    let v = views.get(s);
                    let ok = v.is_some_and(|v| v.synchronized && v.sequence == *want);
                    (!ok).then(|| {
                        let (seq, sync) = v.map_or((None, false), |v| (v.sequence, v.synchronized));
                        format!("{s}: sequence {seq:?} of {want:?}, synchronized {sync}")
                    })
                })
                .collect();
            if lagging.is_empty() || Instant::now() >= deadline {
                return Ok((views, lagging));
            }
            thread::sleep(POLL);
        }
    }
}
