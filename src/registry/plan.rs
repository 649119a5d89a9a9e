//! Turning the instance set into the desired set of streams (the seed's "Automatic discovery").
//!
//! Only xLLM instances of type DEFAULT or PREFILL, and MIX instances acting as prefill, in state
//! ACTIVE or LEASE_LOST, get streams: one per DP rank, on
//! `tcp://host:(port + event_port_offset + r)` and `tcp://host:(port + replay_port_offset + r)`.
//! An instance whose ports overflow, or whose endpoints overlap another's, is excluded with a
//! reason; `max_streams` admits whole instances in name order.

use std::collections::{BTreeMap, HashMap};

use super::record::{split_host_port, Identity, InstanceType};
use super::state::{Instance, InstanceState};
use crate::config::{DiscoveryConfig, StreamSpec};

/// One stream discovery wants running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedStream {
    /// The stream's settings.
    pub spec: StreamSpec,
    /// The process it belongs to; another process means a new stream with no credit (a refresh
    /// of the same one does not: see [`PlannedStream::is_running_as`]).
    pub identity: Identity,
    /// The instance's DP size; a change means new streams.
    pub dp_size: u32,
}

impl PlannedStream {
    /// Whether a stream already running with `spec` for `identity` is this stream, so it keeps
    /// its index: the same settings and the same process by [`Identity::same_process`]. A
    /// refresh with the same `incarnation_id` but a new `register_ts_ms` (or other fields that
    /// do not shape the streams) is the same process; a stream without an identity (static
    /// configuration) never is.
    pub fn is_running_as(&self, spec: &StreamSpec, identity: Option<&Identity>) -> bool {
        self.spec == *spec && identity.is_some_and(|id| id.same_process(&self.identity))
    }
}

/// The outcome of planning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Streams to run, in instance name then rank order.
    pub streams: Vec<PlannedStream>,
    /// Instances without streams and why (role, state, backend, ports, capacity).
    pub excluded: BTreeMap<String, String>,
}

/// Whether an instance is a prefill-side subscription target by role and backend.
pub fn wants_subscription(i: &Instance) -> Result<(), String> {
    let r = &i.record;
    if r.backend != "xllm" {
        return Err(format!("backend {:?} is not xllm", r.backend));
    }
    match r.kind {
        InstanceType::Default | InstanceType::Prefill => {}
        InstanceType::Mix if r.mix_acting_prefill => {}
        InstanceType::Mix => return Err("MIX instance currently acting as DECODE".into()),
        InstanceType::Decode => return Err("DECODE instances hold no reusable prefill KV".into()),
    }
    if i.state == InstanceState::Suspect {
        return Err("SUSPECT".into());
    }
    Ok(())
}

fn streams_for(i: &Instance, d: &DiscoveryConfig) -> Result<Vec<PlannedStream>, String> {
    let r = &i.record;
    let (host, port) = split_host_port(&r.name).ok_or("name is not host:port")?;
    let last =
        u32::from(port) + u32::from(d.event_port_offset.max(d.replay_port_offset)) + r.dp_size - 1;
    if last > 65_535 {
        return Err(format!(
            "port overflow: {port} + offset + dp rank {} reaches {last} > 65535",
            r.dp_size - 1
        ));
    }
    let ep = |offset: u16, rank: u32| {
        format!("tcp://{host}:{}", u32::from(port) + u32::from(offset) + rank)
    };
    Ok((0..r.dp_size)
        .map(|rank| PlannedStream {
            spec: StreamSpec {
                instance_name: r.name.clone(),
                dp_rank: rank,
                block_size: d.block_size,
                endpoint: ep(d.event_port_offset, rank),
                replay_endpoint: ep(d.replay_port_offset, rank),
                topic: d.topic.clone(),
                hash_seed: 1024,
            },
            identity: r.identity.clone(),
            dp_size: r.dp_size,
        })
        .collect())
}

/// Plans the streams for `instances` (in name order).
pub fn plan<'a>(
    instances: impl Iterator<Item = &'a Instance>,
    d: &DiscoveryConfig,
    max_streams: usize,
) -> Plan {
    let mut plan = Plan::default();
    let mut candidates: Vec<(String, Vec<PlannedStream>)> = Vec::new();
    for i in instances {
        match wants_subscription(i).and_then(|()| streams_for(i, d)) {
            Ok(s) => candidates.push((i.record.name.clone(), s)),
            Err(reason) => {
                plan.excluded.insert(i.record.name.clone(), reason);
            }
        }
    }
    exclude_overlaps(&mut candidates, &mut plan.excluded);
    let mut used = 0usize;
    for (name, streams) in candidates {
        if used + streams.len() > max_streams {
            let reason = format!(
                "capacity: {} more streams would exceed max_streams = {max_streams}",
                streams.len()
            );
            plan.excluded.insert(name, reason);
            continue;
        }
        used += streams.len();
        plan.streams.extend(streams);
    }
    plan
}

/// Excludes every instance that shares an endpoint (event or replay) with another.
fn exclude_overlaps(
    candidates: &mut Vec<(String, Vec<PlannedStream>)>,
    excluded: &mut BTreeMap<String, String>,
) {
    let mut owners: HashMap<&str, Vec<&str>> = HashMap::new();
    for (name, streams) in candidates.iter() {
        for s in streams {
            for ep in [s.spec.endpoint.as_str(), s.spec.replay_endpoint.as_str()] {
                owners.entry(ep).or_default().push(name);
            }
        }
    }
    let mut clash: BTreeMap<String, String> = BTreeMap::new();
    for (ep, names) in &owners {
        if names.len() > 1 {
            for n in names {
                let others: Vec<&str> = names.iter().copied().filter(|o| o != n).collect();
                let reason = if others.is_empty() {
                    format!("its event and replay ranges overlap at {ep}")
                } else {
                    format!("endpoint {ep} overlaps instance {}", others.join(", "))
                };
                clash.entry(n.to_string()).or_insert(reason);
            }
        }
    }
    candidates.retain(|(name, _)| !clash.contains_key(name));
    excluded.extend(clash);
}
