//! Engines listed by address (config `engines`, or `POST /register` with a `url`), without etcd:
//! what their `/health` and `/metrics` say, turned into the same [`Instance`] etcd records
//! become, with time passed in. The service polls; this module decides.
//!
//! Process identity, per dialect (no identity: no CAR credit, and no streams yet):
//! - **vLLM**: `process_start_time_seconds` from `/metrics`. Another value is another process:
//!   its streams restart cold. An unreachable engine keeps its identity, so a network blip
//!   costs no resynchronization.
//! - **SGLang** (no `process_start_time_seconds`, and nothing per process in `/server_info`),
//!   **xLLM**, and **vLLM without a start time** (several API servers put its metrics in
//!   multiprocess mode): [`FROM_EVENTS`], known at the first healthy poll and never changed by
//!   a poll. Polls time nothing: a slow or failed one makes the engine SUSPECT, never another
//!   process. A restart is seen by the streams themselves: the new process's events number
//!   from 0 again (SGLang's seq 0 is an `AllBlocksCleared`), and its socket reconnects, so the
//!   stream withdraws its credit and replays the new history, exact from its start.
//! - **An engine without KV events** (approximate credit, which no stream can withdraw): a run
//!   of healthy polls. A failed poll ends the run, and the next healthy answer starts a new
//!   identity, which drops the credit kvdir assumed for the old one.
//!
//! An engine in a Kubernetes pod has the pod's UID in front of that identity: another pod of
//! the same name is another engine, whatever its process shows.
//!
//! Health: a 200 from `/health` is ACTIVE, anything else SUSPECT (never routed). A listed engine
//! is never removed for being down; its streams keep reconnecting.

use std::collections::BTreeMap;
use std::time::Instant;

use super::plan::{Exclusion, Plan, PlannedStream};
use super::prefill_rate::{PrefillRate, PrefillTotals};
use crate::car::RankLoad;
use crate::config::{canonical_endpoint, Dialect, EngineSpec};
use crate::prometheus::Samples;
use crate::registry::{
    Identity, Instance, InstanceRecord, InstanceState, InstanceType, LoadMetrics,
};

/// What the load gauges of one `/metrics` answer say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineReading {
    /// `process_start_time_seconds`, when exported.
    pub process_start: Option<f64>,
    /// Requests queued (vLLM `num_requests_waiting`, SGLang `num_queue_reqs`), summed over
    /// the engine's label sets (its DP ranks).
    pub waiting: u64,
    /// Requests running (vLLM `num_requests_running`, SGLang `num_running_reqs`).
    pub running: u64,
    /// KV cache usage in 0..=1 (vLLM `kv_cache_usage_perc`, SGLang `token_usage`), the
    /// largest over the label sets.
    pub usage: f64,
    /// vLLM's prefill sums, when exported ([`super::prefill_rate`]).
    pub prefill: Option<PrefillTotals>,
    /// SGLang serves a hybrid sliding-window model (a `sglang:max_total_num_tokens_swa`
    /// sample): its events say nothing of the window's blocks (see [`HYBRID_SWA`]).
    pub hybrid_swa: bool,
}

/// Why an SGLang engine serving a hybrid sliding-window model gets no streams.
pub const HYBRID_SWA: &str = "SGLang serves a hybrid sliding-window model \
    (sglang:max_total_num_tokens_swa): its KV events do not say which window blocks it keeps, \
    so kvdir gives it no cache credit and routes it by load";

impl EngineReading {
    /// The load routing reads: continuous batching admits most requests at once, so the queue
    /// CAR weighs is waiting plus running; `prefill_tokens_per_s` is the engine's reported
    /// rate, learned over its polls.
    pub fn load(&self, prefill_tokens_per_s: Option<f64>) -> LoadMetrics {
        LoadMetrics {
            waiting_requests_num: self.waiting + self.running,
            gpu_cache_usage_perc: self.usage,
            prefill_tokens_per_s,
        }
    }
}

/// The metric names of a dialect: waiting, running, usage (with an older alias).
fn names(dialect: Dialect) -> Option<[&'static str; 4]> {
    match dialect {
        Dialect::Vllm => Some([
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
        ]),
        Dialect::Sglang => Some([
            "sglang:num_queue_reqs",
            "sglang:num_running_reqs",
            "sglang:token_usage",
            "sglang:token_usage",
        ]),
        Dialect::Xllm => None,
    }
}

