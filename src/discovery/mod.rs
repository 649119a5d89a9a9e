//! What discovery decides, without etcd or sockets: the streams to run for the instance set
//! ([`plan`]: one per DP rank of every subscribable instance, or an [`Exclusion`] saying why
//! not), and the state of engines listed by address ([`Engines`]: identity and health from
//! their `/health` and `/metrics`). The discovery actor feeds it the [`crate::registry`] and
//! the engines' answers, and runs what it plans. [`parity`] checks a listed engine's tokenizer,
//! block size and model against kvdir's own. [`pods`] turns a Kubernetes pod into the engine
//! it serves.

mod engines;
pub mod parity;
mod plan;
pub mod pods;
mod prefill_rate;

pub use engines::{
    read_metrics, EngineReading, Engines, IdentityChange, ListedEngine, Probe, FROM_EVENTS,
    HYBRID_SWA,
};
pub use plan::{plan, wants_subscription, Exclusion, Plan, PlannedStream};
pub use prefill_rate::{PrefillRate, PrefillTotals};

#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod pods_tests;
