//! Configuration: command-line flags and the `kv_events_config_file`, validated at start-up.
//!
//! Raw input (flags, JSON) is turned into validated types here; everything past this module
//! uses `Duration`s and checked values. Every problem is collected and reported together, each
//! naming the offending value and the fix.

pub mod announce;
pub mod args;
mod bind;
mod endpoint;
mod engines;
pub mod fds;
mod file;
mod flags;
mod json;
pub mod kubernetes;

pub use bind::{
    check_bind_endpoint, is_bound, keyed_topic, BindConfig, TopicPattern, TopicVars, BIND_ENDPOINT,
    KEY_WIDTH,
};
pub use endpoint::{canonical_endpoint, check_endpoint};
pub use engines::{parse_engine_json, parse_engine_json_with, EngineSpec, ENGINE_FIELDS};
pub use file::{parse_config_file, parse_config_file_with_bind};
pub use flags::{parse_flags, usage, Command, Flags, FrontDoorFlags, LogFormat};
pub use json::kind as json_type_name;

use std::fmt;
use std::time::Duration;

use crate::index::IndexConfig;

/// Every problem found in the configuration, reported together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// One message per problem.
    pub problems: Vec<String>,
}

impl ConfigError {
    pub(crate) fn new(problems: Vec<String>) -> Self {
        ConfigError { problems }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problems.as_slice() {
            [one] => write!(f, "invalid configuration: {one}"),
            many => {
                write!(f, "invalid configuration ({} problems):", many.len())?;
                for p in many {
                    write!(f, "\n  - {p}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Most streams one kvdir follows (`max_streams`), and most DP ranks of one engine.
pub const MAX_STREAMS: u64 = 65_536;

/// Resource and recovery limits (protocol.md section 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Maximum subscription streams, one per instance/DP.
    pub max_streams: usize,
    /// Engine blocks per stream, each with its content entry and hash mapping.
    pub max_blocks_per_stream: usize,
    /// Largest live message or snapshot reply payload.
    pub max_message_bytes: usize,
    /// Live-delta buffering budget while a snapshot is pending.
    pub max_buffered_bytes: usize,
    /// Time allowed for a complete snapshot.
    pub replay_timeout: Duration,
    /// Period of snapshot reconciliation on a synchronized stream.
    pub resync_interval: Duration,
    /// A connected publisher whose host answers nothing (no TCP keepalive reply, no
    /// acknowledgement) for about this long is disconnected; zero leaves the system's timeouts.
    pub publisher_timeout: Duration,
    /// I/O threads serving the streams; 0: one per core (at most 64 either way).
    pub io_threads: usize,
    /// Replay DEALERs open at once in the process; further replays wait their turn.
    pub max_concurrent_replays: usize,
    /// Approximate credit of engines without KV events (`approximate_ttl_ms`,
    /// `approximate_blocks_per_engine`).
    pub approximate: crate::car::ApproxSettings,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams: 128,
            max_blocks_per_stream: 262_144,
            max_message_bytes: 8 << 20,
            max_buffered_bytes: 16 << 20,
            replay_timeout: Duration::from_millis(2000),
            resync_interval: Duration::from_millis(30_000),
            publisher_timeout: Duration::from_millis(3000),
            io_threads: 0,
            max_concurrent_replays: 256,
            approximate: crate::car::ApproxSettings::default(),
        }
    }
}

/// One statically configured stream (one instance/DP rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// Instance identity, preferably the engine's registered name.
    pub instance_name: String,
    /// DP rank; must match the batches' `dp_rank`.
    pub dp_rank: u32,
    /// Tokens per block; must match the engine.
    pub block_size: u32,
    /// Connectable live event endpoint (`tcp://host:port`).
    pub endpoint: String,
    /// Connectable snapshot endpoint.
    pub replay_endpoint: String,
    /// Exact publisher topic.
    pub topic: String,
    /// Content-key seed.
    pub hash_seed: u64,
    /// The model the engine serves; empty: unnamed, answers queries for any model.
    pub model: String,
    /// The stream's salt (`additionalsalt` of `POST /register`); empty: none. Its blocks are
    /// keyed in that salt's namespace (protocol.md section 1.1).
    pub salt: String,
    /// What the engine's replay endpoint answers: an xLLM state snapshot or vLLM's and
    /// SGLang's buffered history of batches.
    pub replay: ReplayKind,
}

impl StreamSpec {
    /// The index settings of this stream under `limits`.
    pub fn index_config(&self, limits: &Limits) -> IndexConfig {
        IndexConfig {
            block_size: self.block_size,
            hash_seed: self.hash_seed,
            salt: crate::index::Namespace::salt(self.salt.as_bytes()),
            max_blocks: limits.max_blocks_per_stream,
        }
    }

    /// The topic of the engine's own messages (history replies carry it): the topic, without
    /// the key a bound stream's topic starts with ([`keyed_topic`]).
    pub fn replay_topic(&self) -> &[u8] {
        let t = self.topic.as_bytes();
        match is_bound(&self.endpoint) {
            true => t.get(KEY_WIDTH..).unwrap_or(t),
            false => t,
        }
    }
}

/// What a stream's replay endpoint answers (docs/protocol.md, *Recovery*); reports spell it as
/// the config does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplayKind {
    /// xLLM: the engine's current state, tagged with the first live sequence it does not hold.
    #[default]
    Snapshot,
    /// vLLM and SGLang: the buffered batches from the asked sequence on (or from the oldest
    /// still buffered), the same frames as live.
    History,
}

impl ReplayKind {
    /// The config and report spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayKind::Snapshot => "snapshot",
            ReplayKind::History => "history",
        }
    }

    /// Parses the config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "snapshot" => Some(ReplayKind::Snapshot),
            "history" => Some(ReplayKind::History),
            _ => None,
        }
    }
}