/// Reads a `/metrics` answer of an engine of `dialect`. xLLM's gauges are not read (its load
/// comes from etcd or heartbeats): zeros. A missing gauge is an error naming it.
pub fn read_metrics(dialect: Dialect, text: &str) -> Result<EngineReading, String> {
    let s = Samples::parse(text);
    let process_start = s.max("process_start_time_seconds");
    let Some([waiting, running, usage, usage_alias]) = names(dialect) else {
        let (waiting, running, usage, prefill) = (0, 0, 0.0, None);
        let hybrid_swa = false;
        return Ok(EngineReading { process_start, waiting, running, usage, prefill, hybrid_swa });
    };
    let missing = |name: &str| {
        format!(
            "{name} is missing from /metrics ({} samples); is this a {} server with metrics on?",
            s.samples.len(),
            dialect.as_str()
        )
    };
    let count = |name| s.sum(name).map(|v| v.max(0.0).round() as u64).ok_or_else(|| missing(name));
    let (waiting, running) = (count(waiting)?, count(running)?);
    let usage = s.max(usage).or_else(|| s.max(usage_alias)).ok_or_else(|| missing(usage))?;
    if !(0.0..=1.0).contains(&usage) {
        return Err(format!("KV cache usage {usage} is outside 0..=1"));
    }
    let prefill = PrefillTotals::read(&s);
    let hybrid_swa =
        dialect == Dialect::Sglang && s.max("sglang:max_total_num_tokens_swa").is_some();
    Ok(EngineReading { process_start, waiting, running, usage, prefill, hybrid_swa })
}

/// The label naming the DP rank of a dialect's load gauges: vLLM `engine="r"`, SGLang
/// `dp_rank="r"`.
fn rank_label(dialect: Dialect) -> Option<&'static str> {
    match dialect {
        Dialect::Vllm => Some("engine"),
        Dialect::Sglang => Some("dp_rank"),
        Dialect::Xllm => None,
    }
}

/// Each DP rank's load in a `/metrics` answer, where its gauges carry the rank label
/// ([`rank_label`]): waiting plus running (summed over the rank's label sets), and KV usage
/// (the largest). Empty when no gauge names a rank.
pub fn read_rank_loads(dialect: Dialect, text: &str) -> Vec<RankLoad> {
    let (Some([waiting, running, usage, usage_alias]), Some(label)) =
        (names(dialect), rank_label(dialect))
    else {
        return Vec::new();
    };
    let mut ranks: BTreeMap<u32, RankLoad> = BTreeMap::new();
    for s in Samples::parse(text).samples.iter().filter(|s| s.value.is_finite()) {
        let Some(rank) = s.label(label).and_then(|r| r.parse::<u32>().ok()) else { continue };
        let entry =
            ranks.entry(rank).or_insert(RankLoad { dp_rank: rank, waiting: 0, kv_usage: 0.0 });
        if s.name == waiting || s.name == running {
            entry.waiting += s.value.max(0.0).round() as u64;
        } else if s.name == usage || s.name == usage_alias {
            entry.kv_usage = entry.kv_usage.max(s.value.clamp(0.0, 1.0));
        }
    }
    ranks.into_values().collect()
}

/// Every endpoint of an engine, in canonical form.
fn endpoints(spec: &EngineSpec) -> impl Iterator<Item = String> + '_ {
    spec.events
        .iter()
        .chain(&spec.replay)
        .filter(|ep| !crate::config::is_bound(ep))
        .map(|ep| canonical_endpoint(ep).unwrap_or_else(|| ep.clone()))
}

/// One poll of an engine: `/health` (`Ok` on a 200) and `/metrics` (its text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// `/health`.
    pub health: Result<(), String>,
    /// `/metrics`.
    pub metrics: Result<String, String>,
}

/// The identity of an engine whose process only its events tell apart (see the module
/// documentation).
pub const FROM_EVENTS: &str = "from-events";

/// What a poll did to the engine's process identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityChange {
    /// Nothing.
    Unchanged,
    /// Known for the first time: its streams can start.
    Learned,
    /// Another process: its streams restart cold.
    Changed,
}

