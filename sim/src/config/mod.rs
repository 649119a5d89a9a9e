//! [`EngineConfig`]: what one simulated engine looks like (ports, DP size, block size, tier
//! capacities, wire forms, and the [`Dialect`] it imitates), validated before anything binds.
//!
//! Dialects: `xllm` (the default) answers the replay port with a full-state snapshot and
//! `GET /health` with JSON; `vllm` behaves like vLLM 0.32's `ZmqEventPublisher` and API server:
//! the replay port answers with the last `buffer_steps` batches (history), `GET /health` is an
//! empty 200, `GET /metrics` is Prometheus text, and `cached_tokens` never counts the prompt's
//! last token. SGLang is not simulated.
//!
//! Port rule: rank `r` binds `tcp://127.0.0.1:(event_port + r)` and
//! `tcp://127.0.0.1:(replay_port + r)`, like xLLM. A port of 0 means "ephemeral": every rank
//! binds `tcp://127.0.0.1:*` and the actual endpoints are read back, so they need not be
//! contiguous. Only loopback is ever bound.
//!
//! Discovery rule: with a business HTTP port (`http_port != 0`) and both ZeroMQ ports left at 0,
//! the ports are derived the way kvdir discovery expects (protocol.md section 5): rank `r` binds
//! `http_port + event_port_offset + r` and `http_port + replay_port_offset + r`.
//! [`EngineConfig::resolved`] applies the rule; [`crate::SimEngine`] runs with the resolved config.
//!
//! Connect mode: with [`EngineConfig::events_connect`] `tcp://H:P`, rank `r`'s PUB binds
//! nothing and connects to `tcp://H:(P + r)` instead (vLLM's publisher with a non-wildcard
//! endpoint: kvdir binds, engines connect); the replay ports follow the rules above.

pub use kvdir::config::Dialect;
use kvdir::wire::record::{BatchForm, EventForm, WireHash};
use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::{OpenAiConfig, SimError};

/// How engine block hashes go on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashMode {
    /// MessagePack unsigned 64-bit integers (xLLM, vLLM's integer mode).
    #[default]
    U64,
    /// 32-byte `bin` digests (vLLM's default SHA-256 shape), derived from the 64-bit hash.
    Bin32,
}

impl HashMode {
    /// The wire form of engine hash `h`. `Bin32` expands `h` to 32 deterministic bytes, so equal
    /// blocks still get equal hashes.
    pub fn to_wire(self, h: u64) -> WireHash {
        match self {
            HashMode::U64 => WireHash::Uint(h),
            HashMode::Bin32 => {
                let seed_bytes = h.to_le_bytes();
                let mut bytes = xxh3_128_with_seed(&seed_bytes, 1).to_be_bytes().to_vec();
                bytes.extend_from_slice(&xxh3_128_with_seed(&seed_bytes, 2).to_be_bytes());
                WireHash::Bin(bytes)
            }
        }
    }
}

/// One simulated engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Instance name (what the directory calls `instance_name`).
    pub name: String,
    /// Event port of rank 0; rank `r` uses `event_port + r`. 0 picks ephemeral ports.
    pub event_port: u16,
    /// Snapshot (replay) port of rank 0; rank `r` uses `replay_port + r`. 0 picks ephemeral ports.
    pub replay_port: u16,
    /// Data-parallel ranks; each has its own sockets, sequence and cache.
    pub dp_size: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// The topic frame of every live message (may be empty).
    pub topic: String,
    /// Device (GPU) tier capacity in blocks, per rank.
    pub device_capacity_blocks: usize,
    /// Host (CPU) tier capacity in blocks, per rank; 0 disables the Host tier.
    pub host_capacity_blocks: usize,
    /// Integer or 32-byte `bin` block hashes.
    pub hash_mode: HashMode,
    /// Batch layout (`Array` is xLLM's `[ts, events, dp_rank]`, `Map` is vLLM's).
    pub batch_form: BatchForm,
    /// Event layout (tagged map or positional array).
    pub event_form: EventForm,
    /// Business HTTP port: serves `GET /health` on 127.0.0.1 and names the instance
    /// `127.0.0.1:<http_port>`. 0 means no HTTP server and no port rule.
    pub http_port: u16,
    /// Discovery rule: event port of rank `r` = `http_port + event_port_offset + r`.
    pub event_port_offset: u16,
    /// Discovery rule: replay port of rank `r` = `http_port + replay_port_offset + r`.
    pub replay_port_offset: u16,
    /// The text model served on the HTTP port's OpenAI routes; `None` answers them with 503.
    /// Needs `http_port != 0`.
    pub openai: Option<OpenAiConfig>,
    /// Which engine the simulator imitates: `Xllm` (snapshots) or `Vllm` (history replay,
    /// `/metrics`, last token never reused). `Sglang` is refused by [`EngineConfig::validate`].
    pub dialect: Dialect,
    /// `Vllm` only: how many of the latest batches each rank keeps for replay (vLLM's
    /// `buffer_steps`, 10,000 by default).
    pub buffer_steps: usize,
    /// Connect mode: rank `r`'s PUB connects to this `tcp://host:port` plus `r` instead of
    /// binding (`event_port` must then be 0). `None` binds.
    pub events_connect: Option<String>,
    /// Whether `http_port` is served. `false` keeps the port as the instance's name and the
    /// base of the discovery port rule without starting a server (and its thread); needs
    /// `openai = None`.
    pub serve_http: bool,
}

