//! A heartbeat's body (protocol.md section 5.2) and a load report, parsed straight into their
//! fields: a fleet of a thousand engines sends two thousand heartbeats a second, and building
//! a JSON tree for each (a map, a `String` per key and per name) was most of the handler.
//!
//! The name and the incarnation are borrowed from the body unless they hold escapes.
//! [`LoadReport::check`] is the one validation of a load, for heartbeats and etcd's
//! `XLLM:LOADMETRICS:` values alike.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Number;

use super::LoadMetrics;

/// `{"name", "incarnation_id", "load_metrics"}`, the name and incarnation borrowed.
#[derive(Debug, Deserialize)]
pub struct HeartbeatBody<'a> {
    /// The instance's name (`host:port`).
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    /// The sender's incarnation; absent or null is none.
    #[serde(borrow)]
    pub incarnation_id: Option<Text<'a>>,
    /// Its load, not yet checked.
    pub load_metrics: LoadReport,
}

impl HeartbeatBody<'_> {
    /// The incarnation, if the sender gave one.
    pub fn incarnation(&self) -> Option<&str> {
        self.incarnation_id.as_ref().map(|t| t.0.as_ref())
    }
}

/// A string borrowed from the body unless it holds escapes.
#[derive(Debug, Deserialize)]
pub struct Text<'a>(#[serde(borrow)] pub Cow<'a, str>);

/// `{"waiting_requests_num", "gpu_cache_usage_perc"}` as numbers, before [`LoadReport::check`];
/// other fields are ignored.
#[derive(Debug, Deserialize)]
pub struct LoadReport {
    waiting_requests_num: Option<Number>,
    gpu_cache_usage_perc: Option<Number>,
}

impl LoadReport {
    /// The load, when the waiting count is a non-negative integer and the usage is in 0..=1.
    pub fn check(&self) -> Result<LoadMetrics, String> {
        let waiting = self
            .waiting_requests_num
            .as_ref()
            .and_then(Number::as_u64)
            .ok_or_else(|| "waiting_requests_num must be a non-negative integer".to_string())?;
        let usage = self
            .gpu_cache_usage_perc
            .as_ref()
            .and_then(Number::as_f64)
            .ok_or_else(|| "gpu_cache_usage_perc must be a number in 0..=1".to_string())?;
        let load = LoadMetrics {
            waiting_requests_num: waiting,
            gpu_cache_usage_perc: usage,
            prefill_tokens_per_s: None,
        };
        if load.is_valid() {
            Ok(load)
        } else {
            Err(format!("gpu_cache_usage_perc = {usage} is outside 0..=1"))
        }
    }
}

/// Parses a load report's bytes (an etcd `XLLM:LOADMETRICS:` value) without a JSON tree.
pub fn parse_load_bytes(value: &[u8]) -> Result<LoadMetrics, String> {
    serde_json::from_slice::<LoadReport>(value).map_err(|e| e.to_string())?.check()
}