/// One listed engine.
#[derive(Debug, Clone)]
pub struct ListedEngine {
    /// Its description.
    pub spec: EngineSpec,
    /// As routing and reports see it (role DEFAULT, backend = dialect); the identity is
    /// meaningful only when `identity_known`.
    pub instance: Instance,
    /// Whether the process identity is known.
    pub identity_known: bool,
    /// The latest `/metrics` reading.
    pub reading: Option<EngineReading>,
    /// Each DP rank's load in the latest `/metrics` answer ([`read_rank_loads`]).
    pub rank_loads: Vec<RankLoad>,
    /// The prefill rate its readings report.
    prefill_rate: PrefillRate,
    /// The latest problem (`/health`, `/metrics`, no identity), if any.
    pub error: Option<String>,
    /// Polls so far.
    pub polls: u64,
    /// Runs of healthy polls so far (the identity of an engine without KV events).
    runs: u64,
    /// The parity check of its current process against kvdir's tokenizer and config, once run.
    pub parity: Option<super::parity::Parity>,
    /// Whether the latest poll was healthy.
    healthy: bool,
}

impl ListedEngine {
    fn new(spec: EngineSpec, now: Instant) -> Self {
        let record = InstanceRecord {
            name: spec.name.clone(),
            kind: InstanceType::Default,
            mix_acting_prefill: false,
            identity: Identity::default(),
            dp_size: spec.dp_size(),
            backend: spec.dialect.as_str().to_string(),
            model: spec.model.clone(),
            ttft_profile: Vec::new(),
            tpot_profile: Vec::new(),
        };
        let instance = Instance {
            record,
            state: InstanceState::Suspect,
            since: now,
            last_heartbeat: None,
            load: None,
            load_reports: 0,
            probe: None,
        };
        let error = Some("not polled yet".to_string());
        ListedEngine {
            spec,
            instance,
            identity_known: false,
            reading: None,
            rank_loads: Vec::new(),
            prefill_rate: PrefillRate::default(),
            error,
            polls: 0,
            runs: 0,
            parity: None,
            healthy: false,
        }
    }

    /// The prefill rate its readings report ([`super::prefill_rate`]).
    pub fn prefill_rate(&self) -> Option<f64> {
        self.prefill_rate.get()
    }

    /// Applies one poll.
    fn observe(&mut self, probe: Probe, now: Instant) -> IdentityChange {
        self.polls += 1;
        let i = &mut self.instance;
        let state =
            if probe.health.is_ok() { InstanceState::Active } else { InstanceState::Suspect };
        if i.state != state {
            (i.state, i.since) = (state, now);
        }
        if let Err(e) = probe.health {
            (self.healthy, self.error) = (false, Some(format!("/health: {e}")));
            return IdentityChange::Unchanged;
        }
        if let Ok(text) = &probe.metrics {
            self.rank_loads = read_rank_loads(self.spec.dialect, text);
        }
        let reading = probe.metrics.and_then(|text| read_metrics(self.spec.dialect, &text));
        self.error = reading.as_ref().err().map(|e| format!("/metrics: {e}"));
        let process = self.process(&reading);
        self.healthy = true;
        let i = &mut self.instance;
        if let Ok(r) = reading {
            if r.hybrid_swa {
                self.error = Some(HYBRID_SWA.into());
            }
            self.reading = Some(r);
            self.prefill_rate.observe(r.prefill);
            i.load = Some(r.load(self.prefill_rate.get()));
            i.load_reports += 1;
        } else if i.load.is_none() {
            // Healthy without load gauges: routable, with an empty queue.
            i.load = Some(LoadMetrics {
                waiting_requests_num: 0,
                gpu_cache_usage_perc: 0.0,
                prefill_tokens_per_s: None,
            });
        }
        let Some(id) = process.filter(|p| i.record.identity.incarnation_id.as_ref() != Some(p))
        else {
            return IdentityChange::Unchanged;
        };
        i.record.identity = Identity { incarnation_id: Some(id), register_ts_ms: None };
        self.parity = None; // another process: checked again
        if self.identity_known {
            // Another process: its sums started over, and so does its rate.
            self.prefill_rate.reset();
            self.prefill_rate.observe(self.reading.and_then(|r| r.prefill));
            if let Some(load) = i.load.as_mut() {
                load.prefill_tokens_per_s = None;
            }
        }
        i.load_reports = u64::from(self.reading.is_some());
        if std::mem::replace(&mut self.identity_known, true) {
            IdentityChange::Changed
        } else {
            IdentityChange::Learned
        }
    }

    /// The process a healthy poll with `reading` shows, if it shows one (see the module
    /// documentation), in the pod it runs in, if any (`pod-uid=<uid> <process>`).
    fn process(&mut self, reading: &Result<EngineReading, String>) -> Option<String> {
        let process = self.own_process(reading)?;
        Some(match self.spec.pod_uid.as_str() {
            "" => process,
            uid => format!("pod-uid={uid} {process}"),
        })
    }