/// The kind of engine behind a stream or an instance: what its events, replay, metrics and
/// prefix reuse look like.
/// Reports spell it as the config does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// xLLM (protocol.md): snapshots, etcd registration.
    #[default]
    Xllm,
    /// vLLM: history replay, `/metrics` with `vllm:` load gauges.
    Vllm,
    /// SGLang: history replay, `/metrics` with `sglang:` load gauges.
    Sglang,
}

impl Dialect {
    /// The config and report spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Xllm => "xllm",
            Dialect::Vllm => "vllm",
            Dialect::Sglang => "sglang",
        }
    }

    /// The request header that names the DP rank to serve a request, where the engine takes
    /// one: vLLM's serving code reads `X-data-parallel-rank` (and its DP client then skips
    /// its own balancer); SGLang 0.5's OpenAI routes read `X-Data-Parallel-Rank` (over the
    /// body's `routed_dp_rank`), for every load-balance method of its DP controller. xLLM's
    /// HTTP service reads no rank: its own scheduler places requests.
    pub fn rank_header(self) -> Option<&'static str> {
        match self {
            Dialect::Vllm | Dialect::Sglang => Some("x-data-parallel-rank"),
            Dialect::Xllm => None,
        }
    }

    /// Parses the config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "xllm" => Some(Dialect::Xllm),
            "vllm" => Some(Dialect::Vllm),
            "sglang" => Some(Dialect::Sglang),
            _ => None,
        }
    }

    /// The replay this kind of engine answers.
    pub fn replay(self) -> ReplayKind {
        match self {
            Dialect::Xllm => ReplayKind::Snapshot,
            Dialect::Vllm | Dialect::Sglang => ReplayKind::History,
        }
    }
}

/// Automatic discovery from etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// Whether discovery runs.
    pub enabled: bool,
    /// Tokens per block of every discovered stream.
    pub block_size: u32,
    /// Publisher topic of every discovered stream.
    pub topic: String,
    /// Event port = HTTP port + this + DP rank.
    pub event_port_offset: u16,
    /// Snapshot port = HTTP port + this + DP rank.
    pub replay_port_offset: u16,
    /// How often the instance set is reconciled with the running streams.
    pub refresh_interval: Duration,
    /// Set by `"events": "bind"`: discovered instances publish to the bind endpoint, each under
    /// the topic this pattern names.
    pub bind: Option<BindConfig>,
    /// Set by `"events": "none"`: discovered instances publish no KV events, so they get no
    /// streams and are credited approximately from kvdir's own routing
    /// ([`crate::car::ApproxCache`]), with blocks of `block_size` tokens.
    pub approximate: bool,
}

/// Where streams come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Engines found in etcd.
    Discovery(DiscoveryConfig),
    /// A fixed list.
    Streams(Vec<StreamSpec>),
    /// Neither: only the `engines` list supplies streams.
    EnginesOnly,
}

/// The validated `kv_events_config_file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    /// Discovery or static streams.
    pub source: Source,
    /// Engines listed by address (beside discovery or static streams, or alone).
    pub engines: Vec<EngineSpec>,
    /// How often each listed engine's `/health` and `/metrics` are polled.
    pub engine_poll_interval: Duration,
    /// Resource and recovery limits.
    pub limits: Limits,
    /// The endpoint engines connect to (`kv_events_bind`, or `--kv_events_bind`), if any.
    pub bind: Option<BindConfig>,
    /// Engine pods from the Kubernetes API (`kubernetes`), if configured.
    pub kubernetes: Option<kubernetes::KubernetesConfig>,
}

#[cfg(test)]
mod tests;
