//! Instance records as xLLM engines write them to etcd (protocol.md section 5), parsed leniently:
//! a value that does not parse is an error for that key only, never for discovery as a whole.
//!
//! Values are hostile input: a name is at most [`MAX_NAME_BYTES`] (a DNS name and a port fit), and
//! error messages quote at most [`QUOTED_BYTES`] of any value, so a 1 MiB value costs one parse
//! and a short log line. Numbers that shape streams (`dp_size`) are bounded where streams are
//! planned.

use serde::{Deserialize, Serialize};

/// The role an instance registered with; reports name it as its key segment (`PREFILL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum InstanceType {
    /// Serves prefill and decode alone.
    Default,
    /// Prefill only.
    Prefill,
    /// Decode only.
    Decode,
    /// Switches between prefill and decode; `current` says which it is doing now.
    Mix,
}

impl InstanceType {
    /// The key segment (`XLLM:<TYPE>:<name>`).
    pub fn key_segment(self) -> &'static str {
        match self {
            InstanceType::Default => "DEFAULT",
            InstanceType::Prefill => "PREFILL",
            InstanceType::Decode => "DECODE",
            InstanceType::Mix => "MIX",
        }
    }

    /// Whether an instance of this role prefills (its cache is what routing credits); a MIX
    /// instance does while `mix_acting_prefill`.
    pub fn prefills(self, mix_acting_prefill: bool) -> bool {
        match self {
            InstanceType::Default | InstanceType::Prefill => true,
            InstanceType::Mix => mix_acting_prefill,
            InstanceType::Decode => false,
        }
    }

    fn from_code(code: u64) -> Option<Self> {
        Some(match code {
            0 => InstanceType::Default,
            1 => InstanceType::Prefill,
            2 => InstanceType::Decode,
            3 => InstanceType::Mix,
            _ => return None,
        })
    }
}

/// What distinguishes one engine process from the next on the same address.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Random per process.
    pub incarnation_id: Option<String>,
    /// Registration time, for engines without an incarnation id.
    pub register_ts_ms: Option<u64>,
}

impl Identity {
    /// Whether `other` is the same process: equal incarnation ids, or, when both lack one,
    /// equal registration times (both absent counts as equal: reconnect and snapshot recovery
    /// then provide the remaining protection).
    pub fn same_process(&self, other: &Identity) -> bool {
        match (&self.incarnation_id, &other.incarnation_id) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.register_ts_ms == other.register_ts_ms,
            _ => false,
        }
    }
}

/// One registered engine instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRecord {
    /// `host:port` of the engine's business HTTP port; also the key suffix.
    pub name: String,
    /// The registered role.
    pub kind: InstanceType,
    /// For MIX: whether it currently acts as prefill (`current_type` 1) or decode (2).
    /// Without `current_type` a MIX instance is taken to act as prefill.
    pub mix_acting_prefill: bool,
    /// Process identity.
    pub identity: Identity,
    /// DP ranks (0 or absent means 1).
    pub dp_size: u32,
    /// `xllm` (or absent) gets subscriptions; other backends do not.
    pub backend: String,
    /// The model it serves (`model_name`, a kvdir extension of the record; empty: not said).
    /// Its streams carry it, so queries for another model leave them out.
    pub model: String,
    /// `[prompt_len, ttft_ms]` samples, for SLO_AWARE.
    pub ttft_profile: Vec<(f64, f64)>,
    /// `[avg_len, batch, tpot_ms]` samples, for SLO_AWARE.
    pub tpot_profile: Vec<(f64, f64, f64)>,
}

#[derive(Deserialize)]
struct Raw {
    name: String,
    #[serde(rename = "rpc_address")]
    _rpc_address: String,
    #[serde(rename = "type")]
    kind: u64,
    current_type: Option<u64>,
    incarnation_id: Option<String>,
    register_ts_ms: Option<u64>,
    dp_size: Option<u32>,
    backend_type: Option<String>,
    #[serde(default)]
    model_name: Option<String>,
    #[serde(default)]
    ttft_profiling_data: Vec<(f64, f64)>,
    #[serde(default)]
    tpot_profiling_data: Vec<(f64, f64, f64)>,
}

/// Longest instance name accepted: a 253-byte DNS name, brackets and a port fit.
pub const MAX_NAME_BYTES: usize = 300;

/// Longest excerpt of a value quoted in an error message.
pub const QUOTED_BYTES: usize = 160;

/// `s`, cut to [`QUOTED_BYTES`] on a character boundary with its full length noted.
fn quoted(s: &str) -> String {
    if s.len() <= QUOTED_BYTES {
        return s.to_string();
    }
    let mut end = QUOTED_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

/// Why a record was ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not JSON of the expected shape.
    #[error("instance value does not parse: {0}")]
    Parse(String),
    /// The `type` code is unknown.
    #[error("instance type {0} is not 0 (DEFAULT), 1 (PREFILL), 2 (DECODE) or 3 (MIX)")]
    Type(u64),
    /// The name is not `host:port`.
    #[error("instance name {0:?} is not host:port of the engine's HTTP port")]
    Name(String),
    /// The key suffix and the `name` field disagree.
    #[error("key names instance {key:?} but the value says {value:?}")]
    NameMismatch {
        /// From the key.
        key: String,
        /// From the value.
        value: String,
    },
}

