//! The discovery actor's messages, and the instances report it answers with.

use actix::prelude::*;
use kvdir::registry::{HeartbeatError, LoadMetrics};
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
#[derive(Message)]
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
    pub role: &'static str,
    /// For MIX: what it does now.
    pub acting_as: Option<&'static str>,
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
    /// Every known instance in name order.
    pub instances: Vec<InstanceReport>,
}
