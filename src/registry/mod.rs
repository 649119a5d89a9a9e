//! The instance registry that xLLM engines keep in etcd (protocol.md section 5), without etcd:
//! parsing keys and values, the instance state machine (time passed in), and planning the
//! streams discovery should run. The discovery actor feeds it what etcd and `/health` say.

mod engines;
mod plan;
mod record;
mod state;

pub use engines::{read_metrics, EngineReading, Engines, IdentityChange, ListedEngine, Probe};
pub use plan::{plan, wants_subscription, Exclusion, Plan, PlannedStream};
pub use record::{
    namespace_prefix, parse_instance, parse_key, parse_load, split_host_port, watched_prefixes,
    watched_range, Identity, InstanceRecord, InstanceType, LoadMetrics, RecordError, RegistryKey,
    MAX_NAME_BYTES, QUOTED_BYTES,
};
pub use state::{
    HeartbeatError, Instance, InstanceState, PutOutcome, Registry, LEASE_LOST_GRACE,
    MAX_PENDING_LOADS, SUSPECT_TIMEOUT,
};

#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod tests;
