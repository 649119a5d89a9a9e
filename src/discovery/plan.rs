//! Turning the instance set into the desired set of streams (the seed's "Automatic discovery").
//!
//! Only xLLM instances of type DEFAULT or PREFILL, and MIX instances acting as prefill, in state
//! ACTIVE or LEASE_LOST, get streams: one per DP rank, on
//! `tcp://host:(port + event_port_offset + r)` and `tcp://host:(port + replay_port_offset + r)`.
//! An instance whose `dp_size` exceeds `max_streams`, whose ports overflow, or whose endpoints
//! overlap another's, is excluded with a reason ([`Exclusion`]); `max_streams` admits whole
//! instances in name order. Registry values are hostile input: nothing here can overflow or
//! allocate in proportion to a registered number.

use std::collections::BTreeMap;

use crate::config::{
    canonical_endpoint, is_bound, DiscoveryConfig, StreamSpec, TopicVars, BIND_ENDPOINT,
};
use crate::registry::{split_host_port, Identity, Instance, InstanceState, InstanceType};

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

/// Why an instance has no streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclusion {
    /// Not a subscription target by backend, role or state (routine; see
    /// [`wants_subscription`]).
    NotTarget(String),
    /// The name does not split into `host:port`.
    Name,
    /// More DP ranks than `max_streams` could ever admit: nothing is allocated for them.
    DpSize {
        /// The registered `dp_size`.
        dp_size: u32,
        /// The configured limit.
        max_streams: usize,
    },
    /// The highest endpoint port would pass 65535.
    PortOverflow {
        /// The engine's HTTP port.
        port: u16,
        /// The highest DP rank.
        last_rank: u32,
        /// The port it reaches.
        reaches: u64,
    },
    /// An endpoint equals one of another instance, or its own event and replay ranges meet.
    Overlap(String),
    /// More DP ranks than the bind endpoint serves (discovery with `"events": "bind"`).
    BindRanks {
        /// The registered `dp_size`.
        dp_size: u32,
        /// `kv_events_bind.ranks`.
        ranks: u32,
    },
    /// Admitting it would pass `max_streams`.
    Capacity {
        /// Its streams.
        streams: usize,
        /// The configured limit.
        max_streams: usize,
    },
}

impl Exclusion {
    /// Whether an operator must act (a hostile or misconfigured registration): logged at ERROR.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            Exclusion::Name
                | Exclusion::DpSize { .. }
                | Exclusion::PortOverflow { .. }
                | Exclusion::Overlap(_)
                | Exclusion::BindRanks { .. }
        )
    }
}

impl std::fmt::Display for Exclusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exclusion::NotTarget(why) => f.write_str(why),
            Exclusion::Name => f.write_str("name is not host:port"),
            Exclusion::DpSize { dp_size, max_streams } => write!(
                f,
                "dp_size {dp_size} exceeds max_streams = {max_streams}: no streams for it"
            ),
            Exclusion::BindRanks { dp_size, ranks } => {
                write!(f, "dp_size {dp_size} exceeds kv_events_bind.ranks = {ranks}: raise ranks")
            }
            Exclusion::PortOverflow { port, last_rank, reaches } => write!(
                f,
                "port overflow: {port} + offset + dp rank {last_rank} reaches {reaches} > 65535"
            ),
            Exclusion::Overlap(why) => f.write_str(why),
            Exclusion::Capacity { streams, max_streams } => write!(
                f,
                "capacity: {streams} more streams would exceed max_streams = {max_streams}"
            ),
        }
    }
}

/// The outcome of planning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Streams to run, in instance name then rank order.
    pub streams: Vec<PlannedStream>,
    /// Instances without streams and why (role, state, backend, DP size, ports, capacity).
    pub excluded: BTreeMap<String, Exclusion>,
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