/// Parses an instance value stored under a key whose suffix is `key_name`.
pub fn parse_instance(key_name: &str, value: &[u8]) -> Result<InstanceRecord, RecordError> {
    let raw: Raw =
        serde_json::from_slice(value).map_err(|e| RecordError::Parse(quoted(&e.to_string())))?;
    if raw.name != key_name {
        let (key, value) = (quoted(key_name), quoted(&raw.name));
        return Err(RecordError::NameMismatch { key, value });
    }
    let kind = InstanceType::from_code(raw.kind).ok_or(RecordError::Type(raw.kind))?;
    if raw.name.len() > MAX_NAME_BYTES || split_host_port(&raw.name).is_none() {
        return Err(RecordError::Name(quoted(&raw.name)));
    }
    Ok(InstanceRecord {
        name: raw.name,
        kind,
        mix_acting_prefill: raw.current_type != Some(2),
        identity: Identity {
            incarnation_id: raw.incarnation_id,
            register_ts_ms: raw.register_ts_ms,
        },
        dp_size: raw.dp_size.unwrap_or(1).max(1),
        backend: raw.backend_type.unwrap_or_else(|| "xllm".into()),
        model: raw.model_name.unwrap_or_default(),
        ttft_profile: raw.ttft_profiling_data,
        tpot_profile: raw.tpot_profiling_data,
    })
}

/// `host:port` -> (host, port).
pub fn split_host_port(name: &str) -> Option<(&str, u16)> {
    let (host, port) = name.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    (!host.is_empty()).then_some((host, port))
}

/// Load as engines report it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadMetrics {
    /// Requests waiting in the engine's queue.
    pub waiting_requests_num: u64,
    /// Device KV usage in 0..=1.
    pub gpu_cache_usage_perc: f64,
    /// Prefill rate of one request, uncached tokens per second, where the engine reports the
    /// tokens and time its prefills took (vLLM's `/metrics`; the TTFT policy's `reported`
    /// rate). xLLM's load reports carry none.
    pub prefill_tokens_per_s: Option<f64>,
}

impl LoadMetrics {
    /// Valid: usage is a finite number in 0..=1.
    pub fn is_valid(&self) -> bool {
        self.gpu_cache_usage_perc.is_finite() && (0.0..=1.0).contains(&self.gpu_cache_usage_perc)
    }
}

/// What an etcd key names, with the namespace prefix already removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryKey {
    /// `XLLM:<TYPE>:<name>`.
    Instance(InstanceType, String),
    /// `XLLM:LOADMETRICS:<name>`.
    Load(String),
}

/// The key prefix for a namespace: `/prod/` for `prod`, nothing for empty.
pub fn namespace_prefix(namespace: &str) -> String {
    let ns = namespace.trim_matches('/');
    if ns.is_empty() {
        String::new()
    } else {
        format!("/{ns}/")
    }
}

/// The key prefixes kvdir lists under a namespace `prefix`: the four instance types, then
/// LOADMETRICS (so a listing applies loads after the instances they belong to). Nothing else
/// under `XLLM:` is listed; in particular not the `XLLM:CACHE:` namespace.
pub fn watched_prefixes(prefix: &str) -> [String; 5] {
    ["DEFAULT", "PREFILL", "DECODE", "MIX", "LOADMETRICS"].map(|t| format!("{prefix}XLLM:{t}:"))
}

/// The one key range kvdir watches: from `XLLM:DECODE:` (the first of [`watched_prefixes`] in
/// key order) to the end of `XLLM:PREFILL:` (the last), as `[start, end)`. One watcher keeps
/// etcd's revision order across instance and load keys, which separate watchers on one stream
/// do not. It leaves out `XLLM:CACHE:` (which sorts before `DECODE`); keys of other segments
/// that sort inside it are ignored by [`parse_key`].
pub fn watched_range(prefix: &str) -> (String, String) {
    (format!("{prefix}XLLM:DECODE:"), format!("{prefix}XLLM:PREFILL;"))
}

/// Classifies a key under `prefix`; other keys give `None`, and so do names longer than
/// [`MAX_NAME_BYTES`], which no engine can have.
pub fn parse_key(prefix: &str, key: &str) -> Option<RegistryKey> {
    let rest = key.strip_prefix(prefix)?.strip_prefix("XLLM:")?;
    let (segment, name) = rest.split_once(':')?;
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return None;
    }
    let kind = match segment {
        "DEFAULT" => InstanceType::Default,
        "PREFILL" => InstanceType::Prefill,
        "DECODE" => InstanceType::Decode,
        "MIX" => InstanceType::Mix,
        "LOADMETRICS" => return Some(RegistryKey::Load(name.to_string())),
        _ => return None,
    };
    Some(RegistryKey::Instance(kind, name.to_string()))
}
