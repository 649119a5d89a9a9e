//! The instance registry that xLLM engines keep in etcd (protocol.md section 5), without etcd:
//! parsing keys and values, and the instance state machine (time passed in). The discovery
//! actor feeds it what etcd and `/health` say; [`crate::discovery`] plans streams from it.
//!
//! A bottom-layer module: it uses no other module of the crate, so the index (a stream's
//! [`Identity`]), routing and the config can all use its types.

mod beat;
mod record;
mod state;

pub use beat::{parse_load_bytes, HeartbeatBody, LoadReport, Text};
pub use record::{
    namespace_prefix, parse_instance, parse_key, split_host_port, watched_prefixes, watched_range,
    Identity, InstanceRecord, InstanceType, LoadMetrics, RecordError, RegistryKey, MAX_NAME_BYTES,
    QUOTED_BYTES,
};
pub use state::{
    HeartbeatError, Instance, InstanceState, PutOutcome, Registry, LEASE_LOST_GRACE,
    MAX_PENDING_LOADS, SUSPECT_TIMEOUT,
};

#[cfg(test)]
pub(crate) mod tests;
