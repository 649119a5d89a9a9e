//! The discovery actor's messages, and the instances report it answers with.

use actix::prelude::*;
use kvdir::config::{Dialect, EngineSpec};
use kvdir::discovery::Probe;
use kvdir::registry::{HeartbeatError, InstanceType, LoadMetrics};
use serde::Serialize;

/// A full listing of the registry keys at `revision`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EtcdListed {
    /// Keys and values.
    pub kvs: Vec<(String, Vec<u8>)>,
    /// The listing's revision; the watch starts after it.
    pub revision: i64,
}

/// One key change, in etcd's revision order.
#[derive(Debug, Clone)]
pub enum Change {
    /// Written.
    Put(String, Vec<u8>),
    /// Deleted (or its lease expired).
    Delete(String),
}

/// Changes from the watch.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EtcdChanged(pub Vec<Change>);

/// etcd is unreachable or the watch ended.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EtcdDown {
    /// Why.
    pub error: String,
}

/// The answer of a `/health` probe (`ticket` tells a current probe from an old one).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Probed {
    pub(super) name: String,
    pub(super) ticket: u64,
    pub(super) healthy: bool,
}

/// A heartbeat from an engine.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), HeartbeatError>")]
pub struct Heartbeat {
    /// Instance name.
    pub name: String,
    /// The sender's incarnation.
    pub incarnation_id: Option<String>,
    /// Its load.
    pub load: LoadMetrics,
}

/// Ask for the instances report.
#[derive(Message)]
#[rtype(result = "InstancesReport")]
pub struct GetInstances;

/// One instance as `GET /v1/internal/instances` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceReport {
    /// `host:port`.
    pub name: String,
    /// ACTIVE, LEASE_LOST or SUSPECT.
    pub state: kvdir::registry::InstanceState,
    /// DEFAULT, PREFILL, DECODE or MIX.
    pub role: InstanceType,
    /// For MIX: what it does now, PREFILL or DECODE.
    pub acting_as: Option<InstanceType>,
    /// Process identity.
    pub incarnation_id: Option<String>,
    /// Registration time.
    pub register_ts_ms: Option<u64>,
    /// DP size.
    pub dp_size: u32,
    /// Backend.
    pub backend: String,
    /// Latest load.
    pub waiting_requests_num: Option<u64>,
    /// Latest device KV usage.
    pub gpu_cache_usage_perc: Option<f64>,
    /// DP ranks with a running stream.
    pub streams: Vec<u32>,
    /// Why it has no streams.
    pub excluded: Option<String>,
    /// The engine publishes no KV events: no streams, approximate credit from kvdir's own
    /// routing.
    pub approximate: bool,
    /// For an approximate engine: the blocks credited to it now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approximate_blocks: Option<u64>,
    /// For an engine listed by address: what kvdir polls and what it read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineReport>,
}

/// A listed engine's part of its instance report.
#[derive(Debug, Clone, Serialize)]
pub struct EngineReport {
    /// Its base URL (forwarding, `/health`, `/metrics`).
    pub url: String,
    /// `vllm`, `sglang` or `xllm`.
    pub dialect: Dialect,
    /// `config`, `register`, `announce` (`kv_events_bind.announce`) or `kubernetes`.
    pub source: &'static str,
    /// Whether its process is known (no CAR credit before).
    pub identity_known: bool,
    /// vLLM's process start, the process identity.
    pub process_start_time_seconds: Option<f64>,
    /// The latest `/metrics` gauges.
    pub num_requests_waiting: Option<u64>,
    /// Requests running.
    pub num_requests_running: Option<u64>,
    /// KV cache usage in 0..=1.
    pub kv_cache_usage_perc: Option<f64>,
    /// The prefill rate its `/metrics` report, uncached tokens per second of one request.
    pub prefill_tokens_per_s: Option<f64>,
    /// Polls so far.
    pub polls: u64,
    /// The latest problem (`/health`, `/metrics`, no identity).
    pub error: Option<String>,
    /// Event endpoint per DP rank.
    pub events: Vec<String>,
    /// Replay endpoint per DP rank.
    pub replay: Vec<String>,
    /// Tokens per block.
    pub block_size: u32,
    /// The served model.
    pub model: String,
    /// The parity check of its tokenizer, block size and model against kvdir's, once run
    /// (only with `--tokenizer_path`).
    pub parity: Option<kvdir::discovery::parity::Parity>,
}

