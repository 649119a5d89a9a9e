//! Engine pods (the config's `kubernetes`): one pod, as the Kubernetes API describes it, turned
//! into the engine kvdir lists for it, or the reason it lists none. The service lists and
//! watches the pods; this module decides.
//!
//! Rules:
//! - A pod serves when its phase is `Running`, its `Ready` condition is `True`, it has a pod
//!   IP and it is not being deleted. Any other pod has no engine (and loses the one it had).
//! - Its description comes from annotations `kvdir.io/<key>` ([`KEYS`], with their defaults);
//!   a label of the same key is read when the annotation is absent. Ports of DP rank r are the
//!   given port + r, as vLLM and SGLang number them; the event and replay ranges (and the HTTP
//!   port) must not overlap.
//! - A bad value is [`PodEngine::Invalid`], naming the key, the value and the fix: the pod is
//!   skipped, never guessed at.
//! - The engine is named `<namespace>/<pod>`, and carries the pod's UID: a pod recreated under
//!   the same name is another engine, and so is one whose IP changed (another description).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::config::{Dialect, EngineSpec, MAX_STREAMS};

/// The annotation (or label) keys of an engine pod, with their defaults.
pub const KEYS: [(&str, &str); 8] = [
    (HTTP_PORT, "8000"),
    (EVENTS_PORT, "5557"),
    (REPLAY_PORT, "5558"),
    (DIALECT, "vllm"),
    (MODEL, ""),
    (BLOCK_SIZE, "16"),
    (DP_SIZE, "1"),
    (TOPIC, ""),
];

/// The engine's OpenAI server port.
pub const HTTP_PORT: &str = "kvdir.io/http-port";
/// The KV event publisher port of DP rank 0.
pub const EVENTS_PORT: &str = "kvdir.io/events-port";
/// The replay port of DP rank 0.
pub const REPLAY_PORT: &str = "kvdir.io/replay-port";
/// `vllm` or `sglang`.
pub const DIALECT: &str = "kvdir.io/dialect";
/// The served model name; empty: any.
pub const MODEL: &str = "kvdir.io/model";
/// Tokens per block (vLLM `--block-size`, SGLang `--page-size`).
pub const BLOCK_SIZE: &str = "kvdir.io/block-size";
/// DP ranks.
pub const DP_SIZE: &str = "kvdir.io/dp-size";
/// The publisher topic.
pub const TOPIC: &str = "kvdir.io/topic";

/// Largest block size accepted, as for listed engines.
const MAX_BLOCK_SIZE: u64 = 65_536;

/// What kvdir reads of one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `status.phase` (empty when absent).
    pub phase: String,
    /// Whether `status.conditions` has `Ready` with status `True`.
    pub ready: bool,
    /// `status.podIP`.
    pub ip: Option<String>,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
}

impl Pod {
    /// `<namespace>/<name>`, the engine's name.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why a pod has no engine now (it is not an error: pods start, stop and move).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotServing {
    /// Its phase is not `Running`.
    Phase(String),
    /// Its `Ready` condition is not `True`.
    NotReady,
    /// It has no pod IP.
    NoIp,
    /// It is being deleted.
    Deleting,
}

impl fmt::Display for NotServing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotServing::Phase(p) if p.is_empty() => f.write_str("no phase yet"),
            NotServing::Phase(p) => write!(f, "phase {p}, not Running"),
            NotServing::NotReady => f.write_str("not Ready"),
            NotServing::NoIp => f.write_str("no pod IP"),
            NotServing::Deleting => f.write_str("being deleted"),
        }
    }
}

/// One bad value of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProblem {
    /// Where it was read: `annotation`, `label` or `status`.
    pub place: &'static str,
    /// The key (`kvdir.io/dp-size`, `podIP`).
    pub key: String,
    /// The value given.
    pub value: String,
    /// What is wrong and the fix.
    pub why: String,
}

impl fmt::Display for PodProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} = {:?}: {}", self.place, self.key, self.value, self.why)
    }
}

/// What a pod is to kvdir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodEngine {
    /// It serves this engine.
    Serving(EngineSpec),
    /// It serves none now.
    NotServing(NotServing),
    /// Its description is wrong: skipped until it is fixed. Never empty.
    Invalid(Vec<PodProblem>),
}

/// The engine `pod` serves, if any.
pub fn pod_engine(pod: &Pod) -> PodEngine {
    let not = |why| PodEngine::NotServing(why);
    if pod.deleting {
        return not(NotServing::Deleting);
    }
    if pod.phase != "Running" {
        return not(NotServing::Phase(pod.phase.clone()));
    }
    if !pod.ready {
        return not(NotServing::NotReady);
    }
    let Some(ip) = pod.ip.as_deref().filter(|ip| !ip.is_empty()) else {
        return not(NotServing::NoIp);
    };
    let mut r = Reader { pod, problems: Vec::new() };
    let ip = ip.parse::<IpAddr>().map_err(|_| {
        r.problems.push(PodProblem {
            place: "status",
            key: "podIP".into(),
            value: ip.to_string(),
            why: "not an IP address".into(),
        })
    });
    let engine = r.engine(ip.ok());
    match engine {
        Some(spec) if r.problems.is_empty() => PodEngine::Serving(spec),
        _ => PodEngine::Invalid(r.problems),
    }
}

