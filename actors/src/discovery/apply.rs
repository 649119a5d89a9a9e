//! Applying discovery's plan to the stream set: the streams from etcd discovery and from the
//! listed engines are started, stopped and restarted until they equal the plan.
//!
//! A refresh re-plans every `refresh_interval`. Planning and applying walk every instance and
//! stream (thousands at fleet scale), so a refresh does nothing when the last plan runs in
//! full and nothing it was made from changed since: the registry ([`Registry::changes`]), the
//! listed engines' streams, and the streams running ([`StreamSet::changes`]).
//!
//! [`Registry::changes`]: kvdir::registry::Registry::changes

use std::collections::BTreeMap;

use kvdir::config::is_bound;
use kvdir::discovery::PlannedStream;

use crate::stream::StreamKey;
use crate::stream::{StreamSet, StreamSource};

/// What one refresh wants running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plans {
    /// Streams of instances discovered in etcd (empty without a discovery config).
    pub discovery: Vec<PlannedStream>,
    /// Streams of the engines listed by address.
    pub engines: Vec<PlannedStream>,
    /// The registry's change count the discovery plan was made at.
    pub registry: u64,
}

/// What a plan applied in full was made from, and the stream set's change count just after.
#[derive(Debug)]
pub struct Applied {
    registry: u64,
    engines: Vec<PlannedStream>,
    changes: u64,
}

impl Applied {
    /// Whether a plan made now would be this one (the same registry count and listed engines'
    /// streams) and no stream started or stopped since it was applied.
    pub fn holds(&self, registry: u64, engines: &[PlannedStream], set: &StreamSet) -> bool {
        self.changes == set.changes() && self.registry == registry && self.engines == engines
    }
}

/// Applies both plans; `Some` when every planned stream runs as planned afterwards.
pub async fn apply_plans(set: &StreamSet, plans: Plans) -> Option<Applied> {
    let Plans { discovery, engines, registry } = plans;
    let all_discovered = apply_plan(set, discovery, StreamSource::Discovery).await;
    let all_listed = apply_plan(set, engines.clone(), StreamSource::Engine).await;
    (all_discovered && all_listed).then(|| Applied { registry, engines, changes: set.changes() })
}

/// Starts, stops and restarts the streams from `source` so they equal `desired`; `true` when
/// every desired stream then runs.
async fn apply_plan(set: &StreamSet, desired: Vec<PlannedStream>, source: StreamSource) -> bool {
    let want: BTreeMap<StreamKey, PlannedStream> = desired
        .into_iter()
        .map(|p| {
            (StreamKey { instance_name: p.spec.instance_name.clone(), dp_rank: p.spec.dp_rank }, p)
        })
        .collect();
    // Streams from other sources (`POST /register`, static) are not this plan's to stop.
    for key in set.keys_from(source) {
        let keep = match (set.get(&key), want.get(&key)) {
            (Some(run), Some(p)) => p.is_running_as(&run.spec, run.identity.as_ref()),
            _ => false,
        };
        if !keep {
            tracing::info!(instance = %key.instance_name, dp = key.dp_rank, "stopping stream");
            set.stop(&key).await;
        }
    }
    let mut complete = true;
    for (key, p) in want {
        if set.get(&key).is_none() {
            // A bound stream's endpoint is the in-process fan-out; operators know it by its key.
            let endpoint =
                if is_bound(&p.spec.endpoint) { "kv_events_bind" } else { &p.spec.endpoint };
            tracing::info!(instance = %key.instance_name, dp = key.dp_rank, %endpoint, "starting stream");
            if let Err(e) = set.start(p.spec, Some(p.identity), source) {
                tracing::error!(instance = %key.instance_name, dp = key.dp_rank, error = %e, "cannot start stream");
                complete = false;
            }
        }
    }
    complete
}