/// A listed engine's parity check finished.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct ParityChecked {
    pub(super) name: String,
    pub(super) parity: kvdir::discovery::parity::Parity,
}

/// One poll of a listed engine.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct EnginePolled {
    pub(super) name: String,
    /// The URL polled and the pod, if any: an answer for an engine since replaced under the
    /// same name is dropped.
    pub(super) polled: (String, String),
    pub(super) probe: Probe,
}

/// List an engine (`POST /register` with a `url`); `Err` says why not.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct ListEngine(pub EngineSpec);

/// Unlist an engine listed by `POST /register`: its event endpoints, or `Err` saying why not.
#[derive(Message)]
#[rtype(result = "Result<Vec<String>, String>")]
pub struct UnlistEngine(pub String);

/// Every pod the selector picks, listed at `resource_version` (`kubernetes`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PodsListed {
    /// The pods.
    pub pods: Vec<kvdir::discovery::pods::Pod>,
    /// The list's version; the watch starts there.
    pub resource_version: String,
}

/// One change the pod watch saw.
#[derive(Debug, Clone)]
pub enum PodChange {
    /// Added or modified.
    Applied(kvdir::discovery::pods::Pod),
    /// Deleted, or no longer selected.
    Deleted(kvdir::discovery::pods::Pod),
}

/// A pod watch event.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PodsChanged {
    /// What changed.
    pub change: PodChange,
    /// The version it was seen at.
    pub resource_version: String,
}

/// A pod watch started from `resource_version` (after a list, a resume or a failure).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PodsWatching {
    /// The version it started from.
    pub resource_version: String,
}

/// The Kubernetes API is unreachable, refused, or the watch broke.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PodsDown {
    /// Why, with the fix where there is one.
    pub error: String,
    /// Only an operator fixes it: the API server refused kvdir's credentials or access (401,
    /// 403), or there is no client config.
    pub operator: bool,
}

/// The `kubernetes` part of the instances report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KubernetesReport {
    /// The namespace watched (`*`: every one kvdir may see).
    pub namespace: String,
    /// The label selector.
    pub selector: String,
    /// Whether the pods are listed and watched now.
    pub connected: bool,
    /// The last problem (unreachable, 403 with its fix, ...), until the next list.
    pub error: Option<String>,
    /// Times the pods were listed (the first, then after each 410 Gone or failure).
    pub listings: u64,
    /// The last `resourceVersion` seen (a list, an event or a bookmark).
    pub resource_version: String,
    /// Pods selected now, in any state.
    pub pods: usize,
    /// Engines listed from pods now (`source: kubernetes`).
    pub engines: usize,
    /// Pods skipped for a bad description, by `<namespace>/<name>`: what is wrong and the fix.
    pub skipped: std::collections::BTreeMap<String, String>,
}

/// The instances report.
#[derive(Debug, Clone, Serialize)]
pub struct InstancesReport {
    /// Whether the etcd watch is running.
    pub etcd_connected: bool,
    /// The last etcd problem.
    pub etcd_error: Option<String>,
    /// Times the registry was listed.
    pub etcd_listings: u64,
    /// Keys read by the last listing (instance and LOADMETRICS keys only).
    pub etcd_listed_keys: usize,
    /// Engine pods, with `kubernetes` in the config.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesReport>,
    /// Every known instance in name order.
    pub instances: Vec<InstanceReport>,
}