/// vLLM's default replay buffer, in batches.
pub const DEFAULT_BUFFER_STEPS: usize = 10_000;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            name: "sim-0".to_string(),
            event_port: 0,
            replay_port: 0,
            dp_size: 1,
            block_size: 16,
            topic: "xllm-kv".to_string(),
            device_capacity_blocks: 1024,
            host_capacity_blocks: 0,
            hash_mode: HashMode::U64,
            batch_form: BatchForm::Array,
            event_form: EventForm::Map,
            http_port: 0,
            event_port_offset: 10000,
            replay_port_offset: 30000,
            openai: None,
            dialect: Dialect::Xllm,
            buffer_steps: DEFAULT_BUFFER_STEPS,
            events_connect: None,
            serve_http: true,
        }
    }
}

/// Connectable endpoints of one rank, such as `tcp://127.0.0.1:18000`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RankEndpoints {
    /// The PUB socket (live events).
    pub event: String,
    /// The ROUTER socket (snapshots).
    pub replay: String,
}

impl EngineConfig {
    /// Checks every field and reports all problems at once.
    pub fn validate(&self) -> Result<(), SimError> {
        let mut problems = Vec::new();
        if self.name.is_empty() {
            problems.push("name is empty; give the instance a name".to_string());
        }
        if self.dp_size == 0 {
            problems.push("dp_size = 0 is below the minimum 1".to_string());
        }
        if self.block_size == 0 {
            problems.push("block_size = 0 is below the minimum 1".to_string());
        }
        if self.device_capacity_blocks == 0 {
            problems.push("device_capacity_blocks = 0 is below the minimum 1".to_string());
        }
        self.check_ports(&mut problems);
        if self.dialect == Dialect::Sglang {
            problems.push("dialect = sglang is not simulated; use xllm or vllm".to_string());
        }
        if self.buffer_steps == 0 {
            problems.push("buffer_steps = 0 is below the minimum 1".to_string());
        }
        if let Some(openai) = &self.openai {
            if self.http_port == 0 {
                problems.push(
                    "openai is set but http_port = 0; the OpenAI routes are served on the \
                     HTTP port, so set http_port"
                        .to_string(),
                );
            }
            if !self.serve_http {
                problems.push("openai is set but serve_http = false; serve the HTTP port".into());
            }
            problems.extend(openai.problems());
        }
        if let Some(endpoint) = &self.events_connect {
            self.check_connect(endpoint, &mut problems);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SimError::Config(problems))
        }
    }

    /// Whether the discovery rule derives the ZeroMQ ports (`http_port` set, both ports 0).
    pub fn derives_ports(&self) -> bool {
        self.http_port != 0 && self.event_port == 0 && self.replay_port == 0
    }

    /// Base (event, replay) ports of rank 0, widened so overflow can be reported; a
    /// connecting PUB binds no event port (0).
    fn base_ports(&self) -> (u32, u32) {
        let (event, replay) = if self.derives_ports() {
            let http = u32::from(self.http_port);
            (http + u32::from(self.event_port_offset), http + u32::from(self.replay_port_offset))
        } else {
            (u32::from(self.event_port), u32::from(self.replay_port))
        };
        (if self.events_connect.is_some() { 0 } else { event }, replay)
    }

    /// `events_connect` is `tcp://host:port` with room for every rank, and no event port.
    fn check_connect(&self, endpoint: &str, problems: &mut Vec<String>) {
        let port = connect_port(endpoint);
        match port {
            None => problems.push(format!(
                "events_connect = {endpoint:?} is not tcp://host:port; give the subscriber's \
                 endpoint for rank 0"
            )),
            Some(p) if p + self.dp_size.max(1) - 1 > u32::from(u16::MAX) => {
                problems.push(format!(
                    "events_connect = {endpoint:?} with dp_size = {} needs port {}, above 65535",
                    self.dp_size,
                    p + self.dp_size.max(1) - 1
                ));
            }
            Some(_) => {}
        }
        if self.event_port != 0 {
            problems.push(format!(
                "event_port = {} and events_connect = {endpoint:?}: a connecting PUB binds no \
                 port; set event_port = 0",
                self.event_port
            ));
        }
    }

    fn check_ports(&self, problems: &mut Vec<String>) {
        let (event, replay) = self.base_ports();
        let n = self.dp_size.max(1);
        let rule = if self.derives_ports() { " (derived from http_port)" } else { "" };
        let mut fits = true;
        for (field, port) in [("event_port", event), ("replay_port", replay)] {
            let last = port + n - 1;
            if port != 0 && last > u32::from(u16::MAX) {
                fits = false;
                problems.push(format!(
                    "{field} = {port}{rule} with dp_size = {n} needs port {last}, above 65535"
                ));
            }
        }
        let overlap = |a: u32, b: u32| a != 0 && b != 0 && a < b + n && b < a + n;
        if fits && overlap(event, replay) {
            problems.push(format!(
                "event ports {event}..{} and replay ports {replay}..{} overlap{rule}; \
                 move one range",
                event + n,
                replay + n
            ));
        }
        let http = u32::from(self.http_port);
        let within = |base: u32| base != 0 && (base..base + n).contains(&http);
        if http != 0 && (within(event) || within(replay)) {
            problems.push(format!(
                "http_port = {http} lies inside the event ports {event}.. or replay ports \
                 {replay}.. of the {n} ranks; move it or change the port offsets"
            ));
        }
    }

    /// The config the engine runs with: when [`EngineConfig::derives_ports`], `event_port` and
    /// `replay_port` are set by the discovery rule; otherwise an unchanged copy. Call after
    /// [`EngineConfig::validate`] (an overflowing derived port is left at 0).
    pub fn resolved(&self) -> EngineConfig {
        let mut config = self.clone();
        if self.derives_ports() {
            let (event, replay) = self.base_ports();
            config.event_port = u16::try_from(event).unwrap_or(0);
            config.replay_port = u16::try_from(replay).unwrap_or(0);
        }
        config
    }

    /// `127.0.0.1:<http_port>` with an HTTP port (what the engine registers as), else `name`.
    pub fn instance_name(&self) -> String {
        if self.http_port == 0 {
            self.name.clone()
        } else {
            format!("127.0.0.1:{}", self.http_port)
        }
    }

    /// The part of a `cached`-token prefix that a prompt of `prompt_len` tokens reuses: only
    /// the full blocks within the first `prompt_len - 1` tokens, since every engine (vLLM,
    /// SGLang, xLLM) computes the prompt's last token.
    pub fn reused_tokens(&self, prompt_len: usize, cached: u64) -> u64 {
        let block = u64::from(self.block_size.max(1));
        cached.min((prompt_len as u64).saturating_sub(1) / block * block)
    }

    /// The address rank `rank` binds for the PUB socket.
    pub(crate) fn event_bind_address(&self, rank: u32) -> String {
        bind_address(self.event_port, rank)
    }

    /// Where rank `rank`'s PUB binds, or (connect mode) connects.
    pub(crate) fn event_side(&self, rank: u32) -> EventSide {
        match (&self.events_connect, self.events_connect.as_deref().and_then(connect_port)) {
            (Some(endpoint), Some(port)) => {
                let host = &endpoint[..endpoint.rfind(':').unwrap_or(endpoint.len())];
                EventSide::Connect(format!("{host}:{}", port + rank))
            }
            _ => EventSide::Bind(self.event_bind_address(rank)),
        }
    }

    /// The address rank `rank` binds for the ROUTER socket.
    pub(crate) fn replay_bind_address(&self, rank: u32) -> String {
        bind_address(self.replay_port, rank)
    }
}

/// How a rank's PUB socket meets its subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EventSide {
    /// Bind this address (`*` for an ephemeral port).
    Bind(String),
    /// Connect to this endpoint.
    Connect(String),
}

/// The port of `tcp://host:port` (host non-empty).
fn connect_port(endpoint: &str) -> Option<u32> {
    let (host, port) = endpoint.strip_prefix("tcp://")?.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    (!host.is_empty() && port != 0).then_some(u32::from(port))
}

fn bind_address(port: u16, rank: u32) -> String {
    if port == 0 {
        "tcp://127.0.0.1:*".to_string()
    } else {
        format!("tcp://127.0.0.1:{}", u32::from(port) + rank)
    }
}

#[cfg(test)]
mod tests;