    /// The engine's own process identity, as its dialect shows it.
    fn own_process(&mut self, reading: &Result<EngineReading, String>) -> Option<String> {
        let start = match (self.spec.dialect, reading) {
            (Dialect::Vllm, Ok(r)) => r.process_start,
            _ => None,
        };
        match start {
            Some(t) => Some(format!("process_start_time_seconds={t}")),
            None if !self.spec.is_approximate() => Some(FROM_EVENTS.to_string()),
            None if !self.healthy => {
                self.runs += 1;
                Some(format!("healthy-run-{}", self.runs))
            }
            None => None,
        }
    }
}

/// Every listed engine by name.
#[derive(Debug, Default)]
pub struct Engines {
    by_name: BTreeMap<String, ListedEngine>,
}

impl Engines {
    /// Lists an engine; `Err` names the engine already listed under its name or sharing an
    /// endpoint with it.
    pub fn add(&mut self, spec: EngineSpec, now: Instant) -> Result<(), String> {
        if self.by_name.contains_key(&spec.name) {
            return Err(format!(
                "an engine named {:?} is listed already; give this one another name",
                spec.name
            ));
        }
        let mine: Vec<String> = endpoints(&spec).collect();
        for other in self.iter() {
            if let Some(ep) = endpoints(&other.spec).find(|ep| mine.contains(ep)) {
                return Err(format!(
                    "endpoint {ep} is also one of engine {:?}; each endpoint serves one stream",
                    other.spec.name
                ));
            }
        }
        self.by_name.insert(spec.name.clone(), ListedEngine::new(spec, now));
        Ok(())
    }

    /// Moves out of `plan` (discovery's, from etcd) every instance named like a listed engine
    /// or sharing an endpoint with one: the listing wins.
    pub fn exclude_from(&self, plan: &mut Plan) {
        let listed: BTreeMap<String, &str> = self
            .iter()
            .flat_map(|e| endpoints(&e.spec).map(move |ep| (ep, e.spec.name.as_str())))
            .collect();
        let mut clash: BTreeMap<String, Exclusion> = BTreeMap::new();
        for s in &plan.streams {
            let name = &s.spec.instance_name;
            let why = if self.contains(name) {
                Some("an engine of this name is listed by address; the listing wins".to_string())
            } else {
                [&s.spec.endpoint, &s.spec.replay_endpoint].into_iter().find_map(|ep| {
                    let ep = canonical_endpoint(ep).unwrap_or_else(|| ep.clone());
                    listed.get(&ep).map(|e| format!("endpoint {ep} is one of listed engine {e:?}"))
                })
            };
            if let Some(why) = why {
                clash.entry(name.clone()).or_insert(Exclusion::Overlap(why));
            }
        }
        plan.streams.retain(|s| !clash.contains_key(&s.spec.instance_name));
        plan.excluded.extend(clash);
    }

    /// Unlists an engine.
    pub fn remove(&mut self, name: &str) -> Option<ListedEngine> {
        self.by_name.remove(name)
    }

    /// One engine.
    pub fn get(&self, name: &str) -> Option<&ListedEngine> {
        self.by_name.get(name)
    }

    /// Records the parity check of engine `name`'s current process.
    pub fn set_parity(&mut self, name: &str, parity: super::parity::Parity) {
        if let Some(e) = self.by_name.get_mut(name) {
            e.parity = Some(parity);
        }
    }

    /// Whether `name` is a listed engine.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The engines in name order.
    pub fn iter(&self) -> impl Iterator<Item = &ListedEngine> {
        self.by_name.values()
    }

    /// Applies a poll of `name` (ignored when it is no longer listed).
    pub fn observe(&mut self, name: &str, probe: Probe, now: Instant) -> IdentityChange {
        self.by_name.get_mut(name).map_or(IdentityChange::Unchanged, |e| e.observe(probe, now))
    }

    /// The streams of every engine whose process is known, for that process.
    pub fn planned(&self) -> Vec<PlannedStream> {
        self.iter()
            .filter(|e| e.identity_known && !e.reading.is_some_and(|r| r.hybrid_swa))
            .flat_map(|e| {
                let identity = e.instance.record.identity.clone();
                e.spec.streams().into_iter().map(move |spec| PlannedStream {
                    spec,
                    identity: identity.clone(),
                    dp_size: e.spec.dp_size(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