/// Reads a pod's keys, collecting every problem.
struct Reader<'a> {
    pod: &'a Pod,
    problems: Vec<PodProblem>,
}

impl Reader<'_> {
    fn engine(&mut self, ip: Option<IpAddr>) -> Option<EngineSpec> {
        let http = self.int(HTTP_PORT, 1, 65_535, "a TCP port (the engine's OpenAI server)");
        let events = self.int(EVENTS_PORT, 1, 65_535, "a TCP port (DP rank 0's KV events)");
        let replay = self.int(REPLAY_PORT, 1, 65_535, "a TCP port (DP rank 0's replay)");
        let dp = self.int(DP_SIZE, 1, MAX_STREAMS, "the engine's DP size");
        let block = self.int(BLOCK_SIZE, 1, MAX_BLOCK_SIZE, "the engine's block size");
        let dialect = self.dialect();
        let (http, events, replay, dp) = (http?, events?, replay?, dp?);
        self.check_ports(http, events, replay, dp)?;
        let (ip, block_size, dialect) = (ip?, block? as u32, dialect?);
        let at = |port: u64| SocketAddr::new(ip, port as u16).to_string();
        let ranks = |first: u64| (0..dp).map(|r| format!("tcp://{}", at(first + r))).collect();
        Some(EngineSpec {
            name: self.pod.key(),
            url: format!("http://{}", at(http)),
            dialect,
            events: ranks(events),
            replay: ranks(replay),
            ranks: dp as u32,
            block_size,
            model: self.get(MODEL).map_or_else(String::new, |(v, _)| v.to_string()),
            topic: self.get(TOPIC).map_or_else(String::new, |(v, _)| v.to_string()),
            pod_uid: self.pod.uid.clone(),
        })
    }

    /// The value of `key`, and where it was read: the annotation, else the label.
    fn get(&self, key: &str) -> Option<(&str, &'static str)> {
        let annotation = self.pod.annotations.get(key).map(|v| (v.as_str(), "annotation"));
        annotation.or_else(|| self.pod.labels.get(key).map(|v| (v.as_str(), "label")))
    }

    fn default_of(key: &str) -> &'static str {
        KEYS.iter().find(|(k, _)| *k == key).map_or("", |(_, d)| d)
    }

    fn bad(&mut self, key: &str, why: String) {
        let (value, place) = self.get(key).unwrap_or((Self::default_of(key), "default"));
        let value = value.to_string();
        self.problems.push(PodProblem { place, key: key.into(), value, why });
    }

    /// An integer in `min..=max` (the default when absent).
    fn int(&mut self, key: &str, min: u64, max: u64, what: &str) -> Option<u64> {
        let text = self.get(key).map_or(Self::default_of(key), |(v, _)| v);
        match text.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                let default = Self::default_of(key);
                let why = format!(
                    "expected an integer in {min}..={max}, {what}; fix the value, or remove it \
                     for the default {default}"
                );
                self.bad(key, why);
                None
            }
        }
    }

    fn dialect(&mut self) -> Option<Dialect> {
        let text = self.get(DIALECT).map_or("vllm", |(v, _)| v);
        match Dialect::parse(text.trim()) {
            Some(d @ (Dialect::Vllm | Dialect::Sglang)) => Some(d),
            _ => {
                let why = "expected \"vllm\" or \"sglang\" (xLLM registers itself in etcd: use \
                           discovery)"
                    .to_string();
                self.bad(DIALECT, why);
                None
            }
        }
    }

    /// Rank r's ports are port + r: every range must end by 65535, and the event range, the
    /// replay range and the HTTP port must not overlap.
    fn check_ports(&mut self, http: u64, events: u64, replay: u64, dp: u64) -> Option<()> {
        let before = self.problems.len();
        for (key, first) in [(EVENTS_PORT, events), (REPLAY_PORT, replay)] {
            if first + dp - 1 > 65_535 {
                let why = format!(
                    "rank {} would be at port {} > 65535 ({DP_SIZE} = {dp}); give a lower port",
                    dp - 1,
                    first + dp - 1
                );
                self.bad(key, why);
            }
        }
        let overlaps = |a: u64, b: u64| a < b + dp && b < a + dp;
        if self.problems.len() == before && overlaps(events, replay) {
            let why = format!(
                "the replay ports {replay}..={} overlap the event ports {events}..={} \
                 ({EVENTS_PORT}, {DP_SIZE} = {dp}); give {REPLAY_PORT} a port outside them, \
                 such as {}",
                replay + dp - 1,
                events + dp - 1,
                events + dp
            );
            self.bad(REPLAY_PORT, why);
        }
        for (key, first) in [(EVENTS_PORT, events), (REPLAY_PORT, replay)] {
            if (first..first + dp).contains(&http) {
                let why = format!(
                    "the HTTP port {http} is one of the ports {first}..={} of {key} ({DP_SIZE} = \
                     {dp}); give the engine's OpenAI server port",
                    first + dp - 1
                );
                self.bad(HTTP_PORT, why);
            }
        }
        (self.problems.len() == before).then_some(())
    }
}