/// The streams of one instance. `dp_size` is checked against `max_streams` before anything is
/// allocated, and the port arithmetic is done in u64, so no registered value can overflow it.
fn streams_for(
    i: &Instance,
    d: &DiscoveryConfig,
    max_streams: usize,
) -> Result<Vec<PlannedStream>, Exclusion> {
    let r = &i.record;
    let (host, port) = split_host_port(&r.name).ok_or(Exclusion::Name)?;
    let dp_size = r.dp_size.max(1);
    if usize::try_from(dp_size).map_or(true, |n| n > max_streams) {
        return Err(Exclusion::DpSize { dp_size, max_streams });
    }
    let last_rank = dp_size - 1;
    let top = u64::from(d.event_port_offset.max(d.replay_port_offset));
    let reaches = u64::from(port) + top + u64::from(last_rank);
    if reaches > 65_535 {
        return Err(Exclusion::PortOverflow { port, last_rank, reaches });
    }
    if let Some(b) = d.bind.as_ref().filter(|b| dp_size > b.ranks) {
        return Err(Exclusion::BindRanks { dp_size, ranks: b.ranks });
    }
    let ep = |offset: u16, rank: u32| {
        format!("tcp://{host}:{}", u64::from(port) + u64::from(offset) + u64::from(rank))
    };
    // Bound: every rank on the bind endpoint, under the instance's topic.
    let endpoint = |rank| match d.bind {
        Some(_) => BIND_ENDPOINT.to_string(),
        None => ep(d.event_port_offset, rank),
    };
    let topic = match &d.bind {
        Some(b) => b.topic.render(&TopicVars { host, port, model: &r.model, name: &r.name }),
        None => d.topic.clone(),
    };
    Ok((0..dp_size)
        .map(|rank| PlannedStream {
            spec: StreamSpec {
                instance_name: r.name.clone(),
                dp_rank: rank,
                block_size: d.block_size,
                endpoint: endpoint(rank),
                replay_endpoint: ep(d.replay_port_offset, rank),
                topic: topic.clone(),
                hash_seed: 1024,
                model: r.model.clone(),
                salt: String::new(),
                replay: crate::config::ReplayKind::Snapshot,
            },
            identity: r.identity.clone(),
            dp_size,
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
        let planned = wants_subscription(i)
            .map_err(Exclusion::NotTarget)
            .and_then(|()| streams_for(i, d, max_streams));
        match planned {
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
            let reason = Exclusion::Capacity { streams: streams.len(), max_streams };
            plan.excluded.insert(name, reason);
            continue;
        }
        used += streams.len();
        plan.streams.extend(streams);
    }
    plan
}

/// Excludes every instance that shares an endpoint (event or replay) with another, or whose own
/// event and replay ranges meet. Endpoints are compared in canonical form, so `localhost:8000`
/// and `127.0.0.1:8000` registered as two instances overlap.
fn exclude_overlaps(
    candidates: &mut Vec<(String, Vec<PlannedStream>)>,
    excluded: &mut BTreeMap<String, Exclusion>,
) {
    let mut owners: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (name, streams) in candidates.iter() {
        for s in streams {
            // The bind endpoint is every bound stream's; their topics tell them apart.
            for ep in
                [&s.spec.endpoint, &s.spec.replay_endpoint].into_iter().filter(|e| !is_bound(e))
            {
                let key = canonical_endpoint(ep).unwrap_or_else(|| ep.clone());
                owners.entry(key).or_default().push(name);
            }
        }
    }
    let mut clash: BTreeMap<String, Exclusion> = BTreeMap::new();
    for (ep, names) in &owners {
        if names.len() > 1 {
            for n in names {
                let mut others: Vec<&str> = names.iter().copied().filter(|o| o != n).collect();
                others.dedup();
                let reason = if others.is_empty() {
                    format!("its event and replay ranges overlap at {ep}")
                } else {
                    format!("endpoint {ep} overlaps instance {}", others.join(", "))
                };
                clash.entry(n.to_string()).or_insert(Exclusion::Overlap(reason));
            }
        }
    }
    candidates.retain(|(name, _)| !clash.contains_key(name));
    excluded.extend(clash);
}
